package allowlist

import (
	"fmt"
	"slices"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// ListRequest is "tb-allow list".
type ListRequest struct {
	Selector
	Status []string
}

// List prints the entries of the chosen chains' current revisions.
func List(env *cli.Env, req ListRequest) error {
	b, err := openBook(env)
	if err != nil {
		return err
	}
	cs, err := req.chains(b)
	if err != nil {
		return exitErr(err)
	}
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	for _, c := range cs {
		_, entries, err := b.Head(c)
		if err != nil {
			return exitErr(err)
		}
		for _, e := range entries {
			if len(req.Status) > 0 && !slices.Contains(req.Status, e.Status) {
				continue
			}
			if err := w.Write(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// Show prints a revision and its entries (the chosen chains' current
// revisions without an ID).
func Show(env *cli.Env, id string, sel Selector) error {
	b, err := openBook(env)
	if err != nil {
		return err
	}
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	show := func(r *records.AllowRevision, es []*records.AllowEntry) error {
		if err := w.Write(r); err != nil {
			return err
		}
		for _, e := range es {
			if err := w.Write(e); err != nil {
				return err
			}
		}
		return nil
	}
	if id != "" {
		r, es, err := b.Revision(id)
		if err != nil {
			return exitErr(err)
		}
		return show(r, es)
	}
	cs, err := sel.chains(b)
	if err != nil {
		return exitErr(err)
	}
	for _, c := range cs {
		r, es, err := b.Head(c)
		if err != nil {
			return exitErr(err)
		}
		if r != nil {
			if err := show(r, es); err != nil {
				return err
			}
		}
	}
	return nil
}

// Revisions prints the chosen chains' revisions, oldest first; with
// verify, it checks each chain and fails with the tampered revision.
func Revisions(env *cli.Env, sel Selector, verify, quiet bool) error {
	b, err := openBook(env)
	if err != nil {
		return err
	}
	cs, err := sel.chains(b)
	if err != nil {
		return exitErr(err)
	}
	w := records.NewWriter(env.Stdout)
	defer w.Flush()
	var batch cli.Batch
	for _, c := range cs {
		var revs []*records.AllowRevision
		if verify {
			revs, err = b.Verify(c)
		} else {
			revs, err = b.Chain(c)
		}
		if err != nil {
			err = exitErr(fmt.Errorf("%s: %w", c.Key(), err))
			env.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		if verify {
			env.Log.Info("chain verified", "chain", c.Key(), "revisions", len(revs))
		}
		if quiet {
			continue
		}
		for _, r := range revs {
			if err := w.Write(r); err != nil {
				return err
			}
		}
	}
	return batch.Err()
}

// DiffLine is one line of "tb-allow diff".
type DiffLine struct {
	Op    string              `json:"op"` // added, removed, changed
	Key   string              `json:"key"`
	From  string              `json:"from,omitempty"`
	To    string              `json:"to,omitempty"`
	Entry *records.AllowEntry `json:"entry"`
}

// DiffCmd prints what changed from revision a to b (b empty: from a's
// predecessor to a).
func DiffCmd(env *cli.Env, a, bID string) error {
	bk, err := openBook(env)
	if err != nil {
		return err
	}
	ra, ea, err := bk.Revision(a)
	if err != nil {
		return exitErr(err)
	}
	var from, to []*records.AllowEntry
	if bID == "" {
		to = ea
		if ra.Previous != "" {
			if _, from, err = bk.Revision(ra.Previous); err != nil {
				return exitErr(err)
			}
		}
	} else {
		from = ea
		if _, to, err = bk.Revision(bID); err != nil {
			return exitErr(err)
		}
	}
	byKey := func(es []*records.AllowEntry) map[string]*records.AllowEntry {
		m := map[string]*records.AllowEntry{}
		for _, e := range es {
			m[EntryKey(e)] = e
		}
		return m
	}
	fm, tm := byKey(from), byKey(to)
	cs := Diff(from, to)
	w := records.NewWriter(env.Stdout)
	for _, l := range []struct {
		op string
		cs []records.Change
		m  map[string]*records.AllowEntry
	}{{"removed", cs.Removed, fm}, {"added", cs.Added, tm}, {"changed", cs.Changed, tm}} {
		for _, ch := range l.cs {
			if err := w.Line(records.LineAllowDiff, DiffLine{Op: l.op, Key: ch.Key, From: ch.From, To: ch.To, Entry: l.m[ch.Key]}); err != nil {
				return err
			}
		}
	}
	return w.Flush()
}
