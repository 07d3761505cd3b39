package packet

import (
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
)

// conns returns the connections of a capture between two endpoints,
// whichever their roles.
func connsOf(r result, a, b netip.AddrPort) []flowlog.Conn {
	var out []flowlog.Conn
	for _, c := range r.Conns {
		o, p := netip.AddrPortFrom(c.OrigH, c.OrigP), netip.AddrPortFrom(c.RespH, c.RespP)
		if o == a && p == b || o == b && p == a {
			out = append(out, c)
		}
	}
	return out
}

// one returns the only connection between two endpoints.
func one(t *testing.T, r result, a, b netip.AddrPort) flowlog.Conn {
	t.Helper()
	cs := connsOf(r, a, b)
	if len(cs) != 1 {
		t.Fatalf("%d connections between %v and %v, want 1: %+v", len(cs), a, b, r.Conns)
	}
	return cs[0]
}

func roles(c flowlog.Conn) string {
	return fmt.Sprintf("%v>%v", netip.AddrPortFrom(c.OrigH, c.OrigP), netip.AddrPortFrom(c.RespH, c.RespP))
}

func wantRoles(t *testing.T, c flowlog.Conn, orig, resp netip.AddrPort, flipped bool) {
	t.Helper()
	if got, want := roles(c), fmt.Sprintf("%v>%v", orig, resp); got != want {
		t.Errorf("roles %s, want %s (history %q)", got, want, c.History)
	}
	if strings.Contains(c.History, "^") != flipped {
		t.Errorf("history %q: flipped should be %v", c.History, flipped)
	}
}

// A capture that starts with the SYN-ACK (the SYN was missed, or is in the
// previous file): once the client acknowledges it or either side sends
// data, the SYN-ACK's sender is the responder, as Zeek (5.1 on) decides.
func TestSynAckFirstFlipsOnceAnswered(t *testing.T) {
	c, s := ap(client, 50000), ap(server, 7777) // neither a likely server port
	hello, reply := []byte("hello"), []byte("world!!")
	for _, tc := range []struct {
		name  string
		build func(g *pcapgen.Gen)
		state string
		ob    int64
		rb    int64
	}{
		{"ack", func(g *pcapgen.Gen) {
			g.TCP(s, c, 900, 101, pcapgen.SYN|pcapgen.ACK, nil)
			g.TCP(c, s, 101, 901, pcapgen.ACK, nil)
			g.TCP(c, s, 101, 901, pcapgen.PSH|pcapgen.ACK, hello)
			g.TCP(s, c, 901, 106, pcapgen.PSH|pcapgen.ACK, reply)
			g.TCP(c, s, 106, 908, pcapgen.FIN|pcapgen.ACK, nil)
			g.TCP(s, c, 908, 107, pcapgen.FIN|pcapgen.ACK, nil)
			g.TCP(c, s, 107, 909, pcapgen.ACK, nil)
		}, "SF", 5, 7},
		{"client data", func(g *pcapgen.Gen) {
			g.TCP(s, c, 900, 101, pcapgen.SYN|pcapgen.ACK, nil)
			g.TCP(c, s, 101, 901, pcapgen.PSH|pcapgen.ACK, hello)
		}, "S1", 5, 0},
		// The SYN comes after its SYN-ACK (reordered on the way to the
		// capture): put back in order.
		{"syn after", func(g *pcapgen.Gen) {
			g.TCP(s, c, 900, 101, pcapgen.SYN|pcapgen.ACK, nil)
			g.TCP(c, s, 100, 0, pcapgen.SYN, nil)
			g.TCP(c, s, 101, 901, pcapgen.ACK, nil)
		}, "S1", 0, 0},
		{"server data", func(g *pcapgen.Gen) {
			g.TCP(s, c, 900, 101, pcapgen.SYN|pcapgen.ACK, nil)
			g.TCP(s, c, 901, 101, pcapgen.PSH|pcapgen.ACK, reply)
			g.TCP(c, s, 101, 908, pcapgen.ACK, nil)
		}, "S1", 0, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, pcapgen.Options{}, tc.build)
			f := one(t, r, c, s)
			wantRoles(t, f, c, s, true)
			if f.ConnState != tc.state || f.OrigBytes != tc.ob || f.RespBytes != tc.rb {
				t.Errorf("%s %d/%d bytes (history %q), want %s %d/%d", f.ConnState, f.OrigBytes, f.RespBytes, f.History, tc.state, tc.ob, tc.rb)
			}
			if f.History[0] != 'h' || strings.Count(f.History, "^") != 1 {
				t.Errorf("history %q, want the responder's SYN-ACK then one flip", f.History)
			}
		})
	}
	// A SYN-ACK answered by a reset is what a stealth scan draws: the
	// scanner keeps its role.
	for _, rst := range []int{pcapgen.RST, pcapgen.RST | pcapgen.ACK} {
		r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
			g.TCP(s, c, 900, 101, pcapgen.SYN|pcapgen.ACK, nil)
			g.TCP(c, s, 101, 901, rst, nil)
		})
		wantRoles(t, one(t, r, c, s), s, c, false)
	}
}

