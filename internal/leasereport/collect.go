package leasereport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/mitre"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/sample"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Collect gathers the report of t from the state. A target that names no
// record is a usage error; records the report leads to that are missing or
// unreadable (a pruned flow log, a revision whose content fails its
// digest) become Notes, and the rest is still reported.
func Collect(ctx context.Context, st *state.Store, t Target) (*Report, error) {
	c := &collector{ctx: ctx, st: st, r: &Report{Generated: st.Now()}}
	if err := c.target(t); err != nil {
		return nil, err
	}
	// What the report reads is loaded at once, on every CPU: the cycles
	// with their analyses and flow logs, the leases' allow lists, their
	// observables.
	if err := parallel(c.loadCycles, c.loadChains, c.loadObservables); err != nil {
		return nil, err
	}
	c.readCycles()
	c.span()
	c.allowHistory()
	c.observables()
	if err := c.traffic(); err != nil {
		return nil, err
	}
	c.beacons()
	c.behaviour()
	c.files()
	return c.r, nil
}

// files fills Files from the sample records of the report's sample and of
// what its cycles dropped.
func (c *collector) files() {
	add := func(role, id string) {
		var smp records.Sample
		if err := c.st.Get(id, &smp); err != nil {
			c.note("sample %s: %v", id, err)
			return
		}
		c.r.Files = append(c.r.Files, File{Role: role, Sample: smp.ID, SHA256: smp.SHA256, SHA1: smp.SHA1, MD5: smp.MD5, Size: smp.Size, Names: smp.Names})
	}
	if c.r.Sample != "" {
		if id, err := c.st.Lookup(sample.IndexSHA256, c.r.Sample); err == nil {
			add("sample", id)
		}
	}
	var dropped []string
	for _, cy := range c.cycles {
		for _, id := range cy.DroppedSamples {
			if !slices.Contains(dropped, id) {
				dropped = append(dropped, id)
				add("dropped", id)
			}
		}
	}
}

// parallel runs fns at once and returns their errors.
func parallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// getAll reads the records ids on every CPU, in order; a record that is
// gone is nil, and reported.
func getAll[T any, P interface {
	*T
	records.Record
}](c *collector, ids []string) ([]P, error) {
	out := make([]P, len(ids))
	errs := make([]error, len(ids))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r := P(new(T))
				if err := c.st.Get(ids[i], r); err != nil {
					errs[i] = err
					continue
				}
				out[i] = r
			}
		}()
	}
	for i := range ids {
		if c.ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if err := c.ctx.Err(); err != nil {
		return nil, err
	}
	for i, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, state.ErrNotFound):
			c.note("%s: not found", ids[i])
		default:
			return nil, err
		}
	}
	return out, nil
}

// collector holds what Collect reads on the way to the report.
type collector struct {
	ctx context.Context
	st  *state.Store
	r   *Report
	mu  sync.Mutex // Notes, written while loading
	// leases are the IDs of the report's leases.
	leases []string
	// cycles are the records of r.Cycles, analyses theirs by cycle ID,
	// flowLogs the flow-log artifacts of each cycle.
	cycles   []*records.Cycle
	cycleIdx map[string]int
	analyses map[string]*records.RunAnalysis
	flowLogs map[string][]*records.Artifact
	// chains are the allow lists that apply to each lease, by key and by
	// lease, in the order the leases name them.
	chains    map[string]*chain
	chainKeys []string
	byLease   map[string][]*chain
	// loaded are the observables read; eps (the C2s' endpoint
	// observables) and scans (each cycle's) those the report uses.
	loaded []*records.Observable
	eps    map[string][]*records.Observable
	scans  map[string][]scanKey
	// isC2 are the C2s' endpoint values.
	isC2 map[string]bool
}

func (c *collector) note(format string, a ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.r.Notes = append(c.r.Notes, fmt.Sprintf(format, a...))
}

func notFound(what, id string, err error) error {
	if errors.Is(err, state.ErrNotFound) {
		return fault.Usage(fmt.Errorf("%s %s: not found", what, id))
	}
	return err
}

