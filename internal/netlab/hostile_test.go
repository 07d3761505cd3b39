package netlab_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

var broadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func serialize(t *testing.T, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(buf.Bytes())
}

// udpFrame is an IPv4/UDP frame with any addresses the sender likes.
func udpFrame(t *testing.T, srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, dport uint16, payload []byte) []byte {
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	udp := &layers.UDP{SrcPort: 40000, DstPort: layers.UDPPort(dport)}
	udp.SetNetworkLayerForChecksum(ip)
	return serialize(t, eth, ip, udp, gopacket.Payload(payload))
}

// arpFrame is an ARP frame; the nonce rides in the padding after it.
func arpFrame(t *testing.T, op uint16, dstMAC, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr, nonce []byte) []byte {
	eth := &layers.Ethernet{SrcMAC: sha, DstMAC: dstMAC, EthernetType: layers.EthernetTypeARP}
	arp := &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
		Operation: op, SourceHwAddress: sha, SourceProtAddress: spa.AsSlice(), DstHwAddress: tha, DstProtAddress: tpa.AsSlice()}
	return serialize(t, eth, arp, gopacket.Payload(nonce))
}

// TestHostileGuest: a guest with root spoofs its neighbour's address and
// MAC, claims the gateway and the neighbour by ARP and sends other
// ethertypes. None of its frames passes the bridge, its neighbour's
// allow-listed endpoint stays out of its reach, the host keeps the
// neighbour's MAC, and the neighbour's traffic never reaches it.
func TestHostileGuest(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	victim := l.AddGuest("v", netip.MustParseAddr("10.13.37.10"))
	evil := l.AddGuest("e", netip.MustParseAddr("10.13.37.11"))
	for _, g := range []*labtest.Guest{victim, evil} {
		if err := netlab.AttachPort(ctx, cfg, g.LabPort()); err != nil {
			t.Fatal(err)
		}
	}
	// Attaching again is the same binding; another port cannot claim
	// the victim's address or MAC.
	if err := netlab.AttachPort(ctx, cfg, victim.LabPort()); err != nil {
		t.Fatalf("attaching again: %v", err)
	}
	steal := evil.LabPort()
	steal.IP = victim.IP
	if err := netlab.AttachPort(ctx, cfg, steal); err == nil {
		t.Fatal("a second port was bound to the victim's address")
	}
	steal = evil.LabPort()
	steal.MAC = victim.MAC
	if err := netlab.AttachPort(ctx, cfg, steal); err == nil {
		t.Fatal("a second port was bound to the victim's MAC")
	}
	fw, err := cfg.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	const c2Port = 8080
	err = fw.ApplyLease(ctx, firewall.LeaseRules{Lease: records.NewID("lease", time.Now()), IP: victim.IP, Port: victim.Port,
		Elements: []firewall.Element{{Dst: labtest.C2, Proto: "udp", Port: c2Port, Verdict: firewall.Forward}}})
	if err != nil {
		t.Fatal(err)
	}
	// The attacker's own lease: its rules must not lend it the victim's.
	if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: records.NewID("lease", time.Now()), IP: evil.IP, Port: evil.Port}); err != nil {
		t.Fatal(err)
	}
	// ApplyLease refuses a port bound to another address.
	if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: records.NewID("lease", time.Now()), IP: netip.MustParseAddr("10.13.37.12"), Port: evil.Port}); err == nil {
		t.Fatal("rules applied for an address on a port bound to another")
	}

	host := l.Handle(cfg.HostNS)
	br, err := host.LinkByName(cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	brMAC := br.Attrs().HardwareAddr
	atBridge := l.SniffFrames(cfg.HostNS, cfg.Bridge)
	atVictim := l.SniffFrames(victim.NS, "eth0")
	atEvil := l.SniffFrames(evil.NS, "eth0")
	inet := l.SniffFrames(l.Internet, l.InternetIf)
	sink := l.SniffFrames(cfg.SinkNS, cfg.SinkVeth+"p")

	// The victim reaches its allow-listed endpoint: the attacker has
	// something to steal.
	sendUDP(t, victim.NS, netip.AddrPortFrom(labtest.C2, c2Port).String(), []byte("victim-to-c2"))
	inet.Wait(t, "the victim's datagram at the c2", wait, func(p labtest.Packet) bool { return string(p.Payload) == "victim-to-c2" })

	gw := cfg.Gateway()
	attacks := []struct {
		name  string
		frame func(nonce []byte) []byte
	}{
		{"ipv4 with the neighbour's address", func(n []byte) []byte {
			return udpFrame(t, evil.MAC, brMAC, victim.IP, labtest.C2, c2Port, n)
		}},
		{"ipv4 with the neighbour's address and MAC", func(n []byte) []byte {
			return udpFrame(t, victim.MAC, brMAC, victim.IP, labtest.C2, c2Port, n)
		}},
		{"ipv4 with the neighbour's MAC", func(n []byte) []byte {
			return udpFrame(t, victim.MAC, brMAC, evil.IP, netip.MustParseAddr("192.0.2.7"), 9, n)
		}},
		{"ipv4 from 0.0.0.0 (no DHCP here)", func(n []byte) []byte {
			return udpFrame(t, evil.MAC, broadcastMAC, netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255"), 67, n)
		}},
		{"ipv4 from an unleased address", func(n []byte) []byte {
			return udpFrame(t, evil.MAC, brMAC, netip.MustParseAddr("10.13.37.99"), labtest.C2, c2Port, n)
		}},
		{"gratuitous arp for the gateway", func(n []byte) []byte {
			return arpFrame(t, layers.ARPRequest, broadcastMAC, evil.MAC, gw, make(net.HardwareAddr, 6), gw, n)
		}},
		{"gratuitous arp for the neighbour", func(n []byte) []byte {
			return arpFrame(t, layers.ARPReply, broadcastMAC, evil.MAC, victim.IP, broadcastMAC, victim.IP, n)
		}},
		{"arp reply to the host for the neighbour", func(n []byte) []byte {
			return arpFrame(t, layers.ARPReply, brMAC, evil.MAC, victim.IP, brMAC, gw, n)
		}},
		{"arp with the neighbour's MAC as sender", func(n []byte) []byte {
			return arpFrame(t, layers.ARPRequest, broadcastMAC, victim.MAC, evil.IP, make(net.HardwareAddr, 6), gw, n)
		}},
		{"another ethertype", func(n []byte) []byte {
			return serialize(t, &layers.Ethernet{SrcMAC: evil.MAC, DstMAC: broadcastMAC, EthernetType: 0x88b5}, gopacket.Payload(n))
		}},
		{"vlan-tagged ipv4", func(n []byte) []byte {
			eth := &layers.Ethernet{SrcMAC: evil.MAC, DstMAC: brMAC, EthernetType: layers.EthernetTypeDot1Q}
			vlan := &layers.Dot1Q{VLANIdentifier: 1, Type: layers.EthernetTypeIPv4}
			ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: evil.IP.AsSlice(), DstIP: labtest.C2.AsSlice()}
			udp := &layers.UDP{SrcPort: 40000, DstPort: c2Port}
			udp.SetNetworkLayerForChecksum(ip)
			return serialize(t, eth, vlan, ip, udp, gopacket.Payload(n))
		}},
	}
	nonces := map[string][]byte{}
	var frames [][]byte
	for _, a := range attacks {
		n := []byte("tb-attack-" + a.name)
		nonces[a.name] = n
		frames = append(frames, a.frame(n))
	}
	// Each attack three times, so that one lost frame proves nothing.
	for range 3 {
		labtest.SendFrames(t, evil.NS, "eth0", frames...)
	}
	// A frame the attacker may send, after the others: once it is through,
	// what came before it has been dropped or delivered.
	marker := udpFrame(t, evil.MAC, brMAC, evil.IP, netip.MustParseAddr("192.0.2.7"), 9, []byte("tb-marker"))
	labtest.SendFrames(t, evil.NS, "eth0", marker)
	sink.Wait(t, "the attacker's own datagram at the sinkhole", wait, func(p labtest.Packet) bool { return string(p.Payload) == "tb-marker" })
	atBridge.Wait(t, "the attacker's own datagram at the bridge", wait, func(p labtest.Packet) bool { return string(p.Payload) == "tb-marker" })
	// The bind chain as Go says it (what a capture on the port keeps out):
	// it agrees with the bridge on each frame, every attack dropped (as
	// checked below) and the attacker's own datagram let through.
	evilBinding := firewall.PortBinding{MAC: evil.MAC, IP: evil.IP}
	for i, a := range attacks {
		if evilBinding.Passes(frames[i], cfg.DHCP) {
			t.Errorf("%s: PortBinding.Passes lets through what the bridge drops", a.name)
		}
	}
	if !evilBinding.Passes(marker, cfg.DHCP) {
		t.Error("PortBinding.Passes drops the attacker's own datagram, which the bridge let through")
	}

	// A port on the bridge that was never attached (a tap plugged in
	// behind tb-lease's back) is not bound, so the bridge does not check
	// it; its frames carry no port's mark, and the lab forwards nothing
	// of them: as the victim, with the victim's MAC or as itself, it
	// reaches neither the victim's endpoint nor the sinkhole.
	rogue := l.AddGuest("r", netip.MustParseAddr("10.13.37.12"))
	rogueLink, err := host.LinkByName(rogue.Port)
	if err != nil {
		t.Fatal(err)
	}
	if err := host.LinkSetMaster(rogueLink, br); err != nil {
		t.Fatal(err)
	}
	if err := host.LinkSetUp(rogueLink); err != nil {
		t.Fatal(err)
	}
	waitUp(t, l, cfg.HostNS, rogue.Port)
	waitUp(t, l, rogue.NS, "eth0")
	unbound := counterOf(t, fw, "forward", "guest not from a bound port")
	// Its frames with the victim's MAC do not teach the bridge that the
	// victim is there (the victim's entry is static and sticky): the
	// host's datagram below still reaches the victim.
	rogueFrames := map[string]struct {
		src  net.HardwareAddr
		from netip.Addr
		to   netip.AddrPort
	}{
		"an unattached port with the neighbour's MAC": {victim.MAC, rogue.IP, netip.MustParseAddrPort("192.0.2.7:9")},
		"an unattached port as the neighbour":         {rogue.MAC, victim.IP, netip.AddrPortFrom(labtest.C2, c2Port)},
		"an unattached port as itself":                {rogue.MAC, rogue.IP, netip.AddrPortFrom(labtest.C2, c2Port)},
	}
	for name, f := range rogueFrames {
		n := []byte("tb-rogue-" + name)
		nonces[name] = n
		labtest.SendFrames(t, rogue.NS, "eth0", udpFrame(t, f.src, brMAC, f.from, f.to.Addr(), f.to.Port(), n))
	}
	// Each is dropped there or arrives somewhere (and is reported below).
	waitAccounted(t, "the unattached port's datagrams", len(rogueFrames), func() int {
		n := int(counterOf(t, fw, "forward", "guest not from a bound port") - unbound)
		for name := range rogueFrames {
			if len(sink.Seen(func(p labtest.Packet) bool { return bytes.Contains(p.Frame, nonces[name]) }))+
				len(inet.Seen(func(p labtest.Packet) bool { return bytes.Contains(p.Frame, nonces[name]) })) > 0 {
				n++
			}
		}
		return n
	})

	// The victim talks to the host and is answered; the answers go to it.
	var echo net.PacketConn
	labtest.In(t, cfg.HostNSPath(), func() (err error) {
		echo, err = net.ListenPacket("udp4", net.JoinHostPort(gw.String(), "0"))
		return err
	})
	defer echo.Close()
	// The host's input chain drops guests' packets; this listener is only
	// reached through a reply the host sends itself.
	var reply net.PacketConn
	labtest.In(t, victim.NS, func() (err error) {
		reply, err = net.ListenPacket("udp4", net.JoinHostPort(victim.IP.String(), "7001"))
		return err
	})
	defer reply.Close()
	if _, err := echo.WriteTo([]byte("host-to-victim"), &net.UDPAddr{IP: victim.IP.AsSlice(), Port: 7001}); err != nil {
		t.Fatal(err)
	}
	reply.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 64)
	if n, _, err := reply.ReadFrom(buf); err != nil || string(buf[:n]) != "host-to-victim" {
		t.Fatalf("the victim did not get the host's datagram: %q %v", buf[:n], err)
	}

	for name, n := range nonces {
		for where, s := range map[string]*labtest.Sniffer{"the bridge": atBridge, "the neighbour": atVictim, "the internet": inet, "the sinkhole": sink} {
			if strings.HasPrefix(name, "an unattached port") && where == "the bridge" {
				continue // nothing checks it there: the host drops it
			}
			if got := s.Seen(func(p labtest.Packet) bool { return bytes.Contains(p.Frame, n) }); len(got) > 0 {
				t.Errorf("%s: %d frames reached %s", name, len(got), where)
			}
		}
	}
	if got := atEvil.Seen(func(p labtest.Packet) bool {
		return p.Dst == victim.IP || bytes.Contains(p.Frame, []byte("host-to-victim"))
	}); len(got) > 0 {
		t.Errorf("the attacker received the neighbour's traffic: %v", got)
	}
	// The host still sends the victim's address to the victim's MAC.
	neigh, err := host.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neigh {
		if n.IP.Equal(victim.IP.AsSlice()) && (!bytes.Equal(n.HardwareAddr, victim.MAC) || n.State&netlink.NUD_PERMANENT == 0) {
			t.Errorf("the host's neighbour entry for %s is %s (state %#x), want %s, permanent", victim.IP, n.HardwareAddr, n.State, victim.MAC)
		}
	}
	// The bridge learnt nothing from the attacker's port.
	evilPort, err := host.LinkByName(evil.Port)
	if err != nil {
		t.Fatal(err)
	}
	fdb, err := host.NeighList(evilPort.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range fdb {
		if !bytes.Equal(e.HardwareAddr, evil.MAC) && e.HardwareAddr[0]&1 == 0 && !bytes.Equal(e.HardwareAddr, evilPort.Attrs().HardwareAddr) {
			t.Errorf("the bridge learnt %s on the attacker's port", e.HardwareAddr)
		}
	}

	if got := fdbMaxLearned(t, cfg.HostNSPath(), br.Attrs().Index); got != netlab.FDBMaxLearned {
		t.Errorf("the bridge learns up to %d entries, want %d", got, netlab.FDBMaxLearned)
	}

	// Detached, the attacker's port is no longer bound and its address
	// is free for another port.
	if err := netlab.DetachPort(ctx, cfg, evil.Port); err != nil {
		t.Fatal(err)
	}
	bound, err := fw.Bindings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bound {
		if b.Name == evil.Port {
			t.Errorf("port %s still bound after DetachPort: %+v", evil.Port, b)
		}
	}
}

