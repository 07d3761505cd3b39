package netlab_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// Two labs in one namespace share its uplink: taking the first down must
// not turn forwarding on the uplink off under the second; the last one
// down restores it as found.
func TestDownKeepsForwardingForAnotherLab(t *testing.T) {
	ctx := context.Background()
	l, a, b := twoLabs(t)
	key := "/proc/sys/net/ipv4/conf/" + a.Uplink + "/forwarding"
	forwarding := func() string { return readForwarding(t, l.HostNS(), a.Uplink) }
	// A new interface inherits forwarding from the namespace's default,
	// which a namespace inherits from the host's: start from off, as a
	// host without labs would.
	if err := netns.Do(l.HostNS(), func() error {
		return os.WriteFile(key, []byte("0\n"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	before := forwarding()
	if before != "0" {
		t.Fatalf("forwarding on the uplink did not turn off in the test's namespace: %s", before)
	}
	for _, c := range []netlab.Config{a, b} {
		c := c
		t.Cleanup(func() { netlab.Down(ctx, c.Dir) })
		if _, err := netlab.Up(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := netlab.Down(ctx, a.Dir); err != nil {
		t.Fatal(err)
	}
	// What the first lab kept of its own interfaces' settings goes with
	// them, though another lab is still up.
	for _, iface := range []string{a.Bridge, a.SinkVeth} {
		if kept, _ := filepath.Glob("/run/talkbox/conf." + strings.ReplaceAll(iface, ".", ":") + ".forwarding.*"); len(kept) > 0 {
			t.Errorf("the first lab down left %v", kept)
		}
	}
	if got := forwarding(); got != "1" {
		t.Fatalf("after the first lab went down, the uplink's forwarding = %s: the second lab is broken", got)
	}
	if err := netlab.Down(ctx, b.Dir); err != nil {
		t.Fatal(err)
	}
	if got := forwarding(); got != before {
		t.Fatalf("after the last lab went down, the uplink's forwarding = %s, want %s as found", got, before)
	}
}

// Two labs in one namespace with an uplink each: the first down leaves its
// uplink forwarding (it cannot tell the uplink is not shared), and the
// last one down restores both as found, keeping no record of either. The
// second uplink's name holds a dot, as a VLAN's does ("eth0.100"): its
// forwarding is turned on too (the sysctl's key, dotted, once named a file
// that is not there, and the lab took the uplink for one not yet made).
func TestLastLabDownRestoresEveryUplink(t *testing.T) {
	ctx := context.Background()
	l, a, b := twoLabs(t)
	b.Uplink = a.Uplink + ".7"
	if err := netns.Do(l.HostNS(), func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: b.Uplink}, PeerName: b.Uplink + "p"}); err != nil {
			return err
		}
		up, err := netlink.LinkByName(b.Uplink)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(up)
	}); err != nil {
		t.Fatal(err)
	}
	for _, iface := range []string{a.Uplink, b.Uplink} {
		if err := netns.Do(l.HostNS(), func() error {
			return os.WriteFile("/proc/sys/net/ipv4/conf/"+iface+"/forwarding", []byte("0\n"), 0o644)
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []netlab.Config{a, b} {
		t.Cleanup(func() { netlab.Down(ctx, c.Dir) })
		if _, err := netlab.Up(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, iface := range []string{a.Uplink, b.Uplink} {
		if got := readForwarding(t, l.HostNS(), iface); got != "1" {
			t.Errorf("with the labs up, %s does not forward (%s)", iface, got)
		}
	}
	for _, c := range []netlab.Config{a, b} {
		if err := netlab.Down(ctx, c.Dir); err != nil {
			t.Fatal(err)
		}
	}
	for _, iface := range []string{a.Uplink, b.Uplink} {
		if got := readForwarding(t, l.HostNS(), iface); got != "0" {
			t.Errorf("after the last lab went down, %s forwards (%s); it did not before the labs", iface, got)
		}
		if kept, _ := filepath.Glob("/run/talkbox/conf." + strings.ReplaceAll(iface, ".", ":") + ".forwarding.*"); len(kept) > 0 {
			t.Errorf("the labs down left %v", kept)
		}
	}
}

// readForwarding reads iface's IPv4 forwarding in the namespace ns.
func readForwarding(t *testing.T, ns, iface string) string {
	t.Helper()
	var v []byte
	if err := netns.Do(ns, func() error {
		var err error
		v, err = os.ReadFile("/proc/sys/net/ipv4/conf/" + iface + "/forwarding")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(v))
}

// twoLabs makes a lab in a namespace of its own, and the configurations of
// two labs there (not yet up): its own, and a second with interfaces and
// networks of its own and the same uplink.
func twoLabs(t *testing.T) (l *labtest.Lab, a, b netlab.Config) {
	l = labtest.New(t)
	a, b = l.Config, l.Config
	b.Name, b.Bridge, b.SinkNS, b.SinkVeth, b.Table = a.Name+"b", a.Bridge+"b", a.SinkNS+"b", a.SinkVeth+"b", a.Table+"b"
	b.LabNet, b.SinkNet = netip.MustParsePrefix("10.13.39.0/24"), netip.MustParsePrefix("10.13.40.0/24")
	b.Dir = filepath.Join(t.TempDir(), "lab-b")
	return l, a, b
}
