package allowlist_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

const wait = 5 * time.Second

// liveObs are a lease's observables: with c2, a beacon to labtest.C2:8080
// named c2.example; always a telnet scan that includes labtest.Other.
func liveObs(lease string, c2 bool) []byte {
	name := ""
	if c2 {
		name = "c2.example"
	}
	return namedObs(lease, name)
}

// namedObs are liveObs with the beacon's name (none: no beacon).
func namedObs(lease, name string) []byte {
	c2 := name != ""
	t0 := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	n := 0
	add := func(o *records.Observable) {
		n++
		o.Kind, o.ID, o.V, o.Lease = records.KindObservable, fmt.Sprintf("observable_01JD00000000000000000000%02d", n), 1, lease
		o.CreatedAt, o.UpdatedAt, o.Count = t0, t0, 1
		b, _ := records.Marshal(o)
		out.Write(append(b, '\n'))
	}
	for i := 0; i < 6; i++ {
		dst := labtest.Other
		if i > 0 {
			dst = netip.AddrFrom4([4]byte{192, 0, 2, byte(20 + 7*i)})
		}
		add(endpointObs(netip.AddrPortFrom(dst, 23), false, t0))
	}
	if c2 {
		add(&records.Observable{Type: records.ObsDomain, Value: name, FirstSeen: t0, LastSeen: t0,
			Domain: &records.DomainInfo{Queries: 6, Responses: 6, QTypes: []string{"A"}, Addrs: []string{labtest.C2.String()}}})
		var starts []time.Time
		for i := 0; i < 6; i++ {
			starts = append(starts, t0.Add(time.Duration(i)*time.Minute+time.Duration(i%2)*3*time.Second))
		}
		add(endpointObs(netip.AddrPortFrom(labtest.C2, 8080), true, starts...))
	}
	return out.Bytes()
}

// book opens the allow lists of stateDir as tb-allow does, with a sink
// whose stdout the test reads.
func book(t *testing.T, stateDir string) (*allowlist.Book, cmdout.Sink, *bytes.Buffer) {
	t.Helper()
	st, err := state.Open(context.Background(), stateDir)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return &allowlist.Book{St: st}, cmdout.New("tb-allow", &out, os.Stderr, log), &out
}

func lastRevision(t *testing.T, out *bytes.Buffer) *records.AllowRevision {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var r records.AllowRevision
		if records.Unmarshal([]byte(lines[i]), &r) == nil && r.Kind == records.KindRevision {
			return &r
		}
	}
	t.Fatalf("no revision in %s", out)
	return nil
}

