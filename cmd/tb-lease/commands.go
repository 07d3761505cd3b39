package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/files"
	"github.com/talkbox-sandbox/talkbox/internal/lease"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// common are the flags of every command that touches leases.
type common struct {
	Config string `name:"config" env:"TB_LEASE_CONFIG" type:"path" placeholder:"FILE" help:"Configuration (hosts, placement, pools, bridge); default <state>/tb-lease/config.json if present."`
	Lab    string `name:"lab" env:"TB_LEASE_LAB" placeholder:"NAME" help:"Lab whose bridge and network guests are attached to (default: the default lab, when it is up)."`
	Bridge string `name:"bridge" env:"TB_LEASE_BRIDGE" placeholder:"BRIDGE" help:"Lab bridge: when the lab is up, only its own (default: the lab's, else tb-lab0)."`
	LabNet string `name:"lab-net" env:"TB_LEASE_LAB_NET" placeholder:"CIDR" help:"Lab network: when the lab is up, only its own (default: the lab's, else 10.13.37.0/24)."`
	// HostName is set by tb-run worker for the tools it runs.
	HostName string `name:"host-name" env:"TB_HOST" placeholder:"NAME" help:"This host's name in a fleet: the name of the local libvirtd when no configuration lists hosts (default local)."`
}

// manager runs fn with the lease manager of the state directory and the
// configuration the flags give, read before the state is opened, on the
// bridge and network of the lab (onLab).
func (c common) manager(env *cli.Env, fn func(m *lease.Manager) error) error {
	cfg, err := lease.Options{Config: c.Config, Bridge: c.Bridge, LabNet: c.LabNet, HostName: c.HostName}.Load(env.StateDir())
	if err != nil {
		return err
	}
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	labs, err := c.onLab(st, cfg)
	if err != nil {
		st.Close()
		return err
	}
	m := lease.New(st, cfg, env.Sink())
	m.Labs = labs
	defer m.Close()
	return fn(m)
}

// onLab gives the leases the bridge and network of the lab named, or of the
// default lab when none is named and it is up; --bridge and --lab-net may
// only repeat them (exit 2 naming both otherwise). A lab named that is not
// up starts no guest (exit 69, the lab's not-up error); with none named and
// the default lab not up, the bridge and network are the flags' or the
// configuration's, and a guest starts only on a bridge that is a contained
// lab's (capture.Labs).
func (c common) onLab(st *state.Store, cfg *lease.Config) (lease.Labs, error) {
	labs := lease.HostLabs{Labs: capture.Labs{St: st}}
	lab, err := netlab.Open(st, c.Lab)
	switch {
	case errors.Is(err, netlab.ErrNotUp) && c.Lab == "":
		return labs, nil
	case errors.Is(err, netlab.ErrNotUp):
		return labNotUp{labs, err}, nil
	case err != nil:
		return nil, err
	}
	if c.Bridge != "" && c.Bridge != lab.Config.Bridge {
		return nil, fault.Usage(fmt.Errorf("--bridge %s is not the bridge of lab %q, %s: leave --bridge out or name the lab whose it is (--lab)",
			c.Bridge, lab.Name, lab.Config.Bridge))
	}
	if c.LabNet != "" {
		// Load has refused a --lab-net that is not a prefix.
		if p, err := netip.ParsePrefix(c.LabNet); err != nil || p.Masked() != lab.Config.LabNet.Masked() {
			return nil, fault.Usage(fmt.Errorf("--lab-net %s is not the network of lab %q, %s: leave --lab-net out or name the lab whose it is (--lab)",
				c.LabNet, lab.Name, lab.Config.LabNet))
		}
	}
	cfg.Bridge, cfg.LabNet = lab.Config.Bridge, lab.Config.LabNet.String()
	return labs, nil
}

// labNotUp is the lab check when the lab named is not up: no guest is
// started or handed out; a tap's binding is forgotten as it is for any lab
// that is gone.
type labNotUp struct {
	lease.HostLabs
	err error
}

func (l labNotUp) Contained(context.Context, string, string, netip.Prefix) error { return l.err }

