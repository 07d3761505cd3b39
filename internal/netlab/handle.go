package netlab

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// DefaultName is the lab every tool means when none is named.
const DefaultName = "default"

// Dir is where the lab named name (DefaultName if empty) keeps its state in
// st: the configuration it was brought up with, its last check, the names
// its DNS sinkhole forwards.
func Dir(st *state.Store, name string) string {
	return filepath.Join(labsDir(st), cmp.Or(name, DefaultName))
}

// labsDir holds a directory (Dir) per lab of st.
func labsDir(st *state.Store) string { return st.Path("capture", "labs") }

// Lab is one lab of this host, as Open (or Expected) found it: the one
// handle the tools take a lab's configuration, firewall, validator and last
// check from.
type Lab struct {
	// Name is the lab's name (tb-capture net up --lab).
	Name string
	// Dir is where it keeps its state (Dir).
	Dir string
	// Config is what it was brought up with; for a lab Expected found not
	// up, what tb-capture net up --lab Name would bring it up with.
	Config Config
	up     bool
}

// ErrNotUp matches (errors.Is) the error of a lab that is not up.
var ErrNotUp = errors.New("lab not up")

// NotUpError is a lab asked for that is not up: exit 69, a service
// missing, from every tool, with what to run.
type NotUpError struct{ Lab string }

func (e *NotUpError) Error() string {
	return fmt.Sprintf("lab %q is not up (run tb-capture net up --lab %s)", e.Lab, e.Lab)
}

// FaultCode implements fault.Coder.
func (e *NotUpError) FaultCode() int { return fault.ExitUnavailable }

// Is makes errors.Is(err, ErrNotUp) true.
func (e *NotUpError) Is(target error) bool { return target == ErrNotUp }

// Open is the lab named name (DefaultName if empty) of st when it is up;
// a *NotUpError when it is not.
func Open(st *state.Store, name string) (*Lab, error) {
	name = cmp.Or(name, DefaultName)
	dir := Dir(st, name)
	m, err := Load(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, &NotUpError{Lab: name}
	}
	if err != nil {
		return nil, fmt.Errorf("lab %q: %w", name, err)
	}
	return &Lab{Name: name, Dir: dir, Config: m.Config, up: true}, nil
}

// UpLabs are the labs of st that are up, in name order. A lab whose recorded
// configuration cannot be read is left out, as one that is not up: no
// guest is placed on it.
func UpLabs(st *state.Store) ([]*Lab, error) {
	dirs, err := os.ReadDir(labsDir(st))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var labs []*Lab
	for _, d := range dirs {
		if l, err := Open(st, d.Name()); err == nil {
			labs = append(labs, l)
		}
	}
	return labs, nil
}

// Expected is the lab named name as Open finds it when it is up, else as
// tb-capture net up --lab name would make it with no other flag, in this
// network namespace and without an upstream resolver: what a promotion is
// checked against on a machine whose lab is not up yet.
func Expected(st *state.Store, name string) (*Lab, error) {
	l, err := Open(st, name)
	if !errors.Is(err, ErrNotUp) {
		return l, err
	}
	l = &Lab{Name: cmp.Or(name, DefaultName), Dir: Dir(st, name)}
	l.Config = Config{Name: l.Name, Dir: l.Dir}
	l.Config.Defaults()
	return l, nil
}

// Firewall is the lab's containment driver; a *NotUpError for a lab that
// is not up, which has no tables to change.
func (l *Lab) Firewall() (*firewall.NFT, error) {
	if !l.up {
		return nil, &NotUpError{Lab: l.Name}
	}
	return l.Config.Firewall()
}

// LiveFirewall is the lab's firewall for changing a lease's rules: as
// Firewall, and a *NotUpError too for a lab whose nftables table is gone
// (flushed, a reboot) though its configuration is on disk, which has no
// table to put rules in. What only removes rules takes Firewall: a table
// that is gone holds none.
func (l *Lab) LiveFirewall() (*firewall.NFT, error) {
	fw, err := l.Firewall()
	if err != nil {
		return nil, err
	}
	if ok, err := fw.Present(); err != nil {
		return nil, fmt.Errorf("lab %q: %w", l.Name, err)
	} else if !ok {
		return nil, &NotUpError{Lab: l.Name}
	}
	return fw, nil
}

