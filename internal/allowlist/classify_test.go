package allowlist

import (
	"bytes"
	"context"
	"fmt"
	endpt "github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/parsejob"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// The classifier's tests use public-looking addresses: they only ever
// appear in records and pcap files, never on a wire.
var (
	guest    = netip.MustParseAddr("10.13.37.5")
	gateway  = netip.MustParseAddr("10.13.37.1")
	c2Addr   = netip.MustParseAddr("45.155.205.17")
	onceAddr = netip.MustParseAddr("151.101.65.140")
	ntpAddr  = netip.MustParseAddr("162.159.200.1")
	c2Name   = "cdn.kx-update.net"
)

const testLease = "lease_01JD0000000000000000000000"

func pubValidator() firewall.Policy {
	return firewall.Policy{SMTPPorts: firewall.DefaultSMTPPorts,
		Lab: []netip.Prefix{netip.MustParsePrefix("10.13.37.0/24"), netip.MustParsePrefix("10.13.38.0/24")}}
}

// genCapture writes the known-truth traffic: a jittered periodic HTTP
// beacon to a name resolved before each contact, a telnet SYN scan on 23
// and 2323, a sequential sweep on 8080, DNS noise, a page fetched once,
// periodic NTP and SMTP to a mail server.
func genCapture(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := pcapgen.New(f, pcapgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	ap := netip.AddrPortFrom
	dns := ap(gateway, 53)
	sport := uint16(40000)
	next := func() uint16 { sport++; return sport }
	start := pcapgen.Start
	at := func(d time.Duration) { g.T = start.Add(d) }
	resolve := func(id uint16, name string, addrs ...netip.Addr) {
		var ans []layers.DNSResourceRecord
		for _, a := range addrs {
			ans = append(ans, pcapgen.A(name, a, 60))
		}
		g.DNSOverUDP(ap(guest, next()), dns, pcapgen.DNSQuery(id, name, layers.DNSTypeA),
			pcapgen.DNSResponse(id, name, layers.DNSTypeA, layers.DNSResponseCodeNoErr, ans))
	}
	// The beacon: every 60 s ± 10 %, 12 times.
	for i := 0; i < 12; i++ {
		jit := time.Duration((rng.Float64()*0.2 - 0.1) * float64(60*time.Second))
		at(time.Duration(i)*60*time.Second + jit + 30*time.Second)
		resolve(uint16(100+i), c2Name, c2Addr)
		c := g.Dial(ap(guest, next()), ap(c2Addr, 80), uint32(1000*i), uint32(5000*i))
		c.Send(pcapgen.HTTPGet(c2Name, fmt.Sprintf("/gate.php?id=7f3a&n=%d", i), "Mozilla/4.0"))
		c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("sleep 60")))
		c.Close()
	}
	// The telnet scan: 150 random public addresses on 23 and 50 on 2323.
	at(5 * time.Second)
	g.Step = 2 * time.Millisecond
	for i := 0; i < 200; i++ {
		dst := netip.AddrFrom4([4]byte{byte(20 + rng.IntN(180)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(1 + rng.IntN(250))})
		port := uint16(23)
		if i%4 == 0 {
			port = 2323
		}
		g.Unanswered(ap(guest, next()), ap(dst, port), uint32(i), 1)
	}
	// A sweep of ten consecutive addresses on 8080.
	for i := 0; i < 10; i++ {
		g.Refused(ap(guest, next()), ap(netip.AddrFrom4([4]byte{82, 165, 10, byte(10 + i)}), 8080), uint32(i))
	}
	// DNS noise: names resolved and never contacted.
	at(200 * time.Second)
	for i, n := range []string{"www.google.com", "www.microsoft.com", "update.example-av.com", "api.weather-now.io", "ocsp.digicert.com"} {
		resolve(uint16(500+i), n, netip.AddrFrom4([4]byte{142, 250, byte(i), 4}))
	}
	// A page fetched once.
	at(300 * time.Second)
	resolve(600, "news.example-portal.com", onceAddr)
	c := g.Dial(ap(guest, next()), ap(onceAddr, 80), 77, 88)
	c.Send(pcapgen.HTTPGet("news.example-portal.com", "/", "Wget/1.21"))
	c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("<html></html>")))
	c.Close()
	// NTP every 64 s: periodic, but infrastructure.
	resolve(700, "pool.ntp.org", ntpAddr)
	for i := 0; i < 10; i++ {
		at(time.Duration(i)*64*time.Second + 10*time.Second)
		ntp := make([]byte, 48)
		ntp[0] = 0x23
		g.UDP(ap(guest, 123), ap(ntpAddr, 123), ntp)
		ntp[0] = 0x24
		g.UDP(ap(ntpAddr, 123), ap(guest, 123), ntp)
	}
	// SMTP: spam to a mail server, four times.
	for i := 0; i < 4; i++ {
		at(time.Duration(400+i*30) * time.Second)
		c := g.Dial(ap(guest, next()), ap(netip.MustParseAddr("64.233.184.27"), 25), 9, 9)
		c.Reply([]byte("220 mx ESMTP\r\n"))
		c.Send([]byte("HELO x\r\n"))
		c.Close()
	}
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
}