func (l labNotUp) Attach(context.Context, string, string, netip.Prefix, netlab.Port) error {
	return l.err
}

// printRecords writes records to stdout.
func printRecords(env *cli.Env, recs ...records.Record) error {
	w := records.NewWriter(env.Stdout)
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			return err
		}
	}
	return w.Flush()
}

type limits struct {
	VCPUs       int           `name:"vcpus" help:"vCPUs (default: the plan's, else the image's)."`
	Memory      int           `name:"memory" placeholder:"MIB" help:"Guest memory in MiB (default: the plan's, else the image's)."`
	Disk        int           `name:"disk" placeholder:"GIB" help:"Disk size in GiB (default: the plan's, else the image's)."`
	CPUQuota    int           `name:"cpu-quota" placeholder:"PCT" help:"Share of one host CPU each vCPU may use, in percent (0: no limit)."`
	TTL         time.Duration `name:"ttl" help:"Time to live (default: the plan's, else 1h)."`
	BootTimeout time.Duration `name:"boot-timeout" help:"Longest wait for the guest agent (default: the plan's, else 3m)."`
	Pool        string        `name:"pool" default:"default" help:"Quota pool."`
	Host        string        `name:"host" help:"Place on this configured host (placement explicit)."`
}

type acquireCmd struct {
	common
	limits
	Plan      string `name:"plan" placeholder:"ID" help:"Stored plan ID (default: the first plan record on stdin)."`
	Image     string `name:"image" placeholder:"REF" help:"Use this image (ID, SPEC or SPEC@VERSION) instead of matching."`
	Placement string `name:"placement" enum:",least-loaded,native-arch-first,explicit" default:"" help:"Placement strategy (default: the configuration's, else least-loaded)."`
	Accel     string `name:"accel" enum:"auto,kvm,tcg" default:"auto" help:"auto: KVM where a cached probe shows it runs guests, TCG otherwise."`
	Fresh     bool   `name:"fresh" help:"Always create a new lease (no reuse of an idle one)."`
	Holder    string `name:"holder" placeholder:"REF" help:"Record what the lease is acquired for (tb-run: the cycle), so that it can be found again if the acquirer dies before recording the lease."`
	DryRun    bool   `name:"dry-run" help:"Print the decision (image, reused lease or host and acceleration) and change nothing."`
}

// Run acquires the lease (or, dry, prints the decision) for the plan given,
// or else the first plan record piped on stdin.
func (c *acquireCmd) Run(env *cli.Env) error {
	r := lease.Request{
		Image: c.Image, VCPUs: c.VCPUs, MemoryMiB: c.Memory, DiskGiB: c.Disk, CPUQuota: c.CPUQuota, TTL: c.TTL,
		BootTimeout: c.BootTimeout, Pool: c.Pool, Host: c.Host, Placement: c.Placement, Accel: c.Accel, Fresh: c.Fresh, Holder: c.Holder, DryRun: c.DryRun,
	}
	var stdin io.Reader = strings.NewReader("") // a terminal: say what is expected instead of waiting
	if env.StdinPiped() {
		stdin = env.Stdin
	}
	return c.manager(env, func(m *lease.Manager) error {
		var err error
		if r.Plan, err = lease.ReadPlan(m.St, stdin, c.Plan, env.Log); err != nil {
			return err
		}
		if r.DryRun {
			d, err := m.Decide(env.Ctx, r)
			if err != nil {
				return err
			}
			return records.PrintLine(env.Stdout, records.LineLeaseDecision, d)
		}
		meter := env.Progress()
		defer meter.Wait()
		status := meter.Status("acquire")
		l, err := m.Acquire(env.Ctx, r)
		status.Done()
		if err != nil {
			return err
		}
		return printRecords(env, l)
	})
}

type listCmd struct {
	common
	State []string `name:"lease-state" help:"Only leases in these states (creating, busy, idle, failed, released, expired)."`
	Live  bool     `name:"live" help:"Only leases that hold a VM."`
	Host  string   `name:"host" help:"Only leases on this configured host."`
}

