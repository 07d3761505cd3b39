package beacon

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"
)

// The hostile modes (-hostile): what a sample with root in its guest tries
// against the lab's containment, so that a test can assert the lab holds.
// Each is harmless by construction: it aims only at the documentation
// ranges and at addresses on the guest's own link inside 10.0.0.0/8 (the
// lab), and sends at most a few hundred packets a second for seconds.
const (
	// HostileNames sends HTTP requests whose Host: carries names nothing
	// resolved, to a documentation address.
	HostileNames = "names"
	// HostileSpoof sends TCP SYNs from the guest's interface with the
	// neighbour lease's IPv4 source, its MAC, and both, to the neighbour's
	// C2 endpoint; and from its own MAC with sources the lab never gave
	// it: a routable IPv6 one and 0.0.0.0 (SpoofVariants).
	HostileSpoof = "spoof"
	// HostileARP sends ARP replies claiming the gateway's address and the
	// neighbour's.
	HostileARP = "arp"
	// HostileAim connects periodically to a documentation address:port it
	// never resolved, regular enough to look like a beacon.
	HostileAim = "aim"
	// HostileSpray connects to many ports of one (sinkholed) address and
	// sends a burst of DNS queries for random subdomains.
	HostileSpray = "spray"
)

// HostileModes are the modes, in the order they run when all are asked for.
var HostileModes = []string{HostileNames, HostileSpoof, HostileARP, HostileAim, HostileSpray}

// UnresolvedHosts are the Host: headers of HostileNames: a bare TLD, a
// malformed name, one with a space and a normal-looking made-up one. None
// is ever looked up.
var UnresolvedHosts = []string{"com", "a/b#c", "bad name.example", "cdn-update.example"}

// HostileRepeats is how many times HostileNames sends each name.
const HostileRepeats = 3

// SpoofSeq is the TCP sequence number of the first spoofed SYN (the others
// follow it), so that a capture behind NAT can still tell them: "TB" and
// the variant.
const SpoofSeq uint32 = 0x54420000

// SpoofVariants are what the spoofed frames forge, in SpoofSeq order: the
// neighbour's IPv4 address, its MAC, both; an IPv6 source in the
// documentation prefix (the neighbour's IPv4 address in its last 32 bits,
// to the C2's likewise), which the lab gives no guest; 0.0.0.0, which only
// a DHCP client or an ARP probe may claim.
var SpoofVariants = []string{"ip", "mac", "ip+mac", "ipv6", "0.0.0.0"}

// DocIPv6 is a in the last 32 bits of the IPv6 documentation prefix
// 2001:db8::/32: the IPv6 addresses of the ipv6 spoof variant.
func DocIPv6(a netip.Addr) netip.Addr {
	b := [16]byte{0x20, 0x01, 0x0d, 0xb8}
	v4 := a.As4()
	copy(b[12:], v4[:])
	return netip.AddrFrom16(b)
}

// Bounds that keep every mode small.
const (
	spoofRepeats    = 100                   // five seconds: long enough to overlap the neighbour's beacons
	spoofGap        = 50 * time.Millisecond // 20 frames a second per variant
	arpRepeats      = 10
	arpGap          = 100 * time.Millisecond
	maxSprayPorts   = 256
	maxDNSBurst     = 256
	sprayParallel   = 16
	sprayGap        = 5 * time.Millisecond // at most 200 new flows a second
	maxAimCount     = 60
	minAimInterval  = 500 * time.Millisecond
	hostileTimeout  = 2 * time.Second
	gatewayMACWait  = 3 * time.Second
	gatewayMACProbe = 100 * time.Millisecond
)

// labRange bounds the lab's own network: the neighbour and the gateway
// must be inside it and on the guest's own link.
var labRange = netip.MustParsePrefix("10.0.0.0/8")

// docNets are the documentation ranges, the only "internet" a hostile mode
// aims at.
var docNets = []netip.Prefix{
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
}

// Hostile is what -hostile makes the beacon do.
type Hostile struct {
	Modes []string
	// Iface is the guest's interface for raw frames; "" picks the one on
	// the gateway's link.
	Iface      string
	Gateway    netip.Addr
	GatewayMAC net.HardwareAddr // nil: learnt from the guest's ARP table
	// Neighbour is the other lease on the lab: its address, MAC and its
	// promoted C2 endpoint.
	Neighbour    netip.Addr
	NeighbourMAC net.HardwareAddr
	NeighbourC2  netip.AddrPort
	HTTP         netip.AddrPort // where HostileNames sends its requests
	Aim          netip.AddrPort
	AimCount     int
	AimInterval  time.Duration
	Spray        netip.Addr
	SprayPorts   int
	DNSBurst     int
	DNSDomain    string
}

