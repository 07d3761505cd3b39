package allowlist

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/dnsname"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Validator is the safety check every endpoint passes before it can be
// active: the firewall's own (no private, loopback, link-local, multicast,
// broadcast or reserved address, none of the host's or the lab's, no SMTP).
type Validator interface {
	Check(e firewall.Element) error
}

// Promotion is one promote: the classified destinations of one lease and
// the chain they go to.
type Promotion struct {
	Chain     Chain
	Cycle     string
	Dests     []Dest
	Policy    *Policy
	Validator Validator
	// Guard is the built-in never-allow list (LoadGuard); nil: only its
	// entries that hold everywhere (builtinGuard).
	Guard *Guard
	// InForce are, by cycle, the keys of the entries the lease's chain
	// enforced while the cycle ran (Book.InForce): the cycles in which an
	// answer came from the real far side and not from the sinkhole. Nil:
	// Book.Promote reads them from the cycle records.
	InForce map[string]map[string]bool
	Now     time.Time
}

// confirmed reports whether the far side of an endpoint answered as the
// sample's C2 would, for real: a conversation (an answer in the sample's
// protocol, and the sample's next payload on the same connection) in an
// offline capture of a live run, or in an observable all of whose cycles
// ran with the endpoint let through. Payload alone confirms nothing: any
// server a sample aims at answers something.
func (p *Promotion) confirmed(d *Dest) bool {
	return d.heard.offlineConversed || p.letThrough(d, d.heard.conversed)
}

// letThrough reports whether one of the observables' cycle lists ran with
// the endpoint let through in every cycle.
func (p *Promotion) letThrough(d *Dest, lists [][]string) bool {
	key := d.Type + " " + d.Value
	for _, cycles := range lists {
		all := len(cycles) > 0
		for _, c := range cycles {
			all = all && p.InForce[c][key]
		}
		if all {
			return true
		}
	}
	return false
}

// unconfirmed says which part of a C2's answer the far side of an endpoint
// let through never gave.
func (p *Promotion) unconfirmed(d *Dest) string {
	switch {
	case d == nil:
		return "the sample never contacted it"
	case p.letThrough(d, d.heard.spoke):
		return "the far side answered in the sample's protocol, but the sample never answered back on a session the far side kept open"
	case p.letThrough(d, d.heard.answered):
		return "the far side answered, but not in the protocol the sample spoke"
	}
	return "the far side sent nothing"
}

