package observe

import (
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Two sightings of one attack keep the order closer to its attack (then
// the smaller value), whichever is merged into the other; a sighting
// without an order takes the other's.
func TestMergeAttackOrder(t *testing.T) {
	attack := func(order string, delay float64) *records.Observable {
		return &records.Observable{Type: records.ObsAttack, Value: "udp 203.0.113.77", FirstSeen: t0, LastSeen: t0,
			Attack: &records.AttackInfo{Vector: "udp", Target: "203.0.113.77", Packets: 600, Order: order, OrderDelay: delay}}
	}
	for _, tc := range []struct {
		a, b  *records.Observable
		order string
		delay float64
	}{
		{attack("mirai udp 203.0.113.77/32 4s", 2), attack("mirai udp 203.0.113.0/24 4s", 1), "mirai udp 203.0.113.0/24 4s", 1},
		{attack("irc-bot !udp 203.0.113.77", 1), attack("gafgyt !* UDP 203.0.113.77", 1), "gafgyt !* UDP 203.0.113.77", 1},
		{attack("", 0), attack("irc-bot !udp 203.0.113.77", 3), "irc-bot !udp 203.0.113.77", 3},
	} {
		for _, swap := range []bool{false, true} {
			dst, src := *tc.a, *tc.b
			da, sa := *tc.a.Attack, *tc.b.Attack
			dst.Attack, src.Attack = &da, &sa
			if swap {
				dst, src = src, dst
			}
			Merge(&dst, &src)
			if a := dst.Attack; a.Order != tc.order || a.OrderDelay != tc.delay || a.Packets != 1200 {
				t.Errorf("swap %v: order %q after %v s, %d packets", swap, a.Order, a.OrderDelay, a.Packets)
			}
		}
	}
}
