package packet

import (
	"bytes"

	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

var victim = netip.MustParseAddr("198.51.100.9")

// miraiSYN is an order for a SYN flood of victim/32 for 30 s on port 80.
func miraiSYN() []byte {
	return pcapgen.MiraiOrder(30, 3, []netip.Prefix{netip.PrefixFrom(victim, 32)},
		[]pcapgen.MiraiOption{{Key: 7, Value: "80"}, {Key: 15, Value: "1"}})
}

func TestMiraiChannel(t *testing.T) {
	for _, tc := range []struct {
		name string
		port uint16
		mss  int
	}{{"whole segments on 23", 23, 1460}, {"one byte a segment on an unusual port", 48101, 1}, {"three bytes a segment", 2323, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			c2 := ap(server, tc.port)
			r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
				g.MiraiSession(ap(client, 40001), c2, "telnet.x86", 3, miraiSYN(), tc.mss)
			})
			ch := r.get(t, records.ObsC2Channel, "mirai "+c2.String()).C2Channel
			want := records.C2ChannelInfo{Family: "mirai", Protocol: "mirai", Server: c2.String(), Clients: []string{client.String()},
				Identities: []string{"telnet.x86"}, KeepAlives: 3, Commands: 1}
			if period(ch) != 60 || fmt.Sprint(*ch) != fmt.Sprint(want) {
				t.Fatalf("channel\n got %+v\nwant %+v", *ch, want)
			}
			cmd := r.get(t, records.ObsC2Command, "mirai syn 198.51.100.9/32 30s dport=80 syn=1")
			got := cmd.C2Command
			if got.Vector != "syn" || got.Duration != 30 || !slices.Equal(got.Targets, []string{"198.51.100.9/32"}) ||
				!slices.Equal(got.Ports, []string{"80"}) || !slices.Equal(got.Servers, []string{c2.String()}) ||
				!slices.Equal(got.Clients, []string{client.String()}) || got.Raw != "00150000001e0301c63364092002070238300f0131" {
				t.Fatalf("command %+v", got)
			}
		})
	}
}

// The C2 on the originator's side (a capture that missed the SYN sees the
// C2's SYN-ACK first, or a C2 that connects to its bot) is still the C2.
func TestMiraiChannelEitherDirection(t *testing.T) {
	c2 := ap(server, 48101)
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c := g.Dial(c2, ap(client, 40001), 1, 2)
		c.Reply(pcapgen.MiraiHello(""))
		c.Send(pcapgen.MiraiKeepAlive())
		c.Send(miraiSYN())
		c.Close()
	})
	ch := r.get(t, records.ObsC2Channel, "mirai "+c2.String()).C2Channel
	if ch.Commands != 1 || len(ch.Identities) != 0 || !slices.Equal(ch.Clients, []string{client.String()}) {
		t.Fatalf("%+v", ch)
	}
	r.get(t, records.ObsC2Command, "mirai syn 198.51.100.9/32 30s dport=80 syn=1")
}

func TestMiraiReport(t *testing.T) {
	rs := ap(server, 48101)
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c := g.Dial(ap(client, 40002), rs, 1, 2)
		c.MSS = 2
		c.Send(pcapgen.MiraiReport(ap(netip.MustParseAddr("192.0.2.44"), 23), "root", "xc3511"))
		c.Close()
		c = g.Dial(ap(client, 40003), rs, 1, 2)
		c.Send(pcapgen.MiraiReport(ap(netip.MustParseAddr("192.0.2.45"), 2323), "admin", ""))
		c.Close()
	})
	ch := r.get(t, records.ObsC2Channel, "mirai-report "+rs.String()).C2Channel
	if ch.Family != "mirai" || !slices.Equal(ch.Reports, []string{"192.0.2.44:23 root:xc3511", "192.0.2.45:2323 admin:"}) {
		t.Fatalf("%+v", ch)
	}
}

