package capture_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// TestFailedUpLeavesNoHalfLab: a lab whose build fails part way (here its
// sinkhole's dnsmasq is missing, after the bridge, the sinkhole's
// namespace and the tables were made) is taken down again: no bridge, no
// namespace, no record of a lab, and the next attempt starts clean.
func TestFailedUpLeavesNoHalfLab(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := labtest.New(t)
	cfg := l.Config
	cfg.DNS = true // the sinkhole's resolver: dnsmasq, started last
	t.Cleanup(func() { netlab.Down(ctx, netlab.Dir(st, cfg.Name)) })
	t.Setenv("PATH", t.TempDir()) // no dnsmasq, no multilog
	_, err = capture.UpLab(ctx, st, cfg)
	var missing *netlab.MissingError
	if !errors.As(err, &missing) {
		t.Fatalf("up without dnsmasq: %v", err)
	}
	if _, err := l.Handle(l.HostNS()).LinkByName(cfg.Bridge); err == nil {
		t.Error("the bridge is left behind")
	}
	if netns.Exists(cfg.SinkNS) {
		t.Error("the sinkhole's namespace is left behind")
	}
	if _, err := os.Stat(netlab.Dir(st, cfg.Name)); err == nil {
		if _, err := netlab.Open(st, cfg.Name); !errors.Is(err, netlab.ErrNotUp) {
			t.Errorf("the lab is recorded as up: %v", err)
		}
	}
}
