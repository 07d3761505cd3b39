// Command gen writes the mixed capture tb-parse is benchmarked on: many
// concurrent conversations interleaved packet by packet — DNS over UDP,
// HTTP requests with bodies, TLS handshakes followed by bulk records,
// refused and unanswered connections, UDP chatter and pings — from a
// thousand lab hosts to documentation-range servers.
//
//	go run ./bench/tb-parse/gen -size 1073741824 -o bench/out/tb-parse-mixed.pcap
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"time"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

// seg is one packet of a conversation.
type seg struct {
	src, dst netip.AddrPort
	udp      bool
	icmp     bool
	seq, ack uint32
	flags    int
	payload  []byte
}

type session struct {
	segs []seg
	next int
}

func main() {
	size := flag.Int64("size", 1<<30, "stop once this many bytes are written")
	out := flag.String("o", "bench/out/tb-parse-mixed.pcap", "output capture")
	active := flag.Int("active", 4000, "conversations in progress at once")
	seed := flag.Int64("seed", 1, "random seed")
	scale := flag.Float64("scale", 1, "scale of HTTP bodies and TLS records (0.1: ten times smaller, more conversations per byte)")
	flag.Parse()
	f, err := os.Create(*out)
	if err != nil {
		fail(err)
	}
	w := bufio.NewWriterSize(f, 4<<20)
	cw := &countWriter{w: w}
	g, err := pcapgen.New(cw, pcapgen.Options{})
	if err != nil {
		fail(err)
	}
	g.Step = 20 * time.Microsecond
	rng := rand.New(rand.NewSource(*seed))
	b := newBuilder(rng)
	b.scale = *scale
	sessions := make([]*session, *active)
	for i := range sessions {
		sessions[i] = b.session()
	}
	for cw.n < *size {
		i := rng.Intn(len(sessions))
		s := sessions[i]
		sg := s.segs[s.next]
		switch {
		case sg.icmp:
			g.ICMPEcho(sg.src.Addr(), sg.dst.Addr(), sg.flags != 0, 7, uint16(sg.seq), sg.payload)
		case sg.udp:
			g.UDP(sg.src, sg.dst, sg.payload)
		default:
			g.TCP(sg.src, sg.dst, sg.seq, sg.ack, sg.flags, sg.payload)
		}
		if s.next++; s.next == len(s.segs) {
			sessions[i] = b.session()
		}
	}
	if err := g.Err(); err != nil {
		fail(err)
	}
	if err := w.Flush(); err != nil {
		fail(err)
	}
	if err := f.Close(); err != nil {
		fail(err)
	}
	fmt.Fprintf(os.Stderr, "gen: %s: %d packets, %d bytes, %d conversations\n", *out, g.N, cw.n, b.n)
}

type countWriter struct {
	w *bufio.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.w.Write(p)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gen:", err)
	os.Exit(1)
}

type builder struct {
	rng   *rand.Rand
	scale float64
	n     int
	port  uint16
	bulk  []byte
	names []string
	hello [][]byte
}

func newBuilder(rng *rand.Rand) *builder {
	b := &builder{rng: rng, port: 1024, bulk: make([]byte, 64<<10)}
	rng.Read(b.bulk)
	for i := 0; i < 5000; i++ {
		b.names = append(b.names, fmt.Sprintf("host%d.domain%d.example", i, i%97))
	}
	for i := 0; i < 64; i++ {
		b.hello = append(b.hello, pcapgen.ClientHelloRecord(pcapgen.Hello{
			Version: 0x0303, Ciphers: []uint16{0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc030, 0x009c},
			Order: []uint16{0, 23, 65281, 10, 11, 35, 16, 5, 13, 18, 51, 45, 43, 27, 21}, SNI: b.names[i*71],
			Groups: []uint16{29, 23, 24}, PointFormats: []uint8{0}, SigAlgs: []uint16{0x0403, 0x0804, 0x0401},
			ALPN: []string{"h2", "http/1.1"}, SupportedVersions: []uint16{0x0304, 0x0303}, Pad: 100 + i}))
	}
	return b
}

func (b *builder) client() netip.AddrPort {
	b.port = max(b.port+1, 1024)
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 13, byte(b.rng.Intn(4)), byte(1 + b.rng.Intn(250))}), b.port)
}

func (b *builder) server(port uint16) netip.AddrPort {
	nets := [][3]byte{{192, 0, 2}, {198, 51, 100}, {203, 0, 113}}
	n := nets[b.rng.Intn(3)]
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{n[0], n[1], n[2], byte(1 + b.rng.Intn(254))}), port)
}

func (b *builder) body(n int) []byte {
	off := b.rng.Intn(len(b.bulk) - n)
	return b.bulk[off : off+n]
}

// sized is a body of n bytes times the scale.
func (b *builder) sized(n int) []byte {
	n = max(1, int(float64(n)*b.scale))
	off := b.rng.Intn(len(b.bulk) - n)
	return b.bulk[off : off+n]
}

