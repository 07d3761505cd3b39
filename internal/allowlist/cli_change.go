package allowlist

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// ChangeRequest is approve, reject, revoke: entries by ID, or by value
// ("45.13.7.9:443/tcp", "c2.example.com") in the chains of a selector.
type ChangeRequest struct {
	Selector
	Targets    []string
	Note       string
	PolicyFile string
	Lab        string
	NoApply    bool
}

// ChangeEntries is approve (to active), reject (pending to rejected) or
// revoke (to revoked).
func ChangeEntries(env *cli.Env, op string, req ChangeRequest) error {
	pol, err := LoadPolicy(req.PolicyFile)
	if err != nil {
		return cli.Usage(err)
	}
	b, err := openBook(env)
	if err != nil {
		return err
	}
	var batch cli.Batch
	found := map[string]bool{}
	byChain := map[string][]string{}
	chains := map[string]Chain{}
	var order []string
	for _, t := range req.Targets {
		var cs []Chain
		if records.KindOf(t) == records.KindAllow && records.CheckID(t) == nil {
			c, _, err := b.FindEntry(t)
			if err != nil {
				err = exitErr(err)
				env.Warnf("%v", err)
				batch.Add(err)
				found[t] = true // reported
				continue
			}
			cs = []Chain{c}
		} else {
			if cs, err = req.chains(b); err != nil {
				return exitErr(err)
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
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	var touched []Chain
	for _, k := range order {
		c := chains[k]
		rev, created, err := b.Change(env.Ctx, c, op, func(es []*records.AllowEntry) error {
			for _, e := range es {
				for _, t := range byChain[k] {
					if t != e.ID && t != e.Value {
						continue
					}
					found[t] = true
					if err := changeOne(e, op, req.Note, &expires); err != nil {
						err = cli.DataErr(fmt.Errorf("%s (%s): %w", e.ID, e.Value, err))
						env.Warnf("%v", err)
						batch.Add(err)
					}
				}
			}
			return nil
		})
		if errors.Is(err, errNoRevisions) {
			continue
		}
		if err != nil {
			return exitErr(err)
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
			err := cli.Failure(fmt.Errorf("%s: no such entry", t))
			env.Warnf("%v", err)
			batch.Add(err)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if !req.NoApply && len(touched) > 0 {
		if err := applyChains(env, b, req.Lab, touched); err != nil {
			return err
		}
	}
	return batch.Err()
}

func changeOne(e *records.AllowEntry, op, note string, expires *time.Time) error {
	switch op {
	case "approve":
		if e.Status != records.StatusPending && e.Status != records.StatusCandidate {
			return fmt.Errorf("is %s, not pending-approval or candidate", e.Status)
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

// Expire is "tb-allow expire": entries past their time become expired.
func Expire(env *cli.Env, sel Selector, at time.Time, lab string, noApply bool) error {
	b, err := openBook(env)
	if err != nil {
		return err
	}
	if at.IsZero() {
		at = b.St.Now()
	}
	cs, err := sel.chains(b)
	if err != nil {
		return exitErr(err)
	}
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	var touched []Chain
	for _, c := range cs {
		if h, _, err := b.Head(c); err != nil || h == nil {
			if err != nil {
				return exitErr(err)
			}
			continue
		}
		rev, created, err := b.Change(env.Ctx, c, "expire", Expired(at))
		if err != nil {
			return exitErr(err)
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
		return applyChains(env, b, lab, touched)
	}
	return nil
}

// RollbackCmd is "tb-allow rollback REV".
func RollbackCmd(env *cli.Env, id, lab string, noApply bool) error {
	b, err := openBook(env)
	if err != nil {
		return err
	}
	rev, created, err := b.Rollback(env.Ctx, id)
	if err != nil {
		return exitErr(err)
	}
	if !created {
		env.Log.Info("nothing changed: the current revision already has that content", "revision", rev.ID)
	}
	w := records.NewWriter(env.Stdout)
	if err := w.Write(rev); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if noApply {
		return nil
	}
	return applyChains(env, b, lab, []Chain{chainOf(rev)})
}

// ExportRequest is "tb-allow export".
type ExportRequest struct {
	Selector
	ExportOptions
	Status []string
}

// ExportCmd writes the chosen chains' entries (active ones by default).
func ExportCmd(env *cli.Env, req ExportRequest) error {
	b, err := openBook(env)
	if err != nil {
		return err
	}
	cs, err := req.chains(b)
	if err != nil {
		return exitErr(err)
	}
	req.Now = b.St.Now()
	var es []*records.AllowEntry
	for _, c := range cs {
		_, entries, err := b.Head(c)
		if err != nil {
			return exitErr(err)
		}
		for _, e := range entries {
			if len(req.Status) == 0 && !Enforced(e, req.Now) {
				continue
			}
			if len(req.Status) > 0 && !slices.Contains(req.Status, e.Status) {
				continue
			}
			es = append(es, e)
		}
	}
	return Export(env.Stdout, es, req.ExportOptions)
}

// PolicyCmd prints the effective policy.
func PolicyCmd(env *cli.Env, file string) error {
	pol, err := LoadPolicy(file)
	if err != nil {
		return cli.Usage(err)
	}
	b, err := json.MarshalIndent(pol, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(env.Stdout, "%s\n", b)
	return err
}

// FindEntry finds an entry by ID in the current revisions of every chain.
func (b *Book) FindEntry(id string) (Chain, *records.AllowEntry, error) {
	chains, err := b.Chains()
	if err != nil {
		return Chain{}, nil, err
	}
	for _, c := range chains {
		_, es, err := b.Head(c)
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

// Get prints records by ID: allow-list entries from the current
// revisions, anything else from the state.
func Get(env *cli.Env, ids []string) error {
	b, err := openBook(env)
	if err != nil {
		return err
	}
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	var batch cli.Batch
	for _, id := range ids {
		if records.CheckID(id) != nil {
			err := cli.Usage(records.CheckID(id))
			env.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		var rec records.Record
		if records.KindOf(id) == records.KindAllow {
			_, e, err := b.FindEntry(id)
			if err != nil {
				err = exitErr(err)
				env.Warnf("%v", err)
				batch.Add(err)
				continue
			}
			rec = e
		} else {
			raw, err := b.St.ReadRaw(id)
			if err == nil {
				rec, err = records.Decode(raw)
			}
			if err != nil {
				err = exitErr(err)
				env.Warnf("%v", err)
				batch.Add(err)
				continue
			}
		}
		if err := w.Write(rec); err != nil {
			return err
		}
	}
	return batch.Err()
}
