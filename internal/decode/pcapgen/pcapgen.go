// Package pcapgen writes synthetic captures for tests, fuzz seeds and the
// benchmark: TCP conversations with handshakes, DNS exchanges, TLS hellos,
// HTTP, ICMP and fragments, over Ethernet (optionally VLAN-tagged), Linux
// cooked capture or raw IP, to pcap or pcapng.
package pcapgen

import (
	"cmp"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// Options choose the capture's framing.
type Options struct {
	Link layers.LinkType // LinkTypeEthernet (default), LinkTypeLinuxSLL or LinkTypeRaw
	VLAN uint16          // 802.1Q tag on Ethernet frames (0: none)
	NG   bool            // pcapng instead of pcap
	Nano bool            // nanosecond pcap timestamps
}

type packetWriter interface {
	WritePacket(ci gopacket.CaptureInfo, data []byte) error
}

// Gen writes packets. Each packet is stamped T, then T advances by Step.
type Gen struct {
	opt  Options
	out  packetWriter
	ng   *pcapgo.NgWriter
	T    time.Time
	Step time.Duration
	buf  gopacket.SerializeBuffer
	err  error
	// N counts the packets written.
	N int64
}

// Start is the default first timestamp.
var Start = time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)

// New writes the capture header to w.
func New(w io.Writer, opt Options) (*Gen, error) {
	opt.Link = cmp.Or(opt.Link, layers.LinkTypeEthernet)
	g := &Gen{opt: opt, T: Start, Step: time.Millisecond, buf: gopacket.NewSerializeBuffer()}
	if opt.NG {
		ng, err := pcapgo.NewNgWriter(w, opt.Link)
		if err != nil {
			return nil, err
		}
		g.ng, g.out = ng, ng
		return g, nil
	}
	var pw *pcapgo.Writer
	if opt.Nano {
		pw = pcapgo.NewWriterNanos(w)
	} else {
		pw = pcapgo.NewWriter(w)
	}
	if err := pw.WriteFileHeader(262144, opt.Link); err != nil {
		return nil, err
	}
	g.out = pw
	return g, nil
}

// WriteFile writes a capture of build's packets to path, flushed and
// closed, and returns the first error of any of that.
func WriteFile(path string, opt Options, build func(g *Gen)) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	g, err := New(f, opt)
	if err == nil {
		build(g)
		err = g.Flush()
	}
	return errors.Join(err, f.Close())
}

// Err is the first write error.
func (g *Gen) Err() error { return g.err }

// Flush ends a pcapng capture's buffering; it is a no-op for pcap.
func (g *Gen) Flush() error {
	if g.ng != nil && g.err == nil {
		g.err = g.ng.Flush()
	}
	return g.err
}

// Frame writes one raw frame as captured.
func (g *Gen) Frame(data []byte) {
	if g.err != nil {
		return
	}
	ci := gopacket.CaptureInfo{Timestamp: g.T, CaptureLength: len(data), Length: len(data)}
	if g.ng != nil {
		ci.InterfaceIndex = 0
	}
	g.err = g.out.WritePacket(ci, data)
	g.T = g.T.Add(g.Step)
	g.N++
}

var (
	macA = net.HardwareAddr{0x52, 0x54, 0x00, 0x13, 0x37, 0x05}
	macB = net.HardwareAddr{0x52, 0x54, 0x00, 0x13, 0x37, 0x01}
)

// IPPacket frames and writes one IP packet with the given layers above IP.
func (g *Gen) IPPacket(src, dst netip.Addr, proto layers.IPProtocol, above ...gopacket.SerializableLayer) {
	ls := g.link(src.Is4())
	var ip gopacket.NetworkLayer
	if src.Is4() {
		ip4 := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(), Flags: layers.IPv4DontFragment}
		ls = append(ls, ip4)
		ip = ip4
	} else {
		ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		ls = append(ls, ip6)
		ip = ip6
	}
	for _, l := range above {
		switch t := l.(type) {
		case *layers.TCP:
			t.SetNetworkLayerForChecksum(ip)
		case *layers.UDP:
			t.SetNetworkLayerForChecksum(ip)
		case *layers.ICMPv6:
			t.SetNetworkLayerForChecksum(ip)
		}
	}
	g.write(append(ls, above...)...)
}