// hostileFlags declares the -hostile flags on fs; the function it returns
// reads them once fs is parsed (nil when -hostile is not given) and
// refuses any target outside the documentation ranges and the lab.
func hostileFlags(fs *flag.FlagSet) func() (*Hostile, error) {
	modes := fs.String("hostile", "", "comma-separated hostile modes to run before beaconing: "+strings.Join(HostileModes, ","))
	h := &Hostile{}
	iface := fs.String("iface", "", "with -hostile: the guest interface for raw frames (default: the one on the gateway's link)")
	gw := fs.String("gateway", "", "with -hostile: the lab gateway's address")
	gwMAC := fs.String("gateway-mac", "", "with -hostile: the gateway's MAC (default: from the ARP table)")
	nb := fs.String("neighbour", "", "with -hostile: the neighbour lease's address")
	nbMAC := fs.String("neighbour-mac", "", "with -hostile: the neighbour lease's MAC")
	nbC2 := fs.String("neighbour-c2", "", "with -hostile: the neighbour's C2 endpoint ADDR:PORT (documentation ranges)")
	httpTo := fs.String("hostile-http", "192.0.2.80:80", "names: where the Host:-only requests go (documentation ranges)")
	aim := fs.String("hostile-aim", "203.0.113.77:8443", "aim: the ADDR:PORT connected to (documentation ranges)")
	fs.IntVar(&h.AimCount, "hostile-aim-count", 6, fmt.Sprintf("aim: connections (1-%d)", maxAimCount))
	fs.DurationVar(&h.AimInterval, "hostile-aim-interval", 2*time.Second, "aim: period of the connections (at least "+minAimInterval.String()+")")
	spray := fs.String("hostile-spray", "192.0.2.81", "spray: the address whose ports are tried (documentation ranges)")
	fs.IntVar(&h.SprayPorts, "hostile-spray-ports", 128, fmt.Sprintf("spray: ports 1-N tried (N at most %d)", maxSprayPorts))
	fs.IntVar(&h.DNSBurst, "hostile-dns", 100, fmt.Sprintf("spray: DNS queries for random subdomains, sent to the gateway (0-%d)", maxDNSBurst))
	fs.StringVar(&h.DNSDomain, "hostile-dns-domain", "spray.example", "spray: the domain whose random subdomains are asked for")
	return func() (*Hostile, error) {
		if *modes == "" {
			return nil, nil
		}
		for _, m := range strings.Split(*modes, ",") {
			m = strings.TrimSpace(m)
			if !contains(HostileModes, m) {
				return nil, fmt.Errorf("-hostile: unknown mode %q (want %s)", m, strings.Join(HostileModes, ","))
			}
			if !contains(h.Modes, m) {
				h.Modes = append(h.Modes, m)
			}
		}
		h.Iface = *iface
		var err error
		addr := func(flag, v string, nets ...netip.Prefix) netip.Addr {
			if err != nil || v == "" {
				return netip.Addr{}
			}
			a, perr := netip.ParseAddr(v)
			if perr != nil || !a.Is4() {
				err = fmt.Errorf("-%s %q is not an IPv4 address", flag, v)
			} else if !inNets(a, nets) {
				err = fmt.Errorf("refusing -%s %s: outside %s", flag, a, netsString(nets))
			}
			return a
		}
		addrPort := func(flag, v string) netip.AddrPort {
			if err != nil || v == "" {
				return netip.AddrPort{}
			}
			ap, perr := netip.ParseAddrPort(v)
			if perr != nil || !ap.Addr().Is4() || ap.Port() == 0 {
				err = fmt.Errorf("-%s %q is not an IPv4 ADDR:PORT", flag, v)
			} else if !inNets(ap.Addr(), docNets) {
				err = fmt.Errorf("refusing -%s %s: outside %s", flag, ap.Addr(), netsString(docNets))
			}
			return ap
		}
		mac := func(flag, v string) net.HardwareAddr {
			if err != nil || v == "" {
				return nil
			}
			m, perr := net.ParseMAC(v)
			if perr != nil || len(m) != 6 {
				err = fmt.Errorf("-%s %q is not an Ethernet MAC", flag, v)
			}
			return m
		}
		h.Gateway = addr("gateway", *gw, labRange)
		h.Neighbour = addr("neighbour", *nb, labRange)
		h.Spray = addr("hostile-spray", *spray, docNets...)
		h.GatewayMAC = mac("gateway-mac", *gwMAC)
		h.NeighbourMAC = mac("neighbour-mac", *nbMAC)
		h.NeighbourC2 = addrPort("neighbour-c2", *nbC2)
		h.HTTP = addrPort("hostile-http", *httpTo)
		h.Aim = addrPort("hostile-aim", *aim)
		if err != nil {
			return nil, err
		}
		return h, h.validate()
	}
}