// Without a handshake, the roles follow Zeek's likely server ports.
func TestMidStreamRolesByPort(t *testing.T) {
	c := ap(client, 50001)
	for _, tc := range []struct {
		name       string
		first      [2]netip.AddrPort // sender, receiver of the first packet
		orig, resp netip.AddrPort
		flipped    bool
	}{
		{"data from a likely server port", [2]netip.AddrPort{ap(server, 443), c}, c, ap(server, 443), true},
		{"data to a likely server port", [2]netip.AddrPort{c, ap(server, 443)}, c, ap(server, 443), false},
		{"SYN-ACK from a likely server port", [2]netip.AddrPort{ap(server, 80), c}, c, ap(server, 80), true},
		// Between two likely server ports, the lower one is the server.
		{"from the lower likely port", [2]netip.AddrPort{ap(server, 443), ap(client, 8080)}, ap(client, 8080), ap(server, 443), true},
		{"from the higher likely port", [2]netip.AddrPort{ap(client, 8080), ap(server, 443)}, ap(client, 8080), ap(server, 443), false},
		{"between unlikely ports", [2]netip.AddrPort{ap(server, 7777), c}, ap(server, 7777), c, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.first[0], tc.first[1]
			r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
				flags := pcapgen.PSH | pcapgen.ACK
				var payload []byte = []byte("mid-stream")
				if strings.HasPrefix(tc.name, "SYN-ACK") {
					flags, payload = pcapgen.SYN|pcapgen.ACK, nil
				}
				g.TCP(a, b, 5000, 7000, flags, payload)
				g.TCP(b, a, 7000, 5011, pcapgen.ACK, nil)
			})
			wantRoles(t, one(t, r, a, b), tc.orig, tc.resp, tc.flipped)
		})
	}
}

// dhcp is a DHCP message with op (1 BOOTREQUEST, 2 BOOTREPLY).
func dhcp(op byte) []byte {
	b := make([]byte, 300)
	b[0], b[1], b[2] = op, 1, 6
	copy(b[236:], []byte{99, 130, 83, 99, 53, 1, 5, 255})
	return b
}

// ntp is an NTP v4 packet of a mode (3 client, 4 server).
func ntp(mode byte) []byte {
	b := make([]byte, 48)
	b[0] = 4<<3 | mode
	return b
}