// target resolves t to its leases (and, for a cycle or a sample, its
// cycles).
func (c *collector) target(t Target) error {
	set := 0
	for _, s := range []string{t.Lease, t.Sample, t.Cycle} {
		if s != "" {
			set++
		}
	}
	if set != 1 {
		return fault.Usage(errors.New("a report is of one lease, one sample or one cycle"))
	}
	switch {
	case t.Lease != "":
		if records.CheckID(t.Lease) != nil || records.KindOf(t.Lease) != records.KindLease {
			return fault.Usage(fmt.Errorf("%q is not a lease ID", t.Lease))
		}
		if !c.st.Exists(t.Lease) {
			return fault.Usage(fmt.Errorf("lease %s: not found", t.Lease))
		}
		c.r.Target, c.r.ID, c.leases = TargetLease, t.Lease, []string{t.Lease}
	case t.Cycle != "":
		if records.CheckID(t.Cycle) != nil || records.KindOf(t.Cycle) != records.KindCycle {
			return fault.Usage(fmt.Errorf("%q is not a cycle ID", t.Cycle))
		}
		var cy records.Cycle
		if err := c.st.Get(t.Cycle, &cy); err != nil {
			return notFound("cycle", t.Cycle, err)
		}
		c.r.Target, c.r.ID, c.cycles = TargetCycle, cy.ID, []*records.Cycle{&cy}
		if cy.Lease != "" {
			c.leases = []string{cy.Lease}
		}
	default:
		sha, id, err := c.sample(t.Sample)
		if err != nil {
			return err
		}
		c.r.Target, c.r.ID, c.r.Sample = TargetSample, id, sha
		if c.cycles, err = state.FindBy[records.Cycle](c.st, records.KindCycle, records.KeySample, sha, nil); err != nil {
			return err
		}
		for _, cy := range c.cycles {
			if cy.Lease != "" && !slices.Contains(c.leases, cy.Lease) {
				c.leases = append(c.leases, cy.Lease)
			}
		}
	}
	for _, id := range c.leases {
		c.r.Leases = append(c.r.Leases, c.lease(id))
	}
	return nil
}

// CycleIDs are the IDs of the cycles of a lease or a sample, oldest first.
func CycleIDs(st *state.Store, t Target) ([]string, error) {
	c := &collector{st: st, r: &Report{}}
	if err := c.target(t); err != nil {
		return nil, err
	}
	if t.Lease != "" {
		var err error
		if c.cycles, err = state.FindBy[records.Cycle](st, records.KindCycle, records.KeyLease, t.Lease, nil); err != nil {
			return nil, err
		}
	}
	var ids []string
	for _, cy := range c.cycles {
		ids = append(ids, cy.ID)
	}
	return ids, nil
}

// sample resolves a sample ID or sha256 to both.
func (c *collector) sample(s string) (sha, id string, err error) {
	if records.CheckID(s) == nil && records.KindOf(s) == records.KindSample {
		var smp records.Sample
		if err := c.st.Get(s, &smp); err != nil {
			return "", "", notFound("sample", s, err)
		}
		return smp.SHA256, smp.ID, nil
	}
	sha = strings.ToLower(s)
	if len(sha) != 64 || strings.Trim(sha, "0123456789abcdef") != "" {
		return "", "", fault.Usage(fmt.Errorf("%q is neither a sample ID nor a sha256", s))
	}
	id, err = c.st.Lookup(sample.IndexSHA256, sha)
	if err != nil {
		return "", "", notFound("sample", sha, err)
	}
	return sha, id, nil
}

func (c *collector) lease(id string) Lease {
	var l records.SandboxLease
	if err := c.st.Get(id, &l); err != nil {
		c.note("lease %s: %v", id, err)
		return Lease{ID: id, Missing: true}
	}
	out := Lease{ID: l.ID, State: l.State, Health: l.Health, Host: l.Host, VMName: l.VMName, Platform: l.Platform, Image: l.ImageSpec,
		IP: l.IP, Plan: l.Plan, StartedAt: cmp.Or(l.StartedAt, l.AcquiredAt), ExpiresAt: l.ExpiresAt, Restarts: l.Restarts, Error: l.Error,
		Seen: l.UpdatedAt}
	if records.LeaseGone(l.State) {
		out.ReleasedAt = cmp.Or(l.ReleasedAt, &l.UpdatedAt)
	}
	return out
}

