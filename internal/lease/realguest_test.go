package lease_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/lease"
	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// realGuestHost is what the real-guest tests share: a state with the test
// image of spec installed, the lab up makes, and a lease manager over
// them, all removed when the test ends.
type realGuestHost struct {
	stateDir string
	st       *state.Store
	lab      *leasetest.Lab
	m        *lease.Manager
	// stderr is the manager's log, for failures.
	stderr *strings.Builder
}

func newRealGuestHost(t *testing.T, spec string, up func(ctx context.Context, stateDir string) (*leasetest.Lab, error)) *realGuestHost {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the real-guest test needs root (bridges, nftables, VMs); run it with make test")
	}
	ctx := context.Background()
	fix, err := leasetest.ImageFor(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	h := &realGuestHost{stateDir: filepath.Join(t.TempDir(), "state"), stderr: &strings.Builder{}}
	if err := leasetest.Reachable(h.stateDir); err != nil {
		t.Fatal(err)
	}
	if err := fix.Install(ctx, h.stateDir); err != nil {
		t.Fatal(err)
	}
	if h.lab, err = up(ctx, h.stateDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.lab.Down)
	t.Cleanup(func() { leasetest.Cleanup(h.stateDir) })
	if h.st, err = state.Open(ctx, h.stateDir); err != nil {
		t.Fatal(err)
	}
	cfg, err := lease.Options{Bridge: h.lab.Bridge, LabNet: h.lab.LabNet.String()}.Load(h.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	// The manager's warnings (a restore tried again, say) go with the
	// failure's message.
	h.m = lease.New(h.st, cfg, cmdout.New("tb-lease", io.Discard, h.stderr,
		slog.New(slog.NewTextHandler(h.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	h.m.Labs = lease.HostLabs{Labs: capture.Labs{St: h.st}}
	t.Cleanup(h.m.Close)
	return h
}

// documentationLab brings up the lab with the documentation ranges.
func documentationLab(ctx context.Context, stateDir string) (*leasetest.Lab, error) {
	return leasetest.UpDocumentationLab(ctx, stateDir)
}
