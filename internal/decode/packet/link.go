package packet

import (
	"encoding/binary"

	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
)

// Everything around an IP packet (Ethernet, tags, MPLS, PPP, PPPoE,
// tunnels) is read here, from the EtherType that names it; the IP and
// transport headers in headers.go.

// EtherTypes read by hand.
const (
	etherIPv4    = 0x0800
	etherIPv6    = 0x86dd
	etherVLAN    = 0x8100
	etherQinQ    = 0x88a8
	etherQinQOld = 0x9100 // QinQ before 802.1ad
	etherMPLS    = 0x8847
	etherMPLSMc  = 0x8848
	etherPPPoE   = 0x8864 // session stage (discovery carries no IP)
	etherTEB     = 0x6558 // Ethernet in GRE, Geneve
	etherERSPAN  = 0x88be // ERSPAN type II (type I when GRE has no sequence number)
	etherERSPAN3 = 0x22eb
)

// maxTunnels bounds the tunnels followed into one packet: a capture
// point's mirror (ERSPAN), an overlay (VXLAN) and the sample's own tunnels
// fit; a packet nested deeper is counted in Stats.Deep and only its outer
// flows are recorded.
const maxTunnels = 8

// ether decodes what an EtherType names: tags, MPLS labels, PPPoE and
// Ethernet in a tunnel, until the IP packet they carry.
func (d *Decoder) ether(p *capfile.Packet, et uint16, b []byte) {
	// Every step consumes a header, so the loop ends with the frame.
	for {
		switch et {
		case etherIPv4:
			d.ipv4(p, b)
			return
		case etherIPv6:
			d.ipv6(p, b)
			return
		case etherVLAN, etherQinQ, etherQinQOld:
			if len(b) < 4 {
				d.Malformed++
				return
			}
			et, b = binary.BigEndian.Uint16(b[2:]), b[4:]
		case etherMPLS, etherMPLSMc:
			// The label stack, then IPv4 or IPv6 by the first nibble
			// (MPLS does not say what it carries).
			for {
				if len(b) < 4 {
					d.Malformed++
					return
				}
				bottom := b[2]&1 != 0
				b = b[4:]
				if bottom {
					break
				}
			}
			d.ip(p, b)
			return
		case etherPPPoE:
			if len(b) < 6 || b[0] != 0x11 || b[1] != 0 {
				d.Malformed++
				return
			}
			if et, b = pppProto(b[6:]); et == 0 {
				d.NonIP++
				return
			}
		case etherTEB:
			if len(b) < 14 {
				d.Malformed++
				return
			}
			et, b = binary.BigEndian.Uint16(b[12:]), b[14:]
		case etherERSPAN:
			if len(b) < 8 {
				d.Malformed++
				return
			}
			et, b = etherTEB, b[8:]
		case etherERSPAN3:
			// A 12-byte header, and an 8-byte platform subheader when
			// its O flag is set.
			if len(b) < 12 || (b[11]&1 != 0 && len(b) < 20) {
				d.Malformed++
				return
			}
			h := 12
			if b[11]&1 != 0 {
				h = 20
			}
			et, b = etherTEB, b[h:]
		default:
			d.NonIP++
			return
		}
	}
}

// ppp decodes a PPP frame (LINKTYPE_PPP, PPP_HDLC), or a Cisco HDLC frame
// that PPP_HDLC may also hold.
func (d *Decoder) ppp(p *capfile.Packet, b []byte) {
	if len(b) >= 4 && (b[0] == 0x0f || b[0] == 0x8f) && b[1] == 0 {
		d.ether(p, binary.BigEndian.Uint16(b[2:]), b[4:])
		return
	}
	et, rest := pppProto(b)
	if et == 0 {
		d.NonIP++
		return
	}
	d.ether(p, et, rest)
}