// parseCapture runs tb-parse's library entry point on a file, as the
// test lease's.
func parseCapture(t *testing.T, path string) []*records.Observable {
	t.Helper()
	return tbParse(t, parsejob.Request{Inputs: []string{path}, Lease: testLease, NoStore: true})
}

// tbParse runs tb-parse's library entry point and returns the observables
// it prints (passing over its other records).
func tbParse(t *testing.T, req parsejob.Request) []*records.Observable {
	t.Helper()
	var out, errb bytes.Buffer
	job, err := parsejob.Prepare(req, strings.NewReader(""), nil)
	if err == nil {
		err = job.Run(context.Background(), nil, cmdout.New("tb-parse", &out, &errb, nil))
	}
	if err != nil {
		t.Fatalf("tb-parse: %v: %s", err, errb.String())
	}
	var obs []*records.Observable
	rd := records.NewReader(&out, "tb-parse")
	for {
		l, err := rd.Next()
		if err == io.EOF {
			return obs
		}
		if err != nil {
			t.Fatal(err)
		}
		var o records.Observable
		if err := records.Unmarshal(l.Data, &o); err != nil {
			t.Fatal(err)
		}
		if o.Kind == records.KindObservable {
			obs = append(obs, &o)
		}
	}
}

func byValue(ds []Dest) map[string]Dest {
	m := map[string]Dest{}
	for _, d := range ds {
		m[d.Type+" "+d.Value] = d
	}
	return m
}

