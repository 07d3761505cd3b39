package netlab_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// counterOf is what the rules so labelled, in chains whose names start
// with chain, have counted.
func counterOf(t *testing.T, fw *firewall.NFT, chain, rule string) uint64 {
	t.Helper()
	st, err := fw.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, r := range st.Lab {
		if strings.HasPrefix(r.Chain, chain) && r.Rule == rule {
			n += r.Packets
		}
	}
	for _, l := range st.Leases {
		for _, r := range l.Rules {
			if strings.HasPrefix(r.Chain, chain) && r.Rule == rule {
				n += r.Packets
			}
		}
	}
	return n
}

// waitAccounted polls until every packet sent is counted somewhere
// (delivered or dropped by a rule); there is no event for a counter.
func waitAccounted(t *testing.T, what string, sent int, count func() int) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for count() < sent {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d packets accounted for", what, count(), sent)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// spray sends one datagram to each of n ports of dst from guest ns, each
// a new connection for the host to track.
func spray(t *testing.T, ns string, dst netip.Addr, n int, payload string) {
	t.Helper()
	labtest.In(t, ns, func() error {
		for p := range n {
			c, err := net.Dial("udp4", net.JoinHostPort(dst.String(), strconv.Itoa(20000+p)))
			if err != nil {
				return err
			}
			c.Write([]byte(payload))
			c.Close()
		}
		return nil
	})
}

// sinkEcho listens in the sinkhole and greets every connection.
func sinkEcho(t *testing.T, cfg netlab.Config) int {
	t.Helper()
	var ln net.Listener
	labtest.In(t, cfg.SinkNS, func() (err error) {
		ln, err = net.Listen("tcp4", net.JoinHostPort(cfg.Sinkhole().String(), "0"))
		return err
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "sinkhole")
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

func greeted(t *testing.T, ns string, port int) {
	t.Helper()
	labtest.In(t, ns, func() error {
		c, err := net.DialTimeout("tcp4", net.JoinHostPort("192.0.2.1", strconv.Itoa(port)), wait)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(wait))
		b, err := io.ReadAll(c)
		if string(b) != "sinkhole" {
			t.Errorf("the sinkhole said %q (%v)", b, err)
		}
		return nil
	})
}

// TestGuestLimits: a guest flooding the sinkhole with DNS queries and new
// connections is held to its limits, and the host's connection tracking to
// its share, while another guest is still served.
func TestGuestLimits(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	cfg.DNS = true
	// The connection count binds here; the rate is tested below.
	cfg.Limits = firewall.Limits{Conns: 20, NewConns: firewall.Rate{Value: 100000, Per: 1}, DNS: firewall.Rate{Value: 5, Per: 1}}
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	var gs []*labtest.Guest
	for i, name := range []string{"dns", "spray", "rate", "ok"} {
		g := l.AddGuest(name, netip.AddrFrom4([4]byte{10, 13, 37, byte(10 + i)}))
		if err := netlab.AttachPort(ctx, cfg, g.LabPort()); err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	dnsFlooder, sprayer, rater, quiet := gs[0], gs[1], gs[2], gs[3]
	fw, err := cfg.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	sink := l.Sniff(cfg.SinkNS, cfg.SinkVeth+"p")
	port := sinkEcho(t, cfg)
	sinkhole := cfg.Sinkhole()
	arrived := func(g *labtest.Guest, payload string) int {
		return len(sink.Seen(func(p labtest.Packet) bool { return p.Src == g.IP && string(p.Payload) == payload }))
	}

	// dropped is what the guests' limits dropped, with fw's rules.
	dropped := func(fw *firewall.NFT) int {
		n := 0
		for _, r := range []string{"guest: over its new-connection rate", "guest: over its connection count", "guest dns: over its query rate"} {
			n += int(counterOf(t, fw, "forward", r))
		}
		return n
	}

	t.Run("dns queries", func(t *testing.T) {
		const sent = 200
		// Until the sinkhole answers, each query is a new connection too.
		before := dropped(fw)
		start := time.Now()
		labtest.In(t, dnsFlooder.NS, func() error {
			c, err := net.Dial("udp4", "192.0.2.53:53")
			if err != nil {
				return err
			}
			defer c.Close()
			for range sent {
				c.Write([]byte("flood-query"))
			}
			return nil
		})
		waitAccounted(t, "dns flood", sent, func() int {
			return arrived(dnsFlooder, "flood-query") + dropped(fw) - before
		})
		got := arrived(dnsFlooder, "flood-query")
		bound := 5 + int(5*(time.Since(start).Seconds()+2))
		t.Logf("%d of %d queries reached the sinkhole (at most %d allowed)", got, sent, bound)
		if got == 0 || got > bound {
			t.Fatalf("%d of %d queries reached the sinkhole at 5/second (at most %d allowed)", got, sent, bound)
		}
		if a := resolve(t, quiet.NS, "192.0.2.53:53", "quiet.example."); a != sinkhole {
			t.Fatalf("another guest's query was answered with %s, not the sinkhole", a)
		}
	})
	t.Run("connection count", func(t *testing.T) {
		const sent = 200
		before := dropped(fw)
		spray(t, sprayer.NS, netip.MustParseAddr("192.0.2.9"), sent, "spray")
		waitAccounted(t, "spray", sent, func() int {
			return arrived(sprayer, "spray") + dropped(fw) - before
		})
		if got := arrived(sprayer, "spray"); got == 0 || got > 20 {
			t.Fatalf("%d new connections of %d reached the sinkhole, want at most 20", got, sent)
		}
		flows, err := l.Handle(cfg.HostNS).ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		held := 0
		for _, f := range flows {
			if f.Forward.SrcIP.Equal(sprayer.IP.AsSlice()) {
				held++
			}
		}
		if held > 20 {
			t.Fatalf("the host tracks %d connections of the sprayer, want at most 20", held)
		}
		greeted(t, quiet.NS, port)
	})
	t.Run("new-connection rate", func(t *testing.T) {
		// The same lab with a rate that binds first.
		c := cfg
		c.Limits = firewall.Limits{NewConns: firewall.Rate{Value: 20, Per: 1}}
		fw2, err := c.Firewall()
		if err != nil {
			t.Fatal(err)
		}
		if err := fw2.Up(ctx); err != nil {
			t.Fatal(err)
		}
		const sent = 300
		before := dropped(fw2)
		start := time.Now()
		spray(t, rater.NS, netip.MustParseAddr("192.0.2.10"), sent, "rate")
		waitAccounted(t, "rate spray", sent, func() int {
			return arrived(rater, "rate") + dropped(fw2) - before
		})
		got := arrived(rater, "rate")
		bound := 5 + int(20*(time.Since(start).Seconds()+2))
		t.Logf("%d of %d new connections reached the sinkhole (at most %d allowed)", got, sent, bound)
		if got == 0 || got > bound {
			t.Fatalf("%d of %d new connections reached the sinkhole at 20/second (at most %d allowed)", got, sent, bound)
		}
		greeted(t, quiet.NS, port)
	})
}

// TestLeaseBudget: what a lease sends to its allowed endpoints is bounded
// in total, not only per endpoint, and a lease without a rate gets the
// default rate rather than none.
func TestLeaseBudget(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	budget := uint64(96 << 10)
	// The guest's own new-connection rate is set high so that the lease's
	// budget binds.
	cfg.Limits = firewall.Limits{Budget: firewall.Rate{Value: budget, Bytes: true, Per: 1}, BudgetConns: firewall.Rate{Value: 10, Per: 1},
		NewConns: firewall.Rate{Value: 100000, Per: 1}}
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	g1 := l.AddGuest("b1", netip.MustParseAddr("10.13.37.10"))
	g2 := l.AddGuest("b2", netip.MustParseAddr("10.13.37.11"))
	for _, g := range []*labtest.Guest{g1, g2} {
		if err := netlab.AttachPort(ctx, cfg, g.LabPort()); err != nil {
			t.Fatal(err)
		}
	}
	fw, err := cfg.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	endpoints := []netip.AddrPort{
		netip.AddrPortFrom(labtest.C2, 9090), netip.AddrPortFrom(labtest.Other, 9090), netip.AddrPortFrom(labtest.C2, 9091),
	}
	rate := firewall.Rate{Value: 64 << 10, Bytes: true, Per: 1}
	var els []firewall.Element
	for _, e := range endpoints {
		els = append(els, firewall.Element{Dst: e.Addr(), Proto: "tcp", Port: e.Port(), Verdict: firewall.RateLimit})
	}
	els = append(els, firewall.Element{Dst: labtest.C2, Proto: "udp", Port: 7000, Verdict: firewall.RateLimit})
	if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: records.NewID("lease", time.Now()), IP: g1.IP, Port: g1.Port, Rate: rate, Elements: els}); err != nil {
		t.Fatal(err)
	}
	// No rate given: the default, never unlimited.
	if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: records.NewID("lease", time.Now()), IP: g2.IP, Port: g2.Port,
		Elements: []firewall.Element{{Dst: labtest.Other, Proto: "tcp", Port: 9091, Verdict: firewall.RateLimit}}}); err != nil {
		t.Fatal(err)
	}
	received := map[netip.AddrPort]*atomic.Int64{}
	for _, e := range append(endpoints, netip.AddrPortFrom(labtest.Other, 9091)) {
		var ln net.Listener
		labtest.In(t, l.Internet, func() (err error) {
			ln, err = net.Listen("tcp4", e.String())
			return err
		})
		t.Cleanup(func() { ln.Close() })
		received[e] = new(atomic.Int64)
		go serveCount(ln, received[e])
	}
	inet := l.Sniff(l.Internet, l.InternetIf)

	// push writes to every endpoint at once for two seconds and returns
	// how long that took.
	push := func(g *labtest.Guest, to []netip.AddrPort) time.Duration {
		var conns []net.Conn
		for _, e := range to {
			labtest.In(t, g.NS, func() error {
				c, err := net.DialTimeout("tcp4", e.String(), wait)
				conns = append(conns, c)
				return err
			})
		}
		start := time.Now()
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Go(func() {
				defer c.Close()
				c.SetWriteDeadline(start.Add(2 * time.Second))
				chunk := make([]byte, 16<<10)
				for {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	t.Run("bytes across endpoints", func(t *testing.T) {
		elapsed := push(g1, endpoints)
		var total int64
		for _, e := range endpoints {
			n := received[e].Load()
			if n == 0 {
				t.Errorf("%s received nothing", e)
			}
			total += n
		}
		// A byte bucket holds two seconds' worth (rate and burst) and
		// starts full, then refills at the rate.
		bound := int64(float64(budget)*(elapsed.Seconds()+2)) + 64<<10
		t.Logf("%d bytes to %d endpoints in %s (budget %d bytes/s, each %d)", total, len(endpoints), elapsed, budget, rate.Value)
		if total > bound {
			t.Fatalf("the lease sent %d bytes in %s across its endpoints, its budget allows %d", total, elapsed, bound)
		}
	})
	t.Run("new connections across endpoints", func(t *testing.T) {
		const sent = 100
		start := time.Now()
		labtest.In(t, g1.NS, func() error {
			for range sent {
				c, err := net.Dial("udp4", netip.AddrPortFrom(labtest.C2, 7000).String())
				if err != nil {
					return err
				}
				c.Write([]byte("budget-conn"))
				c.Close()
			}
			return nil
		})
		waitAccounted(t, "new connections", sent, func() int {
			return len(inet.Seen(func(p labtest.Packet) bool { return string(p.Payload) == "budget-conn" })) +
				int(counterOf(t, fw, "fwd_", "lease budget: new connections over"))
		})
		got := len(inet.Seen(func(p labtest.Packet) bool { return string(p.Payload) == "budget-conn" }))
		bound := 5 + int(10*(time.Since(start).Seconds()+2))
		if got == 0 || got > bound {
			t.Fatalf("%d of %d new connections reached the endpoint at 10/second (at most %d allowed)", got, sent, bound)
		}
	})
	t.Run("no rate is the default rate", func(t *testing.T) {
		e := netip.AddrPortFrom(labtest.Other, 9091)
		elapsed := push(g2, []netip.AddrPort{e})
		got := received[e].Load()
		bound := int64(float64(firewall.DefaultRate.Value)*(elapsed.Seconds()+2)) + 64<<10
		t.Logf("%d bytes in %s without a plan rate (default %s)", got, elapsed, firewall.DefaultRate)
		if got == 0 || got > bound {
			t.Fatalf("%d bytes in %s to an endpoint of a lease without a rate, the default allows %d", got, elapsed, bound)
		}
	})
}
