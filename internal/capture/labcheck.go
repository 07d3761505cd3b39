package capture

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// UpLab builds the lab (netlab.Up), then checks that it contains
// (Lab.Check). A lab that fails to build loses its last check, which was of
// what ran before. The report is nil only when the build failed or the
// check could not run; a check that ran but failed is in the report
// (Err says which probe), with the lab left up. A lab that was not up and
// fails to build is taken down again: never left half up.
func UpLab(ctx context.Context, st *state.Store, cfg netlab.Config) (*netlab.ProbeReport, error) {
	cfg.Dir = netlab.Dir(st, cfg.Name)
	_, before := netlab.Open(st, cfg.Name)
	if _, err := netlab.Up(ctx, cfg); err != nil {
		// A refused change leaves the running lab, and its check, as they were.
		var changed *netlab.ConfigChangedError
		switch {
		case errors.As(err, &changed):
		case before != nil:
			// A lab that was not up is not left half up (a bridge, a
			// namespace, tables, services): what this attempt made goes.
			if derr := netlab.Down(context.WithoutCancel(ctx), cfg.Dir); derr != nil {
				err = errors.Join(err, fmt.Errorf("taking down what was made: %w", derr))
			}
		default:
			if rerr := netlab.ForgetCheck(cfg.Dir); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		return nil, Fault(err)
	}
	lab, err := netlab.Open(st, cfg.Name)
	if err != nil {
		return nil, err
	}
	return lab.Check(ctx)
}

// LabContained is nil only when the lab named is up and contained
// (netlab.Lab.Contained): what a fleet worker's host must show before it
// takes a cycle. A lab that is not up is netlab's one not-up error.
func LabContained(ctx context.Context, st *state.Store, name string) error {
	lab, err := netlab.Open(st, name)
	if err != nil {
		return err
	}
	return lab.Contained(ctx)
}

// Labs are the labs of a host, kept in its state directory: what tb-lease
// asks before it starts a guest or hands one out (lease.Labs).
type Labs struct{ St *state.Store }

// Contained is nil only when bridge, in the network namespace hostNS ("" for
// this process's), is the bridge of a lab of this host whose network is
// labNet and that is contained (netlab.Lab.Contained). Otherwise it is a
// *netlab.NotContainedError saying what to run.
func (l Labs) Contained(ctx context.Context, hostNS, bridge string, labNet netip.Prefix) error {
	lab, err := l.byBridge(hostNS, bridge)
	if errors.Is(err, os.ErrNotExist) {
		where := "this host's network namespace"
		if hostNS != "" {
			where = "network namespace " + hostNS
		}
		return &netlab.NotContainedError{Reason: fmt.Sprintf("bridge %s in %s is not the bridge of a Talkbox lab of this host, and a guest is attached to nothing else (tb-capture net up --bridge %s)",
			bridge, where, bridge)}
	}
	if err != nil {
		return err
	}
	if lab.Config.LabNet.Masked() != labNet.Masked() {
		return &netlab.NotContainedError{Lab: lab.Name, Reason: fmt.Sprintf("its network is %s, the leases' is %s (set tb-lease --lab-net %s)",
			lab.Config.LabNet, labNet, lab.Config.LabNet)}
	}
	return lab.Contained(ctx)
}

// ByBridge is the configuration of this host's lab whose bridge is bridge
// in the network namespace hostNS; os.ErrNotExist (wrapped) when none is.
func (l Labs) ByBridge(hostNS, bridge string) (netlab.Config, error) {
	lab, err := l.byBridge(hostNS, bridge)
	if err != nil {
		return netlab.Config{}, err
	}
	return lab.Config, nil
}

func (l Labs) byBridge(hostNS, bridge string) (*netlab.Lab, error) {
	labs, err := netlab.UpLabs(l.St)
	if err != nil {
		return nil, err
	}
	for _, lab := range labs {
		if lab.Config.Bridge == bridge && lab.Config.HostNS == hostNS {
			return lab, nil
		}
	}
	return nil, fmt.Errorf("bridge %s is not a lab's: %w", bridge, os.ErrNotExist)
}
