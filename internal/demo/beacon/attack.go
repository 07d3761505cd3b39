package beacon

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon/botwire"
)

// The attack an order asks for, bounded so that it stays a harmless
// stand-in for a bot's flood: enough packets for tb-parse to see a flood
// (500 at 50 a second or more), no more.
const (
	// AttackRate is the packets a second the attack sends.
	AttackRate = 200
	// AttackMaxSeconds caps the duration, whatever the order says.
	AttackMaxSeconds = 5
	// AttackBudget caps the packets the beacon sends in all its attacks,
	// however many orders the C2 sends.
	AttackBudget = 1000
	// AttackPayload is each packet's payload size: fixed bytes for
	// udpplain, random ones for udp.
	AttackPayload = 64
)

// AttackAllowed reports whether an attack may be aimed at addr: only the
// three documentation ranges (docNets), never the lab's own networks nor
// loopback. The list is fixed in the code: no flag and no order widens it.
func AttackAllowed(addr netip.Addr) bool { return inNets(addr, docNets) }

// attacks is the beacon's attack state: one attack at a time, within the
// process's packet budget.
type attacks struct {
	busy bool
	sent int
}

// order carries out o beside the channel, or logs why not: a vector other
// than UDP, a target outside AttackAllowed, an attack already running, or
// the budget spent. It returns at once; Run waits for the attack at its
// end.
func (b *Beacon) order(ctx context.Context, o botwire.Order) {
	b.atkMu.Lock()
	defer b.atkMu.Unlock()
	switch {
	case o.Vector != "udp" && o.Vector != "udpplain":
		b.Logf("order %q refused: vector %s not carried out", o, o.Vector)
		return
	case !AttackAllowed(o.Target):
		b.Logf("order %q refused: target %s outside 192.0.2.0/24, 198.51.100.0/24 and 203.0.113.0/24", o, o.Target)
		return
	case b.atk.busy:
		b.Logf("order %q refused: an attack is running", o)
		return
	case b.atk.sent >= AttackBudget:
		b.Logf("order %q refused: the %d-packet budget is spent", o, AttackBudget)
		return
	}
	n := min(int(min(o.Seconds, AttackMaxSeconds))*AttackRate, AttackBudget-b.atk.sent)
	b.atk.busy = true
	b.atk.sent += n
	b.Logf("order %q: attack %s:%d, %d packets", o, o.Target, o.Port, n)
	b.atkWG.Add(1)
	go func() {
		defer b.atkWG.Done()
		sent, err := b.attack(ctx, o, n)
		b.atkMu.Lock()
		b.atk.busy = false
		b.atkMu.Unlock()
		b.Logf("attack %s %s:%d sent=%d err=%v", o.Vector, o.Target, o.Port, sent, err)
	}()
}

// attack opens the attack's socket (PacketConn, a UDP socket unless a
// test gives its own) and floods o's target with n packets.
func (b *Beacon) attack(ctx context.Context, o botwire.Order, n int) (int, error) {
	open := b.PacketConn
	if open == nil {
		open = func(ctx context.Context) (net.PacketConn, error) {
			var lc net.ListenConfig
			return lc.ListenPacket(ctx, "udp4", ":0")
		}
	}
	pc, err := open(ctx)
	if err != nil {
		return 0, err
	}
	defer pc.Close()
	return flood(ctx, pc, o, n)
}

// flood sends n UDP packets to o's target at AttackRate a second, until n
// are sent or ctx ends. It checks the target itself: the last guard before
// a packet leaves. The pace is kept by a schedule, not by a ticker: a
// ticker drops the ticks its reader misses, and a guest under TCG on a
// loaded host woke the sender about every 20 ms, which made a 4 s order of
// 800 packets take 17 s, under tb-parse's 50 packets a second (a
// fresh-clone make test, 2026-11-30). Packets that fell due while the
// sender slept go at once, as the C beacon's do.
func flood(ctx context.Context, pc net.PacketConn, o botwire.Order, n int) (int, error) {
	if !AttackAllowed(o.Target) {
		return 0, fmt.Errorf("refusing target %s", o.Target)
	}
	n = min(n, AttackMaxSeconds*AttackRate, AttackBudget)
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(o.Target.Unmap(), o.Port))
	payload := make([]byte, AttackPayload)
	for i := range payload {
		payload[i] = 'A' + byte(i%26)
	}
	// Random payloads need no secret randomness: a PCG seeded per attack.
	rnd := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	const gap = time.Second / AttackRate
	next := time.Now()
	wait := time.NewTimer(0)
	defer wait.Stop()
	for sent := 0; sent < n; {
		now := time.Now()
		// A stall longer than maxCatchUp is not made up, so the pace
		// never bursts far past AttackRate.
		if next.Before(now.Add(-maxCatchUp)) {
			next = now
		}
		for ; sent < n && !next.After(now); sent++ {
			if o.Vector != "udpplain" {
				for i := range payload {
					payload[i] = byte(rnd.Uint32())
				}
			}
			if _, err := pc.WriteTo(payload, dst); err != nil {
				return sent, err
			}
			next = next.Add(gap)
		}
		if sent == n {
			break
		}
		wait.Reset(next.Sub(now))
		select {
		case <-ctx.Done():
			return sent, ctx.Err()
		case <-wait.C:
		}
	}
	return n, nil
}

// maxCatchUp is the longest stall of the sender whose packets are still
// sent once it wakes.
const maxCatchUp = 100 * time.Millisecond