// Next computes the chain's next content from its current entries and the
// classification, with the refusals. It never changes cur's entries.
func Next(p Promotion, cur []*records.AllowEntry) ([]*records.AllowEntry, []records.Refusal) {
	pol := p.Policy
	next := map[string]*records.AllowEntry{}
	for _, e := range cur {
		c := *e
		next[EntryKey(&c)] = &c
	}
	var refusals refusalSet
	expires := p.Now.Add(pol.TTL.D()).UTC().Truncate(time.Second)
	verdict := firewall.Verdict(pol.Verdict)
	guard := p.Guard
	if guard == nil {
		g := builtinGuard()
		guard = &g
	}
	newlyActive := map[string]bool{}
	byKey := map[string]*Dest{}
	for i := range p.Dests {
		byKey[p.Dests[i].Type+" "+p.Dests[i].Value] = &p.Dests[i]
	}
	for i := range p.Dests {
		d := &p.Dests[i]
		key := d.Type + " " + d.Value
		e := next[key]
		if d.invalid != "" {
			// A resolved name that may not be forwarded: refused, grouped,
			// whatever its class.
			refusals.add(&Dest{Type: d.Type, Value: d.Value, Class: "refused", group: "names that may not be forwarded",
				Reason: "not a forwardable name (letters, digits and hyphens under a registrable domain)", UIDs: d.UIDs})
			continue
		}
		switch d.Class {
		case ClassScan, ClassAbuse, ClassInfra:
			refusals.add(d)
			if e != nil && live(e.Status) {
				e.Status = records.StatusRevoked
				e.Reason = fmt.Sprintf("reclassified as %s: %s", d.Class, d.Reason)
				e.Class, e.Score, e.LastSeen = d.Class, 0, d.LastSeen
			}
			continue
		case ClassC2:
		default:
			continue
		}
		if d.Score < pol.CandidateScore {
			continue
		}
		if why := refuse(d, pol, guard, p.Validator, verdict); why != "" {
			refusals.list = append(refusals.list, records.Refusal{Target: d.Value, Class: "refused", Reason: why, UIDs: d.UIDs})
			if e != nil && live(e.Status) {
				e.Status, e.Reason = records.StatusRevoked, "refused: "+why
			}
			continue
		}
		status := records.StatusCandidate
		if d.Score >= pol.PromoteScore {
			status = records.StatusActive
			switch {
			case approvalName(d, pol) != "":
				status = records.StatusPending
			case d.Type == records.AllowEndpoint && !p.confirmed(d):
				status = records.StatusProbation
			}
		}
		if e == nil {
			e = &records.AllowEntry{Type: d.Type, Value: d.Value, Scope: p.Chain.Scope, Lease: p.Chain.Lease,
				Sample: p.Chain.Sample, Status: status, Cycle: p.Cycle}
			fill(e, d)
			e.ExpiresAt = &expires
			if d.Type == records.AllowEndpoint {
				e.Verdict = string(verdict)
				if status == records.StatusProbation {
					e.Verdict = string(firewall.RateLimit)
					e.Reason = "on probation, its far side not yet seen answering as a C2: " + e.Reason
				}
			}
			next[key] = e
			if enforced(status) {
				newlyActive[key] = true
			}
			continue
		}
		switch e.Status {
		case records.StatusRevoked, records.StatusRejected:
			// Revoked after a probation whose far side never answered as a
			// C2, or by the operator: the same evidence does not bring it
			// back.
			refusals.list = append(refusals.list, records.Refusal{Target: d.Value, Class: e.Status,
				Reason: fmt.Sprintf("%s (entry %s): %s", e.Status, e.ID, cmp.Or(e.Note, e.Reason)), UIDs: d.UIDs})
			continue
		case records.StatusProbation:
			// Decided below, from the cycle it was let through in.
			if status == records.StatusActive {
				status = records.StatusProbation
			}
		}
		fresh := d.LastSeen.After(e.LastSeen)
		if e.Status == records.StatusExpired && !fresh {
			continue // no new evidence since it expired
		}
		if fresh {
			fill(e, d)
			e.Cycle = p.Cycle
			e.ExpiresAt = &expires
		}
		if rank(status) > rank(e.Status) || e.Status == records.StatusExpired {
			if enforced(status) && !enforced(e.Status) {
				newlyActive[key] = true
			}
			e.Status = status
			e.ExpiresAt = &expires
			if status == records.StatusProbation {
				e.Verdict = string(firewall.RateLimit)
			}
		}
	}
	for key, e := range next {
		if e.Status == records.StatusProbation {
			probation(e, byKey[key], &p, verdict, expires)
		}
	}
	out := make([]*records.AllowEntry, 0, len(next))
	for _, e := range next {
		out = append(out, e)
	}
	sortEntries(out)
	refusals.list = append(refusals.list, capActive(out, newlyActive, records.AllowEndpoint, pol.MaxPerLease, "max_per_lease")...)
	refusals.list = append(refusals.list, capActive(out, newlyActive, records.AllowDomain, pol.MaxNames, "max_names")...)
	refusals.list = append(refusals.list, capCycle(out, newlyActive, pol.MaxPerCycle)...)
	return out, refusals.sorted()
}

// probation decides an entry on probation: active once its far side
// answered as the sample's C2 would while it was let through; revoked, for
// the lease, when the cycle being promoted ran with it let through and the
// far side did not (the reason says what was missing: an answer, an answer
// in the sample's protocol, the sample answering back, or any contact);
// else it stays on probation.
func probation(e *records.AllowEntry, d *Dest, p *Promotion, verdict firewall.Verdict, expires time.Time) {
	switch {
	case d != nil && p.confirmed(d):
		e.Status, e.Verdict, e.ExpiresAt = records.StatusActive, string(verdict), &expires
		e.Reason = "confirmed: while it was let through its far side answered in the sample's protocol and the sample answered back; " + d.Reason
	case p.Cycle != "" && p.InForce[p.Cycle][EntryKey(e)]:
		e.Status = records.StatusRevoked
		e.Reason = fmt.Sprintf("%s in %s, while it was let through: %s", probationFailed, p.Cycle, p.unconfirmed(d))
	}
}

// probationFailed starts the reason of an entry probation revoked.
const probationFailed = "probation failed"

// enforced statuses are those whose entries are in the live set.
func enforced(s string) bool { return s == records.StatusActive || s == records.StatusProbation }

func fill(e *records.AllowEntry, d *Dest) {
	e.Class, e.Score, e.Reason, e.Beacon, e.Names = d.Class, d.Score, d.Reason, d.Beacon, d.Names
	e.Observable, e.LastSeen, e.UIDs = d.Observable, d.LastSeen, d.UIDs
}

