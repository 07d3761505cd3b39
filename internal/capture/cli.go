package capture

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// exitErr maps this package's errors to talkbox(7) exit codes.
func exitErr(err error) error {
	if err == nil {
		return nil
	}
	var ie *InputError
	var inv *firewall.InvalidError
	var be *BusyError
	var me *netlab.MissingError
	var ce *netlab.ConfigChangedError
	switch {
	case errors.Is(err, diskspace.ErrLow):
		return cli.TempFail(err)
	case errors.As(err, &ce):
		return cli.Usage(err)
	case errors.As(err, &ie), errors.As(err, &inv):
		return cli.DataErr(err)
	case errors.As(err, &be):
		return cli.TempFail(err)
	case errors.As(err, &me):
		return cli.Unavailable(err)
	case errors.Is(err, errNotRunning):
		return cli.Failure(err)
	}
	return err
}

func open(env *cli.Env) (*state.Store, error) { return env.OpenState() }

// NetUp is "tb-capture net up".
func NetUp(env *cli.Env, cfg netlab.Config) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	cfg.Dir = LabDir(st, cfg.Name)
	cfg.Defaults()
	if err := cfg.Check(); err != nil {
		return cli.Usage(err)
	}
	if _, err := netlab.Up(env.Ctx, cfg); err != nil {
		return exitErr(err)
	}
	s, err := netlab.Inspect(env.Ctx, cfg.Dir)
	if err != nil {
		return err
	}
	return records.PrintLine(env.Stdout, records.LineLabStatus, s)
}

// NetDown is "tb-capture net down".
func NetDown(env *cli.Env, lab string) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	return exitErr(netlab.Down(env.Ctx, LabDir(st, lab)))
}

// NetStatus is "tb-capture net status": exit 1 when the lab is not up.
func NetStatus(env *cli.Env, lab string) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	s, err := netlab.Inspect(env.Ctx, LabDir(st, lab))
	if errors.Is(err, os.ErrNotExist) {
		return cli.Failure(fmt.Errorf("lab %q is not up", cmp.Or(lab, "default")))
	}
	if err != nil {
		return err
	}
	if err := records.PrintLine(env.Stdout, records.LineLabStatus, s); err != nil {
		return err
	}
	if !s.Up {
		return cli.Failure(fmt.Errorf("lab %q is only partly up", s.Name))
	}
	return nil
}

// NetDNSAllow is "tb-capture net dns-allow": the names the DNS sinkhole
// forwards upstream (replacing the list).
func NetDNSAllow(env *cli.Env, lab string, names []string) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	if err := netlab.SetAllowedNames(LabDir(st, lab), names); err != nil {
		return cli.DataErr(err)
	}
	return nil
}

// DaemonArgv is how "start" runs the daemon: this same program.
func DaemonArgv() ([]string, error) {
	exe := os.Args[0]
	if !strings.Contains(exe, "/") {
		p, err := exec.LookPath(exe)
		if err != nil {
			if p, err = os.Executable(); err != nil {
				return nil, err
			}
		}
		exe = p
	}
	abs, err := filepath.Abs(exe)
	if err != nil {
		return nil, err
	}
	return []string{abs}, nil
}

// StartCmd is "tb-capture start".
func StartCmd(env *cli.Env, req StartRequest) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	if strings.HasPrefix(req.BPF, "@") {
		b, err := os.ReadFile(req.BPF[1:])
		if err != nil {
			return cli.Usage(err)
		}
		req.BPF = string(b)
	}
	if req.Daemon == nil {
		if req.Daemon, err = DaemonArgv(); err != nil {
			return err
		}
	}
	rec, err := Start(env.Ctx, st, env.Log, req)
	if err != nil {
		return exitErr(err)
	}
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	return w.Write(rec)
}

// RotateCmd is "tb-capture rotate".
func RotateCmd(env *cli.Env, captureID, lease, cycle string) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	c, err := Find(st, captureID, lease)
	if err != nil {
		return exitErr(err)
	}
	arts, err := Rotate(env.Ctx, st, c, cycle)
	if err != nil {
		return exitErr(err)
	}
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	for i := range arts {
		if err := w.Write(&arts[i]); err != nil {
			return err
		}
	}
	return nil
}