// The roles of DNS, NTP and DHCP come from who asked, as Zeek's analyzers
// set them, whichever message is captured first, even where the ports say
// nothing (both likely server ports) or the wrong thing.
func TestUDPRolesByContent(t *testing.T) {
	peer := netip.MustParseAddr("198.51.100.9")
	query := pcapgen.DNSQuery(7, "c2.example.com", layers.DNSTypeA)
	answer := pcapgen.DNSResponse(7, "c2.example.com", layers.DNSTypeA, layers.DNSResponseCodeNoErr,
		[]layers.DNSResourceRecord{pcapgen.A("c2.example.com", netip.MustParseAddr("203.0.113.66"), 60)})
	for _, tc := range []struct {
		name          string
		asker, server netip.AddrPort
		request, resp []byte
	}{
		// A server's query from port 53 to another server's port 53.
		{"dns", ap(client, 53), ap(dnssrv, 53), query, answer},
		{"ntp", ap(client, 123), ap(server, 123), ntp(3), ntp(4)},
		// A relay's request, from 67 to 67.
		{"dhcp", ap(peer, 67), ap(server, 67), dhcp(1), dhcp(2)},
		// From a likely server port to one that is not: the port
		// heuristic alone would make the asker the responder.
		{"dns from 53", ap(client, 53), ap(dnssrv, 40000), query, answer},
	} {
		t.Run(tc.name+" reply first", func(t *testing.T) {
			r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
				g.UDP(tc.server, tc.asker, tc.resp)
				g.UDP(tc.asker, tc.server, tc.request)
			})
			f := one(t, r, tc.asker, tc.server)
			wantRoles(t, f, tc.asker, tc.server, true)
			if f.OrigPkts != 1 || f.RespPkts != 1 || f.OrigBytes != int64(len(tc.request)) || f.RespBytes != int64(len(tc.resp)) {
				t.Errorf("%d/%d packets, %d/%d bytes", f.OrigPkts, f.RespPkts, f.OrigBytes, f.RespBytes)
			}
		})
		t.Run(tc.name+" request first", func(t *testing.T) {
			r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
				g.UDP(tc.asker, tc.server, tc.request)
				g.UDP(tc.server, tc.asker, tc.resp)
			})
			wantRoles(t, one(t, r, tc.asker, tc.server), tc.asker, tc.server, false)
		})
	}
	// Other UDP: the sender from a likely server port (TFTP's) to one that
	// is not is the responder.
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) { g.UDP(ap(server, 69), ap(client, 40000), []byte("\x00\x03\x00\x01data")) })
	wantRoles(t, one(t, r, ap(server, 69), ap(client, 40000)), ap(client, 40000), ap(server, 69), true)
	// What does not look like NTP (version 0, or stratum 17) or DHCP (no
	// magic cookie) says nothing: between two likely server ports, the
	// first packet's sender is the originator.
	badNTP, deepNTP, noCookie := ntp(4), ntp(4), dhcp(2)
	badNTP[0], deepNTP[1], noCookie[236] = 4, 17, 0
	for _, tc := range []struct {
		a, b netip.AddrPort
		msg  []byte
	}{{ap(server, 123), ap(client, 123), badNTP}, {ap(server, 123), ap(client, 123), deepNTP}, {ap(server, 67), ap(peer, 67), noCookie}} {
		r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) { g.UDP(tc.a, tc.b, tc.msg) })
		wantRoles(t, one(t, r, tc.a, tc.b), tc.a, tc.b, false)
	}
	// What does not look like DNS (here 512 questions) says nothing: the
	// ports decide.
	junk := append([]byte{0, 7, 0x81, 0x80, 2, 0}, make([]byte, 30)...)
	r = run(t, pcapgen.Options{}, func(g *pcapgen.Gen) { g.UDP(ap(client, 40000), ap(dnssrv, 53), junk) })
	wantRoles(t, one(t, r, ap(client, 40000), ap(dnssrv, 53)), ap(client, 40000), ap(dnssrv, 53), false)
	// An answer to a multicast group or the broadcast address is not
	// turned into the group asking.
	mdns := ap(netip.MustParseAddr("224.0.0.251"), 5353)
	r = run(t, pcapgen.Options{}, func(g *pcapgen.Gen) { g.UDP(ap(client, 5353), mdns, answer) })
	wantRoles(t, one(t, r, ap(client, 5353), mdns), ap(client, 5353), mdns, false)
	bcast := ap(netip.MustParseAddr("255.255.255.255"), 68)
	r = run(t, pcapgen.Options{}, func(g *pcapgen.Gen) { g.UDP(ap(server, 67), bcast, dhcp(2)) })
	wantRoles(t, one(t, r, ap(server, 67), bcast), ap(server, 67), bcast, false)
}

// Zeek counts no payload bytes for IP protocols it does not analyse, only
// IP bytes.
func TestOtherProtocolsCountNoPayload(t *testing.T) {
	payload := bytes.Repeat([]byte{0xa5}, 100)
	for _, proto := range []layers.IPProtocol{layers.IPProtocolESP, layers.IPProtocolSCTP} {
		r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
			g.IPPacket(client, server, proto, gopacket.Payload(payload))
			g.IPPacket(server, client, proto, gopacket.Payload(payload[:40]))
		})
		f := one(t, r, ap(client, 0), ap(server, 0))
		if f.Proto != fmt.Sprint(int(proto)) || f.OrigBytes != 0 || f.RespBytes != 0 || f.OrigIPBytes != 120 || f.RespIPBytes != 60 ||
			f.OrigPkts != 1 || f.RespPkts != 1 {
			t.Errorf("proto %d: %+v", proto, f)
		}
	}
}

// decodeCarry runs the decoder over a capture seeded with what a previous
// capture carried, and returns what it found and what it carries on.
func decodeCarry(t *testing.T, data []byte, seed []Carried, max int) (result, []Carried) {
	t.Helper()
	origin := observe.Origin{Input: "test.pcap", Source: "pcap"}
	sink := decodetest.New(origin)
	rd, err := capfile.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	d := New(Config{Origin: origin, Sink: sink})
	if n := d.Seed(seed); n != 0 {
		t.Fatalf("%d carried connections skipped", n)
	}
	var p capfile.Packet
	for {
		err := rd.Next(&p)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		d.Packet(&p)
	}
	carry := d.FinishCarry(max)
	sink.Finish(t)
	return result{Sink: sink, stats: d.Stats}, carry
}

