package packet

import (
	"bytes"
	"encoding/binary"
	"math/rand"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// The header decoders accept and refuse what gopacket's layers, which the
// decoder used before, accept and refuse, and read the same fields: every
// byte of a capture is the sample's, so they are compared on well-formed
// headers with random bytes overwritten, truncated or with random lengths
// and options.

// mangle returns variants of a well-formed header: cut at every length,
// and with random bytes overwritten (biased to the length, offset and
// option bytes, where the checks are).
func mangle(rng *rand.Rand, good []byte, hot []int, n int) [][]byte {
	var out [][]byte
	for i := 0; i <= len(good); i++ {
		out = append(out, good[:i])
	}
	for i := 0; i < n; i++ {
		b := append([]byte(nil), good...)
		for k := 0; k < 1+rng.Intn(4); k++ {
			at := rng.Intn(len(b))
			if rng.Intn(2) == 0 {
				at = hot[rng.Intn(len(hot))]
			}
			b[at] = byte(rng.Intn(256))
			if rng.Intn(3) == 0 {
				b[at] = []byte{0, 1, 2, 3, 4, 5, 8, 0x0f, 0x45, 0x4f, 0xc2, 0xff}[rng.Intn(12)]
			}
		}
		if rng.Intn(4) == 0 {
			b = b[:rng.Intn(len(b)+1)]
		}
		out = append(out, b)
	}
	return out
}

func ip4Sample() []byte {
	b := make([]byte, 60+40)
	b[0] = 0x48 // IHL 8: 12 bytes of options
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)-8))
	binary.BigEndian.PutUint16(b[4:], 0x1234)
	binary.BigEndian.PutUint16(b[6:], 0x2001)
	b[8], b[9] = 64, 6
	copy(b[12:], []byte{192, 0, 2, 1, 198, 51, 100, 2})
	copy(b[20:], []byte{1, 7, 7, 1, 2, 3, 4, 5, 1, 0, 9, 9}) // NOP, record route, NOP, end, padding
	return b
}

func TestIPv4HeaderMatchesGopacket(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	for _, b := range mangle(rng, ip4Sample(), []int{0, 2, 3, 6, 20, 21, 22, 23, 24, 28, 29, 30}, 200000) {
		var ref layers.IPv4
		refErr := ref.DecodeFromBytes(b, gopacket.NilDecodeFeedback)
		var h ip4Header
		ok := h.decode(b)
		if ok != (refErr == nil) {
			t.Fatalf("% x: decode %v, gopacket %v", b, ok, refErr)
		}
		if !ok {
			continue
		}
		if h.length != ref.Length || h.hdrLen != int(ref.IHL)*4 || h.id != ref.Id || h.proto != uint8(ref.Protocol) ||
			h.more != (ref.Flags&layers.IPv4MoreFragments != 0) || h.fragOff != ref.FragOffset ||
			!bytes.Equal(h.src, ref.SrcIP) || !bytes.Equal(h.dst, ref.DstIP) || !sameSlice(h.payload, ref.Payload) {
			t.Fatalf("% x: %+v, gopacket %+v", b, h, ref)
		}
	}
}

func ip6Sample() []byte {
	b := make([]byte, 40+16+30)
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(b)-40-4))
	b[6], b[7] = 0, 64 // Hop-by-Hop next
	b[8], b[24] = 0x20, 0x20
	// Hop-by-Hop: next TCP, 16 bytes: PadN of 2, router alert, Pad1s.
	copy(b[40:], []byte{6, 1, 1, 2, 0, 0, 5, 2, 0, 0, 0, 0, 0, 0, 0, 0})
	return b
}

func TestIPv6HeaderMatchesGopacket(t *testing.T) {
	rng := rand.New(rand.NewSource(6))
	samples := mangle(rng, ip6Sample(), []int{4, 5, 6, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49}, 200000)
	noHBH := ip6Sample()
	noHBH[6] = 17
	samples = append(samples, mangle(rng, noHBH, []int{4, 5, 6}, 20000)...)
	for _, b := range samples {
		var h ip6Header
		ok := h.decode(b)
		// What the decoder took from gopacket: a payload length of 0 read
		// as the captured bytes, without a Hop-by-Hop header.
		if len(b) >= 40 && b[4] == 0 && b[5] == 0 {
			if !ok || h.length != 0 || h.next != b[6] || h.hbhLen != 0 || !sameSlice(h.payload, b[40:]) {
				t.Fatalf("% x: %+v", b, h)
			}
			continue
		}
		var ref layers.IPv6
		refErr := ref.DecodeFromBytes(b, gopacket.NilDecodeFeedback)
		if ok != (refErr == nil) {
			t.Fatalf("% x: decode %v, gopacket %v", b, ok, refErr)
		}
		if !ok {
			continue
		}
		next, hbh := ref.NextHeader, 0
		if ref.HopByHop != nil {
			next, hbh = ref.HopByHop.NextHeader, ref.HopByHop.ActualLength
		}
		if h.length != ref.Length || h.next != uint8(next) || h.hbhLen != hbh ||
			!bytes.Equal(h.src, ref.SrcIP) || !bytes.Equal(h.dst, ref.DstIP) || !sameSlice(h.payload, ref.Payload) {
			t.Fatalf("% x: %+v, gopacket %+v", b, h, ref)
		}
	}
}