// fdbMaxLearned reads the bridge's bound on learnt forwarding entries.
func fdbMaxLearned(t *testing.T, ns string, index int) uint32 {
	t.Helper()
	var got uint32
	labtest.In(t, ns, func() error {
		req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
		msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
		msg.Index = int32(index)
		req.AddData(msg)
		msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfInfomsg:])
			if err != nil {
				return err
			}
			for _, a := range attrs {
				if a.Attr.Type != unix.IFLA_LINKINFO {
					continue
				}
				info, _ := nl.ParseRouteAttr(a.Value)
				for _, i := range info {
					if i.Attr.Type != nl.IFLA_INFO_DATA {
						continue
					}
					data, _ := nl.ParseRouteAttr(i.Value)
					for _, d := range data {
						if d.Attr.Type == unix.IFLA_BR_FDB_MAX_LEARNED && len(d.Value) >= 4 {
							got = binary.NativeEndian.Uint32(d.Value)
						}
					}
				}
			}
		}
		return nil
	})
	return got
}

// waitUp waits until a link can send (see netlab's probe guests: a link
// just brought up drops what it is given until it is activated).
func waitUp(t *testing.T, l *labtest.Lab, ns, name string) {
	t.Helper()
	h := l.Handle(ns)
	deadline := time.Now().Add(wait)
	for {
		link, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		qs, _ := h.QdiscList(link)
		active := link.Attrs().OperState == netlink.OperUp && len(qs) > 0
		for _, q := range qs {
			active = active && q.Type() != "noop"
		}
		if active {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not up within %s", name, wait)
		}
		time.Sleep(5 * time.Millisecond) // polling the link; see netlab.waitCanSend for the event-driven wait
	}
}
