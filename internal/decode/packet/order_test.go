package packet

import (
	"bytes"
	"math/rand"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// target is the documentation address the orders aim at.
var target = netip.MustParseAddr("203.0.113.77")

// orderSession writes a channel of proto (mirai, gafgyt, irc, http) on
// which the C2 sends one UDP order against to (an address or prefix for
// Mirai, any target for the text channels), port 9, 4 s; it returns the
// time of the order's packet.
func orderSession(t *testing.T, g *pcapgen.Gen, proto, to string) time.Time {
	t.Helper()
	var at time.Time
	switch proto {
	case "mirai":
		p, err := netip.ParsePrefix(to)
		if err != nil {
			p = netip.PrefixFrom(netip.MustParseAddr(to), 32)
		}
		c := g.Dial(ap(client, 40001), ap(server, 23), 1000, 5000)
		c.Send(pcapgen.MiraiHello("tb"))
		c.Send(pcapgen.MiraiKeepAlive())
		c.Reply(pcapgen.MiraiKeepAlive())
		at = g.T
		c.Reply(pcapgen.MiraiOrder(4, 9, []netip.Prefix{p}, []pcapgen.MiraiOption{{Key: 7, Value: "9"}, {Key: 0, Value: "64"}}))
		c.Close()
	case "gafgyt":
		c := g.Dial(ap(client, 40002), ap(server, 666), 2000, 6000)
		c.Send([]byte("BUILD TALKBOX\n"))
		c.Reply([]byte("PING\n"))
		c.Send([]byte("PONG\n"))
		at = g.T
		c.Reply([]byte("!* UDP " + to + " 9 4 32 0 10\n"))
		c.Close()
	case "irc":
		c := g.Dial(ap(client, 40003), ap(server, 6667), 3000, 7000)
		c.Send([]byte("NICK tb\r\nUSER tb 0 * :talkbox\r\n"))
		c.Reply([]byte(":c2.example 001 tb :Welcome\r\n"))
		c.Send([]byte("JOIN #tb beacon\r\n"))
		at = g.T
		c.Reply([]byte(":op!op@c2.example PRIVMSG #tb :!udp " + to + " 9 4\r\n"))
		c.Close()
	case "http":
		at = httpPolls(g, ap(server, 80), 5, 4, `{"task":"udp `+to+` 9 4"}`)
	default:
		t.Fatalf("no protocol %s", proto)
	}
	return at
}

// httpPolls writes n check-ins of the bot (POST /checkin), 10 s apart,
// each on its own connection; the C2 answers {"task":"sleep"} but to
// check-in number nth, which it answers with body; as the demo's beacon
// does, the bot reports the task done on the same connection. It returns
// the time of the answer with body; the capture's clock is left just
// after the last check-in.
func httpPolls(g *pcapgen.Gen, c2 netip.AddrPort, n, nth int, body string) time.Time {
	post := func(b string) []byte {
		return []byte("POST /checkin HTTP/1.1\r\nHost: c2.example\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(len(b)) + "\r\n\r\n" + b)
	}
	var at time.Time
	for i := 0; i < n; i++ {
		start := g.T
		c := g.Dial(ap(client, uint16(41000+i)), c2, uint32(100*i), 9000)
		c.Send(post(`{"id":"tb","seq":` + strconv.Itoa(i) + `}`))
		answer := `{"task":"sleep"}`
		if i == nth {
			answer, at = body, g.T
		}
		c.Reply(pcapgen.HTTPResponse(200, "OK", []byte(answer)))
		c.Send(post(`{"id":"tb","seq":` + strconv.Itoa(i) + `,"done":"task"}`))
		c.Reply(pcapgen.HTTPResponse(200, "OK", []byte(`{"ok":true}`)))
		c.Close()
		if i < n-1 {
			g.T = start.Add(10 * time.Second)
		}
	}
	return at
}

// udpFlood writes 600 UDP datagrams from the bot to to:9 from start, one
// a millisecond: random payloads, or constant ones when plain.
func udpFlood(g *pcapgen.Gen, to netip.Addr, start time.Time, plain bool) {
	g.T = start
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 600; i++ {
		p := make([]byte, 64)
		if !plain {
			r.Read(p)
		}
		g.UDP(ap(client, 50000), ap(to, 9), p)
	}
}

// An attack carries out the order a channel of each protocol sent before
// it: the order's value and the seconds between them are on the attack.
// A Mirai udpplain order is carried out by a random-payload flood as by a
// constant one (the payload is an option, not the vector).
func TestAttackAttributedToOrder(t *testing.T) {
	for _, tc := range []struct{ proto, to, order string }{
		{"mirai", "203.0.113.77", "mirai udpplain 203.0.113.77/32 4s dport=9 len=64"},
		{"mirai", "203.0.113.0/24", "mirai udpplain 203.0.113.0/24 4s dport=9 len=64"},
		{"gafgyt", "203.0.113.77", "gafgyt !* UDP 203.0.113.77 9 4 32 0 10"},
		{"irc", "203.0.113.77", "irc-bot !udp 203.0.113.77 9 4"},
		{"http", "203.0.113.77", "http-poll udp 203.0.113.77 9 4"},
	} {
		t.Run(tc.proto+" "+tc.to, func(t *testing.T) {
			r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
				at := orderSession(t, g, tc.proto, tc.to)
				udpFlood(g, target, at.Add(2500*time.Millisecond), tc.proto == "gafgyt")
			})
			r.get(t, records.ObsC2Command, tc.order)
			vec := "udp"
			if tc.proto == "gafgyt" {
				vec = "udpplain"
			}
			a := attackOf(t, r, vec+" "+target.String())
			if a.Order != tc.order || a.OrderDelay != 2.5 {
				t.Fatalf("order %q after %v s", a.Order, a.OrderDelay)
			}
		})
	}
}