func (g *Gen) link(v4 bool) []gopacket.SerializableLayer {
	et := layers.EthernetTypeIPv4
	if !v4 {
		et = layers.EthernetTypeIPv6
	}
	switch g.opt.Link {
	case layers.LinkTypeRaw:
		return nil
	case layers.LinkTypeLinuxSLL:
		return []gopacket.SerializableLayer{&sll{proto: et}}
	}
	if g.opt.VLAN != 0 {
		return []gopacket.SerializableLayer{
			&layers.Ethernet{SrcMAC: macA, DstMAC: macB, EthernetType: layers.EthernetTypeDot1Q},
			&layers.Dot1Q{VLANIdentifier: g.opt.VLAN, Type: et},
		}
	}
	return []gopacket.SerializableLayer{&layers.Ethernet{SrcMAC: macA, DstMAC: macB, EthernetType: et}}
}

func (g *Gen) write(ls ...gopacket.SerializableLayer) {
	if g.err != nil {
		return
	}
	g.buf.Clear()
	if err := gopacket.SerializeLayers(g.buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		g.err = err
		return
	}
	g.Frame(g.buf.Bytes())
}

// sll is a Linux cooked capture header (gopacket cannot serialize one).
type sll struct{ proto layers.EthernetType }

func (s *sll) LayerType() gopacket.LayerType { return layers.LayerTypeLinuxSLL }

func (s *sll) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(16)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint16(h[0:], 0) // sent to us
	binary.BigEndian.PutUint16(h[2:], 1) // ARPHRD_ETHER
	binary.BigEndian.PutUint16(h[4:], 6)
	copy(h[6:14], macA)
	binary.BigEndian.PutUint16(h[14:], uint16(s.proto))
	return nil
}

// UDP writes one datagram.
func (g *Gen) UDP(src, dst netip.AddrPort, payload []byte) {
	g.IPPacket(src.Addr(), dst.Addr(), layers.IPProtocolUDP,
		&layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}, gopacket.Payload(payload))
}

// Flags of a TCP segment.
const (
	FIN = 1 << iota
	SYN
	RST
	PSH
	ACK
)

// TCP writes one segment.
func (g *Gen) TCP(src, dst netip.AddrPort, seq, ack uint32, flags int, payload []byte) {
	t := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()), Seq: seq, Ack: ack, Window: 64240,
		FIN: flags&FIN != 0, SYN: flags&SYN != 0, RST: flags&RST != 0, PSH: flags&PSH != 0, ACK: flags&ACK != 0}
	if len(payload) > 0 {
		g.IPPacket(src.Addr(), dst.Addr(), layers.IPProtocolTCP, t, gopacket.Payload(payload))
		return
	}
	g.IPPacket(src.Addr(), dst.Addr(), layers.IPProtocolTCP, t)
}

// ICMPEcho writes an echo request (or reply) with the given payload.
func (g *Gen) ICMPEcho(src, dst netip.Addr, reply bool, id, seq uint16, payload []byte) {
	if src.Is4() {
		typ := uint8(layers.ICMPv4TypeEchoRequest)
		if reply {
			typ = layers.ICMPv4TypeEchoReply
		}
		g.IPPacket(src, dst, layers.IPProtocolICMPv4, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, 0), Id: id, Seq: seq}, gopacket.Payload(payload))
		return
	}
	typ := uint8(layers.ICMPv6TypeEchoRequest)
	if reply {
		typ = layers.ICMPv6TypeEchoReply
	}
	body := make([]byte, 4+len(payload))
	binary.BigEndian.PutUint16(body[0:], id)
	binary.BigEndian.PutUint16(body[2:], seq)
	copy(body[4:], payload)
	g.IPPacket(src, dst, layers.IPProtocolICMPv6, &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, 0)}, gopacket.Payload(body))
}

// Fragments writes one IPv4 UDP datagram split into fragments of at most
// size payload bytes (a multiple of 8), in the given order of indices (nil:
// in order).
func (g *Gen) Fragments(src, dst netip.AddrPort, payload []byte, size int, order []int, id uint16) {
	// Build the UDP datagram whole, then cut its bytes.
	b := gopacket.NewSerializeBuffer()
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
	u := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
	u.SetNetworkLayerForChecksum(ip)
	if err := gopacket.SerializeLayers(b, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, u, gopacket.Payload(payload)); err != nil {
		g.err = err
		return
	}
	whole := b.Bytes()
	var pieces [][2]int
	for off := 0; off < len(whole); off += size {
		pieces = append(pieces, [2]int{off, min(off+size, len(whole))})
	}
	if order == nil {
		for i := range pieces {
			order = append(order, i)
		}
	}
	for _, i := range order {
		p := pieces[i]
		frag := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: ip.SrcIP, DstIP: ip.DstIP,
			Id: id, FragOffset: uint16(p[0] / 8)}
		if p[1] < len(whole) {
			frag.Flags = layers.IPv4MoreFragments
		}
		ls := append(g.link(true), frag, gopacket.Payload(whole[p[0]:p[1]]))
		g.write(ls...)
	}
}
