package lease

import (
	"fmt"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/files"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Options are the flags every tb-lease command shares.
type Options struct {
	Config string
	Bridge string
	LabNet string
}

// withManager runs fn with the lease manager the options describe.
func withManager(env *cli.Env, o Options, fn func(m *Manager) error) error {
	m, err := open(env, o)
	if err != nil {
		return err
	}
	defer m.Close()
	return fn(m)
}

func open(env *cli.Env, o Options) (*Manager, error) {
	required := o.Config != "" && o.Config != defaultConfig(env)
	path := o.Config
	if path == "" {
		path = defaultConfig(env)
	}
	cfg, err := LoadConfig(path, required)
	if err != nil {
		return nil, err
	}
	if o.Bridge != "" {
		cfg.Bridge = o.Bridge
	}
	if o.LabNet != "" {
		cfg.LabNet = o.LabNet
		if err := cfg.check("--lab-net"); err != nil {
			return nil, err
		}
	}
	return New(env, cfg)
}

// defaultConfig is <state>/tb-lease/config.json.
func defaultConfig(env *cli.Env) string {
	return env.StateDir() + "/tb-lease/config.json"
}

// AcquireCmd is "tb-lease acquire".
func AcquireCmd(env *cli.Env, o Options, planID string, r Request) error {
	return withManager(env, o, func(m *Manager) error {
		var err error
		if r.Plan, err = ReadPlan(m.St, env.Stdin, planID); err != nil {
			return err
		}
		if r.DryRun {
			d, err := m.Decide(env.Ctx, r)
			if err != nil {
				return err
			}
			return records.PrintLine(env.Stdout, records.LineLeaseDecision, d)
		}
		l, err := m.Acquire(env.Ctx, r)
		if err != nil {
			return err
		}
		return m.print(l)
	})
}

// ReleaseCmd is "tb-lease release".
func ReleaseCmd(env *cli.Env, o Options, ids []string, keep bool) error {
	return withManager(env, o, func(m *Manager) error {
		var batch cli.Batch
		for _, id := range ids {
			l, err := m.Release(env.Ctx, id, keep)
			if err != nil {
				env.Warnf("%v", err)
				batch.Add(err)
				continue
			}
			m.print(l)
		}
		return batch.Err()
	})
}

// RenewCmd is "tb-lease renew".
func RenewCmd(env *cli.Env, o Options, id string, ttl time.Duration) error {
	return withManager(env, o, func(m *Manager) error {
		l, err := m.Renew(env.Ctx, id, ttl)
		if err != nil {
			return err
		}
		return m.print(l)
	})
}

// ExpireCmd is "tb-lease expire".
func ExpireCmd(env *cli.Env, o Options, apply bool) error {
	return withManager(env, o, func(m *Manager) error {
		ls, err := m.Expire(env.Ctx, apply)
		if err != nil {
			return err
		}
		if !apply && len(ls) > 0 {
			env.Warnf("dry run: %d lease(s) past their TTL; --apply releases them", len(ls))
		}
		for _, l := range ls {
			m.print(l)
		}
		return nil
	})
}

// ReapCmd is "tb-lease reap".
func ReapCmd(env *cli.Env, o Options, dryRun bool) error {
	return withManager(env, o, func(m *Manager) error {
		acts, err := m.Reap(env.Ctx, dryRun)
		if err != nil {
			return err
		}
		w := records.NewWriter(env.Stdout)
		defer w.Flush()
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
			return cli.Failure(fmt.Errorf("reap: %d action(s) failed", failed))
		}
		return nil
	})
}

// HealCmd is "tb-lease heal".
func HealCmd(env *cli.Env, o Options, ids []string, timeout time.Duration) error {
	return withManager(env, o, func(m *Manager) error {
		acts, err := m.Heal(env.Ctx, ids, timeout)
		if err != nil {
			return err
		}
		w := records.NewWriter(env.Stdout)
		defer w.Flush()
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
			return cli.Failure(fmt.Errorf("heal: %d lease(s) could not be brought back", failed))
		}
		return nil
	})
}

