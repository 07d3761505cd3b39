package packet

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

// Link layers pcapgen does not frame itself: BSD loopback, Linux cooked
// capture v2 and QinQ, built by rewriting the frames of simpler captures.
func TestMoreLinkLayers(t *testing.T) {
	exchange := func(g *pcapgen.Gen) {
		g.DNSOverUDP(ap(client, 40000), ap(dnssrv, 53), pcapgen.DNSQuery(5, "link.example", layers.DNSTypeA),
			pcapgen.DNSResponse(5, "link.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("link.example", server, 9)}))
	}
	raw := readAll(t, capture(t, pcapgen.Options{Link: layers.LinkTypeRaw}, exchange))
	tagged := readAll(t, capture(t, pcapgen.Options{VLAN: 5}, exchange))
	for _, tc := range []struct {
		name  string
		link  uint32
		frame func(i int) []byte
	}{
		{name: "loopback", link: 108, frame: func(i int) []byte {
			return append([]byte{0, 0, 0, 2}, raw[i].Data...)
		}},
		{name: "sll2", link: 276, frame: func(i int) []byte {
			h := make([]byte, 20)
			binary.BigEndian.PutUint16(h, 0x0800)
			return append(h, raw[i].Data...)
		}},
		{name: "qinq", link: 1, frame: func(i int) []byte {
			f := append([]byte(nil), tagged[i].Data[:16]...)
			binary.BigEndian.PutUint16(f[12:], 0x88a8)
			f = append(f, 0x81, 0x00, 0x00, 0x07)
			return append(f, tagged[i].Data[16:]...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var frames [][]byte
			for i := range raw {
				frames = append(frames, tc.frame(i))
			}
			r := decodeCapture(t, rawPcap(tc.link, frames), 0)
			if d := r.get(t, "domain", "link.example").Domain; len(d.Addrs) != 1 || d.Addrs[0] != server.String() {
				t.Errorf("%+v", d)
			}
			if r.stats.Malformed != 0 || r.stats.NonIP != 0 {
				t.Errorf("stats %+v", r.stats)
			}
		})
	}
}

// rawPcap writes a little-endian pcap with any link type (gopacket's
// writer takes only 8-bit ones).
func rawPcap(link uint32, frames [][]byte) []byte {
	var b bytes.Buffer
	for _, v := range []any{uint32(0xa1b2c3d4), uint16(2), uint16(4), int32(0), uint32(0), uint32(262144), link} {
		binary.Write(&b, binary.LittleEndian, v)
	}
	for i, f := range frames {
		for _, v := range []uint32{1763683200, uint32(i), uint32(len(f)), uint32(len(f))} {
			binary.Write(&b, binary.LittleEndian, v)
		}
		b.Write(f)
	}
	return b.Bytes()
}