// validate checks that each mode has what it needs and that the counts
// stay small.
func (h *Hostile) validate() error {
	need := func(mode string, what ...string) error {
		return fmt.Errorf("-hostile %s needs %s", mode, strings.Join(what, ", "))
	}
	for _, m := range h.Modes {
		switch m {
		case HostileNames:
			if !h.HTTP.IsValid() {
				return need(m, "-hostile-http")
			}
		case HostileSpoof:
			if !h.Gateway.IsValid() || !h.Neighbour.IsValid() || h.NeighbourMAC == nil || !h.NeighbourC2.IsValid() {
				return need(m, "-gateway", "-neighbour", "-neighbour-mac", "-neighbour-c2")
			}
		case HostileARP:
			if !h.Gateway.IsValid() || !h.Neighbour.IsValid() || h.NeighbourMAC == nil {
				return need(m, "-gateway", "-neighbour", "-neighbour-mac")
			}
		case HostileAim:
			if !h.Aim.IsValid() || h.AimCount < 1 || h.AimCount > maxAimCount || h.AimInterval < minAimInterval {
				return fmt.Errorf("-hostile aim needs -hostile-aim, -hostile-aim-count within 1-%d and -hostile-aim-interval at least %s", maxAimCount, minAimInterval)
			}
		case HostileSpray:
			if !h.Spray.IsValid() || h.SprayPorts < 1 || h.SprayPorts > maxSprayPorts || h.DNSBurst < 0 || h.DNSBurst > maxDNSBurst {
				return fmt.Errorf("-hostile spray needs -hostile-spray, -hostile-spray-ports within 1-%d and -hostile-dns within 0-%d", maxSprayPorts, maxDNSBurst)
			}
			if h.DNSBurst > 0 && (!h.Gateway.IsValid() || strings.ContainsAny(h.DNSDomain, " /#\r\n") || h.DNSDomain == "") {
				return need(m, "-gateway and a -hostile-dns-domain name for its DNS burst")
			}
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func netsString(nets []netip.Prefix) string {
	s := make([]string, len(nets))
	for i, n := range nets {
		s[i] = n.String()
	}
	return strings.Join(s, ", ")
}

// guestLink is the guest's own interface as the raw modes use it.
type guestLink struct {
	Index  int
	MAC    net.HardwareAddr
	Prefix netip.Prefix // its IPv4 address and network
}

// checkLink refuses a link whose network is not the lab's or on which the
// gateway or the neighbour does not live: raw frames go only to addresses
// on the guest's own lab link.
func (h *Hostile) checkLink(l guestLink) error {
	p := l.Prefix.Masked()
	if !l.Prefix.Addr().Is4() || p.Bits() < labRange.Bits() || !labRange.Contains(p.Addr()) {
		return fmt.Errorf("refusing raw frames on %s: not a network inside %s", l.Prefix, labRange)
	}
	for _, a := range []netip.Addr{h.Gateway, h.Neighbour} {
		if a.IsValid() && !p.Contains(a) {
			return fmt.Errorf("refusing %s: not on the guest's link %s", a, p)
		}
	}
	return nil
}

// findLink picks the interface named Iface, or the one whose IPv4 network
// holds the gateway.
func (h *Hostile) findLink() (guestLink, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return guestLink{}, err
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 || (h.Iface != "" && ifc.Name != h.Iface) {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.To4() == nil {
				continue
			}
			ip, _ := netip.AddrFromSlice(ipn.IP.To4())
			ones, _ := ipn.Mask.Size()
			p := netip.PrefixFrom(ip, ones)
			if h.Iface != "" || p.Masked().Contains(h.Gateway) {
				l := guestLink{Index: ifc.Index, MAC: ifc.HardwareAddr, Prefix: p}
				return l, h.checkLink(l)
			}
		}
	}
	return guestLink{}, fmt.Errorf("no interface with an IPv4 address on the gateway %s's link", h.Gateway)
}

// HostRequest is the HTTP request HostileNames sends for one name.
func HostRequest(host string) string {
	return "GET / HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: tb-beacon/1\r\nConnection: close\r\n\r\n"
}

// SpoofFrame is one forged frame and what it forges.
type SpoofFrame struct {
	Variant string
	Frame   []byte
}

// SpoofFrames are the TCP SYNs HostileSpoof sends to the neighbour's C2
// through the gateway, one per SpoofVariants: with the neighbour's IPv4
// source, with its MAC, with both; from the guest's MAC with an IPv6
// source in the documentation prefix and with 0.0.0.0. Each carries
// SpoofSeq plus its index as sequence number.
func (h *Hostile) SpoofFrames(l guestLink, gatewayMAC net.HardwareAddr) ([]SpoofFrame, error) {
	if !inNets(h.NeighbourC2.Addr(), docNets) {
		return nil, fmt.Errorf("refusing %s: outside %s", h.NeighbourC2.Addr(), netsString(docNets))
	}
	if err := h.checkLink(l); err != nil {
		return nil, err
	}
	own, c2 := l.Prefix.Addr(), h.NeighbourC2.Addr()
	srcs := []struct {
		mac net.HardwareAddr
		ip  netip.Addr
	}{{l.MAC, h.Neighbour}, {h.NeighbourMAC, own}, {h.NeighbourMAC, h.Neighbour}, {l.MAC, DocIPv6(h.Neighbour)}, {l.MAC, netip.IPv4Unspecified()}}
	var out []SpoofFrame
	for i, s := range srcs {
		eth := &layers.Ethernet{SrcMAC: s.mac, DstMAC: gatewayMAC, EthernetType: layers.EthernetTypeIPv4}
		tcp := &layers.TCP{SrcPort: layers.TCPPort(47000 + i), DstPort: layers.TCPPort(h.NeighbourC2.Port()), Seq: SpoofSeq + uint32(i), SYN: true, Window: 64240}
		var ip gopacket.NetworkLayer
		if s.ip.Is6() {
			eth.EthernetType = layers.EthernetTypeIPv6
			ip = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: s.ip.AsSlice(), DstIP: DocIPv6(c2).AsSlice()}
		} else {
			ip = &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: s.ip.AsSlice(), DstIP: c2.AsSlice()}
		}
		if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
			return nil, err
		}
		b, err := serialize(eth, ip.(gopacket.SerializableLayer), tcp)
		if err != nil {
			return nil, err
		}
		out = append(out, SpoofFrame{Variant: SpoofVariants[i], Frame: b})
	}
	return out, nil
}

