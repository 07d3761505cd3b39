package leasereport

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// chain is one allow list that applies to a lease of the report: its
// revisions, oldest first, each with the endpoints it forwards (value ->
// expiry, nil for none) and, for those that changed a status and the
// last, its entries by key (nil for the others: refreshed evidence only).
type chain struct {
	key string
	// own: the lease chain of one of the report's leases.
	own      bool
	revs     []*records.AllowRevision
	entries  []map[string]*records.AllowEntry
	enforced []map[string]*time.Time
}

// loadChains reads the chains of the report's leases: their own, their
// sample's, the global one.
func (c *collector) loadChains() error {
	c.chains = map[string]*chain{}
	c.byLease = map[string][]*chain{}
	book := &allowlist.Book{St: c.st}
	for _, l := range c.leases {
		for _, ch := range book.ChainsOf(l) {
			key := ch.Key()
			k := c.chains[key]
			if k == nil {
				var err error
				if k, err = c.readChain(key, ch.Scope == records.ScopeLease); err != nil {
					return err
				}
				c.chains[key] = k
				c.chainKeys = append(c.chainKeys, key)
			}
			c.byLease[l] = append(c.byLease[l], k)
		}
	}
	return nil
}

// allowHistory makes the revisions, the events and the C2 list from the
// chains.
func (c *collector) allowHistory() {
	// A lease's own revisions belong to its life, including those after
	// its last cycle (an approve, an expiry).
	if c.r.Target != TargetCycle {
		for _, key := range c.chainKeys {
			if k := c.chains[key]; k.own && len(k.revs) > 0 {
				if at := k.revs[len(k.revs)-1].CreatedAt; at.After(c.r.To) {
					c.r.To = at
				}
			}
		}
	}
	refusals := map[string]int{}
	c2s := map[string]*C2{}
	for _, key := range c.chainKeys {
		k := c.chains[key]
		for i, rev := range k.revs {
			if rev.CreatedAt.After(c.r.To) {
				break
			}
			c.c2Entries(k, i, c2s)
			if !c.shown(k, rev) {
				continue
			}
			c.r.Revisions = append(c.r.Revisions, Revision{ID: rev.ID, Chain: rev.Chain, Seq: rev.Seq, Cause: rev.Cause, Cycle: rev.Cycle,
				At: rev.CreatedAt, Entries: rev.Entries, Active: rev.Active, RollbackOf: rev.RollbackOf, Changes: statusChanges(rev)})
			c.events(k, i, refusals)
		}
	}
	slices.SortStableFunc(c.r.Revisions, func(a, b Revision) int { return cmp.Or(a.At.Compare(b.At), strings.Compare(a.ID, b.ID)) })
	slices.SortStableFunc(c.r.Events, func(a, b AllowEvent) int { return a.At.Compare(b.At) })
	for _, v := range c2s {
		c.r.C2s = append(c.r.C2s, *v)
	}
	slices.SortFunc(c.r.C2s, func(a, b C2) int { return strings.Compare(a.Value, b.Value) })
}

// shown reports whether a revision belongs in the report: every revision
// of a report lease's own chain, a cycle's own revisions, and the others'
// within the span.
func (c *collector) shown(k *chain, rev *records.AllowRevision) bool {
	switch {
	case c.r.Target == TargetCycle:
		return rev.Cycle == c.r.ID || c.in(rev.CreatedAt)
	case k.own:
		return true
	}
	return c.in(rev.CreatedAt)
}

// readChain reads a chain's revisions, what each forwards (its enforced
// list) and the entries of those that changed a status, and of the last.
// A revision whose blobs cannot be read or fail their digests is reported
// and forwards nothing.
func (c *collector) readChain(key string, own bool) (*chain, error) {
	revs, err := state.FindBy[records.AllowRevision](c.st, records.KindRevision, records.KeyChain, key, nil)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(revs, func(a, b *records.AllowRevision) int { return cmp.Compare(a.Seq, b.Seq) })
	k := &chain{key: key, own: own, revs: revs, entries: make([]map[string]*records.AllowEntry, len(revs)),
		enforced: make([]map[string]*time.Time, len(revs))}
	for i, rev := range revs {
		if k.enforced[i], err = c.enforcedOf(rev); err != nil {
			c.note("revision %s: %v; it is taken to forward nothing", rev.ID, err)
		}
		if i < len(revs)-1 && statusChanges(rev) == 0 {
			continue
		}
		es, err := c.content(rev)
		if err != nil {
			c.note("revision %s: %v; its entries are left out", rev.ID, err)
		}
		k.entries[i] = make(map[string]*records.AllowEntry, len(es))
		for _, e := range es {
			k.entries[i][allowlist.EntryKey(e)] = e
		}
	}
	return k, nil
}

// statusChanges counts the entries a revision added, removed or changed
// the status of (rather than only refreshed their evidence and expiry).
func statusChanges(rev *records.AllowRevision) int {
	n := len(rev.Changes.Added) + len(rev.Changes.Removed)
	for _, ch := range rev.Changes.Changed {
		if ch.From != ch.To {
			n++
		}
	}
	return n
}

// blob reads one of a revision's blobs, checking it against its digest.
func (c *collector) blob(uri, sha string) ([]byte, error) {
	if strings.TrimPrefix(uri, "blob:sha256:") != sha || sha == "" {
		return nil, fmt.Errorf("blob %q does not match its digest %q", uri, sha)
	}
	if err := c.st.EnsureBlob(c.ctx, sha); err != nil {
		return nil, err
	}
	f, err := c.st.OpenBlob(sha)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != sha {
		return nil, fmt.Errorf("blob %s does not match its digest", uri)
	}
	return data, nil
}