// TestClassifyCapture: generated traffic with known truth, through
// tb-parse, then the classifier and a promotion: the beacon's C2 (its
// endpoint and its name) is promoted; the scan, the sweep, the DNS noise,
// NTP and SMTP are not.
func TestClassifyCapture(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mixed.pcap")
	genCapture(t, path)
	obs := parseCapture(t, path)
	pol := DefaultPolicy()
	if err := pol.compile(); err != nil {
		t.Fatal(err)
	}
	ds := Classify(obs, &pol)
	m := byValue(ds)

	c2 := m["endpoint 45.155.205.17:80/tcp"]
	if c2.Class != ClassC2 || c2.Score < pol.PromoteScore || c2.Beacon == nil {
		t.Fatalf("beacon endpoint: %+v", c2)
	}
	if iv := c2.Beacon.Interval.D(); iv < 54*time.Second || iv > 66*time.Second || c2.Beacon.Jitter > 0.15 {
		t.Errorf("beacon estimate %s jitter %.3f, want about 60s and at most 10%%", iv, c2.Beacon.Jitter)
	}
	if !strings.Contains(c2.Reason, "named "+c2Name) || !strings.Contains(c2.Reason, "periodic") {
		t.Errorf("beacon reason: %q", c2.Reason)
	}
	if d := m["domain "+c2Name]; d.Class != ClassC2 || d.Score < pol.PromoteScore {
		t.Errorf("c2 name: %+v", d)
	}
	// The telnet scans are one destination each, standing for their
	// targets; the sweep's ten endpoints are classified one by one.
	scans := 0
	for _, d := range ds {
		switch d.Type {
		case records.ObsScan:
			scans += int(d.Dests)
			if d.Class != ClassScan || !strings.HasPrefix(d.Reason, "scan: ") {
				t.Errorf("scan %s: %s (%s)", d.Value, d.Class, d.Reason)
			}
			continue
		case records.AllowEndpoint:
		default:
			continue
		}
		ep, _ := endpt.Parse(d.Value)
		port := ep.Port
		switch port {
		case 23, 2323, 8080:
			scans++
			if d.Class != ClassScan {
				t.Errorf("scan target %s: %s (%s)", d.Value, d.Class, d.Reason)
			}
		}
	}
	if scans != 210 {
		t.Errorf("%d scan targets classified, want 210", scans)
	}
	if d := m["scan tcp/23"]; d.Reason != "scan: 150 distinct destinations on tcp/23" || d.Dests != 150 {
		t.Errorf("telnet scan: %+v", d)
	}
	if d := m["endpoint 82.165.10.14:8080/tcp"]; !strings.Contains(d.Reason, "sweep") {
		t.Errorf("sweep: %+v", d)
	}
	if d := m["endpoint 162.159.200.1:123/udp"]; d.Class != ClassInfra {
		t.Errorf("ntp: %+v", d)
	}
	if d := m["domain pool.ntp.org"]; d.Class != ClassInfra {
		t.Errorf("ntp name: %+v", d)
	}
	if d := m["endpoint 64.233.184.27:25/tcp"]; d.Class != ClassAbuse {
		t.Errorf("smtp: %+v", d)
	}
	for _, n := range []string{"www.google.com", "ocsp.digicert.com"} {
		if d := m["domain "+n]; d.Class != ClassOther {
			t.Errorf("dns noise %s: %+v", n, d)
		}
	}

	p := Promotion{Chain: Chain{Scope: records.ScopeLease, Lease: testLease}, Dests: ds, Policy: &pol,
		Validator: pubValidator(), Now: pcapgen.Start.Add(time.Hour)}
	next, refusals := Next(p, nil)
	// The endpoint is on probation (enforced): all the capture shows of it
	// is what the sample sent.
	active := map[string]bool{}
	for _, e := range next {
		if enforced(e.Status) {
			active[EntryKey(e)] = true
		}
		if e.Type == records.AllowEndpoint && e.Status == records.StatusActive {
			t.Errorf("%s is active on the sample's side of the evidence alone", e.Value)
		}
	}
	want := map[string]bool{"endpoint 45.155.205.17:80/tcp": true, "domain " + c2Name: true}
	if fmt.Sprint(active) != fmt.Sprint(want) {
		t.Fatalf("active entries %v, want %v", active, want)
	}
	classes := map[string]int{}
	for _, r := range refusals {
		classes[r.Class] += max(r.Count, 1)
	}
	if classes[ClassScan] != 210 || classes[ClassAbuse] < 1 || classes[ClassInfra] < 2 {
		t.Errorf("refusals by class: %v (%+v)", classes, refusals)
	}
}

// obsConns is the endpoint observable tb-parse writes for connections to
// dst:port of one outcome (established, attempted, rejected), one a
// start, the longest lasting dur seconds.
func obsConns(dst string, port uint16, proto, outcome string, dur float64, starts ...time.Time) *records.Observable {
	n := int64(len(starts))
	ep := &records.EndpointInfo{Proto: proto, Addr: dst, Port: port, Conns: n, OrigPkts: 5 * n, MaxDuration: dur,
		Clients: []string{guest.String()}, Starts: starts}
	switch outcome {
	case "established":
		ep.Established, ep.RespPkts, ep.ConnStates = n, 4*n, []string{"SF"}
	case "rejected":
		ep.RespPkts, ep.ConnStates = n, []string{"REJ"}
	default:
		ep.ConnStates = []string{"S0"}
	}
	last := slices.MaxFunc(starts, time.Time.Compare).Add(time.Duration(dur * float64(time.Second)))
	return &records.Observable{Type: records.ObsEndpoint, Value: fmt.Sprintf("%s:%d/%s", dst, port, proto), Lease: testLease,
		FirstSeen: slices.MinFunc(starts, time.Time.Compare), LastSeen: last, Count: n, Endpoint: ep}
}