// TestLive runs promote, apply and rollback against a real lab in
// namespaces: after apply, a guest reaches the promoted C2 and its name
// resolves upstream while the scanned address still lands on the
// sinkhole; after rollback, the C2 is sinkholed again.
func TestLive(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	stateDir := t.TempDir()
	cfg := l.Config
	cfg.DNS = true
	cfg.Dir = filepath.Join(stateDir, "capture", "labs", l.ID)
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	g := l.AddGuest("g1", netip.MustParseAddr("10.13.37.10"))
	if err := netlab.AttachPort(ctx, cfg, g.LabPort()); err != nil {
		t.Fatal(err)
	}
	fw, err := cfg.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	lease := records.NewID("lease", time.Now())
	if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: lease, IP: g.IP}); err != nil {
		t.Fatal(err)
	}
	st, err := state.Open(ctx, stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if got := netlab.Dir(st, l.ID); got != cfg.Dir {
		t.Fatalf("lab dir %s, tb-allow looks in %s", cfg.Dir, got)
	}
	policy := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(policy, []byte(`{"documentation": true}`), 0o644); err != nil {
		t.Fatal(err)
	}

	sink := l.Sniff(cfg.SinkNS, cfg.SinkVeth+"p")
	inet := l.Sniff(l.Internet, l.InternetIf)
	var accepted atomic.Int64
	got := make(chan string, 16)
	var ln net.Listener
	labtest.In(t, l.Internet, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(labtest.C2.String(), "8080"))
		return err
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				got <- string(b)
			}()
		}
	}()
	var dnsConn net.PacketConn
	labtest.In(t, l.Internet, func() (err error) {
		dnsConn, err = net.ListenPacket("udp", net.JoinHostPort(labtest.Resolver.String(), "53"))
		return err
	})
	t.Cleanup(func() { dnsConn.Close() })
	go serveDNS(dnsConn, "c2.example.", labtest.C2)

	sinkhole := cfg.Sinkhole()
	// dial connects from the guest and sends a payload; it reports whether
	// the connection was accepted by whoever answered.
	dial := func(dst netip.Addr, port uint16, payload string) error {
		var derr error
		labtest.In(t, g.NS, func() error {
			c, err := net.DialTimeout("tcp", netip.AddrPortFrom(dst, port).String(), wait)
			if err != nil {
				derr = err
				return nil
			}
			_, derr = c.Write([]byte(payload))
			c.Close()
			return nil
		})
		return derr
	}
	atSink := func(what string, port uint16, since time.Time) {
		t.Helper()
		sink.Wait(t, what, wait, func(p labtest.Packet) bool {
			return p.Src == g.IP && p.Dst == sinkhole && p.Proto == "tcp" && p.DstPort == port && p.At.After(since)
		})
	}
	run := func(fn func(*allowlist.Book, cmdout.Sink) error) *bytes.Buffer {
		t.Helper()
		b, sink, out := book(t, stateDir)
		if err := fn(b, sink); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return out
	}
	pol, err := allowlist.LoadPolicy(policy)
	if err != nil {
		t.Fatal(err)
	}
	promote := func(obs []byte) *records.AllowRevision {
		out := run(func(b *allowlist.Book, sink cmdout.Sink) error {
			return allowlist.Promote(ctx, b, allowlist.PromoteRequest{Input: allowlist.Input{Stdin: bytes.NewReader(obs)},
				Scope: records.ScopeLease, Policy: pol, Lab: l.ID}, sink)
		})
		return lastRevision(t, out)
	}

	// Cycle 1 saw only the scan: an empty revision, everything sinkholed.
	r1 := promote(liveObs(lease, false))
	if r1.Active != 0 || len(r1.Refusals) != 1 || r1.Refusals[0].Class != allowlist.ClassScan || r1.Refusals[0].Count != 6 {
		t.Fatalf("cycle 1 revision: %+v", r1)
	}
	start := time.Now()
	if err := dial(labtest.C2, 8080, "before"); err == nil {
		t.Fatal("the C2 answered before anything was promoted")
	}
	atSink("C2 before promotion", 8080, start)

	// Cycle 2 saw the beacon: promoted and applied by promote itself.
	r2 := promote(liveObs(lease, true))
	if r2.Active != 2 || r2.Previous != r1.ID {
		t.Fatalf("cycle 2 revision: %+v", r2)
	}
	set, err := fw.AllowSet(ctx, lease)
	if err != nil || len(set) != 1 || set[0].Dst != labtest.C2 || set[0].Port != 8080 || set[0].Verdict != firewall.RateLimit {
		t.Fatalf("live set after promote: %v %v", set, err)
	}
	if err := dial(labtest.C2, 8080, "after-apply"); err != nil {
		t.Fatalf("the promoted C2 is not reachable: %v", err)
	}
	select {
	case s := <-got:
		if s != "after-apply" {
			t.Fatalf("the C2 received %q", s)
		}
	case <-time.After(wait):
		t.Fatal("the C2 received nothing")
	}
	inet.Wait(t, "SYN at the C2", wait, func(p labtest.Packet) bool {
		return p.Dst == labtest.C2 && p.DstPort == 8080 && p.Src == labtest.UplinkHost
	})
	// The scanned address is still sinkholed.
	start = time.Now()
	dial(labtest.Other, 23, "scan")
	atSink("scan target after promotion", 23, start)
	// The name resolves upstream now.
	waitResolve(t, g.NS, "c2.example.", labtest.C2)

	// Applying again changes nothing.
	out := run(func(b *allowlist.Book, sink cmdout.Sink) error {
		return allowlist.Apply(ctx, b, allowlist.ApplyRequest{Lab: l.ID}, sink)
	})
	var res allowlist.Applied
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || !res.Unchanged || res.Lease != lease || res.Elements != 1 {
		t.Fatalf("second apply: %s %v", out, err)
	}

	// Rollback to cycle 1: the C2 is sinkholed again, its name too.
	out = run(func(b *allowlist.Book, sink cmdout.Sink) error {
		return allowlist.Rollback(ctx, b, r1.ID, l.ID, false, sink)
	})
	r3 := lastRevision(t, out)
	if r3.RollbackOf != r1.ID || r3.Active != 0 {
		t.Fatalf("rollback revision: %+v", r3)
	}
	if set, err := fw.AllowSet(ctx, lease); err != nil || len(set) != 0 {
		t.Fatalf("live set after rollback: %v %v", set, err)
	}
	before := accepted.Load()
	start = time.Now()
	if err := dial(labtest.C2, 8080, "after-rollback"); err == nil {
		t.Fatal("the C2 answered after the rollback")
	}
	atSink("C2 after rollback", 8080, start)
	if accepted.Load() != before {
		t.Fatal("the C2 accepted a connection after the rollback")
	}
	waitResolve(t, g.NS, "c2.example.", sinkhole)
	if leaked := inet.Seen(func(p labtest.Packet) bool {
		return p.Dst == labtest.Other || (p.Dst == labtest.C2 && p.At.After(start))
	}); len(leaked) > 0 {
		t.Fatalf("packets reached the internet that were not allowed: %v", leaked)
	}
	b := &allowlist.Book{St: st}
	if revs, err := b.Verify(ctx, allowlist.Chain{Scope: records.ScopeLease, Lease: lease}); err != nil || len(revs) != 3 {
		t.Fatalf("verify: %d %v", len(revs), err)
	}

	// A lab whose table is gone from the kernel (flushed, a reboot) is not
	// up: apply says so as every command does (exit 69), not an nftables
	// error.
	if out, err := exec.Command("ip", "netns", "exec", cfg.HostNS, "nft", "delete", "table", "inet", cfg.Table).CombinedOutput(); err != nil {
		t.Fatalf("nft delete table: %v %s", err, out)
	}
	ab, asink, _ := book(t, stateDir)
	if err := allowlist.Apply(ctx, ab, allowlist.ApplyRequest{Lab: l.ID}, asink); !errors.Is(err, netlab.ErrNotUp) || fault.Code(err) != 69 {
		t.Fatalf("apply on a lab whose table is gone: %v, want the lab's not-up error, exit 69", err)
	}
}

