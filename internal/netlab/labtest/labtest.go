// Package labtest builds throw-away labs for tests: a namespace playing the
// host, an "internet" namespace behind the uplink with documentation-range
// addresses, guest namespaces on the lab bridge, and packet sniffers that
// record what actually arrived where. Everything has a per-test unique
// name and is removed by t.Cleanup.
package labtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// Internet addresses inside the internet namespace.
var (
	UplinkHost = netip.MustParseAddr("203.0.113.1") // host end of the uplink
	UplinkNet  = netip.MustParseAddr("203.0.113.2") // internet end
	C2         = netip.MustParseAddr("198.51.100.7")
	Other      = netip.MustParseAddr("198.51.100.8")
	Resolver   = netip.MustParseAddr("198.51.100.53")
)

// TB is what labtest needs of a test: *testing.T, or an adapter for
// testscript.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Lab is a private lab instance and its surroundings.
type Lab struct {
	T      TB
	ID     string
	Config netlab.Config
	// Internet is the namespace behind the uplink; InternetIf its interface.
	Internet   string
	InternetIf string
}

// Require skips nothing: tests need root and fail loudly without it.
func Require(t TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test programs namespaces and nftables: run it as root (make test)")
	}
}

// New makes the host and internet namespaces and a lab config for them
// (not yet up). The lab's directory is under t.TempDir().
func New(t TB) *Lab {
	t.Helper()
	Require(t)
	var b [3]byte
	rand.Read(b[:])
	id := "tbt" + hex.EncodeToString(b[:])
	l := &Lab{T: t, ID: id, Internet: id + "i", InternetIf: "eth0"}
	dir := filepath.Join(t.TempDir(), "lab")
	ReapStale(context.Background(), "labtest", takeDown)
	must(t, Own(Owner{Kind: "labtest", Dir: dir, Tag: id}))
	t.Cleanup(func() { Disown(id) }) // last: after what the test's cleanups take down
	host := id + "h"
	for _, ns := range []string{host, l.Internet} {
		if err := netns.Create(ns); err != nil {
			t.Fatal(err)
		}
		ns := ns
		t.Cleanup(func() { netns.Delete(ns) })
	}
	l.Config = netlab.Config{
		Name: id, HostNS: host, Bridge: id + "br", SinkNS: id + "s", SinkVeth: id + "s0",
		Table: "talkbox_" + id, Uplink: id + "up", Upstream: Resolver, Documentation: true,
		Dir: dir,
	}
	l.Config.Defaults()
	// Uplink: a veth from the host into the internet namespace, which also
	// holds the C2 and resolver addresses.
	hh := l.Handle(host)
	la := netlink.NewLinkAttrs()
	la.Name = l.Config.Uplink
	must(t, hh.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: id + "upp"}))
	peer, err := hh.LinkByName(id + "upp")
	must(t, err)
	inet, err := os.Open(netns.Path(l.Internet))
	must(t, err)
	must(t, hh.LinkSetNsFd(peer, int(inet.Fd())))
	inet.Close()
	up, err := hh.LinkByName(l.Config.Uplink)
	must(t, err)
	addAddr(t, hh, up, netip.PrefixFrom(UplinkHost, 24))
	must(t, hh.LinkSetUp(up))
	lo, _ := hh.LinkByName("lo")
	must(t, hh.LinkSetUp(lo))
	must(t, hh.RouteAdd(&netlink.Route{Gw: UplinkNet.AsSlice(), LinkIndex: up.Attrs().Index}))

	ih := l.Handle(l.Internet)
	ip, err := ih.LinkByName(id + "upp")
	must(t, err)
	must(t, ih.LinkSetName(ip, l.InternetIf))
	ip, _ = ih.LinkByName(l.InternetIf)
	addAddr(t, ih, ip, netip.PrefixFrom(UplinkNet, 24))
	for _, a := range []netip.Addr{C2, Other, Resolver} {
		addAddr(t, ih, ip, netip.PrefixFrom(a, 32))
	}
	must(t, ih.LinkSetUp(ip))
	ilo, _ := ih.LinkByName("lo")
	must(t, ih.LinkSetUp(ilo))
	must(t, ih.RouteAdd(&netlink.Route{Gw: UplinkHost.AsSlice(), LinkIndex: ip.Attrs().Index}))
	return l
}

