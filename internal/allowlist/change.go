package allowlist

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// ChangeRequest is approve, reject, revoke: entries by ID, or by value
// ("45.13.7.9:443/tcp", "c2.example.com") in the chains of a selector.
type ChangeRequest struct {
	Selector
	Targets []string
	Note    string
	// Policy gives an approved entry its time to live.
	Policy  Policy
	Lab     string
	NoApply bool
}

// ChangeEntries is approve (to active), reject (pending to rejected) or
// revoke (to revoked), printing the revisions written; each target that
// cannot change is reported and the others change.
func ChangeEntries(ctx context.Context, b *Book, op string, req ChangeRequest, out cmdout.Sink) (err error) {
	pol := req.Policy
	var batch fault.Batch
	found := map[string]bool{}
	byChain := map[string][]string{}
	chains := map[string]Chain{}
	var order []string
	for _, t := range req.Targets {
		var cs []Chain
		if records.KindOf(t) == records.KindAllow && records.CheckID(t) == nil {
			c, _, err := b.FindEntry(ctx, t)
			if err != nil {
				err = Fault(err)
				out.Warnf("%v", err)
				batch.Add(err)
				found[t] = true // reported
				continue
			}
			cs = []Chain{c}
		} else {
			if cs, err = req.Chains(b); err != nil {
				return Fault(err)
			}
		}
		for _, c := range cs {
			k := c.Key()
			if _, ok := chains[k]; !ok {
				chains[k] = c
				order = append(order, k)
			}
			byChain[k] = append(byChain[k], t)
		}
	}
	now := b.St.Now()
	expires := now.Add(pol.TTL.D()).Truncate(time.Second)
	w := records.NewWriter(out.Stdout)
	defer w.Finish(&err)
	var touched []Chain
	for _, k := range order {
		c := chains[k]
		rev, created, err := b.Change(ctx, c, op, func(es []*records.AllowEntry) error {
			for _, e := range es {
				for _, t := range byChain[k] {
					if t != e.ID && t != e.Value {
						continue
					}
					found[t] = true
					onProbation := e.Status == records.StatusProbation || failedProbation(e)
					if err := changeOne(e, op, req.Note, &expires); err != nil {
						err = fault.DataErr(fmt.Errorf("%s (%s): %w", e.ID, e.Value, err))
						out.Warnf("%v", err)
						batch.Add(err)
					} else if onProbation && op == "approve" && e.Type == records.AllowEndpoint {
						// The operator vouches for it: the policy's verdict.
						e.Verdict = pol.Verdict
					}
				}
			}
			return nil
		})
		if errors.Is(err, errNoRevisions) {
			continue
		}
		if err != nil {
			return Fault(err)
		}
		if created {
			touched = append(touched, c)
			if err := w.Write(rev); err != nil {
				return err
			}
		}
	}
	for _, t := range req.Targets {
		if !found[t] {
			err := fault.Failure(fmt.Errorf("%s: no such entry", t))
			out.Warnf("%v", err)
			batch.Add(err)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if !req.NoApply && len(touched) > 0 {
		if err := applyChains(ctx, b, req.Lab, touched, out); err != nil {
			return err
		}
	}
	return batch.Err()
}

func changeOne(e *records.AllowEntry, op, note string, expires *time.Time) error {
	switch op {
	case "approve":
		if e.Status != records.StatusPending && e.Status != records.StatusCandidate && e.Status != records.StatusProbation && !failedProbation(e) {
			return fmt.Errorf("is %s, not pending-approval, candidate, probation or revoked by its probation", e.Status)
		}
		if failedProbation(e) {
			e.Reason = "approved by the operator after " + e.Reason
		}
		e.Status, e.ExpiresAt = records.StatusActive, expires
	case "reject":
		if e.Status != records.StatusPending && e.Status != records.StatusCandidate {
			return fmt.Errorf("is %s, not pending-approval or candidate", e.Status)
		}
		e.Status = records.StatusRejected
	case "revoke":
		if !live(e.Status) {
			return fmt.Errorf("is already %s", e.Status)
		}
		e.Status = records.StatusRevoked
	}
	if note != "" {
		e.Note = note
	}
	return nil
}

// failedProbation reports an entry revoked because its far side never
// answered as a C2 while on probation: what an operator who knows better
// (a C2 that answers one request a connection) may still approve.
func failedProbation(e *records.AllowEntry) bool {
	return e.Status == records.StatusRevoked && strings.HasPrefix(e.Reason, probationFailed)
}

// Expire is "tb-allow expire": entries past their time (at; zero: now)
// become expired, in a new revision of each chain that has some; then the
// changed chains are applied unless noApply.
func Expire(ctx context.Context, b *Book, sel Selector, at time.Time, lab string, noApply bool, out cmdout.Sink) (err error) {
	if at.IsZero() {
		at = b.St.Now()
	}
	cs, err := sel.Chains(b)
	if err != nil {
		return Fault(err)
	}
	w := records.NewWriter(out.Stdout)
	defer w.Finish(&err)
	var touched []Chain
	for _, c := range cs {
		if h, _, err := b.Head(ctx, c); err != nil || h == nil {
			if err != nil {
				return Fault(err)
			}
			continue
		}
		rev, created, err := b.Change(ctx, c, "expire", Expired(at))
		if err != nil {
			return Fault(err)
		}
		if created {
			touched = append(touched, c)
			if err := w.Write(rev); err != nil {
				return err
			}
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if !noApply && len(touched) > 0 {
		return applyChains(ctx, b, lab, touched, out)
	}
	return nil
}

// Rollback is "tb-allow rollback REV": a new revision with REV's content,
// printed, then applied unless noApply.
func Rollback(ctx context.Context, b *Book, id, lab string, noApply bool, out cmdout.Sink) error {
	rev, created, err := b.Rollback(ctx, id)
	if err != nil {
		return Fault(err)
	}
	if !created {
		out.Log.Info("nothing changed: the current revision already has that content", "revision", rev.ID)
	}
	w := records.NewWriter(out.Stdout)
	if err := w.Write(rev); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if noApply {
		return nil
	}
	return applyChains(ctx, b, lab, []Chain{chainOf(rev)}, out)
}

// FindEntry finds an entry by ID in the current revisions of every
// chain.
func (b *Book) FindEntry(ctx context.Context, id string) (Chain, *records.AllowEntry, error) {
	chains, err := b.Chains()
	if err != nil {
		return Chain{}, nil, err
	}
	for _, c := range chains {
		_, es, err := b.Head(ctx, c)
		if err != nil {
			return c, nil, err
		}
		for _, e := range es {
			if e.ID == id {
				return c, e, nil
			}
		}
	}
	return Chain{}, nil, fmt.Errorf("%s: %w in any current revision", id, state.ErrNotFound)
}