// waitResolve asks the sinkhole's DNS until the name resolves to want
// (dnsmasq re-reads its forward list on SIGHUP, asynchronously).
func waitResolve(t *testing.T, ns, name string, want netip.Addr) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		// A query that arrives while dnsmasq reloads may go unanswered:
		// ask again rather than fail.
		a, err := resolve(ns, labtest.Resolver.String()+":53", name)
		if err == nil && a == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s resolves to %s (%v), want %s", name, a, err, want)
		}
	}
}

func serveDNS(pc net.PacketConn, name string, addr netip.Addr) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionAvailable: true})
		b.StartQuestions()
		b.Question(q)
		b.StartAnswers()
		if strings.EqualFold(q.Name.String(), name) && q.Type == dnsmessage.TypeA {
			b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 0}, dnsmessage.AResource{A: addr.As4()})
		}
		out, _ := b.Finish()
		pc.WriteTo(out, from)
	}
}

func resolve(ns, server, name string) (netip.Addr, error) {
	var got netip.Addr
	err := netns.Do(netns.Path(ns), func() error {
		c, err := net.Dial("udp", server)
		if err != nil {
			return err
		}
		defer c.Close()
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 4242, RecursionDesired: true})
		b.StartQuestions()
		b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		q, _ := b.Finish()
		c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write(q); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		var p dnsmessage.Parser
		if _, err := p.Start(buf[:n]); err != nil {
			return err
		}
		p.SkipAllQuestions()
		for {
			h, err := p.AnswerHeader()
			if err != nil {
				return nil
			}
			if h.Type == dnsmessage.TypeA {
				a, _ := p.AResource()
				got = netip.AddrFrom4(a.A)
				return nil
			}
			p.SkipAnswer()
		}
	})
	return got, err
}