// ARPFrames are the ARP replies HostileARP sends from the guest's MAC: a
// gratuitous one claiming the gateway's address, one sent to the
// neighbour claiming the gateway's, and a gratuitous one claiming the
// neighbour's.
func (h *Hostile) ARPFrames(l guestLink) ([][]byte, error) {
	if err := h.checkLink(l); err != nil {
		return nil, err
	}
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	claims := []struct {
		claimed   netip.Addr
		dstMAC    net.HardwareAddr
		targetMAC net.HardwareAddr
		targetIP  netip.Addr
	}{
		{h.Gateway, bcast, bcast, h.Gateway},
		{h.Gateway, h.NeighbourMAC, h.NeighbourMAC, h.Neighbour},
		{h.Neighbour, bcast, bcast, h.Neighbour},
	}
	var out [][]byte
	for _, c := range claims {
		eth := &layers.Ethernet{SrcMAC: l.MAC, DstMAC: c.dstMAC, EthernetType: layers.EthernetTypeARP}
		arp := &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
			Operation: layers.ARPReply, SourceHwAddress: l.MAC, SourceProtAddress: c.claimed.AsSlice(),
			DstHwAddress: c.targetMAC, DstProtAddress: c.targetIP.AsSlice()}
		b, err := serialize(eth, arp)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func serialize(ls ...gopacket.SerializableLayer) ([]byte, error) {
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// RunHostile runs each mode of h in turn; a mode that fails is logged and
// the others still run. The error names each failed mode, on one line.
func (b *Beacon) RunHostile(ctx context.Context, h *Hostile) error {
	var failed []string
	for _, m := range h.Modes {
		if ctx.Err() != nil {
			break
		}
		var err error
		switch m {
		case HostileNames:
			err = b.hostileNames(ctx, h)
		case HostileSpoof:
			err = b.hostileSpoof(ctx, h)
		case HostileARP:
			err = b.hostileARP(ctx, h)
		case HostileAim:
			err = b.hostileAim(ctx, h)
		case HostileSpray:
			err = b.hostileSpray(ctx, h)
		}
		if err != nil {
			b.Logf("hostile %s failed: %v", m, err)
			failed = append(failed, m+": "+err.Error())
		}
	}
	if len(failed) > 0 {
		return errors.New(strings.Join(failed, "; "))
	}
	return nil
}

func (b *Beacon) hostileNames(ctx context.Context, h *Hostile) error {
	if !inNets(h.HTTP.Addr(), docNets) {
		return fmt.Errorf("refusing %s", h.HTTP)
	}
	answered := 0
	for r := 0; r < HostileRepeats && ctx.Err() == nil; r++ {
		for _, host := range UnresolvedHosts {
			status, err := b.request(ctx, h.HTTP.String(), HostRequest(host))
			b.Logf("hostile names host=%q to=%s status=%q err=%v", host, h.HTTP, status, err)
			if err == nil {
				answered++
			}
		}
	}
	b.Logf("hostile names done answered=%d", answered)
	return nil
}

// request sends one raw HTTP request and returns the status line.
func (b *Beacon) request(ctx context.Context, addr, req string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, hostileTimeout)
	defer cancel()
	c, err := b.Dial(cctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := cctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte(req)); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func (b *Beacon) hostileSpoof(ctx context.Context, h *Hostile) error {
	l, err := h.findLink()
	if err != nil {
		return err
	}
	gwMAC := h.GatewayMAC
	if gwMAC == nil {
		if gwMAC, err = b.gatewayMAC(ctx, h.Gateway); err != nil {
			return err
		}
	}
	frames, err := h.SpoofFrames(l, gwMAC)
	if err != nil {
		return err
	}
	raw := make([][]byte, len(frames))
	for i, f := range frames {
		raw[i] = f.Frame
		b.Logf("hostile spoof variant=%s to=%s seq=%#x", f.Variant, h.NeighbourC2, SpoofSeq+uint32(i))
	}
	return b.sendFrames(ctx, l, raw, spoofRepeats, spoofGap)
}

func (b *Beacon) hostileARP(ctx context.Context, h *Hostile) error {
	l, err := h.findLink()
	if err != nil {
		return err
	}
	frames, err := h.ARPFrames(l)
	if err != nil {
		return err
	}
	b.Logf("hostile arp claiming %s and %s as %s", h.Gateway, h.Neighbour, l.MAC)
	return b.sendFrames(ctx, l, frames, arpRepeats, arpGap)
}

// sendFrames sends every frame repeats times, one round every gap, from
// a packet socket bound to nothing but sending (protocol 0 receives
// nothing).
func (b *Beacon) sendFrames(ctx context.Context, l guestLink, frames [][]byte, repeats int, gap time.Duration) error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	sent := 0
	for r := 0; r < repeats; r++ {
		for _, f := range frames {
			sa := &unix.SockaddrLinklayer{Ifindex: l.Index, Halen: 6}
			copy(sa.Addr[:], f[:6])
			if err := unix.Sendto(fd, f, 0, sa); err != nil {
				return fmt.Errorf("sending on interface %d: %w", l.Index, err)
			}
			sent++
		}
		if r < repeats-1 && !sleep(ctx, gap) {
			break
		}
	}
	b.Logf("hostile frames sent=%d", sent)
	return nil
}

// gatewayMAC learns the gateway's MAC from the guest's ARP table, after a
// DNS datagram to the gateway has made the kernel resolve it.
func (b *Beacon) gatewayMAC(ctx context.Context, gw netip.Addr) (net.HardwareAddr, error) {
	if c, err := b.Dial(ctx, "udp", netip.AddrPortFrom(gw, 53).String()); err == nil {
		c.Write(dnsQuery(1, "gateway.example"))
		c.Close()
	}
	deadline := time.Now().Add(gatewayMACWait)
	for {
		if m := arpTableMAC(gw); m != nil {
			return m, nil
		}
		if time.Now().After(deadline) || !sleep(ctx, gatewayMACProbe) {
			return nil, fmt.Errorf("the gateway %s is not in the ARP table", gw)
		}
	}
}

// arpTableMAC reads a's MAC from /proc/net/arp (nil when not complete).
func arpTableMAC(a netip.Addr) net.HardwareAddr {
	f, err := os.Open("/proc/net/arp")
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 4 && fs[0] == a.String() && fs[2] == "0x2" {
			m, err := net.ParseMAC(fs[3])
			if err == nil {
				return m
			}
		}
	}
	return nil
}

