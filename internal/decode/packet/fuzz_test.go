package packet

import (
	"bufio"
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

func seedCaptures(t testing.TB) [][]byte {
	var out [][]byte
	for _, opt := range []pcapgen.Options{{}, {NG: true, VLAN: 3}, {Link: layers.LinkTypeLinuxSLL}} {
		out = append(out, capture(t, opt, func(g *pcapgen.Gen) {
			httpSession(g, ap(client, 1234), ap(server, 80))
			g.DNSOverUDP(ap(client, 53000), ap(dnssrv, 53), pcapgen.DNSQuery(1, "x.example", layers.DNSTypeA),
				pcapgen.DNSResponse(1, "x.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("x.example", server, 5)}))
			c := g.Dial(ap(client6, 999), ap(server6, 443), 1, 1)
			c.Send(pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x1301}, Order: []uint16{0}, SNI: "s.example"}))
			g.Fragments(ap(client, 7), ap(server, 8), bytes.Repeat([]byte{1}, 100), 48, nil, 9)
			g.ICMPEcho(client, netip.MustParseAddr("192.0.2.1"), false, 1, 1, nil)
		}))
	}
	// The bot channels, each split into small segments.
	out = append(out, capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.MiraiSession(ap(client, 40001), ap(server, 23), "x", 2, miraiSYN(), 3)
		g.GafgytSession(ap(client, 40002), ap(server, 666), "X", 1, []string{"!* UDP 192.0.2.9 80 5"}, 4)
		g.IRCSession(ap(client, 40003), ap(server, 4444), "n", "#c", "k", 1, []string{"!udp 192.0.2.9"}, 5)
		c := g.Dial(ap(client, 40004), ap(server, 48101), 1, 1)
		c.Send(pcapgen.MiraiReport(ap(netip.MustParseAddr("192.0.2.44"), 23), "root", "x"))
		c.Close()
	}))
	return out
}

func FuzzPcap(f *testing.F) {
	for _, s := range seedCaptures(f) {
		f.Add(s)
	}
	// One read buffer for every input: a fresh 4 MiB buffer per input
	// slows instrumented fuzzing down to a crawl.
	br := bufio.NewReaderSize(nil, capfile.BufferSize)
	f.Fuzz(func(t *testing.T, data []byte) {
		br.Reset(bytes.NewReader(data))
		rd, err := capfile.NewReader(br)
		if err != nil {
			return
		}
		d := New(Config{MaxFlows: 8, Origin: origin(), Sink: discard{}})
		var p capfile.Packet
		for rd.Next(&p) == nil {
			d.Packet(&p)
			if d.flows.n > 8 {
				t.Fatalf("%d flows held", d.flows.n)
			}
		}
		d.Finish()
		d.noFaults(t)
		if d.flows.n != 0 || d.flows.first() != nil {
			t.Fatal("flows left after Finish")
		}
	})
}

func BenchmarkDecoder(b *testing.B) {
	data := seedCaptures(b)[0]
	pkts := readAll(b, data)
	d := New(Config{Origin: origin(), Sink: discard{}})
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range pkts {
			d.Packet(&pkts[j])
		}
		d.Finish()
	}
}