// liveLab brings up a lab with DNS (upstream: labtest.Resolver unless
// noUpstream) and a guest, and applies rules for a lease on it.
func liveLab(t *testing.T, noUpstream bool) (l *labtest.Lab, cfg netlab.Config, fw *firewall.NFT, g *labtest.Guest, stateDir string) {
	t.Helper()
	ctx := context.Background()
	l = labtest.New(t)
	stateDir = t.TempDir()
	cfg = l.Config
	cfg.DNS = true
	if noUpstream {
		cfg.Upstream = netip.Addr{}
	}
	cfg.Dir = filepath.Join(stateDir, "capture", "labs", l.ID)
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	g = l.AddGuest("g1", netip.MustParseAddr("10.13.37.10"))
	if err := netlab.AttachPort(ctx, cfg, g.LabPort()); err != nil {
		t.Fatal(err)
	}
	fw, err := cfg.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	return l, cfg, fw, g, stateDir
}

func docPolicy(t *testing.T) allowlist.Policy {
	t.Helper()
	policy := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(policy, []byte(`{"documentation": true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := allowlist.LoadPolicy(policy)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// appliedLines are the applied lines of an apply's output, by lease.
func appliedLines(t *testing.T, out *bytes.Buffer) map[string]allowlist.Applied {
	t.Helper()
	m := map[string]allowlist.Applied{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var a allowlist.Applied
		if json.Unmarshal([]byte(l), &a) == nil && a.Lease != "" && a.Revisions != nil {
			m[a.Lease] = a
		}
	}
	return m
}

// TestLiveForwardListPerLab: the lab's DNS sinkhole forwards the names of
// the live leases on that lab only. A released lease's name and the name
// of a lease elsewhere (no rules on this lab: another lab, another host
// of the fleet) stay sinkholed, as a guest's query shows.
func TestLiveForwardListPerLab(t *testing.T) {
	ctx := context.Background()
	l, cfg, fw, g, stateDir := liveLab(t, false)
	pol := docPolicy(t)
	now := time.Now()
	here, released, elsewhere := records.NewID("lease", now), records.NewID("lease", now.Add(time.Millisecond)),
		records.NewID("lease", now.Add(2*time.Millisecond))
	// The released lease's rules are still there (tb-capture stop has not
	// run yet): its record says it is gone.
	for lease, ip := range map[string]netip.Addr{here: g.IP, released: netip.MustParseAddr("10.13.37.11")} {
		if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: lease, IP: ip}); err != nil {
			t.Fatal(err)
		}
	}
	b, sink, _ := book(t, stateDir)
	rec := &records.SandboxLease{State: records.LeaseReleased}
	records.Init(rec, records.KindLease, now)
	rec.ID = released
	if err := b.St.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	for lease, name := range map[string]string{released: "gone.example", elsewhere: "far.example", here: "c2.example"} {
		if err := allowlist.Promote(ctx, b, allowlist.PromoteRequest{Input: allowlist.Input{Stdin: bytes.NewReader(namedObs(lease, name))},
			Scope: records.ScopeLease, Policy: pol, Lab: l.ID, NoApply: true}, sink); err != nil {
			t.Fatal(err)
		}
	}
	// The upstream knows c2.example only: a forwarded other name would
	// resolve to nothing, not to the sinkhole.
	var dnsConn net.PacketConn
	labtest.In(t, l.Internet, func() (err error) {
		dnsConn, err = net.ListenPacket("udp", net.JoinHostPort(labtest.Resolver.String(), "53"))
		return err
	})
	t.Cleanup(func() { dnsConn.Close() })
	go serveDNS(dnsConn, "c2.example.", labtest.C2)
	b, sink, out := book(t, stateDir)
	if err := allowlist.Apply(ctx, b, allowlist.ApplyRequest{Lab: l.ID}, sink); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	names, err := allowlist.CurrentNames(cfg.Dir)
	if err != nil || strings.Join(names, ",") != "c2.example" {
		t.Fatalf("the lab forwards %v (%v), want only c2.example", names, err)
	}
	if a := appliedLines(t, out)[here]; strings.Join(a.Names, ",") != "c2.example" || a.NamesNotEnforced != "" {
		t.Errorf("applied line of the live lease: %+v", a)
	}
	waitResolve(t, g.NS, "c2.example.", labtest.C2)
	for _, n := range []string{"gone.example.", "far.example."} {
		waitResolve(t, g.NS, n, cfg.Sinkhole())
	}
}

// TestLiveNoUpstream: a lab without an upstream resolver is supported. A
// promoted name is recorded and reported as not enforceable there; the
// promote (and the apply in it) succeeds, the endpoint is let through, and
// the name still resolves to the sinkhole.
func TestLiveNoUpstream(t *testing.T) {
	ctx := context.Background()
	l, cfg, fw, g, stateDir := liveLab(t, true)
	lease := records.NewID("lease", time.Now())
	if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: lease, IP: g.IP}); err != nil {
		t.Fatal(err)
	}
	b, sink, out := book(t, stateDir)
	if err := allowlist.Promote(ctx, b, allowlist.PromoteRequest{Input: allowlist.Input{Stdin: bytes.NewReader(liveObs(lease, true))},
		Scope: records.ScopeLease, Policy: docPolicy(t), Lab: l.ID}, sink); err != nil {
		t.Fatalf("promote on a lab without an upstream: %v\n%s", err, out)
	}
	if r := lastRevision(t, out); r.Active != 2 {
		t.Fatalf("revision: %+v", r)
	}
	a := appliedLines(t, out)[lease]
	if strings.Join(a.Names, ",") != "c2.example" || !strings.Contains(a.NamesNotEnforced, "no upstream resolver") {
		t.Fatalf("applied line: %+v\n%s", a, out)
	}
	if set, err := fw.AllowSet(ctx, lease); err != nil || len(set) != 1 || set[0].Dst != labtest.C2 {
		t.Fatalf("live set: %v %v", set, err)
	}
	waitResolve(t, g.NS, "c2.example.", cfg.Sinkhole())
	// "tb-allow apply" says the same and exits 0.
	b, sink, out = book(t, stateDir)
	if err := allowlist.Apply(ctx, b, allowlist.ApplyRequest{Lab: l.ID}, sink); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if a := appliedLines(t, out)[lease]; !strings.Contains(a.NamesNotEnforced, "no upstream resolver") {
		t.Errorf("apply's line: %s", out)
	}
}

// beaconObs are six connections a minute apart from the guest to each
// destination, as tb-parse writes them.
func beaconObs(lease string, dsts ...netip.AddrPort) []byte {
	t0 := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	n := 0
	for _, d := range dsts {
		n++
		var starts []time.Time
		for i := 0; i < 6; i++ {
			starts = append(starts, t0.Add(time.Duration(i)*time.Minute))
		}
		o := endpointObs(d, true, starts...)
		o.Kind, o.ID, o.V, o.Lease = records.KindObservable, fmt.Sprintf("observable_01JD0000000000000000000%03d", n), 1, lease
		o.CreatedAt, o.UpdatedAt = t0, t0
		b, _ := records.Marshal(o)
		out.Write(append(b, '\n'))
	}
	return out.Bytes()
}

// endpointObs is the endpoint observable tb-parse writes for connections
// from the guest to dst, one a start, established or attempted.
func endpointObs(dst netip.AddrPort, established bool, starts ...time.Time) *records.Observable {
	n := int64(len(starts))
	ep := &records.EndpointInfo{Proto: "tcp", Addr: dst.Addr().String(), Port: dst.Port(), Conns: n, OrigPkts: 5 * n,
		MaxDuration: 1, ConnStates: []string{"S0"}, Clients: []string{"10.13.37.10"}, Starts: starts}
	if established {
		ep.Established, ep.RespPkts, ep.ConnStates = n, 4*n, []string{"SF"}
	}
	return &records.Observable{Type: records.ObsEndpoint, Value: dst.String() + "/tcp", FirstSeen: starts[0],
		LastSeen: starts[len(starts)-1].Add(time.Second), Count: n, Endpoint: ep}
}

// TestLivePromotionCannotBeAimed: tb-allow promote on a real lab refuses
// the lab's gateway on the host's uplink, its upstream resolver and a
// fleet worker's blob server however strong the evidence, saying which
// built-in rule refused each; only the C2 reaches the lease's live set.
func TestLivePromotionCannotBeAimed(t *testing.T) {
	ctx := context.Background()
	l, _, fw, g, stateDir := liveLab(t, false)
	lease := records.NewID("lease", time.Now())
	if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: lease, IP: g.IP}); err != nil {
		t.Fatal(err)
	}
	b, sink, out := book(t, stateDir)
	blobs := netip.MustParseAddrPort("198.51.100.61:8080")
	w := &records.Worker{Host: "other", BlobURL: "http://" + blobs.String(), Slots: 1, Heartbeat: time.Now(), DeadAfter: records.Duration(time.Hour)}
	records.Init(w, records.KindWorker, time.Now())
	if err := b.St.Create(ctx, w); err != nil {
		t.Fatal(err)
	}
	aimed := map[netip.AddrPort]string{
		netip.AddrPortFrom(labtest.UplinkNet, 443): "(built-in)",
		netip.AddrPortFrom(labtest.Resolver, 443):  "the lab's upstream resolver",
		blobs: "a fleet worker's blob server",
	}
	dsts := []netip.AddrPort{netip.AddrPortFrom(labtest.C2, 8080)}
	for d := range aimed {
		dsts = append(dsts, d)
	}
	if err := allowlist.Promote(ctx, b, allowlist.PromoteRequest{Input: allowlist.Input{Stdin: bytes.NewReader(beaconObs(lease, dsts...))},
		Scope: records.ScopeLease, Policy: docPolicy(t), Lab: l.ID}, sink); err != nil {
		t.Fatalf("promote: %v\n%s", err, out)
	}
	r := lastRevision(t, out)
	why := map[string]string{}
	for _, f := range r.Refusals {
		why[f.Target] = f.Reason
	}
	for d, rule := range aimed {
		if got := why[d.String()+"/tcp"]; !strings.Contains(got, "never_allow: ") || !strings.Contains(got, rule) || !strings.HasSuffix(got, "(built-in)") {
			t.Errorf("%s: refused %q, want the built-in rule %q", d, got, rule)
		}
	}
	set, err := fw.AllowSet(ctx, lease)
	if err != nil || len(set) != 1 || set[0].Dst != labtest.C2 || set[0].Port != 8080 {
		t.Fatalf("live set: %v %v", set, err)
	}
}
