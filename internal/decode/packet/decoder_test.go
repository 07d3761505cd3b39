package packet

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// httpSession writes a GET split across two segments, a 200 response and
// a client close, and returns the request and response bytes.
func httpSession(g *pcapgen.Gen, c, s netip.AddrPort) (req, resp []byte) {
	req = pcapgen.HTTPGet("C2.Example.com", "/gate.php?id=42", "Mozilla/5.0 (tb)")
	resp = pcapgen.HTTPResponse(200, "OK", []byte(strings.Repeat("x", 3000)))
	conn := g.Dial(c, s, 1000, 5000)
	conn.MSS = 40
	conn.Send(req)
	conn.MSS = 1460
	conn.Reply(resp)
	conn.Close()
	return req, resp
}

func TestHTTPOverEveryFraming(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  pcapgen.Options
		v6   bool
	}{
		{"ethernet", pcapgen.Options{}, false},
		{"vlan", pcapgen.Options{VLAN: 42}, false},
		{"sll", pcapgen.Options{Link: layers.LinkTypeLinuxSLL}, false},
		{"raw", pcapgen.Options{Link: layers.LinkTypeRaw}, false},
		{"pcapng", pcapgen.Options{NG: true}, false},
		{"nano", pcapgen.Options{Nano: true}, false},
		{"ipv6", pcapgen.Options{}, true},
		{"ipv6-sll-ng", pcapgen.Options{Link: layers.LinkTypeLinuxSLL, NG: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := ap(client, 49152), ap(server, 80)
			iphdr := 20
			if tc.v6 {
				c, s = ap(client6, 49152), ap(server6, 80)
				iphdr = 40
			}
			var req, resp []byte
			r := run(t, tc.opt, func(g *pcapgen.Gen) { req, resp = httpSession(g, c, s) })
			f := r.Flow(t, connKey("tcp", c.Addr(), c.Port(), s.Addr(), s.Port()))
			// Client: SYN, ACK, 3 data segments, 3 ACKs of server data, FIN, ACK.
			// Server: SYN-ACK, 3 ACKs of client data, 3 data segments, FIN.
			nreq := (len(req) + 39) / 40
			nresp := (len(resp) + 1459) / 1460
			wantOrigPkts := int64(2 + nreq + nresp + 2)
			wantRespPkts := int64(1 + nreq + nresp + 1)
			if f.ConnState != "SF" || f.Outcome != "established" || f.Service != "http" {
				t.Errorf("state %s outcome %s service %q", f.ConnState, f.Outcome, f.Service)
			}
			if f.OrigBytes != int64(len(req)) || f.RespBytes != int64(len(resp)) {
				t.Errorf("bytes %d/%d, want %d/%d", f.OrigBytes, f.RespBytes, len(req), len(resp))
			}
			if f.OrigPkts != wantOrigPkts || f.RespPkts != wantRespPkts {
				t.Errorf("packets %d/%d, want %d/%d", f.OrigPkts, f.RespPkts, wantOrigPkts, wantRespPkts)
			}
			hdr := int64(iphdr + 20)
			if f.OrigIPBytes != wantOrigPkts*hdr+int64(len(req)) || f.RespIPBytes != wantRespPkts*hdr+int64(len(resp)) {
				t.Errorf("ip bytes %d/%d", f.OrigIPBytes, f.RespIPBytes)
			}
			h := r.get(t, "http", "GET http://c2.example.com/gate.php?id=42").HTTP
			if h.Host != "C2.Example.com" || h.URI != "/gate.php?id=42" || !slices.Equal(h.UserAgents, []string{"Mozilla/5.0 (tb)"}) ||
				!slices.Equal(h.Statuses, []int{200}) || h.Method != "GET" {
				t.Errorf("http %+v", h)
			}
			ip := r.get(t, "ip", s.Addr().String())
			if ip.IP.Conns != 1 || !slices.Equal(ip.IP.Ports, []string{"tcp/80"}) || ip.Count != 1 {
				t.Errorf("ip %+v", ip.IP)
			}
			if !ip.FirstSeen.Equal(pcapgen.Start) {
				t.Errorf("first seen %v", ip.FirstSeen)
			}
		})
	}
}

func TestConnectionOutcomes(t *testing.T) {
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.Refused(ap(client, 40001), ap(server, 8443), 7)
		g.Unanswered(ap(client, 40002), ap(server, 8444), 9, 3)
		c := g.Dial(ap(client, 40003), ap(server, 8445), 100, 200)
		c.Send([]byte("hello"))
		c.Reset()
		c = g.Dial(ap(client, 40004), ap(server, 8446), 100, 200)
		c.Send([]byte("still open"))
	})
	for port, want := range map[uint16][2]string{8443: {"REJ", "rejected"}, 8444: {"S0", "attempted"}, 8445: {"RSTO", "reset"}, 8446: {"S1", "established"}} {
		f := r.Flow(t, connKey("tcp", client, 40001+port-8443, server, port))
		if f.ConnState != want[0] || f.Outcome != want[1] {
			t.Errorf("port %d: %s/%s, want %v", port, f.ConnState, f.Outcome, want)
		}
	}
	if f := r.Flow(t, connKey("tcp", client, 40002, server, 8444)); f.OrigPkts != 3 || f.RespPkts != 0 || f.OrigBytes != 0 {
		t.Errorf("unanswered: %+v", f)
	}
	if f := r.Flow(t, connKey("tcp", client, 40003, server, 8445)); f.OrigBytes != 5 {
		t.Errorf("reset after 5 bytes: orig_bytes %d", f.OrigBytes)
	}
}

