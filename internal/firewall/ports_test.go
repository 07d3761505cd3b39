package firewall_test

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/net/bpf"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
)

// TestPortBindingPasses: what the bind chain lets through from a bound
// port, as Passes says it, for the frames the lab's own guests send (the
// forged ones are checked against the real bridge in internal/netlab's
// TestHostileGuest): IPv4 from its address, ARP for its address and
// address-conflict probes, and DHCP requests from 0.0.0.0 only where the
// lab serves DHCP. PcapFilter, compiled by tcpdump as a sensor's libpcap
// compiles it, must say the same of each frame.
func TestPortBindingPasses(t *testing.T) {
	mac, other := net.HardwareAddr{2, 0, 0, 0, 0, 1}, net.HardwareAddr{2, 0, 0, 0, 0, 2}
	ip, gw := netip.MustParseAddr("10.13.37.10"), netip.MustParseAddr("10.13.37.1")
	b := firewall.PortBinding{MAC: mac, IP: ip}
	frame := func(ls ...gopacket.SerializableLayer) []byte {
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, ls...); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	eth := func(src net.HardwareAddr, typ layers.EthernetType) *layers.Ethernet {
		return &layers.Ethernet{SrcMAC: src, DstMAC: net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, EthernetType: typ}
	}
	udp := func(src net.HardwareAddr, from netip.Addr, sport, dport uint16, options ...layers.IPv4Option) []byte {
		i := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: from.AsSlice(), DstIP: gw.AsSlice(), Options: options}
		return frame(eth(src, layers.EthernetTypeIPv4), i, &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)})
	}
	arp := func(op uint16, sha net.HardwareAddr, spa netip.Addr) []byte {
		return frame(eth(mac, layers.EthernetTypeARP), &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
			HwAddressSize: 6, ProtAddressSize: 4, Operation: op, SourceHwAddress: sha, SourceProtAddress: spa.AsSlice(),
			DstHwAddress: make([]byte, 6), DstProtAddress: gw.AsSlice()})
	}
	ipv6 := func(src net.HardwareAddr, from string) []byte {
		i := &layers.IPv6{Version: 6, HopLimit: 255, NextHeader: layers.IPProtocolNoNextHeader,
			SrcIP: netip.MustParseAddr(from).AsSlice(), DstIP: netip.MustParseAddr("ff02::2").AsSlice()}
		return frame(eth(src, layers.EthernetTypeIPv6), i)
	}
	zero := netip.IPv4Unspecified()
	for _, tc := range []struct {
		name               string
		frame              []byte
		dhcp, want, forged bool
	}{
		{"ipv4 from its address", udp(mac, ip, 40000, 53), false, true, false},
		{"ipv4 from another address", udp(mac, gw, 40000, 53), false, false, true},
		{"ipv4 from another MAC", udp(other, ip, 40000, 53), false, false, true},
		{"dhcp request from 0.0.0.0, the lab serving DHCP", udp(mac, zero, 68, 67), true, true, false},
		{"the same, IP options before the UDP header", udp(mac, zero, 68, 67, layers.IPv4Option{OptionType: 1}, layers.IPv4Option{OptionType: 1},
			layers.IPv4Option{OptionType: 1}, layers.IPv4Option{OptionType: 1}), true, true, false},
		{"dhcp request from 0.0.0.0, no DHCP in the lab", udp(mac, zero, 68, 67), false, false, false},
		{"other udp from 0.0.0.0", udp(mac, zero, 68, 53), true, false, true},
		{"arp for its address", arp(layers.ARPRequest, mac, ip), false, true, false},
		{"arp probe (RFC 5227)", arp(layers.ARPRequest, mac, zero), false, true, false},
		{"arp reply from 0.0.0.0", arp(layers.ARPReply, mac, zero), false, false, true},
		{"arp for another address", arp(layers.ARPReply, mac, gw), false, false, true},
		{"arp naming another MAC", arp(layers.ARPRequest, other, ip), false, false, true},
		{"ipv6 from ::", ipv6(mac, "::"), false, false, false},
		{"ipv6 from a link-local address", ipv6(mac, "fe80::1"), false, false, false},
		{"ipv6 from a routable address, which the lab never gave", ipv6(mac, "2001:db8::1"), false, false, true},
		{"ipv6 cut short", ipv6(mac, "2001:db8::1")[:40], false, false, false},
		{"another ethertype", frame(eth(mac, layers.EthernetTypeLLC), gopacket.Payload(make([]byte, 40))), false, false, false},
		{"another ethertype from another MAC", frame(eth(other, layers.EthernetTypeIPv6), gopacket.Payload(make([]byte, 40))), false, false, true},
		{"a runt", []byte{1, 2, 3}, false, false, false},
		{"an ipv4 header cut short", udp(mac, ip, 40000, 53)[:30], false, false, false},
	} {
		if got := b.Passes(tc.frame, tc.dhcp); got != tc.want {
			t.Errorf("%s: Passes %v, want %v", tc.name, got, tc.want)
		}
		if got := b.Forged(tc.frame); got != tc.forged {
			t.Errorf("%s: Forged %v, want %v", tc.name, got, tc.forged)
		}
		if got := runFilter(t, b.PcapFilter(tc.dhcp), tc.frame); got != tc.want {
			t.Errorf("%s: PcapFilter %v, want %v (%s)", tc.name, got, tc.want, b.PcapFilter(tc.dhcp))
		}
	}
}

// runFilter compiles a pcap-filter expression for Ethernet as tb-capture
// compiles a capture's (tcpdump -ddd) and runs it on frame.
func runFilter(t *testing.T, expr string, frame []byte) bool {
	t.Helper()
	prog, err := capture.CompileFilter(context.Background(), expr, 0)
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]bpf.RawInstruction, len(prog))
	for i, f := range prog {
		raw[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatalf("%q: an instruction the test's BPF machine does not know", expr)
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatal(err)
	}
	n, err := vm.Run(frame)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}
