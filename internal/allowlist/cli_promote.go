package allowlist

import (
	"errors"
	"fmt"
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// PromoteRequest is "tb-allow promote".
type PromoteRequest struct {
	Input
	Scope      string
	Sample     string
	PolicyFile string
	Lab        string
	NoApply    bool
	DryRun     bool
}

func chainFor(b *Book, scope, lease, sample string) (Chain, error) {
	c := Chain{Scope: scope}
	switch scope {
	case records.ScopeLease:
		c.Lease = lease
	case records.ScopeSample:
		c.Sample = sample
		if c.Sample == "" {
			c.Sample = b.SampleOf(lease)
		}
	}
	return c, c.Check()
}

// Promote is "tb-allow promote": classify, write a revision per lease (or
// for the chosen scope), then apply.
func Promote(env *cli.Env, req PromoteRequest) error {
	pol, err := LoadPolicy(req.PolicyFile)
	if err != nil {
		return cli.Usage(err)
	}
	b, err := openBook(env)
	if err != nil {
		return err
	}
	var batch cli.Batch
	groups, order, err := readObservables(env, b, req.Input, &batch)
	if err != nil {
		return exitErr(err)
	}
	if len(order) == 0 {
		if batch.Failed() > 0 {
			return batch.Err()
		}
		env.Log.Info("no observables: nothing to promote")
		return nil
	}
	v := labValidator(b.St, req.Lab, &pol)
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	var touched []Chain
	for _, lease := range order {
		c, err := chainFor(b, req.Scope, lease, req.Sample)
		if err != nil {
			err = cli.DataErr(fmt.Errorf("lease %q: %w", lease, err))
			env.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		p := Promotion{Chain: c, Cycle: req.Cycle, Dests: Classify(groups[lease], &pol), Policy: &pol, Validator: v, Now: b.St.Now()}
		if req.DryRun {
			_, cur, err := b.Head(c)
			if err != nil {
				return exitErr(err)
			}
			next, _ := Next(p, cur)
			for _, e := range next {
				if err := w.Write(e); err != nil {
					return err
				}
			}
			continue
		}
		rev, created, err := b.Promote(env.Ctx, p)
		if err != nil {
			return exitErr(err)
		}
		if !created {
			env.Log.Info("nothing changed: the current revision stands", "chain", c.Key(), "revision", rev.ID)
		}
		if err := w.Write(rev); err != nil {
			return err
		}
		touched = append(touched, c)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if !req.NoApply && !req.DryRun && len(touched) > 0 {
		if err := applyChains(env, b, req.Lab, touched); err != nil {
			return err
		}
	}
	return batch.Err()
}

// ClassifyRequest is "tb-allow classify".
type ClassifyRequest struct {
	Input
	PolicyFile string
	All        bool
}

// ClassifyCmd prints the classification of every destination, one JSON
// object per line, without writing anything.
func ClassifyCmd(env *cli.Env, req ClassifyRequest) error {
	pol, err := LoadPolicy(req.PolicyFile)
	if err != nil {
		return cli.Usage(err)
	}
	var b *Book
	if !req.FromStdin {
		if b, err = openBook(env); err != nil {
			return err
		}
	}
	var batch cli.Batch
	groups, order, err := readObservables(env, b, req.Input, &batch)
	if err != nil {
		return exitErr(err)
	}
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	for _, lease := range order {
		for _, d := range Classify(groups[lease], &pol) {
			if !req.All && d.Class == ClassOther {
				continue
			}
			if err := w.Line(records.LineAllowClass, d); err != nil {
				return err
			}
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return batch.Err()
}

func labFirewall(st *state.Store, lab string) (*firewall.NFT, string, error) {
	dir := capture.LabDir(st, lab)
	m, err := netlab.Load(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, dir, cli.Unavailable(fmt.Errorf("lab %q is not up (tb-capture net up)", firstOf(lab, "default")))
		}
		return nil, dir, err
	}
	fw, err := m.Config.Firewall()
	return fw, dir, err
}

func firstOf(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// applyChains applies the leases the chains concern: a lease chain its
// lease, a sample or global chain every lease with rules.
func applyChains(env *cli.Env, b *Book, lab string, cs []Chain) error {
	var leases []string
	all := false
	for _, c := range cs {
		if c.Scope == records.ScopeLease {
			leases = append(leases, c.Lease)
		} else {
			all = true
		}
	}
	if all {
		leases = nil
	}
	err := Apply(env, ApplyRequest{Leases: leases, Lab: lab, Incremental: true})
	var ce *cli.Error
	if errors.As(err, &ce) && ce.Code == cli.ExitUnavailable {
		return cli.Unavailable(fmt.Errorf("revision written but not applied: %w", err))
	}
	return err
}

// ApplyRequest is "tb-allow apply".
type ApplyRequest struct {
	Leases []string
	Lab    string
	// Incremental pushes the change since the last apply without reading
	// the live set (after promote, rollback, approve, revoke, expire).
	Incremental bool
}

// Apply is "tb-allow apply": every lease's live set and the DNS forward
// list made to match the active revisions.
func Apply(env *cli.Env, req ApplyRequest) error {
	b, err := openBook(env)
	if err != nil {
		return err
	}
	fw, dir, err := labFirewall(b.St, req.Lab)
	if err != nil {
		return err
	}
	leases := req.Leases
	if len(leases) == 0 {
		if leases, err = LeasesWithRules(env.Ctx, fw); err != nil {
			return err
		}
	}
	now := b.St.Now()
	var batch cli.Batch
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	for _, lease := range leases {
		var res Applied
		if req.Incremental {
			res, err = b.Update(env.Ctx, fw, lease)
		} else {
			res, err = b.Reconcile(env.Ctx, fw, lease)
		}
		if err != nil {
			err = exitErr(fmt.Errorf("lease %s: %w", lease, err))
			env.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		if res.Skipped != "" {
			env.Log.Info("not applied", "lease", lease, "why", res.Skipped)
		} else if res.Unchanged {
			env.Log.Info("already applied: nothing changed", "lease", lease)
		}
		if err := w.Line(records.LineAllowApplied, res); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	names, err := b.Names(now)
	if err != nil {
		return err
	}
	changed, err := ApplyNames(dir, names)
	if err != nil {
		err = cli.Unavailable(fmt.Errorf("DNS forward list: %w", err))
		env.Warnf("%v", err)
		batch.Add(err)
	} else if changed {
		env.Log.Info("DNS sinkhole forward list updated", "names", len(names))
	}
	return batch.Err()
}