// A SYN retried after Zeek's 5 s attempt delay starts a new connection; so
// does a new SYN after a close; the test sink sums them into one 5-tuple with
// a count of connections.
func TestConnectionSplits(t *testing.T) {
	c, s := ap(client, 40010), ap(server, 443)
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.Step = time.Second
		g.TCP(c, s, 1, 0, pcapgen.SYN, nil) // t=0
		g.TCP(c, s, 1, 0, pcapgen.SYN, nil) // t=1
		g.T = g.T.Add(5 * time.Second)
		g.TCP(c, s, 1, 0, pcapgen.SYN, nil) // t=7: a new attempt
		g.Step = time.Millisecond
		conn := g.Dial(c, s, 5000, 9000) // reuse: different ISN
		conn.Send([]byte("abc"))
		conn.Close()
		g.Step = time.Second
		conn = g.Dial(c, s, 7000, 1) // after the close
		conn.Close()
	})
	o := r.Flow(t, connKey("tcp", client, 40010, server, 443))
	if o.Count != 4 {
		t.Fatalf("count %d, want 4 connections", o.Count)
	}
	if len(o.Starts) != 4 || o.OrigBytes != 3 {
		t.Errorf("starts %v orig_bytes %d", o.Starts, o.OrigBytes)
	}
	// The destination's contacts (tb-parse(1)): the attempts at t=0 and
	// t=7 are one (a SYN sent again on the 5-tuple of an attempt nothing
	// answered, within two minutes); the connection that reused their
	// ports at t=8 and the one 8 ms after it are one (a SYN on the 5-tuple
	// of a connection that started less than a second before).
	if ip := r.get(t, "ip", server.String()); ip.IP.Conns != 2 || len(ip.IP.Starts) != 2 {
		t.Errorf("ip %+v", ip.IP)
	}
}

func TestUDPInactivitySplits(t *testing.T) {
	c, s := ap(client, 5000), ap(server, 9999)
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.UDP(c, s, []byte("ping"))
		g.UDP(s, c, []byte("pong!"))
		g.T = g.T.Add(61 * time.Second)
		g.UDP(c, s, []byte("ping"))
	})
	o := r.Flow(t, connKey("udp", client, 5000, server, 9999))
	if o.Count != 2 || o.OrigBytes != 8 || o.RespBytes != 5 || o.OrigPkts != 2 {
		t.Errorf("count %d flow %+v", o.Count, *o)
	}
	// The last connection had no answer.
	if o.ConnState != "S0" {
		t.Errorf("state %s", o.ConnState)
	}
}

// A capture that starts mid-connection names the originator by port.
func TestMidStreamOriginatorByPort(t *testing.T) {
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.TCP(ap(server, 443), ap(client, 51000), 100, 200, pcapgen.ACK|pcapgen.PSH, []byte("server data"))
		g.TCP(ap(client, 51000), ap(server, 443), 200, 111, pcapgen.ACK, nil)
	})
	f := r.Flow(t, connKey("tcp", client, 51000, server, 443))
	if f.RespBytes != 11 || f.ConnState != "OTH" {
		t.Errorf("%+v", f)
	}
}

func TestICMPEcho(t *testing.T) {
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		for i := uint16(0); i < 3; i++ {
			g.ICMPEcho(client, server, false, 1, i, make([]byte, 56))
			g.ICMPEcho(server, client, true, 1, i, make([]byte, 56))
		}
		g.ICMPEcho(client6, server6, false, 1, 1, make([]byte, 16))
	})
	ic := r.get(t, "icmp", client.String()+">"+server.String()+" 8/0").ICMP
	if ic.Packets != 6 || ic.Bytes != 6*56 {
		t.Errorf("%+v", ic)
	}
	f := r.Flow(t, connKey("icmp", client, 8, server, 0))
	if f.OrigPkts != 3 || f.RespPkts != 3 {
		t.Errorf("%+v", f)
	}
	r.get(t, "icmp", client6.String()+">"+server6.String()+" 128/0")
}

func TestEvictionKeepsEveryFlow(t *testing.T) {
	data := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		for i := 0; i < 500; i++ {
			g.UDP(ap(client, uint16(20000+i)), ap(server, 7000), []byte("x"))
		}
	})
	r := decodeCapture(t, data, 16)
	if n := len(r.Flows); n != 500 {
		t.Fatalf("%d 5-tuples, want 500", n)
	}
	if r.stats.Evicted == 0 {
		t.Fatal("nothing evicted with a 16-flow table")
	}
	if ip := r.get(t, "ip", server.String()); ip.IP.Conns != 500 || len(ip.IP.Starts) != 256 {
		t.Errorf("ip conns %d starts %d", ip.IP.Conns, len(ip.IP.Starts))
	}
}