func TestTCPHeaderMatchesGopacket(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	good := make([]byte, 40+20)
	binary.BigEndian.PutUint16(good[0:], 40000)
	binary.BigEndian.PutUint16(good[2:], 80)
	binary.BigEndian.PutUint32(good[4:], 0x01020304)
	binary.BigEndian.PutUint32(good[8:], 0x05060708)
	good[12], good[13] = 0xa0, 0x12
	// MSS, NOP, window scale, SACK permitted, timestamps
	copy(good[20:], []byte{2, 4, 5, 0xb4, 1, 3, 3, 7, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0})
	for _, b := range mangle(rng, good, []int{12, 13, 20, 21, 24, 25, 26, 27, 28, 29, 30, 31}, 200000) {
		var ref layers.TCP
		refErr := ref.DecodeFromBytes(b, gopacket.NilDecodeFeedback)
		var h tcpHeader
		ok := h.decode(b)
		if ok != (refErr == nil) {
			t.Fatalf("% x: decode %v, gopacket %v", b, ok, refErr)
		}
		if !ok {
			continue
		}
		var flags uint8
		for i, set := range []bool{ref.FIN, ref.SYN, ref.RST, ref.PSH, ref.ACK} {
			if set {
				flags |= 1 << i
			}
		}
		if h.srcPort != uint16(ref.SrcPort) || h.dstPort != uint16(ref.DstPort) || h.seq != ref.Seq || h.ack != ref.Ack ||
			h.dataOffset != ref.DataOffset || h.flags != flags || !sameSlice(h.payload, ref.Payload) {
			t.Fatalf("% x: %+v, gopacket %+v", b, h, ref)
		}
	}
}

func TestUDPAndICMPHeadersMatchGopacket(t *testing.T) {
	rng := rand.New(rand.NewSource(8))
	good := make([]byte, 8+24)
	binary.BigEndian.PutUint16(good[0:], 53)
	binary.BigEndian.PutUint16(good[2:], 40000)
	binary.BigEndian.PutUint16(good[4:], 20)
	for _, b := range mangle(rng, good, []int{0, 1, 4, 5}, 50000) {
		var ref layers.UDP
		refErr := ref.DecodeFromBytes(b, gopacket.NilDecodeFeedback)
		var h udpHeader
		ok := h.decode(b)
		if ok != (refErr == nil) {
			t.Fatalf("% x: decode %v, gopacket %v", b, ok, refErr)
		}
		if ok && (h.srcPort != uint16(ref.SrcPort) || h.dstPort != uint16(ref.DstPort) || h.length != ref.Length ||
			!sameSlice(h.payload, ref.Payload)) {
			t.Fatalf("% x: %+v, gopacket %+v", b, h, ref)
		}
		var ref4 layers.ICMPv4
		err4 := ref4.DecodeFromBytes(b, gopacket.NilDecodeFeedback)
		typ, code, ok := icmpHeader(b, false)
		if ok != (err4 == nil) || ok && (typ != ref4.TypeCode.Type() || code != ref4.TypeCode.Code()) {
			t.Fatalf("% x: icmp %d/%d %v, gopacket %v %v", b, typ, code, ok, ref4.TypeCode, err4)
		}
		var ref6 layers.ICMPv6
		err6 := ref6.DecodeFromBytes(b, gopacket.NilDecodeFeedback)
		typ, code, ok = icmpHeader(b, true)
		if ok != (err6 == nil) || ok && (typ != ref6.TypeCode.Type() || code != ref6.TypeCode.Code()) {
			t.Fatalf("% x: icmp6 %d/%d %v, gopacket %v %v", b, typ, code, ok, ref6.TypeCode, err6)
		}
	}
}

// sameSlice: the same bytes of the same frame, or both empty.
func sameSlice(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	return &a[0] == &b[0] && len(a) == len(b)
}