// Validator is the firewall's validator of what may be allowed out of the
// lab: never its own networks or the host's addresses (those of the
// namespace it runs in), the documentation ranges only when documentation
// says so, the SMTP ports smtpPorts only when a plan forces them.
func (l *Lab) Validator(documentation bool, smtpPorts []uint16) (firewall.Policy, error) {
	fw, err := l.Config.Firewall()
	if err != nil {
		return firewall.Policy{}, fmt.Errorf("lab %q: %w", l.Name, err)
	}
	p := fw.Policy(false)
	p.Documentation = documentation
	p.SMTPPorts = smtpPorts
	return p, nil
}

// LastCheck is the lab's last containment check, nil when it has none.
func (l *Lab) LastCheck() (*ProbeReport, error) {
	rep, err := LoadCheck(l.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return rep, err
}

// Check runs the containment probes (Probe) on the lab and records the
// result as its last check (LastCheck), which tb-lease and a fleet worker
// require passed before a guest is placed on the lab. A check that could
// not run is recorded as failed, so that a lab is never taken for
// contained on the strength of an older check; one that was interrupted
// (ctx) records nothing.
func (l *Lab) Check(ctx context.Context) (*ProbeReport, error) {
	if !l.up {
		return nil, &NotUpError{Lab: l.Name}
	}
	start := time.Now()
	rep, err := Probe(ctx, &l.Config)
	if err != nil && ctx.Err() != nil {
		return nil, err
	}
	if err != nil {
		failed := &ProbeReport{Lab: l.Name, At: start.UTC(), TookMS: time.Since(start).Milliseconds(),
			Probes: []ProbeResult{{Name: "setup", Verdict: ProbeFail, Detail: err.Error()}}}
		if serr := SaveCheck(l.Dir, failed); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, err
	}
	if err := SaveCheck(l.Dir, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// NotContainedError is a lab that is up but on which no guest may be
// placed: only partly up, or its containment unchecked or failing; or a
// bridge that is no lab's. It is exit 69, a service missing, like a lab
// that is not up at all.
type NotContainedError struct {
	Lab    string
	Reason string
}

func (e *NotContainedError) Error() string {
	if e.Lab == "" {
		return e.Reason
	}
	return fmt.Sprintf("lab %s: %s", e.Lab, e.Reason)
}

// FaultCode implements fault.Coder.
func (e *NotContainedError) FaultCode() int { return fault.ExitUnavailable }

// Contained is nil only when the lab is up, every part of it, and its last
// check (Check) passed: what a host must show before a guest is placed on
// the lab. Otherwise it is a *NotContainedError saying what to run (a
// *NotUpError for a lab Expected found not up).
func (l *Lab) Contained(ctx context.Context) error {
	if !l.up {
		return &NotUpError{Lab: l.Name}
	}
	s, err := l.Status(ctx)
	if err != nil {
		return err
	}
	if !s.Up {
		return &NotContainedError{Lab: l.Name, Reason: fmt.Sprintf("only partly up (see tb-capture net status --lab %s)", l.Name)}
	}
	rep, err := l.LastCheck()
	if err != nil {
		return err
	}
	if rep == nil {
		return &NotContainedError{Lab: l.Name, Reason: fmt.Sprintf("containment not checked (run tb-capture net check --lab %s)", l.Name)}
	}
	if f := rep.Failed(); f != nil {
		return &NotContainedError{Lab: l.Name, Reason: fmt.Sprintf("containment check failed probe %s at %s: %s (tb-capture net check --lab %s)",
			f.Name, rep.At.Format(time.RFC3339), f.Detail, l.Name)}
	}
	return nil
}

// Status is what the lab's parts look like now.
func (l *Lab) Status(ctx context.Context) (*Status, error) { return inspect(ctx, l.Config) }

// SetAllowedNames replaces the names the lab's DNS sinkhole forwards to its
// upstream (SetAllowedNames).
func (l *Lab) SetAllowedNames(names []string) error {
	if !l.up {
		return &NotUpError{Lab: l.Name}
	}
	return setAllowedNames(&l.Config, names)
}
