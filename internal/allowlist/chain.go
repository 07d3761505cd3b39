package allowlist

// The forms of one allow list. Each revision Write stores is kept in six
// forms, and each lease in one more. Each but the delta has a reader that
// would otherwise pay far more; the delta only just earns its place:
//
//   - The revision record, with its changeset: the chain's link (sequence,
//     predecessor and hashes) and what changed, which tb-allow revisions
//     and show print, and tb-run's analysis and the lease report read,
//     without decoding two contents.
//   - The content blob: every entry, one JSON line each in key order, the
//     entries' only copy (100,000 entries are one blob, not 100,000
//     records).
//   - The enforced blob: the enforced entries as "TYPE VALUE VERDICT
//     EXPIRES" lines, which apply parses in place (parseEnforced, the one
//     reader of the line) instead of decoding the content's JSON.
//   - The enforced delta blob: the lines that went and came since the
//     previous revision. In the process that writes a revision, apply
//     takes it as written; it is read from the store only by Verify and
//     by an apply in another process (a promote or rollback that changed
//     nothing, after a write with --no-apply), which pushes a one-entry
//     change without reading two 100,000-line lists. It is the one form
//     apply could do without (mergeDiff finds the same change).
//   - The head index (allow_head in the state): which revision is a
//     chain's current one, shared by a fleet's hosts.
//   - The head-ref file (allow/heads/CHAIN.json, this host's): the head's
//     blob digests and counts, so that apply does not decode a record
//     whose changeset is megabytes after a 100,000-entry change; rebuilt
//     from the record when missing or stale.
//   - Per lease, the applied sidecar (allow/applied/LEASE.json): what the
//     last apply left in the lease's sets, so that the next one sends
//     only the change without reading the kernel's set.
//
// Within a process, what Write stored goes to apply as written
// (Book.wrote): nothing just written is read back or hashed again. Apply
// finds the change from what was applied three ways, cheapest first: the
// head's delta (it follows the revision applied, nothing expired, the
// lease's other chains enforce no endpoint); the merge of the old and new
// enforced lists of the one chain that changed (walkEnforced, the one
// merge, which also makes the delta); else both sides folded whole, the
// only way to a union of several chains.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// headIndex maps a chain to its latest revision.
const headIndex = "allow_head"

// Chain names one allow list: a lease's, a sample's or the global one.
type Chain struct {
	Scope  string
	Lease  string
	Sample string
}

// Key is the chain's name on revisions: "lease:<id>", "sample:<sha256>",
// "global".
func (c Chain) Key() string {
	switch c.Scope {
	case records.ScopeLease:
		return "lease:" + c.Lease
	case records.ScopeSample:
		return "sample:" + c.Sample
	}
	return records.ScopeGlobal
}

// Check refuses a chain without its subject.
func (c Chain) Check() error {
	switch c.Scope {
	case records.ScopeLease:
		if records.CheckID(c.Lease) != nil || records.KindOf(c.Lease) != "lease" {
			return fmt.Errorf("scope lease needs a lease ID (got %q)", c.Lease)
		}
	case records.ScopeSample:
		if c.Sample == "" || strings.ContainsAny(c.Sample, "/ \t:") {
			return fmt.Errorf("scope sample needs a sample (sha256 or ID)")
		}
	case records.ScopeGlobal:
	default:
		return fmt.Errorf("unknown scope %q (lease, sample, global)", c.Scope)
	}
	return nil
}

func (c Chain) indexKey() string { return indexKeyOf(c.Key()) }

func indexKeyOf(chainKey string) string { return strings.ReplaceAll(chainKey, "_", ".") }

func chainOf(r *records.AllowRevision) Chain {
	return Chain{Scope: r.Scope, Lease: r.Lease, Sample: r.Sample}
}

// Book is the allow lists kept in a state directory.
type Book struct {
	St *state.Store

	// wrote is, per chain, what this Book's Write last stored: the head's
	// ref, enforced list and delta, which the apply that follows in the
	// same process (promote, approve, revoke, expire, rollback) takes as
	// written instead of reading them back and hashing them again.
	mu    sync.Mutex
	wrote map[string]*written
}

// written is what Write stored of one revision for apply.
type written struct {
	ref             *revRef
	enforced, delta []byte
}

func (b *Book) remember(chainKey string, w *written) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.wrote == nil {
		b.wrote = map[string]*written{}
	}
	b.wrote[chainKey] = w
}