// live statuses are those a promotion may still change.
func live(s string) bool {
	return enforced(s) || s == records.StatusPending || s == records.StatusCandidate
}

func rank(s string) int {
	switch s {
	case records.StatusCandidate:
		return 1
	case records.StatusPending:
		return 2
	case records.StatusProbation:
		return 3
	case records.StatusActive:
		return 4
	}
	return 0
}

// refuse is why a C2 destination may not be allowed at all, naming the
// rule: the built-in never-allow list first, whatever the policy says.
func refuse(d *Dest, pol *Policy, g *Guard, v Validator, verdict firewall.Verdict) string {
	switch d.Type {
	case records.AllowEndpoint:
		if why := g.refuse(d.addr, slices.Concat(d.Names, d.Claimed)); why != "" {
			return why
		}
		if err := v.Check(firewall.Element{Dst: d.addr, Proto: d.proto, Port: d.port, Verdict: verdict}); err != nil {
			return "validator: " + err.Error()
		}
		if pf := pol.neverAllowed(d.addr); pf != "" {
			return fmt.Sprintf("%s: never_allow: in %s (policy)", d.addr, pf)
		}
		for _, n := range slices.Concat(d.Names, d.Claimed) {
			if p := matchAny(pol.NeverAllowNames, n); p != "" {
				return fmt.Sprintf("%s: never_allow_names: its name %s matches %s", d.addr, n, p)
			}
		}
	case records.AllowDomain:
		if _, err := dnsname.Forwardable(d.Value); err != nil {
			return "not a forwardable name: " + err.Error()
		}
		if why := g.refuse(netip.Addr{}, []string{d.Value}); why != "" {
			return why
		}
		if p := matchAny(pol.NeverAllowNames, d.Value); p != "" {
			return fmt.Sprintf("%s: never_allow_names: matches %s", d.Value, p)
		}
	}
	return ""
}

func approvalName(d *Dest, pol *Policy) string {
	names := slices.Concat(d.Names, d.Claimed)
	if d.Type == records.AllowDomain {
		names = []string{d.Value}
	}
	for _, n := range names {
		if p := matchAny(pol.ApprovalNames, n); p != "" {
			return p
		}
	}
	return ""
}

// capActive keeps at most max active entries of a type: entries activated
// by this promotion past the cap (lowest scores first) stay candidates.
func capActive(es []*records.AllowEntry, newly map[string]bool, typ string, max int, name string) []records.Refusal {
	if max <= 0 {
		return nil
	}
	var active []*records.AllowEntry
	for _, e := range es {
		if e.Type == typ && enforced(e.Status) {
			active = append(active, e)
		}
	}
	if len(active) <= max {
		return nil
	}
	// Entries already active keep their place; new ones compete by score.
	sort.SliceStable(active, func(i, j int) bool {
		ni, nj := newly[EntryKey(active[i])], newly[EntryKey(active[j])]
		if ni != nj {
			return !ni
		}
		return active[i].Score > active[j].Score
	})
	var out []records.Refusal
	for _, e := range active[max:] {
		if !newly[EntryKey(e)] {
			continue
		}
		e.Status = records.StatusCandidate
		out = append(out, records.Refusal{Target: e.Value, Class: "cap", Reason: fmt.Sprintf("%s (%d) reached; kept as a candidate", name, max),
			UIDs: e.UIDs})
	}
	return out
}

// capCycle keeps at most max entries activated by one promotion, of any
// type (the best scores win; the rest stay candidates), so that no one
// cycle's evidence opens many destinations at once.
func capCycle(es []*records.AllowEntry, newly map[string]bool, max int) []records.Refusal {
	if max <= 0 {
		return nil
	}
	var fresh []*records.AllowEntry
	for _, e := range es {
		if newly[EntryKey(e)] && enforced(e.Status) {
			fresh = append(fresh, e)
		}
	}
	if len(fresh) <= max {
		return nil
	}
	sort.SliceStable(fresh, func(i, j int) bool { return fresh[i].Score > fresh[j].Score })
	var out []records.Refusal
	for _, e := range fresh[max:] {
		e.Status = records.StatusCandidate
		out = append(out, records.Refusal{Target: e.Value, Class: "cap", Reason: fmt.Sprintf("max_per_cycle (%d) reached; kept as a candidate", max),
			UIDs: e.UIDs})
	}
	return out
}

// refusalSet groups refusals of one class and group (a scanned port).
type refusalSet struct {
	list   []records.Refusal
	groups map[string]int
}

