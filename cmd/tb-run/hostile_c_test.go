package main

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

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
