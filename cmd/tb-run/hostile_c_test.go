package main

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// hostileCBeacon is TestHostileGuest's step for the C beacon, the sample
// on the architectures Go does not target: after the Go beacon's cycles,
// with the test's captures still running, the hostile lease runs one
// cycle of the C beacon's -hostile modes built for powerpc, which its
// amd64 guest runs under qemu-user (its binfmt_misc), with the Go
// beacon's arguments. It asserts that the C beacon attacked (checkAttacked
// on what the guest's tap received from it during the cycle) and that the
// cycle completed, forwarding no new name and leaving no endpoint of the
// hostile lease in force; the test's own assertions on
// the taps, the sinkhole, the uplink and the host's neighbour table then
// cover its frames as they cover the Go beacon's. It returns the cycle.
func (l *hostileLab) hostileCBeacon(t *testing.T, capDir string, book *allowlist.Book, good, bad *records.SandboxLease) *records.Cycle {
	t.Helper()
	sample := filepath.Join(l.work, "cbeacon-powerpc")
	build := exec.Command("make", "-s", "-C", "../..", "CBEACON_DIR="+l.work, sample)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the C beacon: %v\n%s", err, out)
	}
	c := *l
	c.beacon = sample
	plan := c.plan(t, "-hostile", "spoof,arp,names,aim,spray", "-gateway", good.Gateway, "-gateway-mac", l.bridgeMAC(t),
		"-neighbour", good.IP, "-neighbour-mac", good.MAC, "-neighbour-c2", l.c2+":80",
		"-hostile-aim", hostileAimAddr, "-hostile-http", hostileHTTPAddr, "-hostile-spray", hostileSprayAddr, "-hostile-spray-ports", "256",
		// What checkAttacked asks of the Go beacon's two cycles, in one.
		"-hostile-aim-count", "12", "-hostile-aim-interval", "1s")

	dir := filepath.Join(capDir, "cbeacon")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sent := sniff(t, dir, bad.Tap, "in")
	start := time.Now()
	cycle, out, err := l.cycle(bad.ID, plan)
	t.Logf("the C beacon's cycle took %s", time.Since(start).Round(time.Second))
	sent.stop()
	if err != nil {
		t.Fatalf("the C beacon's cycle on the hostile lease: %v", err)
	}
	if cycle.State != records.CycleCompleted {
		t.Errorf("the C beacon's cycle on the hostile lease: %s %s\n%s", cycle.State, cycle.Error, out)
	}

	badMAC, err := net.ParseMAC(bad.MAC)
	if err != nil {
		t.Fatal(err)
	}
	checkAttacked(t, frames(t, sent.file), badMAC, netip.MustParseAddr(good.IP), netip.MustParseAddr(good.Gateway))
	if t.Failed() {
		t.Logf("the C beacon's cycle:\n%s", out)
	}
	checkForwardedNames(t, l, hostileCycles+1)
	checkUnanswered(t, book, bad.ID, hostileCycles+1)
	return cycle
}

// watchClaims captures what the host receives on the lab's bridge while
// the cycles run and asserts, as the test ends, that none of it is an ARP
// claim of the attacker's for an address not its own. The tap binding
// drops those at the bridge; the host's static neighbour entries and the
// bridge's isolation of guests hide whether it does, so without this the
// test passed with the binding's ARP rule removed.
func (l *hostileLab) watchClaims(t *testing.T, dir string, bad *records.SandboxLease) {
	t.Helper()
	s := sniff(t, dir, l.bridge, "in")
	mac, err := net.ParseMAC(bad.MAC)
	if err != nil {
		t.Fatal(err)
	}
	own := netip.MustParseAddr(bad.IP)
	t.Cleanup(func() {
		s.stop()
		v := violations{}
		for _, f := range frames(t, s.file) {
			arp, ok := f.Layer(layers.LayerTypeARP).(*layers.ARP)
			if !ok || !slices.Equal(arp.SourceHwAddress, mac) {
				continue
			}
			// A probe (RFC 5227, sender 0.0.0.0) claims nothing.
			if claimed := addrOf(arp.SourceProtAddress); claimed != own && !claimed.IsUnspecified() {
				v.add("the attacker's ARP claim for "+claimed.String()+" passed the bridge to the host", f)
			}
		}
		v.report(t)
	})
}