// Run prints the leases, oldest first: optionally only live ones, some
// states or one host's.
func (c *listCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) (err error) {
		ls, err := m.Leases()
		if err != nil {
			return err
		}
		want := map[string]bool{}
		for _, s := range c.State {
			want[s] = true
		}
		// IDs are ULIDs: oldest first.
		slices.SortStableFunc(ls, func(a, b *records.SandboxLease) int { return strings.Compare(a.ID, b.ID) })
		w := records.NewWriter(env.Stdout)
		defer w.Finish(&err)
		for _, l := range ls {
			if c.Live && records.LeaseGone(l.State) {
				continue
			}
			if (len(want) > 0 && !want[l.State]) || (c.Host != "" && l.Host != c.Host) {
				continue
			}
			if err := w.Write(l); err != nil {
				return err
			}
		}
		return nil
	})
}

type releaseCmd struct {
	common
	IDs  []string `arg:"" name:"lease" help:"Lease IDs."`
	Keep bool     `name:"keep" help:"Keep the VM running as an idle lease for the samples it has run (another sample's acquire reverts it first)."`
}

func (c *releaseCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) (err error) {
		w := records.NewWriter(env.Stdout)
		defer w.Finish(&err)
		var batch fault.Batch
		for _, id := range c.IDs {
			l, err := m.Release(env.Ctx, id, c.Keep)
			if err != nil {
				env.Warnf("%v", err)
				batch.Add(err)
				continue
			}
			if err := w.Write(l); err != nil {
				return err
			}
		}
		return batch.Err()
	})
}

type renewCmd struct {
	common
	ID  string        `arg:"" name:"lease" help:"Lease ID."`
	TTL time.Duration `name:"ttl" help:"New time to live from now (default: the lease's TTL)."`
}

func (c *renewCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) error {
		l, err := m.Renew(env.Ctx, c.ID, c.TTL)
		if err != nil {
			return err
		}
		return printRecords(env, l)
	})
}

type expireCmd struct {
	common
	Apply bool `name:"apply" help:"Release the expired leases (default: only print them)."`
}

func (c *expireCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) error {
		ls, err := m.Expire(env.Ctx, c.Apply)
		if err != nil {
			return err
		}
		if !c.Apply && len(ls) > 0 {
			env.Warnf("dry run: %d lease(s) past their TTL; --apply releases them", len(ls))
		}
		recs := make([]records.Record, len(ls))
		for i, l := range ls {
			recs[i] = l
		}
		return printRecords(env, recs...)
	})
}

type reapCmd struct {
	common
	DryRun bool `name:"dry-run" help:"Print what would be done."`
}

func (c *reapCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) (err error) {
		acts, err := m.Reap(env.Ctx, c.DryRun)
		if err != nil {
			return err
		}
		w := records.NewWriter(env.Stdout)
		defer w.Finish(&err)
		failed := 0
		for _, a := range acts {
			if err := w.Line(records.LineReapAction, a); err != nil {
				return err
			}
			if a.Error != "" {
				failed++
			}
		}
		if failed > 0 {
			return fault.Failure(fmt.Errorf("reap: %d action(s) failed", failed))
		}
		return nil
	})
}

type healCmd struct {
	common
	IDs         []string      `arg:"" optional:"" name:"lease" help:"Leases to check (default: every live lease)."`
	BootTimeout time.Duration `name:"boot-timeout" default:"3m" help:"Longest wait for a restarted guest's agent."`
}

func (c *healCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) (err error) {
		acts, err := m.Heal(env.Ctx, c.IDs, c.BootTimeout)
		if err != nil {
			return err
		}
		w := records.NewWriter(env.Stdout)
		defer w.Finish(&err)
		failed := 0
		for _, a := range acts {
			if err := w.Line(records.LineHealAction, a); err != nil {
				return err
			}
			if a.Action == "fail-lease" {
				failed++
			}
		}
		if failed > 0 {
			return fault.Failure(fmt.Errorf("heal: %d lease(s) could not be brought back", failed))
		}
		return nil
	})
}

type inspectHostCmd struct {
	common
	Name string `arg:"" optional:"" name:"host" help:"Configured host name (default: every host)."`
}

