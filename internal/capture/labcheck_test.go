package capture_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// TestLabContained follows a real lab through what a host shows before a
// lease may be placed on it: not up, up and checked, broken and failing its
// check, checked again, never checked, down.
func TestLabContained(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := labtest.New(t)
	cfg := l.Config
	t.Cleanup(func() { netlab.Down(ctx, netlab.Dir(st, cfg.Name)) })
	refused := func(want string) {
		t.Helper()
		err := capture.LabContained(ctx, st, cfg.Name)
		var nc *netlab.NotContainedError
		if !errors.As(err, &nc) || !strings.Contains(err.Error(), want) || fault.Code(err) != fault.ExitUnavailable {
			t.Fatalf("LabContained: %v (exit %d), want a refusal saying %q", err, fault.Code(err), want)
		}
	}
	notUp := func() {
		t.Helper()
		err := capture.LabContained(ctx, st, cfg.Name)
		want := (&netlab.NotUpError{Lab: cfg.Name}).Error()
		if !errors.Is(err, netlab.ErrNotUp) || err.Error() != want || fault.Code(err) != fault.ExitUnavailable {
			t.Fatalf("LabContained: %v (exit %d), want the one not-up error %q, exit 69", err, fault.Code(err), want)
		}
	}
	check := func(wantFailed string) {
		t.Helper()
		lab, err := netlab.Open(st, cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := lab.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if f := rep.Failed(); f != nil {
			got = f.Name
		}
		if got != wantFailed {
			t.Fatalf("failed probe %q, want %q: %+v", got, wantFailed, rep.Probes)
		}
	}

	notUp()
	rep, err := capture.UpLab(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Passed {
		t.Fatalf("the lab as built fails its check: %v", rep.Err())
	}
	if err := capture.LabContained(ctx, st, cfg.Name); err != nil {
		t.Fatalf("a lab up and checked: %v", err)
	}

	// Guests reach the host: the lab stays up and is refused.
	flushInput(t, l.HostNS(), cfg.Table)
	check("host-dropped")
	refused("containment check failed probe host-dropped at ")
	fw, err := cfg.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	if err := fw.Up(ctx); err != nil {
		t.Fatal(err)
	}
	check("")
	if err := capture.LabContained(ctx, st, cfg.Name); err != nil {
		t.Fatalf("after a passing check: %v", err)
	}

	if err := netlab.ForgetCheck(netlab.Dir(st, cfg.Name)); err != nil {
		t.Fatal(err)
	}
	refused("containment not checked (run tb-capture net check --lab " + cfg.Name + ")")

	if err := netlab.Down(ctx, netlab.Dir(st, cfg.Name)); err != nil {
		t.Fatal(err)
	}
	notUp()
}

// flushInput removes the lab's rules that keep guests off the host.
func flushInput(t *testing.T, ns, table string) {
	t.Helper()
	f, err := os.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	c.FlushChain(&nftables.Chain{Name: "input", Table: &nftables.Table{Name: table, Family: nftables.TableFamilyINet}})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}
