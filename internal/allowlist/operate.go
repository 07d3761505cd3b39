package allowlist

import (
	"context"
	"fmt"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/progress"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// PromoteRequest is "tb-allow promote".
type PromoteRequest struct {
	Input
	Scope   string
	Sample  string
	Policy  Policy
	Lab     string
	NoApply bool
	DryRun  bool
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
// for the chosen scope) and print it, then apply.
func Promote(ctx context.Context, b *Book, req PromoteRequest, out cmdout.Sink) (err error) {
	pol := req.Policy
	var batch fault.Batch
	groups, order, err := ReadObservables(b, req.Input, out.Log, out.Warnf, &batch)
	if err != nil {
		return Fault(err)
	}
	if len(order) == 0 {
		if batch.Failed() > 0 {
			return batch.Err()
		}
		out.Log.Info("no observables: nothing to promote")
		return nil
	}
	lab, err := netlab.Expected(b.St, req.Lab)
	if err != nil {
		return err
	}
	v, err := lab.Validator(pol.Documentation, pol.SMTPPorts)
	if err != nil {
		return err
	}
	guard, err := LoadGuard(ctx, b.St, req.Lab)
	if err != nil {
		return fault.Unavailable(fmt.Errorf("the built-in never-allow list: %w", err))
	}
	w := records.NewWriter(out.Stdout)
	defer w.Finish(&err)
	var touched []Chain
	for _, lease := range order {
		c, err := chainFor(b, req.Scope, lease, req.Sample)
		if err != nil {
			err = fault.DataErr(fmt.Errorf("lease %q: %w", lease, err))
			out.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		inForce, err := b.InForce(ctx, cyclesOf(groups[lease], req.Cycle))
		if err != nil {
			return Fault(fmt.Errorf("lease %s: %w", lease, err))
		}
		p := Promotion{Chain: c, Cycle: req.Cycle, Dests: Classify(groups[lease], &pol), Policy: &pol, Validator: v, Guard: guard,
			InForce: inForce, Now: b.St.Now()}
		if req.DryRun {
			_, cur, err := b.Head(ctx, c)
			if err != nil {
				return Fault(err)
			}
			next, _ := Next(p, cur)
			for _, e := range next {
				if err := w.Write(e); err != nil {
					return err
				}
			}
			continue
		}
		rev, created, err := b.Promote(ctx, p)
		if err != nil {
			return Fault(err)
		}
		if !created {
			out.Log.Info("nothing changed: the current revision stands", "chain", c.Key(), "revision", rev.ID)
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
		if err := applyChains(ctx, b, req.Lab, touched, out); err != nil {
			return err
		}
	}
	return batch.Err()
}

// noUpstream is why a lab's names are not enforced when it has no
// upstream resolver.
const noUpstream = "the lab has no upstream resolver (tb-capture net up --upstream): its DNS sinkhole answers these names itself"

// applyChains applies the leases the chains concern: a lease chain its
// lease, a sample or global chain every lease with rules.
func applyChains(ctx context.Context, b *Book, lab string, cs []Chain, out cmdout.Sink) error {
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
	err := Apply(ctx, b, ApplyRequest{Leases: leases, Lab: lab, Incremental: true}, out)
	if err != nil && fault.Code(err) == fault.ExitUnavailable {
		return fault.Unavailable(fmt.Errorf("revision written but not applied: %w", err))
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
	// Progress shows the leases applied (nil: nothing shown).
	Progress *progress.Meter
}

// Apply is "tb-allow apply": every lease's live set and the DNS forward
// list made to match the active revisions; one applied line per lease.
func Apply(ctx context.Context, b *Book, req ApplyRequest, out cmdout.Sink) (err error) {
	lab, err := netlab.Open(b.St, req.Lab)
	if err != nil {
		return err
	}
	// The rules change: a lab whose table is gone is not up (exit 69).
	fw, err := lab.LiveFirewall()
	if err != nil {
		return err
	}
	leases := req.Leases
	if len(leases) == 0 {
		if leases, err = LeasesWithRules(ctx, fw); err != nil {
			return err
		}
	}
	now := b.St.Now()
	// A lab without an upstream resolver is a supported configuration:
	// names promoted there are recorded and reported, never an error.
	upstream := lab.Config.Upstream.IsValid()
	names, byLease, err := b.LabNames(ctx, fw, now, out.Warnf)
	if err != nil {
		return err
	}
	var batch fault.Batch
	w := records.NewWriter(out.Stdout)
	defer w.Finish(&err)
	bar := req.Progress.Bar("apply: leases", int64(len(leases)), progress.Items)
	defer bar.Done()
	for _, lease := range leases {
		var res Applied
		if req.Incremental {
			res, err = b.Update(ctx, fw, lease)
		} else {
			res, err = b.Reconcile(ctx, fw, lease)
		}
		bar.Add(1)
		if err != nil {
			err = Fault(fmt.Errorf("lease %s: %w", lease, err))
			out.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		res.Names = byLease[lease]
		if !upstream && len(res.Names) > 0 {
			res.NamesNotEnforced = noUpstream
			out.Log.Warn("names not enforceable on this lab", "lease", lease, "names", len(res.Names), "why", noUpstream)
		}
		if res.Skipped != "" {
			out.Log.Info("not applied", "lease", lease, "why", res.Skipped)
		} else if res.Unchanged {
			out.Log.Info("already applied: nothing changed", "lease", lease)
		}
		if err := w.Line(records.LineAllowApplied, res); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	// Without an upstream the lab records the list and forwards nothing.
	changed, err := ApplyNames(lab.Dir, names)
	if err != nil {
		err = fault.Unavailable(fmt.Errorf("DNS forward list: %w", err))
		out.Warnf("%v", err)
		batch.Add(err)
	} else if changed {
		out.Log.Info("DNS sinkhole forward list updated", "names", len(names))
	}
	return batch.Err()
}
