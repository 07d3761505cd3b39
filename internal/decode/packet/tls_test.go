package packet

import (
	"slices"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/decode/tlsfp"
)

func TestTLSClientHelloSplitAcrossSegments(t *testing.T) {
	h := pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x0a0a, 0x1301, 0x1302, 0xc02f}, Order: []uint16{0x0a0a, 0, 10, 11, 13, 16, 43, 21},
		SNI: "Beacon.Example.org", Groups: []uint16{29, 23}, PointFormats: []uint8{0}, SigAlgs: []uint16{0x0403, 0x0804},
		ALPN: []string{"h2", "http/1.1"}, SupportedVersions: []uint16{0x0304, 0x0303}, Pad: 1200}
	rec := pcapgen.ClientHelloRecord(h)
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c := g.Dial(ap(client, 50000), ap(server, 443), 1, 2)
		c.MSS = 500 // the hello needs three segments
		c.Send(rec)
		c.Reply(pcapgen.ServerHelloRecord(0x0304, 0x1301))
		c.Close()
	})
	var ch tlsfp.ClientHello
	if err := tlsfp.ParseClientHello(rec, &ch, nil); err != nil {
		t.Fatal(err)
	}
	o := r.get(t, "tls", "beacon.example.org")
	tl := o.TLS
	if tl.ServerName != "beacon.example.org" || !slices.Equal(tl.Versions, []string{"TLSv13"}) || !slices.Equal(tl.ALPN, []string{"h2"}) {
		t.Errorf("%+v", tl)
	}
	if !slices.Equal(tl.JA3, []string{ch.JA3()}) || !slices.Equal(tl.JA4, []string{ch.JA4()}) {
		t.Errorf("ja3 %v ja4 %v", tl.JA3, tl.JA4)
	}
	if f := r.Flow(t, connKey("tcp", client, 50000, server, 443)); f.Service != "ssl" || f.OrigBytes != int64(len(rec)) {
		t.Errorf("%+v", f)
	}
}

func TestTLSWithoutSNINamedByServer(t *testing.T) {
	h := pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0xc02f}, Order: []uint16{10, 11}, Groups: []uint16{23}, PointFormats: []uint8{0}}
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c := g.Dial(ap(client, 50001), ap(server, 8443), 1, 2)
		c.Send(pcapgen.ClientHelloRecord(h))
		c.Close()
	})
	tl := r.get(t, "tls", server.String()+":8443").TLS
	if !slices.Equal(tl.Versions, []string{"TLSv12"}) || tl.ServerName != "" {
		t.Errorf("%+v", tl)
	}
}

// Segments of a ClientHello and of an HTTP request that arrive out of order,
// or after a retransmission, are put back in order.
func TestReorderedHeads(t *testing.T) {
	hello := pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x1301}, Order: []uint16{0, 21}, SNI: "reordered.example", Pad: 900})
	req := pcapgen.HTTPGet("late.example", "/retransmitted", "ua")
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c, s := ap(client, 50100), ap(server, 443)
		g.Dial(c, s, 1000, 2000)
		// Three segments, sent 2, 3, 1.
		parts := [][]byte{hello[:300], hello[300:700], hello[700:]}
		offs := []uint32{0, 300, 700}
		for _, i := range []int{1, 2, 0} {
			g.TCP(c, s, 1001+offs[i], 2001, pcapgen.ACK|pcapgen.PSH, parts[i])
		}
		// HTTP: the first segment is lost, the second arrives, then the
		// first is retransmitted.
		c2, s2 := ap(client, 50101), ap(server, 80)
		g.Dial(c2, s2, 5000, 6000)
		g.TCP(c2, s2, 5001+10, 6001, pcapgen.ACK|pcapgen.PSH, req[10:])
		g.TCP(c2, s2, 5001, 6001, pcapgen.ACK|pcapgen.PSH, req[:10])
		// A gap never filled: nothing is read after it, bytes still count.
		c3, s3 := ap(client, 50102), ap(server, 80)
		g.Dial(c3, s3, 7000, 8000)
		g.TCP(c3, s3, 7001+100, 8001, pcapgen.ACK|pcapgen.PSH, pcapgen.HTTPGet("never.example", "/", "ua"))
	})
	if tl := r.get(t, "tls", "reordered.example").TLS; len(tl.JA4) != 1 {
		t.Errorf("%+v", tl)
	}
	r.get(t, "http", "GET http://late.example/retransmitted")
	if _, ok := r.Obs["http GET http://never.example/"]; ok {
		t.Error("read past a gap")
	}
	if f := r.Flow(t, connKey("tcp", client, 50102, server, 80)); f.OrigBytes != int64(100+len(pcapgen.HTTPGet("never.example", "/", "ua"))) {
		t.Errorf("orig_bytes %d", f.OrigBytes)
	}
}
