package netlab_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

func openState(t *testing.T) *state.Store {
	t.Helper()
	st, err := state.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// A lab that is not up is one error, in one wording and of one class,
// whichever tool asks: it names the lab and says how to bring it up.
func TestOpenNotUp(t *testing.T) {
	st := openState(t)
	for name, want := range map[string]string{
		"":      `lab "default" is not up (run tb-capture net up --lab default)`,
		"nolab": `lab "nolab" is not up (run tb-capture net up --lab nolab)`,
	} {
		_, err := netlab.Open(st, name)
		if err == nil || err.Error() != want {
			t.Errorf("Open(%q) = %v, want %s", name, err, want)
		}
		if !errors.Is(err, netlab.ErrNotUp) || fault.Code(err) != fault.ExitUnavailable {
			t.Errorf("Open(%q): %v is not ErrNotUp of exit 69 (exit %d)", name, err, fault.Code(err))
		}
	}
	// Expected takes a lab that is not up for the one net up would make,
	// but gives it no firewall to change.
	lab, err := netlab.Expected(st, "nolab")
	if err != nil {
		t.Fatal(err)
	}
	if lab.Config.Bridge != "tb-lab0" || lab.Config.LabNet != netip.MustParsePrefix("10.13.37.0/24") || lab.Dir != netlab.Dir(st, "nolab") {
		t.Errorf("Expected(nolab) = %+v, want the default configuration in %s", lab, netlab.Dir(st, "nolab"))
	}
	if _, err := lab.Firewall(); !errors.Is(err, netlab.ErrNotUp) {
		t.Errorf("the firewall of a lab that is not up: %v, want ErrNotUp", err)
	}
	if err := lab.SetAllowedNames([]string{"example.com"}); !errors.Is(err, netlab.ErrNotUp) {
		t.Errorf("the DNS names of a lab that is not up: %v, want ErrNotUp", err)
	}
	if _, err := lab.Check(context.Background()); !errors.Is(err, netlab.ErrNotUp) {
		t.Errorf("checking a lab that is not up: %v, want ErrNotUp", err)
	}
	v, err := lab.Validator(true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.CheckDst(netip.MustParseAddr("10.13.38.2")); err == nil || !strings.Contains(err.Error(), "a lab address") {
		t.Errorf("the default sinkhole address: %v, want refused as a lab address", err)
	}
}

// The handle of a lab that is up is that lab: its configuration, its real
// nftables table in the namespace playing the host, a validator that
// refuses the lab's networks and the addresses of that namespace (even a
// documentation address standing in for the internet), and its last check.
func TestOpenUpLab(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	st := openState(t)
	cfg := l.Config
	cfg.Dir = netlab.Dir(st, cfg.Name)
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	lab, err := netlab.Open(st, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if lab.Name != cfg.Name || lab.Dir != cfg.Dir || lab.Config.Bridge != cfg.Bridge || lab.Config.HostNS != cfg.HostNS {
		t.Fatalf("Open(%s) = %+v, want the lab brought up in %s", cfg.Name, lab, cfg.Dir)
	}
	// A lab that is not up (only its directory left) is not among those up.
	if err := os.MkdirAll(netlab.Dir(st, "gone"), 0o750); err != nil {
		t.Fatal(err)
	}
	if up, err := netlab.UpLabs(st); err != nil || len(up) != 1 || up[0].Name != cfg.Name || up[0].Config.Bridge != cfg.Bridge {
		t.Fatalf("UpLabs = %+v, %v, want only %s", up, err, cfg.Name)
	}
	fw, err := lab.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lab.LiveFirewall(); err != nil {
		t.Fatalf("the live firewall of a lab that is up: %v", err)
	}
	fs, err := fw.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !fs.Up || fs.Table != cfg.Table {
		t.Fatalf("the lab's firewall: %+v, want its table %s up", fs, cfg.Table)
	}
	s, err := lab.Status(ctx)
	if err != nil || !s.Bridge || !s.SinkNS || !s.Firewall.Up {
		t.Fatalf("the lab's status: %+v, %v", s, err)
	}

	v, err := lab.Validator(true, nil)
	if err != nil {
		t.Fatal(err)
	}
	for addr, why := range map[string]string{
		cfg.LabNet.Addr().Next().Next().String(): "a lab address",
		cfg.Sinkhole().String():                  "a lab address",
		labtest.UplinkHost.String():              "an address of the host",
	} {
		if err := v.CheckDst(netip.MustParseAddr(addr)); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%s: %v, want refused as %s", addr, err, why)
		}
	}
	if err := v.CheckDst(labtest.C2); err != nil {
		t.Errorf("%s, a documentation address off the host, with documentation: %v", labtest.C2, err)
	}
	if v, _ := lab.Validator(false, nil); v.CheckDst(labtest.C2) == nil {
		t.Errorf("%s allowed without documentation", labtest.C2)
	}

	if rep, err := lab.LastCheck(); rep != nil || err != nil {
		t.Fatalf("last check of a lab never checked: %+v, %v", rep, err)
	}
	saved := &netlab.ProbeReport{Lab: cfg.Name, Probes: []netlab.ProbeResult{{Name: "setup", Verdict: netlab.ProbeFail, Detail: "x"}}}
	if err := netlab.SaveCheck(lab.Dir, saved); err != nil {
		t.Fatal(err)
	}
	if rep, err := lab.LastCheck(); err != nil || rep == nil || rep.Failed() == nil {
		t.Fatalf("last check: %+v, %v, want the failed one saved", rep, err)
	}

	if err := netlab.Down(ctx, cfg.Dir); err != nil {
		t.Fatal(err)
	}
	if _, err := netlab.Open(st, cfg.Name); !errors.Is(err, netlab.ErrNotUp) {
		t.Fatalf("Open after down: %v, want ErrNotUp", err)
	}
	if up, err := netlab.UpLabs(st); err != nil || len(up) != 0 {
		t.Fatalf("UpLabs after down = %+v, %v, want none", up, err)
	}
	if fs, err := fw.Status(ctx); err != nil || fs.Up {
		t.Fatalf("the lab's table after down: %+v, %v, want gone", fs, err)
	}
	// The handle still says up; its table is gone: not up, in the one
	// wording.
	notUp := (&netlab.NotUpError{Lab: cfg.Name}).Error()
	if _, err := lab.LiveFirewall(); !errors.Is(err, netlab.ErrNotUp) || err.Error() != notUp || fault.Code(err) != fault.ExitUnavailable {
		t.Fatalf("the live firewall of a lab whose table is gone: %v (exit %d), want %q, exit 69", err, fault.Code(err), notUp)
	}
}