// Steady-state packets of a known connection allocate nothing.
func TestNoAllocationsPerPacket(t *testing.T) {
	c, s := ap(client, 40100), ap(server, 8080)
	u1, u2 := ap(client, 5353+1000), ap(server, 9000)
	data := capture(t, pcapgen.Options{VLAN: 7}, func(g *pcapgen.Gen) {
		g.Dial(c, s, 1, 1)
		for i := 0; i < 10; i++ {
			g.TCP(c, s, 2, 2, pcapgen.ACK, nil)
			g.UDP(u1, u2, []byte("datagram"))
		}
	})
	pkts := readAll(t, data)
	d := New(Config{Origin: origin(), Sink: discard{}})
	for i := range pkts {
		d.Packet(&pkts[i])
	}
	steady := pkts[len(pkts)-2:]
	allocs := testing.AllocsPerRun(200, func() {
		for i := range steady {
			steady[i].TS += 1000
			d.Packet(&steady[i])
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per packet pair", allocs)
	}
}

func TestFragmentedDNSResponse(t *testing.T) {
	name := "frag.example.net"
	var answers []layers.DNSResourceRecord
	for i := 0; i < 40; i++ {
		answers = append(answers, pcapgen.A(name, netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}), 60))
	}
	resp := pcapgen.DNSResponse(77, name, layers.DNSTypeA, 0, answers)
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.UDP(ap(client, 3333), ap(dnssrv, 53), pcapgen.DNSQuery(77, name, layers.DNSTypeA))
		g.Fragments(ap(dnssrv, 53), ap(client, 3333), resp, 512, []int{2, 0, 1}, 4242)
	})
	d := r.get(t, "domain", name)
	if len(d.Domain.Addrs) != 40 || d.Count != 1 || d.Domain.Responses != 1 {
		t.Fatalf("addrs %d count %d responses %d", len(d.Domain.Addrs), d.Count, d.Domain.Responses)
	}
	if r.stats.Reassembled != 1 {
		t.Errorf("reassembled %d", r.stats.Reassembled)
	}
	f := r.Flow(t, connKey("udp", client, 3333, dnssrv, 53))
	if f.RespPkts != 1 || f.RespBytes != int64(len(resp)) || f.Service != "dns" {
		t.Errorf("%+v", f)
	}
}

func TestManyFlowsSummaries(t *testing.T) {
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		for i := 0; i < 50; i++ {
			s := ap(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), 443)
			c := g.Dial(ap(client, uint16(30000+i)), s, uint32(i), uint32(i*7))
			c.Send([]byte(fmt.Sprint(i)))
			c.Close()
		}
	})
	if n := len(r.Flows); n != 50 {
		t.Fatalf("%d flows", n)
	}
	if n := r.count("ip"); n != 50 {
		t.Fatalf("%d ips", n)
	}
}

// The observable carries its provenance: the packet that began it.
func TestProvenancePacketNumbers(t *testing.T) {
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.UDP(ap(client, 1), ap(server, 2), []byte("a"))
		g.DNSOverUDP(ap(client, 3000), ap(dnssrv, 53), pcapgen.DNSQuery(1, "a.example", layers.DNSTypeA), nil)
	})
	if p := r.get(t, "domain", "a.example").Provenance; len(p) != 1 || p[0].Packet != 2 || p[0].Input != "test.pcap" {
		t.Errorf("%+v", p)
	}
	if o := r.get(t, "domain", "a.example"); o.Domain.Queries != 1 || o.Domain.Responses != 0 || len(o.Domain.RCodes) != 0 {
		t.Errorf("%+v", o.Domain)
	}
}

// Pipelined requests that are never answered are all reported, and the
// queue waiting for responses stays bounded.
func TestUnansweredPipelinedRequests(t *testing.T) {
	data := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c := g.Dial(ap(client, 40200), ap(server, 8080), 1, 1)
		for i := 0; i < 100; i++ {
			c.Send(pcapgen.HTTPGet("flood.example", fmt.Sprintf("/r/%d", i), "x"))
		}
	})
	pkts := readAll(t, data)
	res := map[string]bool{}
	d := New(Config{Origin: origin(), Sink: sinkFunc(func(o *records.Observable) { res[o.Type+" "+o.Value] = true })})
	for i := range pkts {
		d.Packet(&pkts[i])
		for _, f := range d.flows.list() {
			if f.pend != nil && len(f.pend.reqs) > maxHTTPQueue {
				t.Fatalf("%d requests queued", len(f.pend.reqs))
			}
		}
	}
	d.Finish()
	for i := 0; i < 100; i++ {
		if !res[fmt.Sprintf("http GET http://flood.example/r/%d", i)] {
			t.Fatalf("request %d not reported", i)
		}
	}
}

type sinkFunc func(*records.Observable)

func (f sinkFunc) Add(o *records.Observable) { f(o) }
func (f sinkFunc) Conn(*flowlog.Conn)        {}