// loadCycles reads the lease's cycles (a lease's report), their analyses
// and flow logs.
func (c *collector) loadCycles() error {
	if c.r.Target == TargetLease {
		cycles, err := state.FindBy[records.Cycle](c.st, records.KindCycle, records.KeyLease, c.r.ID, nil)
		if err != nil {
			return err
		}
		c.cycles = cycles
	}
	slices.SortFunc(c.cycles, func(a, b *records.Cycle) int {
		return cmp.Or(a.RequestedAt.Compare(b.RequestedAt), strings.Compare(a.ID, b.ID))
	})
	c.cycleIdx = make(map[string]int, len(c.cycles))
	var ids []string
	for i, cy := range c.cycles {
		c.cycleIdx[cy.ID] = i
		if c.r.Sample == "" {
			c.r.Sample = cy.Sample
		}
		if cy.Analysis != "" {
			ids = append(ids, cy.Analysis)
		}
	}
	as, err := getAll[records.RunAnalysis](c, ids)
	if err != nil {
		return err
	}
	c.analyses = make(map[string]*records.RunAnalysis, len(as))
	var logs []string
	for _, a := range as {
		if a != nil {
			c.analyses[a.Cycle] = a
			logs = append(logs, a.FlowLogs...)
		}
	}
	// A cycle's flow logs are in its analysis; one without an analysis
	// yet has its flow logs found by its ID.
	arts, err := getAll[records.Artifact](c, logs)
	if err != nil {
		return err
	}
	for _, cy := range c.cycles {
		if c.analyses[cy.ID] == nil {
			more, err := flowlog.Logs(c.st, flowlog.Query{Cycle: cy.ID})
			if err != nil {
				return err
			}
			arts = append(arts, more...)
		}
	}
	c.flowLogs = map[string][]*records.Artifact{}
	pruned := 0
	for _, a := range arts {
		switch {
		case a == nil:
		case a.PrunedAt != nil:
			pruned++
		default:
			c.flowLogs[a.Cycle] = append(c.flowLogs[a.Cycle], a)
		}
	}
	if pruned > 0 {
		c.note("%d flow log(s) were pruned by retention", pruned)
	}
	return nil
}

// readCycles fills r.Cycles from the cycles and their analyses.
func (c *collector) readCycles() {
	for _, cy := range c.cycles {
		out := Cycle{ID: cy.ID, Lease: cy.Lease, State: cy.State, RequestedAt: cy.RequestedAt, StartedAt: cy.StartedAt,
			CompletedAt: cy.CompletedAt, Revision: cy.Revision, Allowed: cy.Allowed, Promoted: cy.Promoted, Args: cy.Args,
			ExitCode: cy.ExitCode, Error: cy.Error, Execution: cy.Execution, Analysis: cy.Analysis}
		if a := c.analyses[cy.ID]; a != nil {
			out.Connections, out.FlowLogs = a.Connections, a.FlowLogs
			out.Classification, out.Recommendation, out.Reasons = a.Classification, a.Recommendation, a.Reasons
			out.Yara, out.Techniques = a.Yara, mitre.Named(a.Techniques)
		}
		c.r.Cycles = append(c.r.Cycles, out)
	}
}

// span sets From and To: the leases' lives (a cycle's own, for a cycle)
// and the cycles in them; what has not ended yet ends now.
func (c *collector) span() {
	now := c.r.Generated
	var from, to time.Time
	widen := func(t time.Time) {
		if t.IsZero() {
			return
		}
		if from.IsZero() || t.Before(from) {
			from = t
		}
		if t.After(to) {
			to = t
		}
	}
	for _, cy := range c.r.Cycles {
		widen(cy.RequestedAt)
		widen(cy.End(now))
	}
	if c.r.Target != TargetCycle {
		for _, l := range c.r.Leases {
			if l.StartedAt != nil {
				widen(*l.StartedAt)
			}
			if l.ReleasedAt != nil {
				widen(*l.ReleasedAt)
			}
		}
	}
	if from.IsZero() {
		from, to = now, now
	}
	c.r.From, c.r.To = from, to
}

// in reports whether t falls in the report's span.
func (c *collector) in(t time.Time) bool { return !t.Before(c.r.From) && !t.After(c.r.To) }