// HostNS is the path of the host namespace.
func (l *Lab) HostNS() string { return netns.Path(l.Config.HostNS) }

// Handle is a netlink handle in a named namespace, closed at cleanup.
func (l *Lab) Handle(ns string) *netlink.Handle {
	l.T.Helper()
	h, err := vnetns.GetFromPath(netns.Path(ns))
	must(l.T, err)
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	must(l.T, err)
	l.T.Cleanup(nh.Close)
	return nh
}

func addAddr(t TB, h *netlink.Handle, l netlink.Link, p netip.Prefix) {
	t.Helper()
	a, err := netlink.ParseAddr(p.String())
	must(t, err)
	a.Flags = unix.IFA_F_NODAD
	must(t, h.AddrAdd(l, a))
}

func must(t TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Guest is a namespace standing in for a VM: eth0 inside, Port (the "tap")
// on the host side.
type Guest struct {
	NS   string
	Port string
	IP   netip.Addr
	MAC  net.HardwareAddr
}

// LabPort is what netlab.AttachPort binds the guest's port to.
func (g *Guest) LabPort() netlab.Port { return netlab.Port{Name: g.Port, MAC: g.MAC, IP: g.IP} }

// AddGuest makes a guest namespace with a veth whose host end is named
// like a tap (not yet on the bridge: netlab.AttachPort does that).
func (l *Lab) AddGuest(name string, ip netip.Addr) *Guest {
	t := l.T
	t.Helper()
	g := &Guest{NS: l.ID + name, Port: l.ID + name, IP: ip}
	must(t, netns.Create(g.NS))
	t.Cleanup(func() { netns.Delete(g.NS) })
	hh := l.Handle(l.Config.HostNS)
	la := netlink.NewLinkAttrs()
	la.Name = g.Port
	must(t, hh.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: g.Port + "p"}))
	peer, err := hh.LinkByName(g.Port + "p")
	must(t, err)
	gf, err := os.Open(netns.Path(g.NS))
	must(t, err)
	must(t, hh.LinkSetNsFd(peer, int(gf.Fd())))
	gf.Close()
	gh := l.Handle(g.NS)
	in, err := gh.LinkByName(g.Port + "p")
	must(t, err)
	must(t, gh.LinkSetName(in, "eth0"))
	in, _ = gh.LinkByName("eth0")
	g.MAC = in.Attrs().HardwareAddr
	addAddr(t, gh, in, netip.PrefixFrom(ip, l.Config.LabNet.Bits()))
	must(t, gh.LinkSetUp(in))
	lo, _ := gh.LinkByName("lo")
	must(t, gh.LinkSetUp(lo))
	must(t, gh.RouteAdd(&netlink.Route{Gw: l.Config.Gateway().AsSlice(), LinkIndex: in.Attrs().Index}))
	return g
}

// Packet is one frame a sniffer saw, decoded.
type Packet struct {
	At       time.Time
	Src, Dst netip.Addr
	Proto    string // tcp, udp, icmp, icmp6, other
	SrcPort  uint16
	DstPort  uint16
	Payload  []byte
	IPv6     bool
	// Frame is the whole Ethernet frame, as it arrived.
	Frame []byte
}

func (p Packet) String() string {
	return fmt.Sprintf("%s %s:%d > %s:%d", p.Proto, p.Src, p.SrcPort, p.Dst, p.DstPort)
}

// Sniffer records every IP packet that arrives on one interface.
type Sniffer struct {
	// frames records every frame, not only IP packets (SniffFrames).
	frames bool
	mu     sync.Mutex
	cond   *sync.Cond
	pkts   []Packet
	fd     int
	done   chan struct{}
}

// Sniff starts recording inbound packets on iface in namespace ns.
func (l *Lab) Sniff(ns, iface string) *Sniffer {
	l.T.Helper()
	return l.sniff(ns, iface, false)
}

// SniffFrames starts recording every inbound frame on iface in namespace
// ns, ARP and other ethertypes too (Proto "other" unless IP).
func (l *Lab) SniffFrames(ns, iface string) *Sniffer {
	l.T.Helper()
	return l.sniff(ns, iface, true)
}