func TestGafgytChannel(t *testing.T) {
	for _, mss := range []int{1460, 1} {
		c2 := ap(server, 666)
		r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
			g.GafgytSession(ap(client, 40004), c2, "MIPSEL", 2, []string{"!* UDP 198.51.100.9 80 60 32 1024 10", "!* KILLATTK"}, mss)
		})
		ch := r.get(t, records.ObsC2Channel, "gafgyt "+c2.String()).C2Channel
		want := records.C2ChannelInfo{Family: "gafgyt", Protocol: "gafgyt", Server: c2.String(), Clients: []string{client.String()},
			Identities: []string{"BUILD MIPSEL"}, KeepAlives: 2, Commands: 2}
		if period(ch) != 60 || fmt.Sprint(*ch) != fmt.Sprint(want) {
			t.Fatalf("mss %d: channel\n got %+v\nwant %+v", mss, *ch, want)
		}
		udp := r.get(t, records.ObsC2Command, "gafgyt !* UDP 198.51.100.9 80 60 32 1024 10").C2Command
		if udp.Vector != "UDP" || !slices.Equal(udp.Targets, []string{"198.51.100.9"}) || !slices.Equal(udp.Ports, []string{"80"}) ||
			udp.Duration != 60 || !slices.Equal(udp.Options, []string{"32", "1024", "10"}) {
			t.Fatalf("%+v", udp)
		}
		if k := r.get(t, records.ObsC2Command, "gafgyt !* KILLATTK").C2Command; k.Vector != "KILLATTK" || len(k.Targets) != 0 {
			t.Fatalf("%+v", k)
		}
	}
}

func TestIRCChannel(t *testing.T) {
	for _, mss := range []int{1460, 7} {
		c2 := ap(server, 4444)
		r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
			g.IRCSession(ap(client, 40005), c2, "x86|lab", "#b0ts", "s3cret", 4, []string{"!udp 198.51.100.9 53 120"}, mss)
		})
		ch := r.get(t, records.ObsC2Channel, "irc "+c2.String()).C2Channel
		if ch.Family != "irc-bot" || !slices.Equal(ch.Identities, []string{"NICK x86|lab", "USER x86|lab localhost localhost :x86|lab"}) ||
			!slices.Equal(ch.Channels, []string{"#b0ts s3cret"}) || ch.KeepAlives != 4 || period(ch) != 90 ||
			ch.Commands != 1 {
			t.Fatalf("mss %d: %+v", mss, ch)
		}
		cmd := r.get(t, records.ObsC2Command, "irc-bot !udp 198.51.100.9 53 120").C2Command
		if cmd.Protocol != "irc" || cmd.Vector != "!udp" || cmd.Duration != 120 || !slices.Equal(cmd.Ports, []string{"53"}) {
			t.Fatalf("%+v", cmd)
		}
	}
}

func TestHTTPPolling(t *testing.T) {
	c2 := ap(server, 8080)
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.HTTPPolls(client, c2, "c2.example", "/gate.php", 5, 30*time.Second)
		// A page that fetches the same resource a few times at once is
		// no poll.
		for i := 0; i < 5; i++ {
			httpSession(g, ap(client, uint16(42000+i)), ap(server, 80))
		}
	})
	ch := r.get(t, records.ObsC2Channel, "http GET http://c2.example/gate.php").C2Channel
	if ch.Family != "http-poll" || ch.Server != c2.String() || ch.KeepAlives != 5 || period(ch) != 30 {
		t.Fatalf("%+v", ch)
	}
	if n := r.count(records.ObsC2Channel); n != 1 {
		t.Fatalf("%d channels", n)
	}
}

// Ordinary traffic is no channel: HTTP, TLS on 443, SMTP, DNS over TCP,
// IRC-like words that never register.
func TestNoChannel(t *testing.T) {
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		httpSession(g, ap(client, 1234), ap(server, 80))
		c := g.Dial(ap(client, 1235), ap(server, 443), 1, 1)
		c.Send(pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x1301}, Order: []uint16{0}, SNI: "s.example"}))
		c.Reply(pcapgen.ServerHelloRecord(0x0303, 0x1301))
		c.Close()
		c = g.Dial(ap(client, 1236), ap(server, 25), 1, 1)
		c.Reply([]byte("220 mx.example ESMTP\r\n"))
		c.Send([]byte("EHLO lab\r\n"))
		c.Close()
		c = g.Dial(ap(client, 1237), ap(server, 5000), 1, 1)
		c.Send([]byte("PING :x\r\n"))
		c.Send([]byte(strings.Repeat("PING :x\r\n", 40)))
		c.Close()
		// A binary protocol that starts with zeros but is not Mirai's.
		c = g.Dial(ap(client, 1238), ap(server, 5001), 1, 1)
		c.Send([]byte{0, 0, 0, 1, 3, 'a', 'b', 'c', 0x17, 0x03})
		c.Reply([]byte{0, 0})
		c.Close()
	})
	if n := r.count(records.ObsC2Channel) + r.count(records.ObsC2Command); n != 0 {
		for k := range r.Obs {
			t.Log(k)
		}
		t.Fatalf("%d c2 observables", n)
	}
}

