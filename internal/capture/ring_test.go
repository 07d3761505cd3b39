package capture_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// TestDefaultRingHoldsSparseTrafficThroughAStall: the kernel hands a ring
// block over at each timeout however empty it is, so a guest that sends a
// packet now and then fills a block with each. While the reader is held up
// (a loaded host), the default ring must hold several seconds of such
// traffic without a drop: here 90 datagrams 70 ms apart (6.3 s, one block
// each), which the ring of 64 blocks of 1 MiB it replaced (3.2 s at the
// 50 ms timeout) dropped from the 65th on.
func TestDefaultRingHoldsSparseTrafficThroughAStall(t *testing.T) {
	const n, gap = 90, 70 * time.Millisecond
	l := newLink(t)
	prog, err := capture.CompileFilter(context.Background(), "udp dst port 9", 65535)
	if err != nil {
		t.Fatal(err)
	}
	src, err := capture.OpenAFPacket(netns.Path(l.host), l.tap, 65535, prog, capture.DefaultRing)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	// Nothing reads the ring while the guest sends: the stall.
	labtest.In(t, l.guest, func() error {
		c, err := net.ListenPacket("udp", ":0")
		if err != nil {
			return err
		}
		defer c.Close()
		to := &net.UDPAddr{IP: l.dst.AsSlice(), Port: 9}
		next := time.Now()
		for i := range n {
			time.Sleep(time.Until(next)) // the traffic's own pace, not a wait for an event
			next = next.Add(gap)
			if _, err := c.WriteTo([]byte(fmt.Sprintf("sparse-%03d", i)), to); err != nil {
				return err
			}
		}
		return nil
	})
	packets, drops, err := src.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if packets != n || drops != 0 {
		t.Fatalf("the kernel counted %d packets and %d drops; want %d and none", packets, drops, n)
	}
	// And every one of them is in the ring, to be read after the stall.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := 0
	err = src.Run(ctx, func(time.Time, []byte, int, bool) error {
		if read++; read == n {
			cancel()
		}
		return nil
	})
	if read != n {
		t.Fatalf("read %d of the %d packets back (%v)", read, n, err)
	}
}
