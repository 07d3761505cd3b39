package packet

import "encoding/binary"

// The IP and transport headers, read at fixed offsets with every length
// checked against the captured bytes. What they accept and refuse is what
// gopacket's layers accepted and refused when the decoder used them
// (headers_test.go compares the two on random and mangled headers): a
// header they refuse is a malformed frame. They keep only the fields the
// decoder reads, point into the frame and allocate nothing.

// ip4Header is an IPv4 header.
type ip4Header struct {
	src, dst []byte // 4 bytes each
	// length is the total length, the captured length when the header
	// says 0 (a segment captured before the NIC split it: TSO).
	length  uint16
	hdrLen  int // IHL in bytes
	id      uint16
	more    bool   // more fragments
	fragOff uint16 // in 8-byte units
	proto   uint8
	payload []byte // up to the total length
}

// decode reads b as an IPv4 header and its payload; false when malformed.
// The version nibble is not checked: the EtherType or link type said IPv4.
func (h *ip4Header) decode(b []byte) bool {
	if len(b) < 20 {
		return false
	}
	ihl := int(b[0] & 0x0f)
	h.length = binary.BigEndian.Uint16(b[2:4])
	if h.length == 0 {
		h.length = uint16(len(b))
	}
	h.id = binary.BigEndian.Uint16(b[4:6])
	ff := binary.BigEndian.Uint16(b[6:8])
	h.more, h.fragOff = ff&0x2000 != 0, ff&0x1fff
	h.proto = b[9]
	h.src, h.dst = b[12:16], b[16:20]
	if h.length < 20 || ihl < 5 || ihl*4 > int(h.length) {
		return false
	}
	if len(b) > int(h.length) {
		b = b[:h.length]
	} else if ihl*4 > len(b) {
		return false
	}
	h.hdrLen = ihl * 4
	h.payload = b[h.hdrLen:]
	return optionsValid(b[20:h.hdrLen], 3)
}

// optionsValid walks IPv4 or TCP options: each but End and NOP has a
// length of at least minLen (3 for IPv4, 2 for TCP) within the header.
func optionsValid(b []byte, minLen int) bool {
	for len(b) > 0 {
		switch b[0] {
		case 0: // end of options: the rest is padding
			return true
		case 1: // NOP
			b = b[1:]
		default:
			if len(b) < 2 {
				return false
			}
			l := int(b[1])
			if l < minLen || l > len(b) {
				return false
			}
			b = b[l:]
		}
	}
	return true
}

// ip6Header is an IPv6 header with the Hop-by-Hop options header that may
// follow it.
type ip6Header struct {
	src, dst []byte // 16 bytes each
	// length is the payload length (0: the rest of the captured frame, as
	// Zeek reads a jumbogram or a segment captured before the NIC split
	// it; no Hop-by-Hop header is read then).
	length uint16
	// next is the header after the Hop-by-Hop header if there is one,
	// else after the fixed header; hbhLen is the Hop-by-Hop header's
	// length (0: none).
	next   uint8
	hbhLen int
	// payload follows the fixed and Hop-by-Hop headers, at most length
	// bytes.
	payload []byte
}

// decode reads b as an IPv6 header; false when malformed.
func (h *ip6Header) decode(b []byte) bool {
	if len(b) < 40 {
		return false
	}
	h.length = binary.BigEndian.Uint16(b[4:6])
	h.next = b[6]
	h.src, h.dst = b[8:24], b[24:40]
	h.hbhLen = 0
	h.payload = b[40:]
	if h.length == 0 {
		return true
	}
	if h.next == 0 {
		n, ok := hopByHop(h.payload)
		if !ok {
			return false
		}
		h.next, h.hbhLen = h.payload[0], n
		h.payload = h.payload[n:]
	}
	h.payload = h.payload[:min(int(h.length), len(h.payload))]
	return true
}

// hopByHop reads a Hop-by-Hop options header at the start of b and returns
// its length. Its options are type-length-values, each within b; a jumbo
// payload option is refused, as the payload length is not 0.
func hopByHop(b []byte) (int, bool) {
	if len(b) < 2 {
		return 0, false
	}
	n := int(b[1])*8 + 8
	if len(b) < n {
		return 0, false
	}
	for off := 2; off < n; {
		o := b[off:]
		if len(o) < 2 {
			return 0, false
		}
		if o[0] == 0 { // Pad1
			off++
			continue
		}
		l := int(o[1]) + 2
		if len(o) < l || o[0] == 0xc2 { // 0xc2: jumbo payload
			return 0, false
		}
		off += l
	}
	return n, true
}

// tcpHeader is a TCP header.
type tcpHeader struct {
	srcPort, dstPort uint16
	seq, ack         uint32
	dataOffset       uint8 // in 4-byte words
	flags            uint8 // FIN, SYN, RST, PSH, ACK as flagFIN…flagACK
	payload          []byte
}

// decode reads b as a TCP header and its payload; false when malformed.
func (h *tcpHeader) decode(b []byte) bool {
	if len(b) < 20 {
		return false
	}
	h.srcPort, h.dstPort = binary.BigEndian.Uint16(b[0:2]), binary.BigEndian.Uint16(b[2:4])
	h.seq, h.ack = binary.BigEndian.Uint32(b[4:8]), binary.BigEndian.Uint32(b[8:12])
	h.dataOffset = b[12] >> 4
	// FIN, SYN, RST, PSH and ACK are the header's low five flag bits, in
	// the order of flagFIN…flagACK.
	h.flags = b[13] & (flagFIN | flagSYN | flagRST | flagPSH | flagACK)
	start := int(h.dataOffset) * 4
	if h.dataOffset < 5 || start > len(b) {
		return false
	}
	h.payload = b[start:]
	return optionsValid(b[20:start], 2)
}

// udpHeader is a UDP header.
type udpHeader struct {
	srcPort, dstPort uint16
	length           uint16
	// payload is up to the UDP length (the captured bytes when it is 0).
	payload []byte
}

// decode reads b as a UDP header and its payload; false when malformed (a
// length between 1 and 7).
func (h *udpHeader) decode(b []byte) bool {
	if len(b) < 8 {
		return false
	}
	h.srcPort, h.dstPort = binary.BigEndian.Uint16(b[0:2]), binary.BigEndian.Uint16(b[2:4])
	h.length = binary.BigEndian.Uint16(b[4:6])
	switch {
	case h.length >= 8:
		h.payload = b[8:min(int(h.length), len(b))]
	case h.length == 0:
		h.payload = b[8:]
	default:
		return false
	}
	return true
}

// icmpHeader reads the type and code of an ICMPv4 message (an 8-byte
// header) or an ICMPv6 one (4 bytes); false when too short.
func icmpHeader(b []byte, v6 bool) (typ, code uint8, ok bool) {
	n := 8
	if v6 {
		n = 4
	}
	if len(b) < n {
		return 0, 0, false
	}
	return b[0], b[1], true
}
