package netlab_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
)

// upstream is a resolver in the test's internet: it answers every A
// question with answerA (TTL 0, so the sinkhole caches nothing) and
// records every question it got.
type upstream struct {
	mu   sync.Mutex
	seen []dnsmessage.Question
}

var answerA = netip.MustParseAddr("192.0.2.1")

func startUpstream(t *testing.T, l *labtest.Lab) *upstream {
	u := &upstream{}
	var pc net.PacketConn
	labtest.In(t, l.Internet, func() (err error) {
		pc, err = net.ListenPacket("udp", net.JoinHostPort(labtest.Resolver.String(), "53"))
		return err
	})
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
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
			u.mu.Lock()
			u.seen = append(u.seen, q)
			u.mu.Unlock()
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionAvailable: true})
			b.EnableCompression()
			b.StartQuestions()
			b.Question(q)
			b.StartAnswers()
			if q.Type == dnsmessage.TypeA {
				b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 0},
					dnsmessage.AResource{A: answerA.As4()})
			}
			if msg, err := b.Finish(); err == nil {
				pc.WriteTo(msg, from)
			}
		}
	}()
	return u
}

// names lists the names the upstream was asked, lower-cased, each once.
func (u *upstream) names() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]int{}
	for _, q := range u.seen {
		out[strings.ToLower(q.Name.String())]++
	}
	return out
}

func (u *upstream) count(match func(dnsmessage.Question) bool) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, q := range u.seen {
		if match(q) {
			n++
		}
	}
	return n
}

func dnsQuery(id uint16, name string, typ dnsmessage.Type) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
	msg, err := b.Finish()
	if err != nil {
		panic(err)
	}
	return msg
}