// every is n times, step apart from at.
func every(at time.Time, n int, step time.Duration) []time.Time {
	ts := make([]time.Time, n)
	for i := range ts {
		ts[i] = at.Add(time.Duration(i) * step)
	}
	return ts
}

func obsDomain(name string, at time.Time, addrs ...string) *records.Observable {
	return &records.Observable{Type: records.ObsDomain, Value: name, Lease: testLease, FirstSeen: at, LastSeen: at, Count: 1,
		Domain: &records.DomainInfo{Queries: 1, Responses: 1, QTypes: []string{"A"}, Addrs: addrs}}
}

// TestClassifyRules checks each rule on hand-made observables with
// public-looking addresses, so that refusals come from behaviour and not
// from the address filter.
func TestClassifyRules(t *testing.T) {
	pol := DefaultPolicy()
	pol.compile()
	t0 := pcapgen.Start
	var obs []*records.Observable
	// Long-lived session to a named address: C2.
	obs = append(obs, obsDomain("relay.tk-sync.org", t0, "91.92.240.11"),
		obsConns("91.92.240.11", 8443, "tcp", "established", 1800, t0.Add(time.Second)))
	// A re-established session three times, no name: repeated.
	obs = append(obs, obsConns("37.120.10.5", 6667, "tcp", "established", 20, every(t0, 3, 17*time.Minute)...))
	// Irregular contacts, twice: not enough.
	obs = append(obs, obsConns("5.188.86.3", 443, "tcp", "established", 1, t0, t0.Add(7*time.Second)))
	// A flood: 600 connections to one address.
	obs = append(obs, obsConns("31.13.71.36", 80, "tcp", "attempted", 0, every(t0, 600, time.Millisecond)...))
	// An exploit request (Mirai-style propagation) to a public server.
	obs = append(obs, obsConns("103.77.5.9", 80, "tcp", "established", 1, t0), &records.Observable{Type: records.ObsHTTP,
		Value: "POST http://103.77.5.9/GponForm/diag_Form", Lease: testLease, FirstSeen: t0, LastSeen: t0, Count: 1,
		HTTP: &records.HTTPInfo{Method: "POST", Host: "103.77.5.9", URI: "/GponForm/diag_Form?images/", Servers: []string{"103.77.5.9:80"}}})
	// SSH scan of five addresses (an SSH port needs only four).
	for i := 0; i < 5; i++ {
		obs = append(obs, obsConns(fmt.Sprintf("150.%d.3.4", 10+i*7), 22, "tcp", "rejected", 0, t0))
	}
	// A MX lookup: spam.
	mx := obsDomain("gmail-smtp-in.l.google.com", t0)
	mx.Domain.QTypes = []string{"MX"}
	obs = append(obs, mx)
	// A name that needs approval, contacted periodically.
	obs = append(obs, obsDomain("raw.githubusercontent.com", t0, "185.199.108.133"),
		obsConns("185.199.108.133", 443, "tcp", "established", 1, every(t0, 6, 5*time.Minute)...))
	// A C2 on the scanned telnet port, named and beaconing, stands out
	// from the scan.
	obs = append(obs, obsDomain("cnc.mirai-like.xyz", t0, "194.87.1.2"),
		obsConns("194.87.1.2", 23, "tcp", "established", 2, every(t0, 6, time.Minute)...))
	for i := 0; i < 10; i++ {
		obs = append(obs, obsConns(fmt.Sprintf("77.%d.9.9", 40+i*3), 23, "tcp", "attempted", 0, t0))
	}
	ds := Classify(obs, &pol)
	m := byValue(ds)
	check := func(key, class string, minScore float64, reason string) {
		t.Helper()
		d, ok := m[key]
		if !ok {
			t.Errorf("%s: not classified", key)
			return
		}
		if d.Class != class || d.Score < minScore || !strings.Contains(d.Reason, reason) {
			t.Errorf("%s: got %s %.2f %q, want %s >= %.2f with %q", key, d.Class, d.Score, d.Reason, class, minScore, reason)
		}
	}
	check("endpoint 91.92.240.11:8443/tcp", ClassC2, 0.6, "session of 30m")
	check("domain relay.tk-sync.org", ClassC2, 0.6, "resolved, then 91.92.240.11:8443/tcp contacted")
	check("endpoint 37.120.10.5:6667/tcp", ClassC2, 0.5, "re-established 3 times")
	check("endpoint 5.188.86.3:443/tcp", ClassC2, 0, "re-established 2 times")
	check("endpoint 31.13.71.36:80/tcp", ClassAbuse, 0, "flood")
	check("endpoint 103.77.5.9:80/tcp", ClassAbuse, 0, "exploit request")
	check("endpoint 150.10.3.4:22/tcp", ClassScan, 0, "5 distinct destinations on tcp/22")
	check("domain gmail-smtp-in.l.google.com", ClassAbuse, 0, "MX")
	check("endpoint 185.199.108.133:443/tcp", ClassC2, 0.6, "periodic every 5m0s")
	check("endpoint 194.87.1.2:23/tcp", ClassC2, 0.6, "stands out from the scan of tcp/23")
	check("endpoint 77.40.9.9:23/tcp", ClassScan, 0, "11 distinct destinations on tcp/23")
	if d := m["endpoint 5.188.86.3:443/tcp"]; d.Score >= pol.CandidateScore {
		t.Errorf("two irregular contacts scored %.2f", d.Score)
	}

	// The promotion: a name that needs approval waits for it, with the
	// endpoint it named; the validator refuses nothing here.
	p := Promotion{Chain: Chain{Scope: records.ScopeLease, Lease: testLease}, Dests: ds, Policy: &pol,
		Validator: pubValidator(), Now: t0}
	next, refusals := Next(p, nil)
	status := map[string]string{}
	for _, e := range next {
		status[EntryKey(e)] = e.Status
	}
	for k, want := range map[string]string{
		"endpoint 91.92.240.11:8443/tcp":   records.StatusProbation,
		"domain relay.tk-sync.org":         records.StatusActive,
		"domain raw.githubusercontent.com": records.StatusPending,
		"endpoint 185.199.108.133:443/tcp": records.StatusPending,
		"endpoint 37.120.10.5:6667/tcp":    records.StatusCandidate,
		"endpoint 194.87.1.2:23/tcp":       records.StatusProbation,
		"endpoint 31.13.71.36:80/tcp":      "",
		"endpoint 103.77.5.9:80/tcp":       "",
		"endpoint 150.10.3.4:22/tcp":       "",
	} {
		if status[k] != want {
			t.Errorf("%s: status %q, want %q", k, status[k], want)
		}
	}
	for _, r := range refusals {
		if r.Class == "refused" {
			t.Errorf("validator refusal with public addresses: %+v", r)
		}
	}

	// Caps: with room for one endpoint, the best-scored wins.
	pol.MaxPerLease = 1
	next, refusals = Next(p, nil)
	n := 0
	for _, e := range next {
		if e.Type == records.AllowEndpoint && enforced(e.Status) {
			n++
		}
	}
	capped := 0
	for _, r := range refusals {
		if r.Class == "cap" {
			capped++
		}
	}
	if n != 1 || capped != 1 {
		t.Errorf("cap 1: %d active endpoints, %d cap refusals", n, capped)
	}
}