// written is the enforced list or delta with this digest if this Book
// wrote it, else nil.
func (b *Book) written(sha string) []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, w := range b.wrote {
		switch sha {
		case w.ref.EnforceSHA256:
			return w.enforced
		case w.ref.DeltaSHA256:
			return w.delta
		}
	}
	return nil
}

// writtenRef is the ref of the revision this Book last wrote of a chain,
// if it is still the head (id), else nil.
func (b *Book) writtenRef(chainKey, id string) *revRef {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w := b.wrote[chainKey]; w != nil && w.ref.ID == id {
		return w.ref
	}
	return nil
}

// enforcedBlob is apply's read of an enforced list or delta: as written,
// when this Book wrote it, else from the store. Verify reads the store.
func (b *Book) enforcedBlob(ctx context.Context, rev, uri, sha string) ([]byte, error) {
	if data := b.written(sha); data != nil && uri == "blob:sha256:"+sha {
		return data, nil
	}
	return b.blob(ctx, rev, uri, sha)
}

// Lock serialises the writers of one chain (across processes).
func (b *Book) Lock(ctx context.Context, c Chain) (func(), error) {
	return b.St.Lock(ctx, "allow-"+c.indexKey())
}

// Head returns a chain's latest revision and its entries (nil and
// none for a chain without revisions).
func (b *Book) Head(ctx context.Context, c Chain) (*records.AllowRevision, []*records.AllowEntry, error) {
	id, err := b.headID(c.Key())
	if err != nil || id == "" {
		return nil, nil, err
	}
	return b.Revision(ctx, id)
}

// HeadID is the ID of a chain's latest revision from the head index (one
// lookup, the revision not read), "" when it has none.
func (b *Book) HeadID(c Chain) (string, error) { return b.headID(c.Key()) }

// headID is the ID of the latest revision of the chain with this key, ""
// when it has none.
func (b *Book) headID(chainKey string) (string, error) {
	id, err := b.St.Lookup(headIndex, indexKeyOf(chainKey))
	if errors.Is(err, state.ErrNotFound) {
		return "", nil
	}
	return id, err
}

// Revision reads a revision and its entries; ctx bounds the fetch
// of its content blob from the fleet host that wrote it.
func (b *Book) Revision(ctx context.Context, id string) (*records.AllowRevision, []*records.AllowEntry, error) {
	if records.KindOf(id) != records.KindRevision {
		return nil, nil, fmt.Errorf("%q is not a revision ID", id)
	}
	var r records.AllowRevision
	if err := b.St.Get(id, &r); err != nil {
		return nil, nil, err
	}
	entries, err := b.content(ctx, &r)
	if err != nil {
		return &r, nil, err
	}
	return &r, entries, nil
}

// content reads a revision's entries from its blob, checking the digest.
func (b *Book) content(ctx context.Context, r *records.AllowRevision) ([]*records.AllowEntry, error) {
	data, err := b.blob(ctx, r.ID, r.Content, r.ContentSHA256)
	if err != nil {
		return nil, err
	}
	return DecodeEntries(data, r.ID)
}

// blob reads one of a revision's blobs and checks it against its digest.
func (b *Book) blob(ctx context.Context, rev, uri, sha string) ([]byte, error) {
	if strings.TrimPrefix(uri, "blob:sha256:") != sha || sha == "" {
		return nil, &TamperError{Revision: rev, Reason: fmt.Sprintf("blob URI %q and digest %q differ", uri, sha)}
	}
	// A revision written on another host of a fleet has its blobs there:
	// an HTTP fetch, which the caller's ctx (a command's Ctrl-C) stops.
	if err := b.St.EnsureBlob(ctx, sha); err != nil {
		return nil, fmt.Errorf("revision %s: %w", rev, err)
	}
	f, err := b.St.OpenBlob(sha)
	if err != nil {
		return nil, fmt.Errorf("revision %s: %w", rev, err)
	}
	defer f.Close()
	var data []byte
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		data = make([]byte, 0, fi.Size()+1)
	}
	if data, err = readAll(f, data); err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != sha {
		return nil, &TamperError{Revision: rev, Reason: "its content blob does not match its digest"}
	}
	return data, nil
}