// tcp builds handshake, exchanges and close; each exchange is client data
// then server data.
func tcp(c, s netip.AddrPort, isn1, isn2 uint32, exchanges [][2][]byte) []seg {
	out := []seg{{src: c, dst: s, seq: isn1, flags: pcapgen.SYN}, {src: s, dst: c, seq: isn2, ack: isn1 + 1, flags: pcapgen.SYN | pcapgen.ACK},
		{src: c, dst: s, seq: isn1 + 1, ack: isn2 + 1, flags: pcapgen.ACK}}
	cs, ss := isn1+1, isn2+1
	send := func(from, to netip.AddrPort, seq, ack *uint32, data []byte) {
		for len(data) > 0 {
			n := min(len(data), 1448)
			out = append(out, seg{src: from, dst: to, seq: *seq, ack: *ack, flags: pcapgen.PSH | pcapgen.ACK, payload: data[:n]})
			*seq += uint32(n)
			data = data[n:]
			if len(data) == 0 || len(out)%2 == 0 {
				out = append(out, seg{src: to, dst: from, seq: *ack, ack: *seq, flags: pcapgen.ACK})
			}
		}
	}
	for _, ex := range exchanges {
		send(c, s, &cs, &ss, ex[0])
		send(s, c, &ss, &cs, ex[1])
	}
	return append(out, seg{src: c, dst: s, seq: cs, ack: ss, flags: pcapgen.FIN | pcapgen.ACK},
		seg{src: s, dst: c, seq: ss, ack: cs + 1, flags: pcapgen.FIN | pcapgen.ACK}, seg{src: c, dst: s, seq: cs + 1, ack: ss + 1, flags: pcapgen.ACK})
}

func (b *builder) session() *session {
	b.n++
	r := b.rng
	var segs []seg
	switch k := r.Intn(100); {
	case k < 30: // DNS lookup
		c, s := b.client(), netip.AddrPortFrom(netip.MustParseAddr("10.13.37.1"), 53)
		name := b.names[r.Intn(len(b.names))]
		id := uint16(r.Intn(65536))
		ans := []layers.DNSResourceRecord{pcapgen.CNAME(name, "edge."+name, 300),
			pcapgen.A("edge."+name, b.server(0).Addr(), 60)}
		segs = []seg{{src: c, dst: s, udp: true, payload: pcapgen.DNSQuery(id, name, layers.DNSTypeA)},
			{src: s, dst: c, udp: true, payload: pcapgen.DNSResponse(id, name, layers.DNSTypeA, 0, ans)}}
	case k < 50: // HTTP
		c, s := b.client(), b.server(80)
		var ex [][2][]byte
		for i := 0; i < 1+r.Intn(3); i++ {
			req := pcapgen.HTTPGet(b.names[r.Intn(len(b.names))], fmt.Sprintf("/api/v1/item/%d?session=%x", r.Intn(100000), r.Uint32()), "Mozilla/5.0 (bench)")
			ex = append(ex, [2][]byte{req, pcapgen.HTTPResponse(200, "OK", b.sized(1000+r.Intn(30000)))})
		}
		segs = tcp(c, s, r.Uint32(), r.Uint32(), ex)
	case k < 70: // TLS with bulk records
		c, s := b.client(), b.server(443)
		hello := b.hello[r.Intn(len(b.hello))]
		ex := [][2][]byte{{hello, pcapgen.ServerHelloRecord(0x0304, 0x1301)}, {b.sized(200 + r.Intn(2000)), b.sized(2000 + r.Intn(60000))}}
		segs = tcp(c, s, r.Uint32(), r.Uint32(), ex)
	case k < 80: // refused or unanswered
		c, s := b.client(), b.server(uint16(1+r.Intn(10000)))
		segs = []seg{{src: c, dst: s, seq: 1, flags: pcapgen.SYN}}
		if r.Intn(2) == 0 {
			segs = append(segs, seg{src: s, dst: c, ack: 2, flags: pcapgen.RST | pcapgen.ACK})
		}
	case k < 95: // UDP chatter
		c, s := b.client(), b.server(uint16(10000+r.Intn(5000)))
		for i := 0; i < 1+r.Intn(6); i++ {
			segs = append(segs, seg{src: c, dst: s, udp: true, payload: b.body(40 + r.Intn(1200))})
			if r.Intn(2) == 0 {
				segs = append(segs, seg{src: s, dst: c, udp: true, payload: b.body(40 + r.Intn(400))})
			}
		}
	default: // ping
		c, s := b.client(), b.server(0)
		for i := 0; i < 3; i++ {
			segs = append(segs, seg{src: c, dst: s, icmp: true, seq: uint32(i), payload: b.body(56)},
				seg{src: s, dst: c, icmp: true, flags: 1, seq: uint32(i), payload: b.body(56)})
		}
	}
	return &session{segs: segs}
}