// TestValidatorRefusals: the same C2 behaviour towards addresses the
// validator refuses (the sinkhole, a private address, documentation
// ranges without the policy's leave, SMTP) is refused with the reason.
func TestValidatorRefusals(t *testing.T) {
	pol := DefaultPolicy()
	pol.compile()
	t0 := pcapgen.Start
	var obs []*records.Observable
	for _, dst := range []string{"10.13.38.2", "192.168.1.20", "203.0.113.7"} {
		obs = append(obs, obsConns(dst, 443, "tcp", "established", 1, every(t0, 6, time.Minute)...))
	}
	ds := Classify(obs, &pol)
	p := Promotion{Chain: Chain{Scope: records.ScopeLease, Lease: testLease}, Dests: ds, Policy: &pol, Validator: pubValidator(), Now: t0}
	next, refusals := Next(p, nil)
	if len(next) != 0 {
		t.Fatalf("entries for refused destinations: %v", next)
	}
	want := map[string]string{"10.13.38.2:443/tcp": "lab address", "192.168.1.20:443/tcp": "private", "203.0.113.7:443/tcp": "documentation"}
	for _, r := range refusals {
		if w, ok := want[r.Target]; ok && strings.Contains(r.Reason, w) {
			delete(want, r.Target)
		}
	}
	if len(want) > 0 {
		t.Errorf("missing refusals %v in %+v", want, refusals)
	}
	pol.Documentation = true
	v := pubValidator()
	v.Documentation = true
	p.Validator = v
	next, _ = Next(p, nil)
	if len(next) != 1 || next[0].Value != "203.0.113.7:443/tcp" || next[0].Status != records.StatusProbation {
		t.Errorf("with documentation ranges allowed: %v", next)
	}
}