// What is not an order's attack is left alone: an attack with no order
// before it, an order with no attack, an order for another target, of
// another vector, or an attack starting 31 s after its order; 30 s after
// still carries it out.
func TestAttackNotAttributed(t *testing.T) {
	other := netip.MustParseAddr("203.0.113.78")
	for _, tc := range []struct {
		name   string
		build  func(t *testing.T, g *pcapgen.Gen)
		attack bool
		order  string
	}{
		{"attack with no order", func(t *testing.T, g *pcapgen.Gen) {
			udpFlood(g, target, g.T, false)
		}, true, ""},
		{"order with no attack", func(t *testing.T, g *pcapgen.Gen) {
			orderSession(t, g, "mirai", target.String())
		}, false, ""},
		{"order for another target", func(t *testing.T, g *pcapgen.Gen) {
			at := orderSession(t, g, "irc", other.String())
			udpFlood(g, target, at.Add(time.Second), false)
		}, true, ""},
		{"order of another vector", func(t *testing.T, g *pcapgen.Gen) {
			c := g.Dial(ap(client, 40003), ap(server, 6667), 3000, 7000)
			c.Send([]byte("NICK tb\r\nUSER tb 0 * :talkbox\r\n"))
			c.Reply([]byte(":c2.example 001 tb :Welcome\r\n"))
			at := g.T
			c.Reply([]byte(":op!op@c2.example PRIVMSG #tb :!syn 203.0.113.77 9 4\r\n"))
			c.Close()
			udpFlood(g, target, at.Add(time.Second), false)
		}, true, ""},
		{"attack after the order by 31 s", func(t *testing.T, g *pcapgen.Gen) {
			at := orderSession(t, g, "mirai", target.String())
			udpFlood(g, target, at.Add(31*time.Second), false)
		}, true, ""},
		{"attack after the order by 30 s", func(t *testing.T, g *pcapgen.Gen) {
			at := orderSession(t, g, "mirai", target.String())
			udpFlood(g, target, at.Add(30*time.Second), false)
		}, true, "mirai udpplain 203.0.113.77/32 4s dport=9 len=64"},
		{"attack before the order", func(t *testing.T, g *pcapgen.Gen) {
			udpFlood(g, target, g.T, false)
			orderSession(t, g, "mirai", target.String())
		}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) { tc.build(t, g) })
			if !tc.attack {
				if n := r.count(records.ObsAttack); n != 0 {
					t.Fatalf("%d attacks", n)
				}
				if n := r.count(records.ObsC2Command); n != 1 {
					t.Fatalf("%d orders", n)
				}
				return
			}
			if a := attackOf(t, r, "udp "+target.String()); a.Order != tc.order {
				t.Fatalf("order %q after %v s", a.Order, a.OrderDelay)
			}
		})
	}
}