// A connection split across two rotated files keeps its roles and state
// in the second, which counts its own share: the two records add up to
// the connection. A connection that says nothing in the second file is not
// reported again; one that times out there is not carried further.
func TestConnectionContinuesInTheNextFile(t *testing.T) {
	c, s := ap(client, 50002), ap(server, 7777)
	quiet := ap(client, 50003)
	udpc, udps := ap(client, 40001), ap(server, 9999)
	req, resp := bytes.Repeat([]byte("q"), 300), bytes.Repeat([]byte("r"), 2000)
	first := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.Dial(c, s, 100, 900).Send(req[:100])
		g.Dial(quiet, s, 5000, 6000)
		g.UDP(udpc, udps, []byte("ping"))
		g.UDP(udps, udpc, []byte("pong"))
		g.Unanswered(ap(client, 50004), s, 77, 1)                                     // an attempt: not carried
		g.TCP(s, ap(client, 50008), 5, 78, pcapgen.SYN|pcapgen.ACK, nil)              // a SYN-ACK alone: not carried
		g.TCP(ap(client, 50009), s, 500, 600, pcapgen.PSH|pcapgen.ACK, []byte("mid")) // seen from the middle: carried
		g.Dial(ap(client, 50006), s, 10, 20).Reset()                                  // over: not carried
		g.UDP(ap(client, 40053), ap(dnssrv, 53), pcapgen.DNSQuery(9, "late.example", layers.DNSTypeA))
	})
	second := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.T = pcapgen.Start.Add(10e9)
		g.TCP(c, s, 201, 901, pcapgen.PSH|pcapgen.ACK, req[100:])
		g.TCP(s, c, 901, 401, pcapgen.PSH|pcapgen.ACK, resp[:1460])
		g.TCP(s, c, 2361, 401, pcapgen.PSH|pcapgen.ACK, resp[1460:])
		g.TCP(c, s, 401, 2901, pcapgen.FIN|pcapgen.ACK, nil)
		g.TCP(s, c, 2901, 402, pcapgen.FIN|pcapgen.ACK, nil)
		g.TCP(c, s, 402, 2902, pcapgen.ACK, nil)
		g.UDP(udps, udpc, []byte("pong again")) // the responder speaks first here
		g.UDP(ap(dnssrv, 53), ap(client, 40053), pcapgen.DNSResponse(9, "late.example", layers.DNSTypeA, layers.DNSResponseCodeNoErr,
			[]layers.DNSResourceRecord{pcapgen.A("late.example", netip.MustParseAddr("203.0.113.99"), 60)}))
	})
	r1, carry := decodeCarry(t, first, nil, DefaultMaxCarry)
	if len(carry) != 5 {
		t.Fatalf("carried %d connections, want 5: %+v", len(carry), carry)
	}
	f1 := one(t, r1, c, s)
	r2, carry2 := decodeCarry(t, second, carry, DefaultMaxCarry)
	f2 := one(t, r2, c, s)
	wantRoles(t, f2, c, s, false)
	if f1.ConnState != "S1" || f2.ConnState != "SF" {
		t.Errorf("states %s then %s, want S1 then SF", f1.ConnState, f2.ConnState)
	}
	if f1.OrigBytes+f2.OrigBytes != int64(len(req)) || f1.RespBytes+f2.RespBytes != int64(len(resp)) ||
		f2.OrigBytes != 200 || f2.RespBytes != int64(len(resp)) {
		t.Errorf("bytes %d/%d then %d/%d, want 100/0 then 200/%d", f1.OrigBytes, f1.RespBytes, f2.OrigBytes, f2.RespBytes, len(resp))
	}
	if f2.History != f1.History+"dFf" || f2.Start != pcapgen.Start.Add(10e9).UnixNano() {
		t.Errorf("second file: history %q (first %q), start %d", f2.History, f1.History, f2.Start)
	}
	u := one(t, r2, udpc, udps)
	wantRoles(t, u, udpc, udps, false)
	if u.OrigPkts != 0 || u.RespPkts != 1 || u.ConnState != "SHR" {
		t.Errorf("udp continued: %+v", u)
	}
	// The answer to the query of the first file is a resolution.
	if d := r2.get(t, "domain", "late.example").Domain; !slices.Equal(d.Addrs, []string{"203.0.113.99"}) || d.Unsolicited != 0 {
		t.Errorf("answer to a carried query: %+v", d)
	}
	if cs := connsOf(r2, quiet, s); len(cs) != 0 {
		t.Errorf("the quiet connection reported again: %+v", cs)
	}
	// The quiet connection and the UDP ones are still open; the closed one
	// is not carried. Past the timeouts, nothing is.
	if len(carry2) != 4 {
		t.Errorf("carried on %d, want 4: %+v", len(carry2), carry2)
	}
	late := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.T = pcapgen.Start.Add(3600e9)
		g.UDP(udps, udpc, []byte("much later"))
	})
	r3, carry3 := decodeCarry(t, late, carry2, DefaultMaxCarry)
	wantRoles(t, one(t, r3, udpc, udps), udps, udpc, false)
	if len(carry3) != 0 || len(connsOf(r3, quiet, s)) != 0 {
		t.Errorf("after the timeouts: carried %+v, conns %+v", carry3, r3.Conns)
	}
}