// TestSinkholedNames is the lab as it is: every name resolves to the
// sinkhole, so the beacon's connections go to the sinkhole's address. The
// name the HTTP requests carry is promoted; the sinkhole's address is
// refused by the validator; the other names, which resolved to the same
// address, are not named by it.
func TestSinkholedNames(t *testing.T) {
	pol := DefaultPolicy()
	pol.compile()
	t0 := pcapgen.Start
	sinkhole := "10.13.38.2"
	var obs []*records.Observable
	for _, n := range []string{"cdn.kx-update.net", "www.google.com", "ocsp.digicert.com"} {
		obs = append(obs, obsDomain(n, t0, sinkhole))
	}
	obs = append(obs, obsConns(sinkhole, 80, "tcp", "established", 1, every(t0, 6, 30*time.Second)...))
	obs = append(obs, &records.Observable{Type: records.ObsHTTP, Value: "GET http://cdn.kx-update.net/gate.php", Lease: testLease,
		FirstSeen: t0, LastSeen: t0.Add(150 * time.Second), Count: 6,
		HTTP: &records.HTTPInfo{Method: "GET", Host: "cdn.kx-update.net", URI: "/gate.php", Servers: []string{sinkhole + ":80"}}})
	ds := Classify(obs, &pol)
	p := Promotion{Chain: Chain{Scope: records.ScopeLease, Lease: testLease}, Dests: ds, Policy: &pol, Validator: pubValidator(), Now: t0}
	next, refusals := Next(p, nil)
	if len(next) != 1 || next[0].Value != "cdn.kx-update.net" || next[0].Status != records.StatusActive {
		t.Fatalf("entries: %+v", next)
	}
	found := false
	for _, r := range refusals {
		if r.Target == sinkhole+":80/tcp" && strings.Contains(r.Reason, "lab address") {
			found = true
		}
	}
	if !found {
		t.Errorf("no validator refusal of the sinkhole's address: %+v", refusals)
	}
}