func (b *Beacon) hostileAim(ctx context.Context, h *Hostile) error {
	if !inNets(h.Aim.Addr(), docNets) {
		return fmt.Errorf("refusing %s", h.Aim)
	}
	t := time.NewTicker(h.AimInterval)
	defer t.Stop()
	for i := 1; i <= h.AimCount; i++ {
		cctx, cancel := context.WithTimeout(ctx, hostileTimeout)
		c, err := b.Dial(cctx, "tcp", h.Aim.String())
		cancel()
		if err == nil {
			c.Close()
		}
		b.Logf("hostile aim seq=%d to=%s err=%v", i, h.Aim, err)
		if i == h.AimCount {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
	return nil
}

func (b *Beacon) hostileSpray(ctx context.Context, h *Hostile) error {
	if !inNets(h.Spray, docNets) || !inNets(h.Gateway, []netip.Prefix{labRange}) && h.DNSBurst > 0 {
		return fmt.Errorf("refusing %s or %s", h.Spray, h.Gateway)
	}
	var open, answered int
	var mu sync.Mutex
	paced(ctx, h.SprayPorts, func(i int) {
		cctx, cancel := context.WithTimeout(ctx, hostileTimeout)
		defer cancel()
		c, err := b.Dial(cctx, "tcp", netip.AddrPortFrom(h.Spray, uint16(i+1)).String())
		if err == nil {
			c.Close()
			mu.Lock()
			open++
			mu.Unlock()
		}
	})
	b.Logf("hostile spray to=%s ports=1-%d open=%d", h.Spray, h.SprayPorts, open)
	resolver := netip.AddrPortFrom(h.Gateway, 53).String()
	// The names are drawn here: Rand is not safe for the parallel askers.
	names := make([]string, h.DNSBurst)
	for i := range names {
		names[i] = fmt.Sprintf("%08x.%s", b.Rand.Uint32(), h.DNSDomain)
	}
	paced(ctx, h.DNSBurst, func(i int) {
		if b.dnsAsk(ctx, resolver, uint16(i), names[i]) {
			mu.Lock()
			answered++
			mu.Unlock()
		}
	})
	b.Logf("hostile dns to=%s queries=%d answered=%d", resolver, h.DNSBurst, answered)
	return nil
}

// paced runs f(0..n-1) with at most sprayParallel in flight, one start
// every sprayGap.
func paced(ctx context.Context, n int, f func(i int)) {
	slots := make(chan struct{}, sprayParallel)
	var wg sync.WaitGroup
	for i := 0; i < n && sleep(ctx, sprayGap); i++ {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i)
			<-slots
		}()
	}
	wg.Wait()
}

// dnsAsk sends one A query over UDP and reports whether an answer came.
func (b *Beacon) dnsAsk(ctx context.Context, resolver string, id uint16, name string) bool {
	cctx, cancel := context.WithTimeout(ctx, hostileTimeout)
	defer cancel()
	c, err := b.Dial(cctx, "udp", resolver)
	if err != nil {
		return false
	}
	defer c.Close()
	if dl, ok := cctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write(dnsQuery(id, name)); err != nil {
		return false
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	return err == nil && n >= 2 && buf[0] == byte(id>>8) && buf[1] == byte(id)
}

// dnsQuery is a DNS query for name's A record, recursion desired.
func dnsQuery(id uint16, name string) []byte {
	q := &layers.DNS{ID: id, RD: true, QDCount: 1,
		Questions: []layers.DNSQuestion{{Name: []byte(name), Type: layers.DNSTypeA, Class: layers.DNSClassIN}}}
	b, err := serialize(q)
	if err != nil { // only a label longer than 63 bytes: a name of our own making
		return nil
	}
	return b
}