// readAll appends what is left of r to buf: io.ReadAll, into a buffer
// already of the size expected.
func readAll(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// DecodeEntries reads a revision's content: one allow entry per line; name is
// the content's name in errors.
func DecodeEntries(data []byte, name string) ([]*records.AllowEntry, error) {
	rd := records.NewReader(bytes.NewReader(data), name)
	var out []*records.AllowEntry
	for {
		l, err := rd.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var e records.AllowEntry
		if err := records.Unmarshal(l.Data, &e); err != nil {
			return nil, l.Err(err)
		}
		out = append(out, &e)
	}
}

// encodeEntries is the canonical content: one entry per line, in key order.
func encodeEntries(es []*records.AllowEntry) ([]byte, error) {
	sortEntries(es)
	var buf bytes.Buffer
	for _, e := range es {
		b, err := records.Marshal(e)
		if err != nil {
			return nil, err
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	return buf.Bytes(), nil
}

// EntryKey identifies an entry within its chain.
func EntryKey(e *records.AllowEntry) string { return e.Type + " " + e.Value }

// cmpEntries orders entries by key without building keys: the types
// (endpoint, domain) are not prefixes of one another.
func cmpEntries(a, b *records.AllowEntry) int {
	if c := strings.Compare(a.Type, b.Type); c != 0 {
		return c
	}
	return strings.Compare(a.Value, b.Value)
}

func sortEntries(es []*records.AllowEntry) { slices.SortFunc(es, cmpEntries) }

// canonical is what a revision's hash covers: every field but those the
// state store owns (rev, updated_at) and the hash itself.
func canonical(r *records.AllowRevision) []byte {
	c := struct {
		ID, Kind, Chain, Scope, Lease, Sample string
		Seq                                   int64
		Previous, PrevHash, Cycle, Cause      string
		RollbackOf, Content, ContentSHA256    string
		Enforce, EnforceSHA256                string
		EnforceDelta                          string `json:",omitempty"`
		EnforceDeltaSHA256                    string `json:",omitempty"`
		Entries, Active                       int
		Changes                               records.Changeset
		Refusals                              []records.Refusal
		CreatedAt                             string
	}{r.ID, r.Kind, r.Chain, r.Scope, r.Lease, r.Sample, r.Seq, r.Previous, r.PrevHash, r.Cycle, r.Cause,
		r.RollbackOf, r.Content, r.ContentSHA256, r.Enforce, r.EnforceSHA256, r.EnforceDelta, r.EnforceDeltaSHA256,
		r.Entries, r.Active, r.Changes, r.Refusals,
		r.CreatedAt.UTC().Format(time.RFC3339Nano)}
	b, _ := json.Marshal(c)
	return b
}

// Hash is the sha256 of a revision's canonical encoding.
func Hash(r *records.AllowRevision) string {
	sum := sha256.Sum256(canonical(r))
	return hex.EncodeToString(sum[:])
}

// Diff is the changeset from one content to another.
func Diff(from, to []*records.AllowEntry) records.Changeset {
	old := map[string]*records.AllowEntry{}
	for _, e := range from {
		old[EntryKey(e)] = e
	}
	var cs records.Changeset
	seen := map[string]bool{}
	for _, e := range to {
		k := EntryKey(e)
		seen[k] = true
		o, ok := old[k]
		switch {
		case !ok:
			cs.Added = append(cs.Added, records.Change{Key: k, Entry: e.ID, To: e.Status})
		case !sameEntry(o, e):
			cs.Changed = append(cs.Changed, records.Change{Key: k, Entry: e.ID, From: o.Status, To: e.Status})
		}
	}
	for _, e := range from {
		if k := EntryKey(e); !seen[k] {
			cs.Removed = append(cs.Removed, records.Change{Key: k, Entry: e.ID, From: e.Status})
		}
	}
	for _, l := range [][]records.Change{cs.Added, cs.Removed, cs.Changed} {
		sort.Slice(l, func(i, j int) bool { return l[i].Key < l[j].Key })
	}
	return cs
}

// Empty reports a changeset that changes nothing.
func Empty(cs records.Changeset) bool {
	return len(cs.Added)+len(cs.Removed)+len(cs.Changed) == 0
}

// sameEntry compares what an entry says, not when it was written.
func sameEntry(a, b *records.AllowEntry) bool {
	return a.Type == b.Type && a.Value == b.Value && a.Observable == b.Observable && a.Scope == b.Scope &&
		a.Lease == b.Lease && a.Sample == b.Sample && a.Status == b.Status && a.Class == b.Class &&
		a.Score == b.Score && a.Reason == b.Reason && a.Verdict == b.Verdict && a.Cycle == b.Cycle &&
		a.Note == b.Note && a.LastSeen.Equal(b.LastSeen) && slices.Equal(a.Names, b.Names) && slices.Equal(a.UIDs, b.UIDs) &&
		sameTime(a.ExpiresAt, b.ExpiresAt) && sameBeacon(a.Beacon, b.Beacon) && sameExtra(a.Extra, b.Extra)
}

func sameTime(a, b *time.Time) bool {
	return a == nil && b == nil || a != nil && b != nil && a.Equal(*b)
}

func sameBeacon(a, b *records.Beacon) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func sameExtra(a, b map[string]json.RawMessage) bool {
	return maps.EqualFunc(a, b, func(x, y json.RawMessage) bool { return bytes.Equal(x, y) })
}

// Commit is one change of a chain.
type Commit struct {
	Chain      Chain
	Cycle      string
	Cause      string
	RollbackOf string
	Refusals   []records.Refusal
}

// Write stores a new revision of the chain whose content is entries, unless
// it equals the head's: then it returns the head and false. The caller
// holds the chain's lock. Entries that are new or changed get the new
// revision's ID. The content blob is the entries' only copy: a revision of
// 100,000 entries is two blobs and one record, not 100,000 records.
func (b *Book) Write(ctx context.Context, c Commit, head *records.AllowRevision, prev, entries []*records.AllowEntry) (*records.AllowRevision, bool, error) {
	now := b.St.Now()
	for _, e := range entries {
		if e.ID == "" {
			records.Init(e, records.KindAllow, now)
		}
	}
	storable(entries, c.Refusals)
	cs := Diff(prev, entries)
	if head != nil && Empty(cs) {
		return head, false, nil
	}
	rev := &records.AllowRevision{Chain: c.Chain.Key(), Scope: c.Chain.Scope, Lease: c.Chain.Lease, Sample: c.Chain.Sample,
		Cycle: c.Cycle, Cause: c.Cause, RollbackOf: c.RollbackOf, Refusals: c.Refusals, Changes: cs}
	records.Init(rev, records.KindRevision, now)
	if head != nil {
		rev.Seq, rev.Previous, rev.PrevHash = head.Seq+1, head.ID, Hash(head)
	} else {
		rev.Seq = 1
	}
	changed := map[string]bool{}
	for _, l := range [][]records.Change{cs.Added, cs.Changed} {
		for _, ch := range l {
			changed[ch.Key] = true
		}
	}
	for _, e := range entries {
		if changed[EntryKey(e)] {
			e.Revision = rev.ID
			e.UpdatedAt = now
		}
		if enforced(e.Status) {
			rev.Active++
		}
	}
	data, err := encodeEntries(entries)
	if err != nil {
		return nil, false, err
	}
	blob, err := b.St.PutBlob(ctx, bytes.NewReader(data))
	if err != nil {
		return nil, false, err
	}
	rev.Content, rev.ContentSHA256, rev.Entries = blob.URI(), blob.SHA256, len(entries)
	enforced := encodeEnforced(entries)
	eb, err := b.St.PutBlob(ctx, bytes.NewReader(enforced))
	if err != nil {
		return nil, false, err
	}
	rev.Enforce, rev.EnforceSHA256 = eb.URI(), eb.SHA256
	var was []byte
	if head != nil {
		was = b.written(head.EnforceSHA256)
	}
	if was == nil {
		if !slices.IsSortedFunc(prev, cmpEntries) {
			sortEntries(prev)
		}
		was = encodeEnforced(prev)
	}
	delta := enforcedDelta(was, enforced)
	db, err := b.St.PutBlob(ctx, bytes.NewReader(delta))
	if err != nil {
		return nil, false, err
	}
	rev.EnforceDelta, rev.EnforceDeltaSHA256 = db.URI(), db.SHA256
	ref, err := b.refOf(ctx, rev, enforced)
	if err != nil {
		return nil, false, err
	}
	rev.Hash = Hash(rev)
	if err := b.St.Create(ctx, rev); err != nil {
		return nil, false, err
	}
	if err := b.St.SetIndex(headIndex, c.Chain.indexKey(), rev.ID); err != nil {
		return nil, false, err
	}
	if err := b.writeHeadRef(c.Chain, ref); err != nil {
		return nil, false, err
	}
	b.remember(c.Chain.Key(), &written{ref: ref, enforced: enforced, delta: delta})
	return rev, true, nil
}

// TamperError is a revision chain that does not hold together.
type TamperError struct {
	Revision string
	Reason   string
}

func (e *TamperError) Error() string {
	return fmt.Sprintf("revision %s: %s: the chain was tampered with", e.Revision, e.Reason)
}

// Chain returns a chain's revisions, oldest first, following Previous back
// from the head.
func (b *Book) Chain(c Chain) ([]*records.AllowRevision, error) {
	head, err := b.headID(c.Key())
	if err != nil || head == "" {
		return nil, err
	}
	var out []*records.AllowRevision
	for id := head; id != ""; {
		var r records.AllowRevision
		if err := b.St.Get(id, &r); err != nil {
			if errors.Is(err, state.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
				prev := head
				if len(out) > 0 {
					prev = out[len(out)-1].ID
				}
				return nil, &TamperError{Revision: prev, Reason: fmt.Sprintf("its previous revision %s is missing", id)}
			}
			return nil, err
		}
		out = append(out, &r)
		if len(out) > 1<<20 {
			return nil, &TamperError{Revision: id, Reason: "the chain loops"}
		}
		id = r.Previous
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// Verify checks a chain: every revision's own hash, the hash of its
// predecessor it records, its sequence number, its content against its
// digest, and its changeset against the contents it joins.
func (b *Book) Verify(ctx context.Context, c Chain) ([]*records.AllowRevision, error) {
	revs, err := b.Chain(c)
	if err != nil {
		return nil, err
	}
	var prev *records.AllowRevision
	var prevContent []*records.AllowEntry
	for _, r := range revs {
		if r.Chain != c.Key() {
			return revs, &TamperError{Revision: r.ID, Reason: fmt.Sprintf("it belongs to chain %q, not %q", r.Chain, c.Key())}
		}
		if r.Hash != Hash(r) {
			return revs, &TamperError{Revision: r.ID, Reason: "its fields do not match its hash"}
		}
		if prev == nil {
			if r.Seq != 1 || r.PrevHash != "" {
				return revs, &TamperError{Revision: r.ID, Reason: "the first revision has a predecessor's hash or a sequence number other than 1"}
			}
		} else {
			if r.PrevHash != Hash(prev) {
				return revs, &TamperError{Revision: prev.ID, Reason: fmt.Sprintf("its hash is not the one revision %s recorded", r.ID)}
			}
			if r.Seq != prev.Seq+1 {
				return revs, &TamperError{Revision: r.ID, Reason: fmt.Sprintf("sequence %d follows %d", r.Seq, prev.Seq)}
			}
		}
		content, err := b.content(ctx, r)
		if err != nil {
			return revs, err
		}
		enf, err := b.blob(ctx, r.ID, r.Enforce, r.EnforceSHA256)
		if err != nil {
			return revs, err
		}
		if !bytes.Equal(enf, encodeEnforced(content)) {
			return revs, &TamperError{Revision: r.ID, Reason: "its enforced list does not match its content"}
		}
		if r.EnforceDelta != "" {
			delta, err := b.blob(ctx, r.ID, r.EnforceDelta, r.EnforceDeltaSHA256)
			if err != nil {
				return revs, err
			}
			if !bytes.Equal(delta, enforcedDelta(encodeEnforced(prevContent), enf)) {
				return revs, &TamperError{Revision: r.ID, Reason: "its enforced delta does not match its and its predecessor's enforced lists"}
			}
		}
		got, _ := json.Marshal(Diff(prevContent, content))
		want, _ := json.Marshal(r.Changes)
		if !bytes.Equal(got, want) {
			return revs, &TamperError{Revision: r.ID, Reason: "its changeset does not match its content"}
		}
		prev, prevContent = r, content
	}
	return revs, nil
}

// Chains lists every chain that has revisions. Only each revision's
// chain is decoded: the record of a 100,000-entry change holds a
// changeset of 100,000 changes.
func (b *Book) Chains() ([]Chain, error) {
	ids, err := b.St.List(records.KindRevision)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []Chain
	for _, id := range ids {
		raw, err := b.St.ReadRaw(id)
		if err != nil {
			continue
		}
		var r struct {
			Chain  string `json:"chain"`
			Scope  string `json:"scope"`
			Lease  string `json:"lease"`
			Sample string `json:"sample"`
		}
		if json.Unmarshal(raw, &r) != nil || r.Chain == "" {
			continue
		}
		if !seen[r.Chain] {
			seen[r.Chain] = true
			out = append(out, Chain{Scope: r.Scope, Lease: r.Lease, Sample: r.Sample})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out, nil
}
