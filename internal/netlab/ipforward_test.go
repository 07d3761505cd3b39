package netlab_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// TestForwardingPerInterface: the lab forwards by its own interfaces only.
// Another network on the host, routed through it to the internet, is not
// forwarded while the lab is up, and the host-wide switch stays off.
func TestForwardingPerInterface(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	read := func(key string) string {
		var v []byte
		labtest.In(t, l.HostNS(), func() (err error) {
			v, err = os.ReadFile("/proc/sys/" + strings.ReplaceAll(key, ".", "/"))
			return err
		})
		return strings.TrimSpace(string(v))
	}
	// A host without labs forwards nothing (a new namespace inherits the
	// host's setting).
	labtest.In(t, l.HostNS(), func() error {
		return os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("0\n"), 0o644)
	})
	// Another network: a namespace behind its own link, routed by the host.
	outside := l.ID + "o"
	if err := netns.Create(outside); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Delete(outside) })
	hh := l.Handle(cfg.HostNS)
	la := netlink.NewLinkAttrs()
	la.Name = l.ID + "ot"
	if err := hh.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(nsFd(t, outside))}); err != nil {
		t.Fatal(err)
	}
	hostEnd, err := hh.LinkByName(la.Name)
	if err != nil {
		t.Fatal(err)
	}
	hostAddr, outAddr := netip.MustParseAddr("192.0.2.65"), netip.MustParseAddr("192.0.2.66")
	if err := hh.AddrAdd(hostEnd, &netlink.Addr{IPNet: netlink.NewIPNet(net.IP(hostAddr.AsSlice())), Flags: 0}); err != nil {
		t.Fatal(err)
	}
	if err := hh.LinkSetUp(hostEnd); err != nil {
		t.Fatal(err)
	}
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: hostEnd.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: &net.IPNet{IP: outAddr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	oh := l.Handle(outside)
	in, err := oh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := oh.AddrAdd(in, &netlink.Addr{IPNet: netlink.NewIPNet(net.IP(outAddr.AsSlice()))}); err != nil {
		t.Fatal(err)
	}
	if err := oh.LinkSetUp(in); err != nil {
		t.Fatal(err)
	}
	if err := oh.RouteAdd(&netlink.Route{LinkIndex: in.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: &net.IPNet{IP: hostAddr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := oh.RouteAdd(&netlink.Route{LinkIndex: in.Attrs().Index, Gw: hostAddr.AsSlice()}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if got := read("net.ipv4.ip_forward"); got != "0" {
		t.Errorf("net.ipv4.ip_forward = %s with the lab up, want 0", got)
	}
	for _, ifc := range []string{cfg.Bridge, cfg.SinkVeth, cfg.Uplink} {
		if got := read("net.ipv4.conf." + ifc + ".forwarding"); got != "1" {
			t.Errorf("%s does not forward (%s): the lab cannot route", ifc, got)
		}
	}
	if got := read("net.ipv4.conf." + hostEnd.Attrs().Name + ".forwarding"); got != "0" {
		t.Errorf("another interface forwards (%s)", got)
	}

	// The lab routes: a guest reaches the sinkhole.
	g := l.AddGuest("f", netip.MustParseAddr("10.13.37.10"))
	if err := netlab.AttachPort(ctx, cfg, g.LabPort()); err != nil {
		t.Fatal(err)
	}
	sink := l.Sniff(cfg.SinkNS, cfg.SinkVeth+"p")
	inet := l.Sniff(l.Internet, l.InternetIf)
	sendUDP(t, g.NS, "192.0.2.99:4444", []byte("guest-routed"))
	sink.Wait(t, "the guest's datagram at the sinkhole", wait, func(p labtest.Packet) bool { return string(p.Payload) == "guest-routed" })

	// The other network is not: its datagram to the internet stays on
	// the host. A datagram to the host itself, sent after it by the same
	// link, is the marker that the first was handled.
	var host net.PacketConn
	labtest.In(t, l.HostNS(), func() (err error) {
		host, err = net.ListenPacket("udp4", net.JoinHostPort(hostAddr.String(), "0"))
		return err
	})
	defer host.Close()
	sendUDP(t, outside, netip.AddrPortFrom(labtest.C2, 9999).String(), []byte("outside-routed"))
	sendUDP(t, outside, host.LocalAddr().String(), []byte("marker"))
	buf := make([]byte, 16)
	host.SetReadDeadline(time.Now().Add(wait))
	if n, _, err := host.ReadFrom(buf); err != nil || string(buf[:n]) != "marker" {
		t.Fatalf("marker: %q %v", buf[:n], err)
	}
	if got := inet.Seen(func(p labtest.Packet) bool { return string(p.Payload) == "outside-routed" }); len(got) > 0 {
		t.Fatalf("the host forwarded another network's datagram to the internet: %v", got)
	}

	if err := netlab.Down(ctx, cfg.Dir); err != nil {
		t.Fatal(err)
	}
	if got := read("net.ipv4.conf." + cfg.Uplink + ".forwarding"); got != "0" {
		t.Errorf("after down, the uplink forwards (%s), want 0 as found", got)
	}
}

func nsFd(t *testing.T, name string) int {
	t.Helper()
	f, err := os.Open(netns.Path(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}
