package cycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// heldLease returns the live lease acquired for the cycle, if there is one.
func (r *Runner) heldLease(cycle string) (string, error) {
	l, err := state.LatestBy(r.St, records.KindLease, records.KeyHolder, cycle, func(l *records.SandboxLease) bool {
		return !records.LeaseGone(l.State) && (r.FleetHost == "" || l.Host == r.FleetHost)
	})
	if errors.Is(err, state.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return l.ID, nil
}

// lease binds the cycle to a live lease and records its lineage.
func (r *Runner) lease(ctx context.Context, c *records.Cycle, unlock *func()) (*records.Cycle, error) {
	var err error
	if c.Lease == "" {
		if r.Leaser == nil {
			return c, errors.New("no lease given and no way to acquire one")
		}
		start := time.Now()
		// A tb-run that died after its acquire ended, but before it
		// recorded the lease here, left the lease busy under this cycle's
		// name: adopt it rather than leak it until its TTL.
		id, err := r.heldLease(c.ID)
		if err == nil && id == "" {
			id, err = r.Leaser.Acquire(ctx, c.Plan, c.ID, c.FreshLease)
		}
		if err != nil {
			return c, fmt.Errorf("acquiring a lease: %w", err)
		}
		if c, err = r.timed(ctx, c, "lease", start, func(n *records.Cycle) error { n.Lease = id; return nil }); err != nil {
			return c, err
		}
	}
	var l records.SandboxLease
	if err := r.St.Get(c.Lease, &l); err != nil {
		return c, fmt.Errorf("lease %s: %w", c.Lease, err)
	}
	if records.LeaseGone(l.State) {
		return c, fmt.Errorf("lease %s is %s", l.ID, l.State)
	}
	if l.State == records.LeaseCreating {
		return c, fmt.Errorf("lease %s is still being created", l.ID)
	}
	if *unlock == nil {
		if *unlock, err = r.lockLease(ctx, c.Lease); err != nil {
			return c, err
		}
	}
	prev, err := r.previous(c)
	if err != nil {
		return c, err
	}
	rev, err := currentRevision(r.St, "lease:"+c.Lease)
	if err != nil {
		return c, err
	}
	// The sample's and the global chains are enforced too: what the
	// analysis says of the cycle's floods reads them (containment.go).
	// Their heads come from tb-allow's head index, one lookup each, not a
	// read of every revision a fleet's global chain ever had.
	var enforced []string
	book := &allowlist.Book{St: r.St}
	for _, chain := range []allowlist.Chain{{Scope: records.ScopeSample, Sample: c.Sample}, {Scope: records.ScopeGlobal}} {
		id, err := book.HeadID(chain)
		if err != nil {
			return c, err
		}
		if id != "" {
			enforced = append(enforced, id)
		}
	}
	return r.transition(ctx, c, records.CyclePreparing, "", func(n *records.Cycle) error {
		n.Previous, n.Enforced = prev, enforced
		if rev != nil {
			n.Revision, n.Forwarding, n.Allowed = rev.ID, rev.EnforceSHA256, rev.Active
		}
		return nil
	})
}

// previous is the latest other cycle of the same sample on the same lease
// since its guest was last reverted: a revert (tb-lease gave the guest to
// another sample) leaves nothing of the cycles before it to follow.
func (r *Runner) previous(c *records.Cycle) (string, error) {
	var since time.Time
	var l records.SandboxLease
	if err := r.St.Get(c.Lease, &l); err == nil && len(l.Reverts) > 0 {
		since = l.Reverts[len(l.Reverts)-1].At
	} else if err != nil && !errors.Is(err, state.ErrNotFound) {
		return "", err
	}
	o, err := state.LatestBy(r.St, records.KindCycle, records.KeyLease, c.Lease, func(o *records.Cycle) bool {
		return o.ID < c.ID && o.Sample == c.Sample && o.CreatedAt.After(since)
	})
	if errors.Is(err, state.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return o.ID, nil
}

// currentRevision is the latest revision of an allow-list chain, or nil.
func currentRevision(st *state.Store, chain string) (*records.AllowRevision, error) {
	revs, err := state.FindBy[records.AllowRevision](st, records.KindRevision, records.KeyChain, chain, nil)
	if err != nil || len(revs) == 0 {
		return nil, err
	}
	return slices.MaxFunc(revs, func(a, b *records.AllowRevision) int { return cmp.Compare(a.Seq, b.Seq) }), nil
}