// The next file keeps the service recognised in the previous one; it
// reads application data afresh, so a request split across the two files
// is not read.
func TestServiceContinuesInTheNextFile(t *testing.T) {
	c, s := ap(client, 50007), ap(server, 8000)
	req := pcapgen.HTTPGet("c2.example", "/split", "bot")
	first := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		k := g.Dial(c, s, 100, 900)
		k.Send(pcapgen.HTTPGet("c2.example", "/whole", "bot"))
		k.Reply(pcapgen.HTTPResponse(200, "OK", []byte("ok")))
	})
	n := uint32(len(pcapgen.HTTPGet("c2.example", "/whole", "bot")))
	resp := uint32(len(pcapgen.HTTPResponse(200, "OK", []byte("ok"))))
	split := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.T = pcapgen.Start.Add(10e9)
		g.TCP(c, s, 101+n, 901+resp, pcapgen.PSH|pcapgen.ACK, req[:10])
	})
	second := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.T = pcapgen.Start.Add(20e9)
		g.TCP(c, s, 111+n, 901+resp, pcapgen.PSH|pcapgen.ACK, req[10:])
		g.TCP(s, c, 901+resp, 101+n+uint32(len(req)), pcapgen.ACK, nil)
	})
	r1, carry := decodeCarry(t, first, nil, DefaultMaxCarry)
	if f := one(t, r1, c, s); f.Service != "http" {
		t.Fatalf("first file: service %q", f.Service)
	}
	_, carry = decodeCarry(t, split, carry, DefaultMaxCarry)
	r3, _ := decodeCarry(t, second, carry, DefaultMaxCarry)
	f := one(t, r3, c, s)
	wantRoles(t, f, c, s, false)
	if f.Service != "http" || r3.count("http") != 0 {
		t.Errorf("service %q, %d http observables (want http, none)", f.Service, r3.count("http"))
	}
}

// A SYN in one file and its SYN-ACK first in the next: the attempt is not
// carried (a scanning bot's millions of them would be), and the next file
// sets the roles from the handshake's end.
func TestHandshakeSplitAcrossFiles(t *testing.T) {
	c, s := ap(client, 50005), ap(server, 7777)
	first := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) { g.TCP(c, s, 100, 0, pcapgen.SYN, nil) })
	second := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.TCP(s, c, 900, 101, pcapgen.SYN|pcapgen.ACK, nil)
		g.TCP(c, s, 101, 901, pcapgen.ACK, nil)
	})
	_, carry := decodeCarry(t, first, nil, DefaultMaxCarry)
	if len(carry) != 0 {
		t.Fatalf("an attempt carried: %+v", carry)
	}
	r, _ := decodeCarry(t, second, carry, DefaultMaxCarry)
	f := one(t, r, c, s)
	wantRoles(t, f, c, s, true)
	if f.ConnState != "S1" {
		t.Errorf("state %s", f.ConnState)
	}
}

// The carry is bounded and keeps the most recently active connections.
func TestCarryIsBounded(t *testing.T) {
	data := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		for i := range 50 {
			g.Dial(ap(client, uint16(30000+i)), ap(server, 7777), uint32(i), 9)
		}
		for i := range 1000 {
			g.Unanswered(ap(client, uint16(40000+i)), ap(server, 23), uint32(i), 1)
		}
	})
	_, carry := decodeCarry(t, data, nil, 10)
	if len(carry) != 10 {
		t.Fatalf("carried %d, want 10", len(carry))
	}
	for i, c := range carry {
		if want := uint16(30049 - i); c.Orig.Port() != want {
			t.Errorf("carry[%d] from port %d, want %d", i, c.Orig.Port(), want)
		}
	}
}
