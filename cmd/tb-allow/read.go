package main

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// The commands that read the allow lists and write nothing.

type classifyCmd struct {
	policyFlag
	Lease string `name:"lease" help:"Read this lease's observables from the state."`
	Cycle string `name:"cycle" help:"Only observables of this cycle."`
	All   bool   `name:"all" help:"Also print destinations without any evidence (class other)."`
}

// Run prints the classification of every destination, one line each,
// without writing anything (nor opening the state, for stdin).
func (c *classifyCmd) Run(env *cli.Env) (err error) {
	pol, err := c.policy()
	if err != nil {
		return err
	}
	in := input(env, false, c.Lease, c.Cycle)
	var b *allowlist.Book
	if in.Stdin == nil {
		if b, err = book(env); err != nil {
			return err
		}
	}
	var batch fault.Batch
	groups, order, err := allowlist.ReadObservables(b, in, env.Log, env.Warnf, &batch)
	if err != nil {
		return allowlist.Fault(err)
	}
	w := records.NewWriter(env.Stdout)
	defer w.Finish(&err)
	for _, lease := range order {
		for _, d := range allowlist.Classify(groups[lease], &pol) {
			if !c.All && d.Class == allowlist.ClassOther {
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

type listCmd struct {
	selector
	Status []string `name:"status" help:"Only entries with this status (repeatable)."`
}

// Run prints the entries of the chosen chains' current revisions.
func (c *listCmd) Run(env *cli.Env) (err error) {
	b, err := book(env)
	if err != nil {
		return err
	}
	cs, err := c.sel().Chains(b)
	if err != nil {
		return allowlist.Fault(err)
	}
	w := records.NewWriter(env.Stdout)
	defer w.Finish(&err)
	for _, ch := range cs {
		_, entries, err := b.Head(env.Ctx, ch)
		if err != nil {
			return allowlist.Fault(err)
		}
		for _, e := range entries {
			if len(c.Status) > 0 && !slices.Contains(c.Status, e.Status) {
				continue
			}
			if err := w.Write(e); err != nil {
				return err
			}
		}
	}
	return nil
}

type getCmd struct {
	IDs []string `arg:"" name:"id" help:"Record IDs (allow_…, revision_…)."`
}

// Run prints records by ID: allow-list entries from the current
// revisions, anything else from the state.
func (c *getCmd) Run(env *cli.Env) (err error) {
	b, err := book(env)
	if err != nil {
		return err
	}
	w := records.NewWriter(env.Stdout)
	defer w.Finish(&err)
	var batch fault.Batch
	for _, id := range c.IDs {
		if records.CheckID(id) != nil {
			err := fault.Usage(records.CheckID(id))
			env.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		var rec records.Record
		if records.KindOf(id) == records.KindAllow {
			_, e, err := b.FindEntry(env.Ctx, id)
			if err != nil {
				err = allowlist.Fault(err)
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
				err = allowlist.Fault(err)
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

type showCmd struct {
	selector
	Revision string `arg:"" optional:"" name:"revision" help:"Revision ID (default: the current revisions of the chosen chains)."`
}

// Run prints a revision and its entries (the chosen chains' current
// revisions without an ID).
func (c *showCmd) Run(env *cli.Env) (err error) {
	b, err := book(env)
	if err != nil {
		return err
	}
	w := records.NewWriter(env.Stdout)
	defer w.Finish(&err)
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
	if c.Revision != "" {
		r, es, err := b.Revision(env.Ctx, c.Revision)
		if err != nil {
			return allowlist.Fault(err)
		}
		return show(r, es)
	}
	cs, err := c.sel().Chains(b)
	if err != nil {
		return allowlist.Fault(err)
	}
	for _, ch := range cs {
		r, es, err := b.Head(env.Ctx, ch)
		if err != nil {
			return allowlist.Fault(err)
		}
		if r != nil {
			if err := show(r, es); err != nil {
				return err
			}
		}
	}
	return nil
}

type revisionsCmd struct {
	selector
	Verify bool `name:"verify" help:"Check each chain's hashes, contents and changesets; exit 65 naming a tampered revision."`
}

func (c *revisionsCmd) Run(env *cli.Env) error { return revisions(env, c.sel(), c.Verify, false) }

type verifyCmd struct{ selector }

func (c *verifyCmd) Run(env *cli.Env) error { return revisions(env, c.sel(), true, true) }

// revisions prints the chosen chains' revisions, oldest first (unless
// quiet); with verify, it checks each chain and fails with the tampered
// revision.
func revisions(env *cli.Env, sel allowlist.Selector, verify, quiet bool) (err error) {
	b, err := book(env)
	if err != nil {
		return err
	}
	cs, err := sel.Chains(b)
	if err != nil {
		return allowlist.Fault(err)
	}
	w := records.NewWriter(env.Stdout)
	defer w.Finish(&err)
	var batch fault.Batch
	for _, c := range cs {
		var revs []*records.AllowRevision
		if verify {
			revs, err = b.Verify(env.Ctx, c)
		} else {
			revs, err = b.Chain(c)
		}
		if err != nil {
			err = allowlist.Fault(fmt.Errorf("%s: %w", c.Key(), err))
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

type diffCmd struct {
	From string `arg:"" name:"rev" help:"Revision (alone: what it changed from its predecessor)."`
	To   string `arg:"" optional:"" name:"rev2" help:"Second revision: what changed from the first to it."`
}

// diffLine is one line of "tb-allow diff".
type diffLine struct {
	Op    string              `json:"op"` // added, removed, changed
	Key   string              `json:"key"`
	From  string              `json:"from,omitempty"`
	To    string              `json:"to,omitempty"`
	Entry *records.AllowEntry `json:"entry"`
}

// Run prints what changed from one revision to the other (alone: from its
// predecessor to it).
func (c *diffCmd) Run(env *cli.Env) error {
	bk, err := book(env)
	if err != nil {
		return err
	}
	ra, ea, err := bk.Revision(env.Ctx, c.From)
	if err != nil {
		return allowlist.Fault(err)
	}
	var from, to []*records.AllowEntry
	if c.To == "" {
		to = ea
		if ra.Previous != "" {
			if _, from, err = bk.Revision(env.Ctx, ra.Previous); err != nil {
				return allowlist.Fault(err)
			}
		}
	} else {
		from = ea
		if _, to, err = bk.Revision(env.Ctx, c.To); err != nil {
			return allowlist.Fault(err)
		}
	}
	byKey := func(es []*records.AllowEntry) map[string]*records.AllowEntry {
		m := map[string]*records.AllowEntry{}
		for _, e := range es {
			m[allowlist.EntryKey(e)] = e
		}
		return m
	}
	fm, tm := byKey(from), byKey(to)
	cs := allowlist.Diff(from, to)
	w := records.NewWriter(env.Stdout)
	for _, l := range []struct {
		op string
		cs []records.Change
		m  map[string]*records.AllowEntry
	}{{"removed", cs.Removed, fm}, {"added", cs.Added, tm}, {"changed", cs.Changed, tm}} {
		for _, ch := range l.cs {
			if err := w.Line(records.LineAllowDiff, diffLine{Op: l.op, Key: ch.Key, From: ch.From, To: ch.To, Entry: l.m[ch.Key]}); err != nil {
				return err
			}
		}
	}
	return w.Flush()
}

type exportCmd struct {
	selector
	Format  string   `name:"format" short:"f" enum:"json,plain,nft,zeek,suricata,stix" default:"json" help:"json, plain, nft, zeek, suricata or stix."`
	Status  []string `name:"status" help:"Entries with this status (repeatable; default: those enforced now)."`
	Table   string   `name:"nft-table" default:"talkbox" help:"nft format: the inet table."`
	Set     string   `name:"nft-set" default:"allow" help:"nft format: the set."`
	SIDBase int      `name:"sid-base" default:"9700001" help:"suricata format: the first signature ID."`
}

// Run writes the chosen chains' entries (those enforced now by default).
func (c *exportCmd) Run(env *cli.Env) error {
	b, err := book(env)
	if err != nil {
		return err
	}
	cs, err := c.sel().Chains(b)
	if err != nil {
		return allowlist.Fault(err)
	}
	opts := allowlist.ExportOptions{Format: c.Format, Table: c.Table, Set: c.Set, SIDBase: c.SIDBase, Now: b.St.Now()}
	var es []*records.AllowEntry
	for _, ch := range cs {
		_, entries, err := b.Head(env.Ctx, ch)
		if err != nil {
			return allowlist.Fault(err)
		}
		for _, e := range entries {
			if len(c.Status) == 0 && !allowlist.Enforced(e, opts.Now) {
				continue
			}
			if len(c.Status) > 0 && !slices.Contains(c.Status, e.Status) {
				continue
			}
			es = append(es, e)
		}
	}
	return allowlist.Export(env.Stdout, es, opts)
}

type policyCmd struct{ policyFlag }

// Run prints the effective policy.
func (c *policyCmd) Run(env *cli.Env) error {
	pol, err := c.policy()
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(pol, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(env.Stdout, "%s\n", b)
	return err
}