// pppProto reads a PPP header, with or without the HDLC-like address and
// control bytes and with a one- or two-byte protocol, and returns the
// EtherType of what it carries: 0 for anything but IP and MPLS (LCP, IPCP,
// compressed data, …).
func pppProto(b []byte) (uint16, []byte) {
	if len(b) >= 2 && b[0] == 0xff && b[1] == 0x03 {
		b = b[2:]
	}
	var proto uint16
	switch {
	case len(b) >= 1 && b[0]&1 != 0:
		proto, b = uint16(b[0]), b[1:]
	case len(b) >= 2:
		proto, b = binary.BigEndian.Uint16(b), b[2:]
	default:
		return 0, nil
	}
	switch proto {
	case 0x0021:
		return etherIPv4, b
	case 0x0057:
		return etherIPv6, b
	case 0x0281, 0x0283:
		return etherMPLS, b
	}
	return 0, nil
}

// nflog finds the packet in a Linux NFLOG record: a 4-byte header, then
// type-length-value attributes padded to 4 bytes, in the capturing host's
// byte order (told by the first attribute's length); the packet (an IP
// packet) is attribute 9, NFULA_PAYLOAD.
func (d *Decoder) nflog(p *capfile.Packet, b []byte) {
	if len(b) < 8 {
		d.Malformed++
		return
	}
	b = b[4:]
	var order binary.ByteOrder = binary.LittleEndian
	if l := order.Uint16(b); l < 4 || int(l) > len(b) {
		order = binary.BigEndian
	}
	for len(b) >= 4 {
		l, t := int(order.Uint16(b)), order.Uint16(b[2:])
		if l < 4 || l > len(b) {
			d.Malformed++
			return
		}
		if t == 9 {
			d.ip(p, b[4:l])
			return
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	d.NonIP++
}

// tunnel decodes the packet a tunnel carries. The outer packet has been
// counted already, as a flow of its own between the tunnel's endpoints.
func (d *Decoder) tunnel(p *capfile.Packet, proto uint8, b []byte) {
	var et uint16
	switch proto {
	case 4:
		et = etherIPv4
	case 41:
		et = etherIPv6
	case 137: // MPLS in IP
		et = etherMPLS
	case 47:
		et, b = gre(b)
	case 17:
		et, b = udpTunnel(b)
	}
	if et == 0 {
		return
	}
	if d.encap >= maxTunnels {
		d.Deep++
		return
	}
	d.encap++
	d.Tunnelled++
	d.ether(p, et, b)
}

// gre reads a GRE header (version 0: RFC 2784 with RFC 2890's key and
// sequence number) and returns the EtherType it carries. ERSPAN type I is
// an Ethernet frame right after a GRE header without sequence number.
func gre(b []byte) (uint16, []byte) {
	if len(b) < 4 {
		return 0, nil
	}
	flags, et := binary.BigEndian.Uint16(b), binary.BigEndian.Uint16(b[2:])
	if flags&0x4007 != 0 { // routing present (RFC 1701), or another version (PPTP's)
		return 0, nil
	}
	h := 4
	if flags&0x8000 != 0 { // checksum
		h += 4
	}
	if flags&0x2000 != 0 { // key
		h += 4
	}
	if flags&0x1000 != 0 { // sequence number
		h += 4
	}
	if et == etherERSPAN && flags&0x1000 == 0 {
		et = etherTEB
	}
	if len(b) < h {
		return 0, nil
	}
	return et, b[h:]
}

// udpTunnel reads VXLAN (RFC 7348, port 4789) and Geneve (RFC 8926, port
// 6081) by their destination port, both directions of a tunnel using it,
// and returns the EtherType of what they carry (0: not a tunnel).
func udpTunnel(b []byte) (uint16, []byte) {
	if len(b) < 8 {
		return 0, nil
	}
	port := binary.BigEndian.Uint16(b[2:])
	b = b[8:]
	switch port {
	case 4789:
		// Flags with the valid-VNI bit, the VNI, then an Ethernet frame.
		if len(b) < 8 || b[0]&0x08 == 0 {
			return 0, nil
		}
		return etherTEB, b[8:]
	case 6081:
		// Version 0, the options' length in 4-byte words, the protocol.
		if len(b) < 8 || b[0]>>6 != 0 {
			return 0, nil
		}
		h := 8 + int(b[0]&0x3f)*4
		if len(b) < h {
			return 0, nil
		}
		return binary.BigEndian.Uint16(b[2:]), b[h:]
	}
	return 0, nil
}