func (c *inspectHostCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) error {
		rs, err := m.InspectHosts(env.Ctx, c.Name)
		if err != nil {
			return err
		}
		w := records.NewWriter(env.Stdout)
		for _, r := range rs {
			if err := w.Line(records.LineHostReport, r); err != nil {
				return err
			}
		}
		return w.Flush()
	})
}

type snapshotCmd struct {
	common
	ID string `arg:"" name:"lease" help:"Lease ID."`
}

func (c *snapshotCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) error {
		s, err := m.Snapshot(env.Ctx, c.ID)
		if err != nil {
			return err
		}
		return printRecords(env, s)
	})
}

type dumpCmd struct {
	common
	ID    string `arg:"" name:"lease" help:"Lease ID."`
	Cycle string `name:"cycle" placeholder:"ID" help:"Record the dump as an artifact of this cycle."`
}

// Run prints the artifact of the lease's memory.
func (c *dumpCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) error {
		a, err := m.Dump(env.Ctx, c.ID, c.Cycle)
		if err != nil {
			return err
		}
		return printRecords(env, a)
	})
}

type snapshotsCmd struct {
	common
	Verify bool `name:"verify" help:"Check every file against its recorded checksum (exit 65 on a mismatch)."`
}

// Run prints one line per snapshot with size and checksums (the records;
// --verify checks the files again).
func (c *snapshotsCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) (err error) {
		ss, err := m.Snapshots()
		if err != nil {
			return err
		}
		w := records.NewWriter(env.Stdout)
		defer w.Finish(&err)
		var batch fault.Batch
		for _, s := range ss {
			if c.Verify {
				for _, f := range s.Files {
					sum, _, err := files.SHA256(s.Dir + "/" + f.Name)
					if err != nil || sum != f.SHA256 {
						e := fault.DataErr(fmt.Errorf("snapshot %s: %s does not match its checksum", s.ID, f.Name))
						env.Warnf("%v", e)
						batch.Add(e)
					}
				}
			}
			if err := w.Write(s); err != nil {
				return err
			}
		}
		return batch.Err()
	})
}

type snapshotRmCmd struct {
	common
	IDs []string `arg:"" name:"snapshot" help:"Snapshot IDs."`
}

func (c *snapshotRmCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) error {
		var batch fault.Batch
		for _, id := range c.IDs {
			if err := m.DeleteSnapshot(env.Ctx, id); err != nil {
				env.Warnf("%v", err)
				batch.Add(err)
			}
		}
		return batch.Err()
	})
}

type restoreCmd struct {
	common
	ID          string        `arg:"" name:"snapshot" help:"Snapshot ID."`
	TTL         time.Duration `name:"ttl" default:"1h" help:"Time to live of the new lease."`
	Pool        string        `name:"pool" default:"default" help:"Quota pool."`
	BootTimeout time.Duration `name:"boot-timeout" default:"1m" help:"Longest wait for the restored guest's agent."`
}

func (c *restoreCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) error {
		l, err := m.Restore(env.Ctx, c.ID, lease.Request{TTL: c.TTL, Pool: c.Pool, BootTimeout: c.BootTimeout})
		if err != nil {
			return err
		}
		return printRecords(env, l)
	})
}

type execCmd struct {
	common
	ID   string   `arg:"" name:"lease" help:"Lease ID."`
	Argv []string `arg:"" name:"command" passthrough:"" help:"Program (absolute path in the guest) and arguments."`
}

// Run runs a program in the guest, prints its output and exits with its
// status.
func (c *execCmd) Run(env *cli.Env) error {
	return c.manager(env, func(m *lease.Manager) error {
		r, err := m.Exec(env.Ctx, c.ID, c.Argv)
		if err != nil {
			return err
		}
		_, werr := env.Stdout.Write(r.Stdout)
		// The guest's stderr goes where tb-lease's own errors go, which
		// have nowhere else to be reported.
		env.Stderr.Write(r.Stderr)
		if werr != nil {
			return werr
		}
		if r.ExitCode != 0 {
			return fault.Errorf(fault.ExitFailure, "%s exited %d in %s", c.Argv[0], r.ExitCode, c.ID)
		}
		return nil
	})
}