// obsEndpoint is an endpoint observable as tb-parse writes it: conns
// connections spread evenly from first to last.
func obsEndpoint(addr string, port uint16, conns int64, first, last time.Time) *records.Observable {
	var starts []time.Time
	for i := int64(max(conns-256, 0)); i < conns; i++ {
		starts = append(starts, first.Add(time.Duration(i)*last.Sub(first)/time.Duration(max(conns-1, 1))))
	}
	return &records.Observable{Type: records.ObsEndpoint, Value: fmt.Sprintf("%s:%d/tcp", addr, port), Lease: testLease,
		FirstSeen: first, LastSeen: last, Count: conns,
		Endpoint: &records.EndpointInfo{Proto: "tcp", Addr: addr, Port: port, Conns: conns, Established: conns,
			OrigPkts: 12 * conns, RespPkts: 10 * conns, MaxDuration: 1, Starts: starts}}
}

// A beacon merged over a day of cycles (1440 connections, 17,280 packets)
// is the C2, not a flood; the same connections within a minute are.
func TestFloodsAreFastNotJustMany(t *testing.T) {
	pol := DefaultPolicy()
	pol.compile()
	t0 := pcapgen.Start
	obs := []*records.Observable{
		obsDomain("cdn.kx-update.net", t0, "45.155.205.17"),
		obsEndpoint("45.155.205.17", 443, 1440, t0, t0.Add(24*time.Hour)),
		obsEndpoint("31.13.71.36", 80, 1440, t0, t0.Add(time.Minute)),
	}
	m := byValue(Classify(obs, &pol))
	if d := m["endpoint 45.155.205.17:443/tcp"]; d.Class != ClassC2 || d.Beacon == nil {
		t.Errorf("a day of beacons: %s (%s)", d.Class, d.Reason)
	}
	if d := m["endpoint 31.13.71.36:80/tcp"]; d.Class != ClassAbuse || !strings.HasPrefix(d.Reason, "flood: 1440 connections") {
		t.Errorf("a minute of 1440 connections: %s (%s)", d.Class, d.Reason)
	}
}

// A scan seen in several cycles counts its distinct destinations over all
// of them (the union of the cycles' sketches), not the largest cycle's.
func TestScanDestinationsUniteCycles(t *testing.T) {
	pol := DefaultPolicy()
	pol.compile()
	var obs []*records.Observable
	for c := 0; c < 3; c++ {
		obs = append(obs, parseScanCycle(t, c))
	}
	d := byValue(Classify(obs, &pol))["scan tcp/23"]
	// Three cycles of 5000 distinct addresses each: about 15000.
	if d.Dests < 14000 || d.Dests > 16000 {
		t.Errorf("scan of three cycles: %d destinations (%s), want about 15000", d.Dests, d.Reason)
	}
}

// parseScanCycle is the scan observable tb-parse makes of one cycle
// scanning 5000 addresses of its own on tcp/23.
func parseScanCycle(t *testing.T, cycle int) *records.Observable {
	t.Helper()
	path := writeCapture(t, func(g *pcapgen.Gen) {
		g.Step = time.Millisecond
		for i := 0; i < 5000; i++ {
			dst := netip.AddrFrom4([4]byte{byte(20 + cycle), byte(i >> 8), byte(i), 1})
			g.Refused(netip.AddrPortFrom(guest, uint16(40000+i)), netip.AddrPortFrom(dst, 23), uint32(i))
		}
	})
	for _, o := range parseCapture(t, path) {
		if o.Scan != nil {
			return o
		}
	}
	t.Fatal("no scan observable")
	return nil
}

