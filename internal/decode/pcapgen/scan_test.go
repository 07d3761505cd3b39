package pcapgen

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
)

func TestScannable(t *testing.T) {
	for a, want := range map[string]bool{
		"8.8.8.8": true, "1.0.0.1": true, "100.63.255.255": true, "100.128.0.1": true, "172.15.255.255": true,
		"172.32.0.1": true, "198.17.255.255": true, "198.20.0.1": true, "223.255.255.254": true, "192.0.3.1": true,
		"0.1.2.3": false, "10.13.37.5": false, "100.64.0.1": false, "127.0.0.1": false, "169.254.1.1": false,
		"172.16.0.1": false, "172.31.255.255": false, "192.168.1.1": false, "198.18.0.1": false, "198.19.255.255": false,
		"224.0.0.1": false, "240.0.0.1": false, "255.255.255.255": false,
		"192.0.2.1": false, "198.51.100.20": false, "203.0.113.66": false, "2001:db8::1": false,
	} {
		if got := Scannable(netip.MustParseAddr(a)); got != want {
			t.Errorf("Scannable(%s) = %v, want %v", a, got, want)
		}
	}
}

// TestTargets: distinct scannable addresses spread over the space, another
// sequence for another seed, the same for the same.
func TestTargets(t *testing.T) {
	const n = 200000
	seen := make(map[netip.Addr]bool, n)
	firsts := map[byte]bool{}
	tg, same, other := NewTargets(1), NewTargets(1), NewTargets(2)
	differ := 0
	for i := 0; i < n; i++ {
		a, ok := tg.Next()
		if !ok || !Scannable(a) || seen[a] {
			t.Fatalf("address %d: %s (ok %v, scannable %v, seen before %v)", i, a, ok, Scannable(a), seen[a])
		}
		seen[a] = true
		firsts[a.As4()[0]] = true
		if b, _ := same.Next(); b != a {
			t.Fatalf("address %d: %s, then %s for the same seed", i, a, b)
		}
		if b, _ := other.Next(); b != a {
			differ++
		}
	}
	if len(firsts) < 200 || differ < n*99/100 {
		t.Errorf("%d distinct first octets (want 200+), %d of %d addresses differ for another seed", len(firsts), differ, n)
	}
}

type recorder struct {
	ts   []time.Time
	data []string
}

func (r *recorder) WritePacket(ci gopacket.CaptureInfo, data []byte) error {
	r.ts = append(r.ts, ci.Timestamp)
	r.data = append(r.data, string(data))
	return nil
}

// TestSched: conversations generated one after the other come out
// interleaved in time order, ties in the order given, and Release holds
// back what a later conversation could still precede.
func TestSched(t *testing.T) {
	rec := &recorder{}
	s := &Sched{Out: rec}
	at := func(ms int) time.Time { return Start.Add(time.Duration(ms) * time.Millisecond) }
	frame := []byte("a")
	put := func(ms int, b byte) {
		frame[0] = b // the frame is copied: reusing the buffer is fine
		if err := s.WritePacket(gopacket.CaptureInfo{Timestamp: at(ms)}, frame); err != nil {
			t.Fatal(err)
		}
	}
	put(0, 'a')
	put(300, 'b')
	put(100, 'c')
	put(200, 'd')
	put(100, 'e')
	if err := s.Release(at(200)); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rec.data, ""); got != "ace" || s.Held() != 2 {
		t.Fatalf("released before 200 ms: %q, %d held; want \"ace\", 2", got, s.Held())
	}
	put(250, 'f') // in buffers freed by the release
	put(260, 'g')
	if err := s.Drain(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rec.data, ""); got != "acedfgb" {
		t.Errorf("drained: %q, want \"acedfgb\"", got)
	}
	for i := 1; i < len(rec.ts); i++ {
		if rec.ts[i].Before(rec.ts[i-1]) {
			t.Errorf("frame %d stamped before the one before it", i)
		}
	}

	// Through a generator: a handshake and a refused SYN started later but
	// answered sooner interleave.
	rec2 := &recorder{}
	s2 := &Sched{Out: rec2}
	g := To(s2, Options{})
	g.Step = 100 * time.Millisecond
	c, srv := netip.MustParseAddrPort("10.13.37.5:40000"), netip.MustParseAddrPort("198.51.100.20:80")
	g.T = at(0)
	g.Dial(c, srv, 1, 2) // at 0, 100, 200 ms
	g.T = at(50)
	g.Refused(c, netip.MustParseAddrPort("198.51.100.21:23"), 9) // at 50, 150 ms
	if err := s2.Drain(); err != nil || g.Err() != nil {
		t.Fatal(err, g.Err())
	}
	want := []int{0, 50, 100, 150, 200}
	if len(rec2.ts) != len(want) {
		t.Fatalf("%d frames, want %d", len(rec2.ts), len(want))
	}
	for i, ms := range want {
		if !rec2.ts[i].Equal(at(ms)) {
			t.Errorf("frame %d at %s, want %d ms", i, rec2.ts[i].Sub(Start), ms)
		}
	}
}