// Of several orders an attack may carry out, the latest before its start
// is the one; an order after the start is not.
func TestAttackTakesLatestOrder(t *testing.T) {
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c := g.Dial(ap(client, 40002), ap(server, 666), 2000, 6000)
		c.Send([]byte("BUILD TALKBOX\n"))
		c.Reply([]byte("!* UDP 203.0.113.77 9 4 32 0 10\n"))
		c.Wait(5 * time.Second)
		at := g.T
		c.Reply([]byte("!* UDP 203.0.113.0/24 9 4 32 0 10\n"))
		udpFlood(g, target, at.Add(3*time.Second), false)
		c.Wait(10 * time.Second)
		c.Reply([]byte("!* UDP 203.0.113.77 9 5 32 0 10\n"))
		c.Close()
	})
	if a := attackOf(t, r, "udp "+target.String()); a.Order != "gafgyt !* UDP 203.0.113.0/24 9 4 32 0 10" || a.OrderDelay != 3 {
		t.Fatalf("order %q after %v s", a.Order, a.OrderDelay)
	}
}

// An order naming a host is carried out by an attack on an address the
// name resolved to after the order, in the same capture.
func TestAttackOnResolvedName(t *testing.T) {
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		at := orderSession(t, g, "http", "victim.example")
		g.T = at.Add(time.Second)
		g.DNSOverUDP(ap(client, 5353), ap(dnssrv, 53), pcapgen.DNSQuery(7, "victim.example", layers.DNSTypeA),
			pcapgen.DNSResponse(7, "victim.example", layers.DNSTypeA, layers.DNSResponseCodeNoErr,
				[]layers.DNSResourceRecord{pcapgen.A("victim.example", target, 60)}))
		udpFlood(g, target, at.Add(2*time.Second), false)
	})
	if a := attackOf(t, r, "udp "+target.String()); a.Order != "http-poll udp victim.example 9 4" || a.OrderDelay != 2 {
		t.Fatalf("order %q after %v s", a.Order, a.OrderDelay)
	}
}

// A bot's poll whose answer carries an order ({"task":"udp ADDR 9 4"}, or
// a bare "VECTOR TARGET [PORT [SECONDS]]") yields a c2-command of
// protocol http from the C2's endpoint to the bot.
func TestHTTPOrders(t *testing.T) {
	for _, body := range []string{`{"task":"udp 203.0.113.77 9 4"}`, "udp 203.0.113.77 9 4\n"} {
		r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
			httpPolls(g, ap(server, 80), 5, 3, body)
		})
		o := r.get(t, records.ObsC2Command, "http-poll udp 203.0.113.77 9 4")
		k := o.C2Command
		if k.Protocol != "http" || k.Family != "http-poll" || k.Vector != "udp" || k.Duration != 4 || len(k.Targets) != 1 ||
			k.Targets[0] != "203.0.113.77" || len(k.Ports) != 1 || k.Ports[0] != "9" || k.Servers[0] != ap(server, 80).String() ||
			k.Clients[0] != client.String() || !o.FirstSeen.Equal(pcapgen.Start.Add(30*time.Second+5*time.Millisecond)) {
			t.Fatalf("%q: %+v at %v", body, k, o.FirstSeen)
		}
		if ch := r.get(t, records.ObsC2Channel, "http POST http://c2.example/checkin").C2Channel; ch.Commands != 1 || ch.KeepAlives != 5 {
			t.Fatalf("%+v", ch)
		}
	}
}

// Ordinary answers are no orders, even polled: pages and JSON that show
// an address, words that are no vector, numbers that are no host, a
// longer text; an order-shaped answer longer than 1 KiB; and an order in
// the answer to a client that does not poll.
func TestHTTPNoOrders(t *testing.T) {
	pad := `{"pad":"` + string(bytes.Repeat([]byte{'x'}, 1024)) + `","task":"udp 203.0.113.77 9 4"}`
	for _, body := range []string{
		"<html><body>Your address is 203.0.113.77</body></html>",
		`{"ip":"203.0.113.77","port":9}`,
		`{"status":"ok","client":"203.0.113.77 9 4"}`,
		"http 1.1",
		"ping 203.0.113.77",
		"host web.example 443",
		"udp 203.0.113.77 port 9",
		"udp 203.0.113.77 9 4 extra words",
		"udp 203.0.113.77\nsyn 203.0.113.78",
		"sleep",
		pad,
	} {
		r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
			httpPolls(g, ap(server, 80), 5, 3, body)
		})
		r.get(t, records.ObsC2Channel, "http POST http://c2.example/checkin")
		if n := r.count(records.ObsC2Command); n != 0 {
			t.Fatalf("%q: %d orders", body, n)
		}
	}
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		httpPolls(g, ap(server, 80), 1, 0, `{"task":"udp 203.0.113.77 9 4"}`)
	})
	if n := r.count(records.ObsC2Command); n != 0 {
		t.Fatalf("%d orders from a client that does not poll", n)
	}
}
