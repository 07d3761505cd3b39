package lease_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/lease"
	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// TestTapBoundBeforeCapture: a guest with root claims a neighbour's
// address in ARP as soon as its lease is handed out, before any capture
// of it started (until issue 25, tb-capture start bound the tap); the
// bridge never passes that claim, while the guest's own address passes.
// The claim is sent before the marker (the guest's own address asking for
// another unused one) on the same path, so once the marker is on the
// bridge the claim would have been too.
func TestTapBoundBeforeCapture(t *testing.T) {
	h := newRealGuestHost(t, leasetest.Spec, func(ctx context.Context, dir string) (*leasetest.Lab, error) {
		return leasetest.UpLab(ctx, dir, "", "", netip.Prefix{})
	})
	ctx := context.Background()
	st, m, lab, stderr := h.st, h.m, h.lab, h.stderr
	p := storePlan(t, st, "cccc", records.NetPolicy{Mode: "sinkhole"})
	l, err := m.Acquire(ctx, lease.Request{Plan: p, Holder: "cycle_bind"})
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	own := netip.MustParseAddr(l.IP)
	// Addresses of the lab network no lease has: the neighbour the guest
	// claims to be, and the two it asks for.
	neighbour, claimTarget, markerTarget := labAddr(lab.LabNet, 200), labAddr(lab.LabNet, 201), labAddr(lab.LabNet, 202)

	sniff, err := capture.OpenAFPacket("", lab.Bridge, 128, nil, capture.RingConfig{BlockSize: 1 << 16, Blocks: 4, Timeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sniff.Close()
	errMarker := errors.New("marker seen")
	var claims int
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- sniff.Run(sctx, func(_ time.Time, b []byte, _ int, _ bool) error {
			sender, target, ok := arp(b)
			switch {
			case !ok:
			case sender == neighbour:
				claims++
			case sender == own && target == markerTarget:
				return errMarker
			}
			return nil
		})
	}()
	guestSh(t, m, l.ID, "ip addr add "+neighbour.String()+"/32 dev eth0 && busybox arping -c 1 -w 1 -I eth0 -s "+neighbour.String()+" "+claimTarget.String()+
		"; busybox arping -c 1 -w 1 -I eth0 -s "+own.String()+" "+markerTarget.String()+"; true")
	if err := <-done; !errors.Is(err, errMarker) {
		t.Fatalf("the guest's own ARP never reached the bridge: %v", err)
	}
	if claims != 0 {
		t.Errorf("the bridge passed %d ARP frames of the guest claiming %s", claims, neighbour)
	}
}

// labAddr is the host address n of the lab network.
func labAddr(p netip.Prefix, n byte) netip.Addr {
	a := p.Masked().Addr().As4()
	a[3] = n
	return netip.AddrFrom4(a)
}

// arp returns the sender and target IPv4 of an Ethernet ARP frame.
func arp(b []byte) (sender, target netip.Addr, ok bool) {
	if len(b) < 42 || b[12] != 0x08 || b[13] != 0x06 {
		return sender, target, false
	}
	return netip.AddrFrom4([4]byte(b[28:32])), netip.AddrFrom4([4]byte(b[38:42])), true
}