// StopCmd is "tb-capture stop": the last artifacts, then the capture.
func StopCmd(env *cli.Env, captureID, lease string) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	c, err := Find(st, captureID, lease)
	if err != nil {
		return exitErr(err)
	}
	out, arts, err := Stop(env.Ctx, st, c)
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	for i := range arts {
		w.Write(&arts[i])
	}
	if out != nil && out.ID != "" {
		w.Write(out)
	}
	return exitErr(err)
}

// AllowCmd is "tb-capture allow": change a lease's live allow set in one
// batch, then print the set.
func AllowCmd(env *cli.Env, lab, lease string, add, del []string) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	fw, err := LabFirewall(st, lab)
	if err != nil {
		return cli.Failure(err)
	}
	parse := func(in []string) ([]firewall.Element, error) {
		var out []firewall.Element
		for _, s := range in {
			e, err := firewall.ParseElement(s)
			if err != nil {
				return nil, cli.Usage(err)
			}
			out = append(out, e)
		}
		return out, nil
	}
	a, err := parse(add)
	if err != nil {
		return err
	}
	d, err := parse(del)
	if err != nil {
		return err
	}
	if len(a)+len(d) > 0 {
		if err := fw.ApplyAllowSet(env.Ctx, lease, a, d); err != nil {
			if errors.Is(err, firewall.ErrNoLease) {
				return cli.Failure(err)
			}
			return exitErr(err)
		}
	}
	els, err := fw.AllowSet(env.Ctx, lease)
	if err != nil {
		return cli.Failure(err)
	}
	w := records.NewWriter(env.Stdout)
	for _, e := range els {
		if err := w.Line(records.LineAllowElement, e); err != nil {
			return err
		}
	}
	return w.Flush()
}

// ReconcileCmd is "tb-capture reconcile".
func ReconcileCmd(env *cli.Env, lab string, dryRun bool) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	acts, err := Reconcile(env.Ctx, st, lab, dryRun)
	w := records.NewWriter(env.Stdout)
	for _, a := range acts {
		if werr := w.Line(records.LineReconcileAction, a); werr != nil {
			return werr
		}
	}
	// The actions taken are printed even when a later one failed.
	if werr := w.Flush(); werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	for _, a := range acts {
		if a.Error != "" {
			return cli.Failure(fmt.Errorf("%s %s%s: %s", a.Action, a.Lease, a.Capture, a.Error))
		}
	}
	return nil
}

// StatusCmd is "tb-capture status".
func StatusCmd(env *cli.Env, lab string) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	reps, err := Status(env.Ctx, st, lab)
	if err != nil {
		return err
	}
	w := records.NewWriter(env.Stdout)
	for _, r := range reps {
		if err := w.Line(records.LineCaptureStatus, r); err != nil {
			return err
		}
	}
	return w.Flush()
}

// DaemonCmd is the hidden "tb-capture daemon ID" that start runs; it exits
// 75 when it stopped for want of disk space.
func DaemonCmd(env *cli.Env, id string) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	return exitErr(RunDaemon(env.Ctx, st, env.Log, id))
}

// PruneCmd is "tb-capture prune": the artifacts it pruned (or would
// prune), oldest first. Without --keep-days or --keep-bytes it applies the
// retention of the lease's (or the capture's) newest capture.
func PruneCmd(env *cli.Env, captureID, lease string, ret Retention, dryRun bool) error {
	st, err := open(env)
	if err != nil {
		return err
	}
	if err := ret.check(); err != nil {
		return exitErr(err)
	}
	if ret.Zero() {
		c, err := Find(st, captureID, lease)
		if err != nil {
			return exitErr(err)
		}
		ret = Retention{KeepDays: c.KeepDays, KeepBytes: c.KeepBytes}
		if ret.Zero() {
			return cli.Usage(fmt.Errorf("capture %s has no retention: give --keep-days or --keep-bytes", c.ID))
		}
	}
	res, err := Prune(env.Ctx, st, env.Log, PruneRequest{Lease: lease, Capture: captureID, Retention: ret, DryRun: dryRun})
	w := records.NewWriter(env.Stdout)
	if res != nil {
		for i := range res.Pruned {
			if werr := w.Write(&res.Pruned[i]); werr != nil {
				return werr
			}
		}
	}
	// What was pruned is printed even when a later deletion failed.
	if werr := w.Flush(); werr != nil {
		return werr
	}
	return exitErr(err)
}
