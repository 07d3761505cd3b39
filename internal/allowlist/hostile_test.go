package allowlist

import (
	"bytes"
	"context"
	"encoding/json"
	endpt "github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// hostileNames are Host: and server-name values a sample chooses: a
// top-level domain, characters that break a dnsmasq line or a record's
// enforced list, quotes, a newline, a semicolon, bytes that are not UTF-8.
var hostileNames = []string{"com", "gov", "co.uk", "a/b#c", "x y", "x y.example.com", `q"uote.example.com`,
	"evil.example.com\nserver=/com/198.51.100.53", "semi;colon.example.com", "bad\xff\xfe.example.com", "evil.example.org"}

// beaconTo is six connections to an endpoint, a minute apart, each with an
// HTTP request (port 80) or a TLS ClientHello (443) calling it by name.
func beaconTo(addr string, port uint16, name string) []*records.Observable {
	t0 := pcapgen.Start
	obs := []*records.Observable{obsConns(addr, port, "tcp", "established", 1, every(t0, 6, time.Minute)...)}
	srv := []string{addr + ":" + strconv.Itoa(int(port))}
	if port == 443 {
		return append(obs, &records.Observable{Type: records.ObsTLS, Value: name, Lease: testLease, FirstSeen: t0, LastSeen: t0, Count: 6,
			TLS: &records.TLSInfo{ServerName: name, Servers: srv}})
	}
	return append(obs, &records.Observable{Type: records.ObsHTTP, Value: "GET http://" + name + "/", Lease: testLease, FirstSeen: t0,
		LastSeen: t0, Count: 6, HTTP: &records.HTTPInfo{Method: "GET", Host: name, URI: "/", Servers: srv}})
}

// hostileObs: every hostile name as the Host of requests to one endpoint
// and as the server name of ClientHellos to another; none resolved.
func hostileObs() []*records.Observable {
	var obs []*records.Observable
	for _, n := range hostileNames {
		obs = append(obs, beaconTo("45.155.205.17", 80, n)...)
		obs = append(obs, beaconTo("91.92.240.11", 443, n)...)
	}
	return obs
}

// TestNamesOnlyFromResolutions: names a sample only writes into requests
// (Host:, SNI) never become DNS forwards, whatever they are; a name it
// resolved, through the lab's resolver, to the endpoint it then beaconed
// to does.
func TestNamesOnlyFromResolutions(t *testing.T) {
	pol := DefaultPolicy()
	pol.Documentation = true
	pol.compile()
	now := pcapgen.Start.Add(time.Hour)
	promote := func(obs []*records.Observable) ([]*records.AllowEntry, []records.Refusal) {
		p := Promotion{Chain: Chain{Scope: records.ScopeLease, Lease: testLease}, Dests: Classify(obs, &pol), Policy: &pol,
			Validator: pubValidator(), Now: now}
		return Next(p, nil)
	}
	next, _ := promote(hostileObs())
	for _, e := range next {
		if e.Type == records.AllowDomain {
			t.Errorf("a name only seen in requests became a DNS forward: %q (%s)", e.Value, e.Reason)
		}
		for _, n := range e.Names {
			t.Errorf("endpoint %s is named %q, which it was never resolved from", e.Value, n)
		}
	}
	obs := append(hostileObs(), obsDomain("Real.Example.org.", pcapgen.Start, "45.155.205.17"))
	next, _ = promote(obs)
	var domains []string
	for _, e := range next {
		if e.Type == records.AllowDomain {
			domains = append(domains, e.Value+" "+e.Status)
		}
	}
	if strings.Join(domains, ",") != "real.example.org active" {
		t.Errorf("with a resolution, the domain entries are %v, want real.example.org active", domains)
	}
}

// TestHostileNamesNeverFailAWrite: resolved names that may not be
// forwarded are refused with their reason; the revision holding the rest
// is written, verifies, and applies, and the forward list never sees them.
func TestHostileNamesNeverFailAWrite(t *testing.T) {
	ctx := context.Background()
	pol := DefaultPolicy()
	pol.compile()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	var obs []*records.Observable
	for i, n := range hostileNames {
		// Each name is the only one resolved to its own address, then
		// beaconed to: the strongest evidence a name can have.
		addr := "45.155.205." + strconv.Itoa(10+i)
		obs = append(obs, obsDomain(n, pcapgen.Start, addr))
		obs = append(obs, beaconTo(addr, 80, n)...)
	}
	c := Chain{Scope: records.ScopeLease, Lease: testLease}
	rev, _, err := b.Promote(ctx, Promotion{Chain: c, Dests: Classify(obs, &pol), Policy: &pol, Validator: pubValidator(), Now: now})
	if err != nil {
		t.Fatalf("promote: %v", err)
	}
	if _, err := b.Verify(ctx, c); err != nil {
		t.Fatalf("verify: %v", err)
	}
	_, entries, err := b.Head(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type == records.AllowDomain && e.Value != "evil.example.org" {
			t.Errorf("domain entry %q", e.Value)
		}
	}
	refused := 0
	for _, r := range rev.Refusals {
		for _, x := range r.Examples {
			if strings.ContainsAny(x, "\n\xff") {
				t.Errorf("refusal example %q is not quoted", x)
			}
		}
		if r.Target == "names that may not be forwarded" {
			refused = r.Count
		}
		if r.Target == "gov" || strings.Contains(r.Reason, "never_allow") {
			refused++
		}
	}
	// Everything but evil.example.org: com and gov are single labels,
	// co.uk a public suffix, the rest not letters, digits and hyphens.
	if refused != len(hostileNames)-1 {
		t.Errorf("refused %d names, want %d: %+v", refused, len(hostileNames)-1, rev.Refusals)
	}
	names, err := b.LeaseNames(ctx, testLease, now, func(f string, a ...any) { t.Errorf(f, a...) })
	if err != nil || strings.Join(names, ",") != "evil.example.org" {
		t.Errorf("forward list %v, %v", names, err)
	}
}

// hostileEntries are entries as a revision written before values were
// checked, or a hand-edited content blob, may hold: values and reasons
// that break lines, quotes and encodings.
func hostileEntries(expires time.Time) []*records.AllowEntry {
	var out []*records.AllowEntry
	for i, v := range []string{"x y", "a\nb.example.com", "bad\xff.example.com", `q"x.example.com`, "semi;colon.example.com", "com"} {
		e := &records.AllowEntry{Type: records.AllowDomain, Value: v, Scope: records.ScopeLease, Lease: testLease,
			Status: records.StatusActive, Class: ClassC2, Reason: "reason\twith\ttabs\nand a newline \xfe", ExpiresAt: &expires}
		records.Init(e, records.KindAllow, pcapgen.Start.Add(time.Duration(i)*time.Millisecond))
		out = append(out, e)
	}
	e := &records.AllowEntry{Type: records.AllowEndpoint, Value: "1.2.3.4:80/tcp\nadd rule", Scope: records.ScopeLease,
		Lease: testLease, Status: records.StatusActive, Class: ClassC2, Verdict: "rate-limit", ExpiresAt: &expires}
	records.Init(e, records.KindAllow, pcapgen.Start)
	return append(out, e)
}

// TestHostileValuesNeverFailAWriteOrAnExport: hostile Host and server
// names, resolved names, request URIs and flood addresses go through
// promote into a revision that verifies and applies; hostile values in old
// content are taken out of the enforced set when written again; and no
// export lets a value out of its field or its line.
func TestHostileValuesNeverFailAWriteOrAnExport(t *testing.T) {
	ctx := context.Background()
	pol := DefaultPolicy()
	pol.compile()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	c := Chain{Scope: records.ScopeLease, Lease: testLease}
	obs := hostileObs()
	for i, n := range hostileNames {
		addr := "45.155.205." + strconv.Itoa(10+i)
		obs = append(obs, obsDomain(n, pcapgen.Start, addr))
		obs = append(obs, beaconTo(addr, 80, n)...)
	}
	obs = append(obs, &records.Observable{Type: records.ObsHTTP, Value: "x", Lease: testLease, FirstSeen: pcapgen.Start,
		LastSeen: pcapgen.Start, HTTP: &records.HTTPInfo{Method: "GET", Host: "x y", URI: "/cgi-bin/\"\n;\xff\u2028", Servers: []string{"45.155.205.17:80"}}},
		&records.Observable{Type: records.ObsICMP, Value: "x", Lease: testLease, FirstSeen: pcapgen.Start, LastSeen: pcapgen.Start,
			ICMP: &records.ICMPInfo{RespH: "1.2.3.4\n\xff\"", Packets: pol.FloodPackets}})
	if _, _, err := b.Promote(ctx, Promotion{Chain: c, Dests: Classify(obs, &pol), Policy: &pol, Validator: pubValidator(), Now: now}); err != nil {
		t.Fatalf("promote: %v", err)
	}
	// Old content with hostile values, written again (as a rollback does).
	head, cur, err := b.Head(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := b.Lock(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	next := append(append([]*records.AllowEntry(nil), cur...), hostileEntries(now.Add(time.Hour))...)
	_, _, err = b.Write(ctx, Commit{Chain: c, Cause: "rollback", Refusals: []records.Refusal{{Target: "t\xff\n", Reason: "r\xfe", Examples: []string{"e\xfd"}}}},
		head, cur, next)
	unlock()
	if err != nil {
		t.Fatalf("writing old hostile content: %v", err)
	}
	if _, err := b.Verify(ctx, c); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if _, err := b.Desired(ctx, testLease, now); err != nil {
		t.Fatalf("the enforced list: %v", err)
	}
	_, entries, err := b.Head(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if enforced(e.Status) && invalidValue(e) != "" {
			t.Errorf("enforced entry with value %q", e.Value)
		}
	}
	// Every export, of the stored entries and of the raw hostile ones.
	all := append(entries, hostileEntries(now.Add(time.Hour))...)
	for _, f := range Formats {
		var out bytes.Buffer
		if err := Export(&out, all, ExportOptions{Format: f, Table: "talkbox", Set: "allow", SIDBase: 9700001, Now: now}); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !utf8.Valid(out.Bytes()) {
			t.Errorf("%s: output is not UTF-8", f)
		}
		lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		for i, l := range lines {
			if strings.ContainsAny(l, "\r\x00\u2028") {
				t.Errorf("%s line %d holds a control character: %q", f, i+1, l)
			}
			switch f {
			case "plain":
				if e := (records.AllowEntry{Type: records.AllowDomain, Value: l}); invalidValue(&e) != "" {
					if _, err := endpt.Parse(l); err != nil {
						t.Errorf("plain line %q is neither a name nor an endpoint", l)
					}
				}
			case "zeek":
				if n := len(strings.Split(l, "\t")); i > 0 && n != 5 {
					t.Errorf("zeek line %d has %d fields: %q", i+1, n, l)
				}
			case "suricata":
				if !suricataRule.MatchString(l) {
					t.Errorf("suricata line %d: %q", i+1, l)
				}
			case "nft":
				if i > 0 && !nftLine.MatchString(l) {
					t.Errorf("nft line %d: %q", i+1, l)
				}
			case "stix", "json":
				if !json.Valid([]byte(l)) {
					t.Errorf("%s line %d is not JSON: %q", f, i+1, l)
				}
			}
		}
	}
}

var (
	suricataRule = regexp.MustCompile(`^alert (tcp|udp|dns) \$HOME_NET any -> \S+ \S+ \(msg:"[^";\\]*"; (flow:to_server|dns\.query; content:"[a-z0-9.-]+"; nocase; endswith); metadata:talkbox_entry allow_[0-9A-Z]{26}; sid:[0-9]+; rev:1;\)$`)
	nftLine      = regexp.MustCompile(`^add element inet talkbox allow \{ [0-9.]+ \. (tcp|udp) \. [0-9]+(, [0-9.]+ \. (tcp|udp) \. [0-9]+)* \}$`)
)

// TestHostileRequestsThroughTheParser: the packets a sample sends, decoded
// by tb-parse: HTTP requests whose Host is a top-level domain, a value
// with a space, a slash and a hash, quotes, a semicolon and bytes that are
// not UTF-8, and ClientHellos with such server names, each six times a
// minute apart to its own public address and answered. No name becomes a
// DNS forward; the revision verifies; every export stays well-formed.
func TestHostileRequestsThroughTheParser(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hostile.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	g, err := pcapgen.New(f, pcapgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hosts := []string{"com", "gov", "a/b#c", "x y", `q"uote.example.com`, "semi;colon.example.com", "bad\xff\xfe.example.com"}
	sport := uint16(40000)
	for i, h := range hosts {
		web := netip.AddrFrom4([4]byte{198, 51, 100, byte(20 + i)})
		tls := netip.AddrFrom4([4]byte{198, 51, 100, byte(40 + i)})
		for n := 0; n < 6; n++ {
			g.T = pcapgen.Start.Add(time.Duration(n)*time.Minute + time.Duration(i)*time.Second)
			sport++
			c := g.Dial(netip.AddrPortFrom(guest, sport), netip.AddrPortFrom(web, 80), uint32(1000*n), uint32(5000*n))
			c.Send(pcapgen.HTTPGet(h, "/gate", "tb-beacon"))
			c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("ok")))
			c.Close()
			sport++
			c = g.Dial(netip.AddrPortFrom(guest, sport), netip.AddrPortFrom(tls, 443), uint32(1000*n), uint32(5000*n))
			c.Send(pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x1301}, SNI: h}))
			c.Reply(pcapgen.ServerHelloRecord(0x0303, 0x1301))
			c.Close()
		}
	}
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	obs := parseCapture(t, path)
	seen := 0
	for _, o := range obs {
		if o.HTTP != nil || o.TLS != nil {
			seen++
		}
	}
	if seen == 0 {
		t.Fatal("tb-parse saw no request")
	}
	pol := DefaultPolicy()
	pol.Documentation, pol.MaxPerCycle = true, 0
	pol.compile()
	v := pubValidator()
	v.Documentation = true
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	c := Chain{Scope: records.ScopeLease, Lease: testLease}
	ctx := context.Background()
	rev, _, err := b.Promote(ctx, Promotion{Chain: c, Dests: Classify(obs, &pol), Policy: &pol, Validator: v, Now: now})
	if err != nil {
		t.Fatalf("promote: %v", err)
	}
	if _, err := b.Verify(ctx, c); err != nil {
		t.Fatalf("verify: %v", err)
	}
	_, entries, err := b.Head(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	endpoints := 0
	for _, e := range entries {
		switch e.Type {
		case records.AllowDomain:
			t.Errorf("a name only seen in requests became a DNS forward: %q", e.Value)
		case records.AllowEndpoint:
			endpoints++
		}
	}
	if endpoints == 0 || rev.Entries != endpoints {
		t.Errorf("%d endpoint entries of %d: the beacons themselves are evidence", endpoints, rev.Entries)
	}
	for _, format := range Formats {
		var out bytes.Buffer
		if err := Export(&out, entries, ExportOptions{Format: format, Table: "talkbox", Set: "allow", SIDBase: 1, Now: now}); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		if !utf8.Valid(out.Bytes()) || strings.ContainsAny(out.String(), "\r\x00\xff") {
			t.Errorf("%s export: %q", format, out.String())
		}
	}
}