// TestForgedResolutionIsNotEvidence: a sample sends a DNS query carrying an
// answer (decoy.example A 203.0.113.66), then contacts the decoy as often as
// a name it really resolved (real.example, 203.0.113.77). Through tb-parse
// and the classifier, the decoy gains no name, and stays below the score
// that promotes; the resolved one is promoted.
func TestForgedResolutionIsNotEvidence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "forged.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	g, err := pcapgen.New(f, pcapgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.AddrPortFrom
	decoy, real := netip.MustParseAddr("203.0.113.66"), netip.MustParseAddr("203.0.113.77")
	dns := ap(gateway, 53)
	forged := pcapgen.DNSResponse(1, "decoy.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("decoy.example", decoy, 60)})
	forged[2] &^= 0x80 // the QR bit: a query, carrying the answer
	g.T = pcapgen.Start
	g.UDP(ap(guest, 40000), dns, forged)
	g.DNSOverUDP(ap(guest, 40001), dns, pcapgen.DNSQuery(2, "real.example", layers.DNSTypeA),
		pcapgen.DNSResponse(2, "real.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("real.example", real, 60)}))
	// Three connections to each, at irregular times (no beacon period).
	for i, d := range []time.Duration{5 * time.Second, 47 * time.Second, 61 * time.Second} {
		for j, dst := range []netip.Addr{decoy, real} {
			g.T = pcapgen.Start.Add(d + time.Duration(j)*time.Second)
			c := g.Dial(ap(guest, uint16(41000+10*i+j)), ap(dst, 443), uint32(1000*i), uint32(5000*i))
			c.Send([]byte("hello"))
			c.Reply([]byte("world"))
			c.Close()
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	pol := DefaultPolicy()
	if err := pol.compile(); err != nil {
		t.Fatal(err)
	}
	m := byValue(Classify(parseCapture(t, path), &pol))
	if d := m["endpoint 203.0.113.66:443/tcp"]; len(d.Names) != 0 || d.Score >= pol.PromoteScore {
		t.Errorf("the decoy: names %v, score %.2f (promotes at %.2f): %s", d.Names, d.Score, pol.PromoteScore, d.Reason)
	}
	if d := m["endpoint 203.0.113.77:443/tcp"]; !slices.Equal(d.Names, []string{"real.example"}) || d.Score < pol.PromoteScore {
		t.Errorf("the resolved destination: names %v, score %.2f: %s", d.Names, d.Score, d.Reason)
	}
	if d, ok := m["domain decoy.example"]; ok && d.Class == ClassC2 {
		t.Errorf("the forged name is a C2 candidate: %+v", d)
	}
}

// TestTriedDestinations: a connect the behaviour trace shows, to a
// destination the capture never saw, is a C2 candidate below the promotion
// score (the sample chooses what it calls), even with a policy whose
// candidate score is the promotion score; a lab service is infrastructure;
// a destination the capture saw is classified from the capture alone.
func TestTriedDestinations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mixed.pcap")
	genCapture(t, path)
	obs := parseCapture(t, path)
	netcall := func(call, addr string, port uint16, calls int64) *records.Observable {
		o := &records.Observable{Type: records.ObsNetcall, Value: fmt.Sprintf("%s %s:%d/tcp", call, addr, port), Lease: testLease,
			Netcall: &records.NetcallInfo{Call: call, Family: "inet", Proto: "tcp", Addr: addr, Port: port, Calls: calls}}
		records.Init(o, records.KindObservable, time.Now())
		return o
	}
	obs = append(obs, netcall("connect", "203.0.113.99", 8443, 7), netcall("connect", c2Addr.String(), 80, 12),
		netcall("connect", gateway.String(), 53, 1), netcall("listen", "0.0.0.0", 2323, 1))
	pol := DefaultPolicy()
	pol.CandidateScore = pol.PromoteScore
	if err := pol.compile(); err != nil {
		t.Fatal(err)
	}
	m := byValue(Classify(obs, &pol))
	if d := m["endpoint 203.0.113.99:8443/tcp"]; d.Class != ClassC2 || d.Score >= pol.PromoteScore || d.Conns != 7 || !strings.Contains(d.Reason, "tried by system call") {
		t.Errorf("tried only: %+v", d)
	}
	if d := m["endpoint "+c2Addr.String()+":80/tcp"]; d.Class != ClassC2 || d.Score < pol.PromoteScore || strings.Contains(d.Reason, "tried") {
		t.Errorf("captured and tried: %+v", d)
	}
	if d := m["endpoint "+gateway.String()+":53/tcp"]; d.Class != ClassInfra {
		t.Errorf("the lab's DNS: %+v", d)
	}
	if _, ok := m["endpoint 0.0.0.0:2323/tcp"]; ok {
		t.Error("a listener is a destination")
	}
}