func (l *Lab) sniff(ns, iface string, frames bool) *Sniffer {
	t := l.T
	t.Helper()
	s := &Sniffer{done: make(chan struct{}), frames: frames}
	s.cond = sync.NewCond(&s.mu)
	err := netns.Do(netns.Path(ns), func() error {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		s.fd = fd
		// A flood must not overflow the sniffer: it counts what arrived.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20); err != nil {
			return err
		}
		tv := unix.Timeval{Usec: 100000}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index})
	})
	must(t, err)
	go s.run()
	t.Cleanup(s.Close)
	return s
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (s *Sniffer) run() {
	defer close(s.done)
	s.mu.Lock()
	fd := s.fd
	s.mu.Unlock()
	buf := make([]byte, 65536)
	for {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EAGAIN || err == unix.EINTR {
			s.mu.Lock()
			closed := s.fd < 0
			s.mu.Unlock()
			if closed {
				return
			}
			continue
		}
		if err != nil {
			return
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if p, ok := decode(buf[:n]); ok || s.frames {
			s.mu.Lock()
			s.pkts = append(s.pkts, p)
			s.cond.Broadcast()
			s.mu.Unlock()
		}
	}
}

func decode(b []byte) (Packet, bool) {
	pk := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.NoCopy)
	p := Packet{At: time.Now(), Proto: "other", Frame: append([]byte(nil), b...)}
	switch ip := pk.NetworkLayer().(type) {
	case *layers.IPv4:
		p.Src, _ = netip.AddrFromSlice(ip.SrcIP.To4())
		p.Dst, _ = netip.AddrFromSlice(ip.DstIP.To4())
	case *layers.IPv6:
		p.Src, _ = netip.AddrFromSlice(ip.SrcIP)
		p.Dst, _ = netip.AddrFromSlice(ip.DstIP)
		p.IPv6 = true
	default:
		return p, false
	}
	switch tl := pk.TransportLayer().(type) {
	case *layers.TCP:
		p.Proto, p.SrcPort, p.DstPort, p.Payload = "tcp", uint16(tl.SrcPort), uint16(tl.DstPort), append([]byte(nil), tl.Payload...)
	case *layers.UDP:
		p.Proto, p.SrcPort, p.DstPort, p.Payload = "udp", uint16(tl.SrcPort), uint16(tl.DstPort), append([]byte(nil), tl.Payload...)
	default:
		if pk.Layer(layers.LayerTypeICMPv4) != nil {
			p.Proto = "icmp"
		} else if pk.Layer(layers.LayerTypeICMPv6) != nil {
			p.Proto = "icmp6"
		}
	}
	return p, true
}

// Wait blocks until a packet matching match has arrived, or fails the test
// after timeout.
func (s *Sniffer) Wait(t TB, what string, timeout time.Duration, match func(Packet) bool) Packet {
	t.Helper()
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer timer.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		for _, p := range s.pkts {
			if match(p) {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no such packet within %s; saw %d packets: %v", what, timeout, len(s.pkts), s.pkts)
		}
		s.cond.Wait()
	}
}

// Seen lists the recorded packets that match.
func (s *Sniffer) Seen(match func(Packet) bool) []Packet {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Packet
	for _, p := range s.pkts {
		if match(p) {
			out = append(out, p)
		}
	}
	return out
}

// Close stops the sniffer.
func (s *Sniffer) Close() {
	s.mu.Lock()
	fd := s.fd
	s.fd = -1
	s.mu.Unlock()
	if fd >= 0 {
		<-s.done
		unix.Close(fd)
	}
}

// SendFrames writes whole Ethernet frames, unchecked, out of iface in
// namespace ns: what a guest with root can put on its link.
func SendFrames(t TB, ns, iface string, frames ...[]byte) {
	t.Helper()
	In(t, ns, func() error { return netlab.SendFrames(iface, frames...) })
}

// In runs fn in a namespace (for dialing from a guest, listening in the
// internet), failing the test on error.
func In(t TB, ns string, fn func() error) {
	t.Helper()
	if err := netns.Do(netns.Path(ns), fn); err != nil {
		t.Fatal(err)
	}
}
