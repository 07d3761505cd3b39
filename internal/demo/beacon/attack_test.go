package beacon

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon/botwire"
)

// packetSink is an attack's socket in a test: it keeps what the attack
// would send, and sends nothing.
type packetSink struct {
	mu      sync.Mutex
	packets []packet
	closed  chan struct{}
	// The sender stalls for stall after every stallEvery-th packet.
	stallEvery int
	stall      time.Duration
}

type packet struct {
	at      time.Time
	to      string
	payload []byte
}

func newPacketSink() *packetSink { return &packetSink{closed: make(chan struct{})} }

func (p *packetSink) WriteTo(b []byte, addr net.Addr) (int, error) {
	p.mu.Lock()
	p.packets = append(p.packets, packet{time.Now(), addr.String(), bytes.Clone(b)})
	n := len(p.packets)
	p.mu.Unlock()
	if p.stallEvery > 0 && n%p.stallEvery == 0 {
		time.Sleep(p.stall) // the sender descheduled, as a loaded guest's is
	}
	return len(b), nil
}

func (p *packetSink) sent() []packet {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]packet(nil), p.packets...)
}

func (p *packetSink) Close() error                           { close(p.closed); return nil }
func (p *packetSink) ReadFrom([]byte) (int, net.Addr, error) { return 0, nil, errors.New("not read") }
func (p *packetSink) LocalAddr() net.Addr                    { return &net.UDPAddr{} }
func (p *packetSink) SetDeadline(time.Time) error            { return nil }
func (p *packetSink) SetReadDeadline(time.Time) error        { return nil }
func (p *packetSink) SetWriteDeadline(time.Time) error       { return nil }

// attackBeacon is a beacon whose attacks go to sinks; opened counts them.
func attackBeacon(log *bytes.Buffer) (*Beacon, chan *packetSink) {
	opened := make(chan *packetSink, 8)
	b := &Beacon{Cfg: &Config{}, Log: log, Rand: rand.New(rand.NewPCG(1, 2)),
		PacketConn: func(context.Context) (net.PacketConn, error) {
			s := newPacketSink()
			opened <- s
			return s, nil
		}}
	return b, opened
}

func order(t *testing.T, s string) botwire.Order {
	t.Helper()
	o, err := botwire.ParseOrder(s)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// An attack is aimed only at the documentation ranges: not the lab's guest
// network nor its sinkhole, not loopback, not anything else. The policy
// refuses them, the beacon refuses the order without opening a socket, and
// the sender itself refuses them too.
func TestAttackRefusesTargetsOutsideTheDocumentationRanges(t *testing.T) {
	for _, a := range []string{"192.0.2.1", "198.51.100.255", "203.0.113.77"} {
		if !AttackAllowed(netip.MustParseAddr(a)) {
			t.Errorf("%s refused", a)
		}
	}
	refused := []string{"10.13.37.5", "10.13.38.2", "10.0.0.1", "127.0.0.1", "0.0.0.0", "255.255.255.255", "8.8.8.8", "192.0.3.1", "198.51.101.1", "203.0.114.1", "224.0.0.1", "169.254.1.1"}
	for _, a := range append(refused, "::ffff:10.13.37.5", "::1", "2001:db8::1") {
		if AttackAllowed(netip.MustParseAddr(a)) {
			t.Errorf("%s allowed", a)
		}
	}
	var log bytes.Buffer
	b, opened := attackBeacon(&log)
	for _, a := range refused {
		b.order(context.Background(), order(t, "udp "+a+" 9 5"))
	}
	b.atkWG.Wait()
	if len(opened) != 0 {
		t.Fatalf("%d attack sockets opened for refused targets", len(opened))
	}
	if n := strings.Count(log.String(), "refused: target"); n != len(refused) {
		t.Fatalf("%d refusals logged, want %d:\n%s", n, len(refused), log.String())
	}
	sink := newPacketSink()
	if n, err := flood(context.Background(), sink, order(t, "udp 10.13.37.5 9 1"), 10); n != 0 || err == nil || len(sink.sent()) != 0 {
		t.Fatalf("flood to the lab: %d sent, %v", n, err)
	}
}

// Other vectors than UDP's are refused, and so is a second attack while
// one runs.
func TestAttackRefusesOtherVectorsAndASecondAttack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log bytes.Buffer
		b, opened := attackBeacon(&log)
		b.order(t.Context(), order(t, "syn 192.0.2.1 80 5"))
		b.order(t.Context(), order(t, "udp 192.0.2.1 9 1"))
		b.order(t.Context(), order(t, "udpplain 192.0.2.2 9 1"))
		b.atkWG.Wait()
		if len(opened) != 1 {
			t.Fatalf("%d attacks, want 1:\n%s", len(opened), log.String())
		}
		if s := log.String(); !strings.Contains(s, "vector syn not carried out") || !strings.Contains(s, "an attack is running") {
			t.Fatalf("log:\n%s", s)
		}
	})
}