// lookupA asks server for name's A record from namespace ns, asking again
// while no answer comes (a lost datagram, or one the sinkhole's upstream
// limit dropped), and returns the first address of the answer (invalid
// when it has none).
func lookupA(t *testing.T, ns, server, name string) netip.Addr {
	t.Helper()
	var c net.Conn
	labtest.In(t, ns, func() (err error) {
		c, err = net.Dial("udp", server)
		return err
	})
	defer c.Close()
	deadline := time.Now().Add(wait)
	buf := make([]byte, 2048)
	for id := uint16(1); time.Now().Before(deadline); id++ {
		if _, err := c.Write(dnsQuery(id, name, dnsmessage.TypeA)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		for {
			n, err := c.Read(buf)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil || h.ID != id {
				continue // an answer to an earlier try
			}
			p.SkipAllQuestions()
			for {
				rh, err := p.AnswerHeader()
				if err != nil {
					return netip.Addr{}
				}
				if rh.Type != dnsmessage.TypeA {
					p.SkipAnswer()
					continue
				}
				a, err := p.AResource()
				if err != nil {
					t.Fatal(err)
				}
				return netip.AddrFrom4(a.A)
			}
		}
	}
	t.Fatalf("%s: no answer for %s within %s", server, name, wait)
	return netip.Addr{}
}

// TestSinkholeForwardsExactNames: a guest cannot use a promoted name to
// reach the upstream resolver with anything but that name. Its subdomains
// (a DNS tunnel's, or a random-subdomain flood's) are answered by the
// sinkhole, other names too, and a flood of questions for the promoted name
// itself reaches the upstream at no more than the lab's limit.
func TestSinkholeForwardsExactNames(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	cfg.DNS = true
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	g := l.AddGuest("g", netip.MustParseAddr("10.13.37.10"))
	if err := netlab.AttachPort(ctx, cfg, netlab.Port{Name: g.Port, MAC: g.MAC, IP: g.IP}); err != nil {
		t.Fatal(err)
	}
	up := startUpstream(t, l)
	sinkhole := cfg.Sinkhole()
	// The guest may name any resolver: the lab sends it to the sinkhole.
	resolver := labtest.Resolver.String() + ":53"

	if err := netlab.SetAllowedNames(cfg.Dir, []string{"good.example", "Also.Good.Example.", "sentinel.example", "not a/name#"}); err != nil {
		t.Fatalf("one invalid name failed the whole list: %v", err)
	}
	// dnsmasq re-reads its servers-file on SIGHUP: wait for the answer to
	// change rather than for a fixed time.
	deadline := time.Now().Add(wait)
	for lookupA(t, g.NS, resolver, "good.example.") != answerA {
		if time.Now().After(deadline) {
			t.Fatal("good.example still sinkholed after promoting it")
		}
	}
	for _, name := range []string{"x.good.example.", "y.x.good.example.", "X.GOOD.example.",
		"exfil-6a6b6c.good.example.", "other.example.", "good.example.evil.", "xgood.example."} {
		if a := lookupA(t, g.NS, resolver, name); a != sinkhole {
			t.Errorf("%s answered %s, want the sinkhole %s", name, a, sinkhole)
		}
	}
	if a := lookupA(t, g.NS, resolver, "also.good.example."); a != answerA {
		t.Errorf("also.good.example, promoted itself, answered %s, want the upstream's %s", a, answerA)
	}
	// Once the upstream has answered a later question, it has seen every
	// earlier one the sinkhole sent it.
	if a := lookupA(t, g.NS, resolver, "sentinel.example."); a != answerA {
		t.Fatalf("sentinel.example answered %s, want the upstream's %s", a, answerA)
	}
	for name := range up.names() {
		switch name {
		case "good.example.", "also.good.example.", "sentinel.example.":
		default:
			t.Errorf("the upstream resolver was asked for %s, which was not promoted", name)
		}
	}

	// The flood: every question different (its type), so that neither
	// the cache nor dnsmasq's merging of duplicate queries absorbs it. It
	// comes from the host's side, as from every lease of the lab at once:
	// the limit holds whatever each guest's own limit lets through.
	const flood = 2000
	isFlood := func(q dnsmessage.Question) bool { return q.Type >= 1000 }
	direct := net.JoinHostPort(sinkhole.String(), "53")
	var c net.Conn
	labtest.In(t, cfg.HostNS, func() (err error) {
		c, err = net.Dial("udp", direct)
		return err
	})
	defer c.Close()
	start := time.Now()
	for i := range flood {
		if _, err := c.Write(dnsQuery(uint16(i), "good.example.", dnsmessage.Type(1000+i))); err != nil {
			t.Fatal(err)
		}
	}
	// The sinkhole handles its queries in turn: once the sentinel is
	// answered, the flood has been forwarded or dropped. Until the queries
	// the limit dropped time out, they fill dnsmasq's table of queries in
	// flight, and it refuses new ones: ask until it forwards again.
	deadline = time.Now().Add(time.Minute)
	for lookupA(t, cfg.HostNS, direct, "sentinel.example.") != answerA {
		if time.Now().After(deadline) {
			t.Fatal("sentinel.example not forwarded a minute after the flood")
		}
	}
	elapsed := time.Since(start)
	got := up.count(isFlood)
	limit := netlab.UpstreamQueryBurst + int(float64(netlab.UpstreamQueriesPerSecond)*elapsed.Seconds()) + 1
	t.Logf("%d of %d flood queries reached the upstream in %s (limit %d)", got, flood, elapsed, limit)
	if got > limit {
		t.Fatalf("%d flood queries reached the upstream in %s: more than the lab's limit of %d/s (burst %d) allows (%d)",
			got, elapsed, netlab.UpstreamQueriesPerSecond, netlab.UpstreamQueryBurst, limit)
	}
	if got == 0 {
		t.Fatal("no flood query reached the upstream: the promoted name is not forwarded at all")
	}
}

// TestSinkholeWithoutUpstream: a lab without an upstream resolver takes
// any list of names (an invalid one skipped), records it, and forwards
// nothing.
func TestSinkholeWithoutUpstream(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	cfg.DNS, cfg.Upstream = true, netip.Addr{}
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := netlab.SetAllowedNames(cfg.Dir, []string{"good.example", "-bad-.example"}); err != nil {
		t.Fatalf("a lab without an upstream refused the names: %v", err)
	}
	rec, err := os.ReadFile(netlab.AllowNamesFile(cfg.Dir))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(rec); got != "server=/good.example/\n" {
		t.Fatalf("recorded list %q, want good.example alone", got)
	}
	if a := lookupA(t, cfg.HostNS, net.JoinHostPort(cfg.Sinkhole().String(), "53"), "good.example."); a != cfg.Sinkhole() {
		t.Fatalf("good.example answered %s without an upstream, want the sinkhole", a)
	}
}