// enforcedOf reads the endpoints a revision forwards from its enforced
// list ("endpoint VALUE VERDICT EXPIRY" per line, the expiry in Unix
// seconds, 0 for none).
func (c *collector) enforcedOf(rev *records.AllowRevision) (map[string]*time.Time, error) {
	data, err := c.blob(rev.Enforce, rev.EnforceSHA256)
	if err != nil {
		return nil, err
	}
	out := map[string]*time.Time{}
	for len(data) > 0 {
		var l []byte
		l, data, _ = bytes.Cut(data, []byte{'\n'})
		f := bytes.Fields(l)
		if len(f) != 4 || string(f[0]) != records.AllowEndpoint {
			continue
		}
		exp, err := strconv.ParseInt(string(f[3]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("enforced list: %q: bad expiry", l)
		}
		var at *time.Time
		if exp != 0 {
			t := time.Unix(exp, 0).UTC()
			at = &t
		}
		out[string(f[1])] = at
	}
	return out, nil
}

// content reads a revision's entries.
func (c *collector) content(rev *records.AllowRevision) ([]*records.AllowEntry, error) {
	data, err := c.blob(rev.Content, rev.ContentSHA256)
	if err != nil {
		return nil, err
	}
	return allowlist.DecodeEntries(data, rev.Content)
}

// c2Entries takes revision i's C2 endpoints into the C2 list: the latest
// entry of each wins, a lease's own chain over the others.
func (c *collector) c2Entries(k *chain, i int, c2s map[string]*C2) {
	for _, e := range k.entries[i] {
		if e.Type != records.AllowEndpoint || e.Class != allowlist.ClassC2 {
			continue
		}
		cur := c2s[e.Value]
		if cur != nil && cur.Chain != k.key && !k.own {
			continue
		}
		if cur == nil {
			cur = &C2{Value: e.Value}
			c2s[e.Value] = cur
		}
		cur.Entry, cur.Chain, cur.Names, cur.Status, cur.Score, cur.Reason = e.ID, k.key, e.Names, e.Status, e.Score, e.Reason
		if e.Beacon != nil {
			cur.Beacon, cur.EstimatedIn = e.Beacon, e.Revision
		}
	}
}

// events adds what revision i of k changed and refused.
func (c *collector) events(k *chain, i int, refusals map[string]int) {
	rev, entries := k.revs[i], k.entries[i]
	base := AllowEvent{At: rev.CreatedAt, Revision: rev.ID, Chain: rev.Chain, Seq: rev.Seq, Cause: rev.Cause, Cycle: rev.Cycle}
	add := func(ch records.Change, action string) {
		ev := base
		ev.Action, ev.Key, ev.Entry, ev.From, ev.To = action, ch.Key, ch.Entry, ch.From, ch.To
		if e := entries[ch.Key]; e != nil {
			ev.Class, ev.Why, ev.Note = e.Class, e.Reason, e.Note
			if action == ActionExpired && e.ExpiresAt != nil {
				ev.Why = "its time was up at " + e.ExpiresAt.UTC().Format(time.RFC3339)
			}
		}
		c.r.Events = append(c.r.Events, ev)
	}
	for _, ch := range rev.Changes.Added {
		add(ch, statusAction(ch.To))
	}
	for _, ch := range rev.Changes.Changed {
		switch {
		case ch.From == ch.To:
			// refreshed evidence or expiry: the status stands
		case ch.To == records.StatusActive && (ch.From == records.StatusPending || ch.From == records.StatusCandidate) && rev.Cause == "approve":
			add(ch, ActionApproved)
		default:
			add(ch, statusAction(ch.To))
		}
	}
	for _, ch := range rev.Changes.Removed {
		add(ch, ActionRemoved)
	}
	for _, f := range rev.Refusals {
		key := rev.Chain + "\x00" + f.Target + "\x00" + f.Class
		if j, ok := refusals[key]; ok {
			ev := &c.r.Events[j]
			ev.Repeats++
			ev.Last, ev.LastRevision = rev.CreatedAt, rev.ID
			ev.Why, ev.Count, ev.Examples = f.Reason, f.Count, f.Examples
			continue
		}
		ev := base
		ev.Action, ev.Key, ev.Class, ev.Why, ev.Count, ev.Examples = ActionRefused, f.Target, f.Class, f.Reason, f.Count, f.Examples
		refusals[key] = len(c.r.Events)
		c.r.Events = append(c.r.Events, ev)
	}
}

func statusAction(status string) string {
	switch status {
	case records.StatusActive:
		return ActionPromoted
	case records.StatusPending:
		return ActionPending
	case records.StatusCandidate:
		return ActionCandidate
	case records.StatusRejected:
		return ActionRejected
	case records.StatusRevoked:
		return ActionRevoked
	case records.StatusExpired:
		return ActionExpired
	}
	return status
}

// forwarded reports whether an allow-list revision in force on lease at t
// forwarded the endpoint value: the latest revision of each of the lease's
// chains made by then had it active and not past its expiry.
func (c *collector) forwarded(lease, value string, t time.Time) bool {
	for _, k := range c.byLease[lease] {
		i := sort.Search(len(k.revs), func(i int) bool { return k.revs[i].CreatedAt.After(t) }) - 1
		if i < 0 {
			continue
		}
		if exp, ok := k.enforced[i][value]; ok && (exp == nil || t.Before(*exp)) {
			return true
		}
	}
	return false
}