// A sample that opens more candidate connections than MaxBotConvs gets
// no more recognisers than that: memory stays bounded, and the rest are
// counted.
func TestBotRecognisersBounded(t *testing.T) {
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		for i := 0; i < MaxBotConvs+10; i++ {
			c := g.Dial(ap(client, uint16(10000+i)), ap(server, 48101), 1, 1)
			c.Send([]byte{0, 0})
		}
	})
	if r.stats.BotsRefused != 10 {
		t.Fatalf("%d refused", r.stats.BotsRefused)
	}
}

// A channel that never decides (lines that could be IRC's but register
// nothing) frees its recogniser after a few lines, so that a long session
// holds none.
func TestUndecidedChannelReleased(t *testing.T) {
	var buf []byte
	buf = capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c := g.Dial(ap(client, 1237), ap(server, 5000), 1, 1)
		c.Send([]byte(strings.Repeat("PING :x\r\n", 40)))
	})
	d := decodeOpen(t, buf)
	if d.bots != 0 {
		t.Fatalf("%d recognisers held", d.bots)
	}
}

// Everything in a record is bounded however much a bot announces: a
// thousand JOINs keep a few channels.
func TestChannelListsBounded(t *testing.T) {
	c2 := ap(server, 4444)
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c := g.Dial(ap(client, 40005), c2, 1, 1)
		c.Send([]byte("NICK a\r\nUSER a a a :a\r\n"))
		var b strings.Builder
		for i := 0; i < 1000; i++ {
			fmt.Fprintf(&b, "JOIN #c%d %s\r\n", i, strings.Repeat("k", 600))
		}
		c.Send([]byte(b.String()))
		c.Close()
	})
	ch := r.get(t, records.ObsC2Channel, "irc "+c2.String()).C2Channel
	if len(ch.Channels) > 8 {
		t.Fatalf("%d channels", len(ch.Channels))
	}
	for _, c := range ch.Channels {
		if len(c) > 200 {
			t.Fatalf("channel of %d bytes", len(c))
		}
	}
}

// decodeOpen runs the decoder over a capture without finishing it: the
// connections are still open.
func decodeOpen(t *testing.T, data []byte) *Decoder {
	t.Helper()
	rd, err := capfile.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	d := New(Config{Origin: origin(), Sink: discard{}})
	var p capfile.Packet
	for rd.Next(&p) == nil {
		d.Packet(&p)
	}
	return d
}

// period is a channel's keep-alive period in whole seconds (the test
// captures' packets are a millisecond apart), and clears it from ch.
func period(ch *records.C2ChannelInfo) float64 {
	p := ch.KeepAlivePeriod
	ch.KeepAlivePeriod = 0
	return float64(int64(p))
}

// A day-long IRC session whose capture is rotated every hour registers in
// the first file only: the next file still reports the channel, with its
// keep-alives, from the connection the first handed on.
func TestChannelAcrossRotatedCaptures(t *testing.T) {
	c2 := ap(server, 4444)
	data := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.IRCSession(ap(client, 40005), c2, "x86|lab", "#b0ts", "k", 6, []string{"!udp 198.51.100.9 53 120"}, 1460)
	})
	rd, err := capfile.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var pkts []capfile.Packet
	for {
		var p capfile.Packet
		if rd.Next(&p) != nil {
			break
		}
		p.Data = bytes.Clone(p.Data)
		pkts = append(pkts, p)
	}
	// The first file ends after the third PING and its PONG.
	cut := len(pkts) / 2
	first, second := decodetest.New(origin()), decodetest.New(origin())
	d := New(Config{Origin: origin(), Sink: first})
	for i := range pkts[:cut] {
		d.Packet(&pkts[i])
	}
	carried := d.FinishCarry(DefaultMaxCarry)
	first.Finish(t)
	d = New(Config{Origin: origin(), Sink: second})
	if skipped := d.Seed(carried); skipped != 0 {
		t.Fatalf("%d skipped", skipped)
	}
	for i := range pkts[cut:] {
		d.Packet(&pkts[cut+i])
	}
	d.Finish()
	second.Finish(t)
	a := first.Get(t, records.ObsC2Channel, "irc "+c2.String()).C2Channel
	b := second.Get(t, records.ObsC2Channel, "irc "+c2.String()).C2Channel
	if len(a.Identities) != 2 || len(b.Identities) != 0 || a.KeepAlives+b.KeepAlives != 6 || b.KeepAlives == 0 || b.Commands != 1 {
		t.Fatalf("first %+v\nsecond %+v", a, b)
	}
	second.Get(t, records.ObsC2Command, "irc-bot !udp 198.51.100.9 53 120")
}
