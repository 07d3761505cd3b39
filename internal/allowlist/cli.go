package allowlist

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Selector picks chains: a lease's (its own with Scope lease, else the
// three that apply to it), a sample's, the global one, or every chain.
type Selector struct {
	Lease  string
	Scope  string
	Sample string
}

func (s Selector) chains(b *Book) ([]Chain, error) {
	switch {
	case s.Scope == records.ScopeGlobal:
		return []Chain{{Scope: records.ScopeGlobal}}, nil
	case s.Scope == records.ScopeSample || s.Sample != "":
		c := Chain{Scope: records.ScopeSample, Sample: s.Sample}
		return []Chain{c}, c.Check()
	case s.Lease != "":
		if s.Scope == records.ScopeLease {
			c := Chain{Scope: records.ScopeLease, Lease: s.Lease}
			return []Chain{c}, c.Check()
		}
		return b.ChainsOf(s.Lease), nil
	case s.Scope == records.ScopeLease:
		return nil, cli.Usage(errors.New("--scope lease needs --lease"))
	}
	return b.Chains()
}

// exitErr maps this package's errors to talkbox(7) exit codes.
func exitErr(err error) error {
	var te *TamperError
	var inv *firewall.InvalidError
	var le *records.LineError
	var ce *cli.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return err
	case errors.As(err, &te), errors.As(err, &inv), errors.As(err, &le):
		return cli.DataErr(err)
	case errors.Is(err, state.ErrNotFound):
		return cli.Failure(err)
	}
	return err
}

func openBook(env *cli.Env) (*Book, error) {
	st, err := env.OpenState()
	if err != nil {
		return nil, err
	}
	return &Book{St: st}, nil
}

// ---- input ----

// Input says where observables come from: stdin, or the state (a lease's,
// optionally one cycle's).
type Input struct {
	FromStdin bool
	Lease     string
	Cycle     string
}

// readObservables returns observables grouped by lease. Lines that are not
// observables are reported and skipped (bad data).
func readObservables(env *cli.Env, b *Book, in Input, batch *cli.Batch) (map[string][]*records.Observable, []string, error) {
	groups := map[string][]*records.Observable{}
	var order []string
	add := func(o *records.Observable) {
		lease := o.Lease
		if lease == "" {
			lease = in.Lease
		}
		if in.Lease != "" && lease != in.Lease {
			return
		}
		if in.Cycle != "" && o.Cycle != in.Cycle && !slices.Contains(o.Cycles, in.Cycle) {
			return
		}
		if _, ok := groups[lease]; !ok {
			order = append(order, lease)
		}
		groups[lease] = append(groups[lease], o)
	}
	if in.FromStdin {
		rd := records.NewReader(env.Stdin, "stdin")
		for {
			l, err := rd.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, nil, err
			}
			var o records.Observable
			if err := records.Unmarshal(l.Data, &o); err != nil {
				err = l.Err(err)
				env.Warnf("%v", err)
				batch.Add(cli.DataErr(err))
				continue
			}
			if o.Kind != records.KindObservable {
				err := l.Err(fmt.Errorf("a %s record, not an observable", o.Kind))
				env.Warnf("%v", err)
				batch.Add(cli.DataErr(err))
				continue
			}
			add(&o)
		}
		return groups, order, nil
	}
	if in.Lease == "" {
		return nil, nil, cli.Usage(errors.New("no input: pipe observables on stdin, or give --lease (and --cycle) to read them from the state"))
	}
	ids, err := b.St.List(records.KindObservable)
	if err != nil {
		return nil, nil, err
	}
	for _, id := range ids {
		var o records.Observable
		if err := b.St.Get(id, &o); err != nil {
			if errors.Is(err, state.ErrNotFound) {
				continue
			}
			return nil, nil, cli.DataErr(fmt.Errorf("%s: %w", id, err))
		}
		if o.Lease == in.Lease {
			add(&o)
		}
	}
	return groups, order, nil
}

// ---- validator ----

// labValidator is the firewall's validator for the lab's networks, with the
// documentation ranges as the policy says.
func labValidator(st *state.Store, lab string, pol *Policy) firewall.Policy {
	if m, err := netlab.Load(capture.LabDir(st, lab)); err == nil {
		if fw, err := m.Config.Firewall(); err == nil {
			p := fw.Policy(false)
			p.Documentation = pol.Documentation
			p.SMTPPorts = pol.SMTPPorts
			return p
		}
	}
	var def netlab.Config
	def.Defaults()
	p := firewall.Policy{Documentation: pol.Documentation, SMTPPorts: pol.SMTPPorts,
		Lab: []netip.Prefix{def.LabNet, def.SinkNet}}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					p.Host = append(p.Host, ip.Unmap())
				}
			}
		}
	}
	return p
}

// ---- promote and classify ----

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

// ---- apply ----

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

// ---- read commands ----

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

// ---- changes ----

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