func (r *refusalSet) add(d *Dest) {
	target := d.group
	if target == "" {
		switch d.Type {
		case records.AllowEndpoint:
			target = d.proto + "/" + fmt.Sprint(d.port)
		case records.AllowDomain:
			target = "names"
		default:
			target = d.Type
		}
	}
	k := d.Class + "\x00" + target
	if r.groups == nil {
		r.groups = map[string]int{}
	}
	// A scan tb-parse summarised stands for its distinct destinations.
	n, examples := 1, []string{d.Value}
	if d.Dests > 0 {
		n, examples = int(d.Dests), d.Sample
	}
	i, ok := r.groups[k]
	if !ok {
		r.groups[k] = len(r.list)
		r.list = append(r.list, records.Refusal{Target: target, Class: d.Class, Reason: d.Reason, Count: n, Examples: slices.Clone(examples),
			UIDs: slices.Clone(d.UIDs)})
		return
	}
	f := &r.list[i]
	f.Count += n
	f.UIDs = unionUIDs(f.UIDs, d.UIDs)
	for _, x := range examples {
		if len(f.Examples) < 8 {
			f.Examples = append(f.Examples, x)
		}
	}
	if f.Reason != d.Reason && !strings.HasSuffix(f.Reason, "…") {
		f.Reason += "; …"
	}
}

func (r *refusalSet) sorted() []records.Refusal {
	sort.SliceStable(r.list, func(i, j int) bool {
		a, b := r.list[i], r.list[j]
		if a.Class != b.Class {
			return a.Class < b.Class
		}
		return a.Target < b.Target
	})
	return r.list
}

// Promote classifies nothing itself: it writes the chain's next revision
// from an already classified promotion (no revision when nothing changes).
func (b *Book) Promote(ctx context.Context, p Promotion) (*records.AllowRevision, bool, error) {
	unlock, err := b.Lock(ctx, p.Chain)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	head, cur, err := b.Head(ctx, p.Chain)
	if err != nil {
		return nil, false, err
	}
	if p.InForce == nil {
		if p.InForce, err = b.InForce(ctx, destCycles(p)); err != nil {
			return nil, false, err
		}
	}
	next, refusals := Next(p, cur)
	return b.Write(ctx, Commit{Chain: p.Chain, Cycle: p.Cycle, Cause: "promote", Refusals: refusals}, head, cur, next)
}

// errNoRevisions is a change asked of a chain that has no revision yet.
var errNoRevisions = errors.New("no revisions")

// Change applies an operator's decision to entries of one chain: fn
// changes the (copied) entries it is given and says which it changed.
func (b *Book) Change(ctx context.Context, c Chain, cause string, fn func(es []*records.AllowEntry) error) (*records.AllowRevision, bool, error) {
	unlock, err := b.Lock(ctx, c)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	head, cur, err := b.Head(ctx, c)
	if err != nil {
		return nil, false, err
	}
	if head == nil {
		return nil, false, fmt.Errorf("%s: %w", c.Key(), errNoRevisions)
	}
	next := make([]*records.AllowEntry, len(cur))
	for i, e := range cur {
		c := *e
		next[i] = &c
	}
	if err := fn(next); err != nil {
		return nil, false, err
	}
	return b.Write(ctx, Commit{Chain: c, Cause: cause}, head, cur, next)
}

// Rollback writes a new revision of rev's chain whose content is rev's.
func (b *Book) Rollback(ctx context.Context, revID string) (*records.AllowRevision, bool, error) {
	target, content, err := b.Revision(ctx, revID)
	if err != nil {
		return nil, false, err
	}
	c := chainOf(target)
	unlock, err := b.Lock(ctx, c)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	head, cur, err := b.Head(ctx, c)
	if err != nil {
		return nil, false, err
	}
	return b.Write(ctx, Commit{Chain: c, Cause: "rollback", RollbackOf: target.ID}, head, cur, content)
}

// Expired is the change that marks entries whose time is up as expired.
func Expired(now time.Time) func(es []*records.AllowEntry) error {
	return func(es []*records.AllowEntry) error {
		for _, e := range es {
			if live(e.Status) && e.ExpiresAt != nil && !e.ExpiresAt.After(now) {
				e.Status = records.StatusExpired
			}
		}
		return nil
	}
}

// Enforced reports whether an entry belongs in the live set now.
func Enforced(e *records.AllowEntry, now time.Time) bool {
	return enforced(e.Status) && (e.ExpiresAt == nil || e.ExpiresAt.After(now))
}