// The attack sends 200 packets a second (one every 5 ms of the bubble's
// clock), for the order's duration up to 5 s, 1,000 packets at most in
// all the beacon's attacks; udpplain's payload is fixed, udp's random.
func TestAttackIsPacedAndCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log bytes.Buffer
		b, opened := attackBeacon(&log)
		for _, tc := range []struct {
			order string
			want  int
		}{
			{"udpplain 192.0.2.1 9 3", 600},
			{"udp 198.51.100.7 53 3600", 400}, // capped by the budget left
			{"udp 203.0.113.1 9 1", 0},        // the budget is spent
		} {
			b.order(t.Context(), order(t, tc.order))
			b.atkWG.Wait()
			if tc.want == 0 {
				if len(opened) != 0 || !strings.Contains(log.String(), "budget is spent") {
					t.Fatalf("%s: attacked after the budget\n%s", tc.order, log.String())
				}
				continue
			}
			sink := <-opened
			<-sink.closed
			o := order(t, tc.order)
			pk := sink.sent()
			if len(pk) != tc.want {
				t.Fatalf("%s: %d packets, want %d", tc.order, len(pk), tc.want)
			}
			for i, p := range pk {
				if p.to != netip.AddrPortFrom(o.Target, o.Port).String() || len(p.payload) != AttackPayload {
					t.Fatalf("%s: packet %d to %s, %d bytes", tc.order, i, p.to, len(p.payload))
				}
				if i > 0 && p.at.Sub(pk[i-1].at) != time.Second/AttackRate {
					t.Fatalf("%s: packet %d %v after the one before", tc.order, i, p.at.Sub(pk[i-1].at))
				}
				if same := bytes.Equal(p.payload, pk[0].payload); i > 0 && same != (o.Vector == "udpplain") {
					t.Fatalf("%s: packet %d's payload the same as the first: %v", tc.order, i, same)
				}
			}
		}
		// Longer than 5 s is cut to 5 s: 1,000 packets, whatever the order.
		b2, opened2 := attackBeacon(&log)
		b2.order(t.Context(), order(t, "udp 192.0.2.9 9 4294967295"))
		b2.atkWG.Wait()
		if pk := (<-opened2).sent(); len(pk) != AttackMaxSeconds*AttackRate || pk[len(pk)-1].at.Sub(pk[0].at) >= AttackMaxSeconds*time.Second {
			t.Fatalf("a long order: %d packets over %v", len(pk), pk[len(pk)-1].at.Sub(pk[0].at))
		}
	})
}

// A sender that is woken late keeps the attack's pace: the packets that
// fell due while it slept go when it wakes. A guest under TCG on a loaded
// host, whose sender was woken about every 20 ms, sent a 4 s order's 800
// packets over 17 s with a ticker's pace, under tb-parse's 50 a second.
func TestAttackKeepsItsPaceThroughStalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := newPacketSink()
		sink.stallEvery, sink.stall = 10, 30*time.Millisecond
		start := time.Now()
		n, err := flood(t.Context(), sink, order(t, "udp 192.0.2.1 9 4"), 4*AttackRate)
		took := time.Since(start)
		if n != 4*AttackRate || err != nil {
			t.Fatalf("%d sent, %v", n, err)
		}
		// 800 packets due over 3.995 s; the last stall is 30 ms.
		if limit := 4*time.Second + sink.stall; took > limit {
			t.Fatalf("800 packets took %v with a 30 ms stall every 10th, want at most %v", took, limit)
		}
		// A stall past maxCatchUp is not made up in a burst.
		sink = newPacketSink()
		sink.stallEvery, sink.stall = 100, time.Second
		if n, err := flood(t.Context(), sink, order(t, "udp 192.0.2.1 9 1"), AttackRate); n != AttackRate || err != nil {
			t.Fatalf("%d sent, %v", n, err)
		}
		pk := sink.sent()
		burst := 0
		for i := 101; i < len(pk) && pk[i].at.Equal(pk[100].at); i++ {
			burst++
		}
		if max := int(maxCatchUp / (time.Second / AttackRate)); burst > max {
			t.Fatalf("%d packets at once after a 1 s stall, want at most %d", burst, max)
		}
	})
}

// An attack stops when the beacon does.
func TestAttackStopsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log bytes.Buffer
		b, opened := attackBeacon(&log)
		ctx, cancel := context.WithCancel(t.Context())
		b.order(ctx, order(t, "udp 192.0.2.1 9 5"))
		time.Sleep(time.Second + time.Second/AttackRate/2) // the bubble's clock: packets at 0, 5 ms, ..., 1 s
		cancel()
		b.atkWG.Wait()
		if n := len((<-opened).sent()); n != AttackRate+1 {
			t.Fatalf("%d packets in one second, want %d", n, AttackRate+1)
		}
	})
}