// InspectHostCmd is "tb-lease inspect host".
func InspectHostCmd(env *cli.Env, o Options, host string) error {
	return withManager(env, o, func(m *Manager) error {
		rs, err := m.InspectHosts(env.Ctx, host)
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

// SnapshotCmd is "tb-lease snapshot".
func SnapshotCmd(env *cli.Env, o Options, id string) error {
	return withManager(env, o, func(m *Manager) error {
		s, err := m.Snapshot(env.Ctx, id)
		if err != nil {
			return err
		}
		return m.print(s)
	})
}

// DumpCmd is "tb-lease dump": the lease's memory as an artifact.
func DumpCmd(env *cli.Env, o Options, id, cycle string) error {
	return withManager(env, o, func(m *Manager) error {
		a, err := m.Dump(env.Ctx, id, cycle)
		if err != nil {
			return err
		}
		return m.print(a)
	})
}

// SnapshotsCmd is "tb-lease snapshots": one line per snapshot with size and
// checksums (the records; --verify checks the files again).
func SnapshotsCmd(env *cli.Env, o Options, verify bool) error {
	return withManager(env, o, func(m *Manager) error {
		ss, err := m.Snapshots()
		if err != nil {
			return err
		}
		var batch cli.Batch
		for _, s := range ss {
			if verify {
				for _, f := range s.Files {
					sum, _, err := files.SHA256(s.Dir + "/" + f.Name)
					if err != nil || sum != f.SHA256 {
						e := cli.DataErr(fmt.Errorf("snapshot %s: %s does not match its checksum", s.ID, f.Name))
						env.Warnf("%v", e)
						batch.Add(e)
					}
				}
			}
			m.print(s)
		}
		return batch.Err()
	})
}

// RestoreCmd is "tb-lease restore".
func RestoreCmd(env *cli.Env, o Options, id string, r Request) error {
	return withManager(env, o, func(m *Manager) error {
		l, err := m.Restore(env.Ctx, id, r)
		if err != nil {
			return err
		}
		return m.print(l)
	})
}

// DeleteSnapshotCmd is "tb-lease snapshot-rm".
func DeleteSnapshotCmd(env *cli.Env, o Options, ids []string) error {
	return withManager(env, o, func(m *Manager) error {
		var batch cli.Batch
		for _, id := range ids {
			if err := m.DeleteSnapshot(env.Ctx, id); err != nil {
				env.Warnf("%v", err)
				batch.Add(err)
			}
		}
		return batch.Err()
	})
}

// ExecCmd is "tb-lease exec": run a program in the guest, print its output,
// exit with its status.
func ExecCmd(env *cli.Env, o Options, id string, argv []string) error {
	return withManager(env, o, func(m *Manager) error {
		r, err := m.Exec(env.Ctx, id, argv)
		if err != nil {
			return err
		}
		env.Stdout.Write(r.Stdout)
		env.Stderr.Write(r.Stderr)
		if r.ExitCode != 0 {
			return cli.Errorf(cli.ExitFailure, "%s exited %d in %s", argv[0], r.ExitCode, id)
		}
		return nil
	})
}

// ListCmd is "tb-lease list": leases, optionally only live ones, some
// states or one host's.
func ListCmd(env *cli.Env, o Options, states []string, liveOnly bool, host string) error {
	return withManager(env, o, func(m *Manager) error {
		ls, err := m.Leases()
		if err != nil {
			return err
		}
		want := map[string]bool{}
		for _, s := range states {
			want[s] = true
		}
		sortByAge(ls)
		for _, l := range ls {
			if liveOnly && records.LeaseGone(l.State) {
				continue
			}
			if (len(want) > 0 && !want[l.State]) || (host != "" && l.Host != host) {
				continue
			}
			m.print(l)
		}
		return nil
	})
}
