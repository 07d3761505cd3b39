package allowlist

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	endpt "github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/files"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// encodeEnforced is the compact list of a content's enforced entries
// (active, or on probation: rate-limited whatever the entry says), in key
// order, that apply reads instead of the whole content.
func encodeEnforced(es []*records.AllowEntry) []byte {
	var b bytes.Buffer
	b.Grow(64 * len(es))
	for _, e := range es {
		if !enforced(e.Status) {
			continue
		}
		v := cmp.Or(e.Verdict, "-")
		if e.Status == records.StatusProbation {
			v = string(firewall.RateLimit)
		}
		var exp int64
		if e.ExpiresAt != nil {
			exp = e.ExpiresAt.Unix()
		}
		b.WriteString(e.Type)
		b.WriteByte(' ')
		b.WriteString(e.Value)
		b.WriteByte(' ')
		b.WriteString(v)
		b.WriteByte(' ')
		b.Write(strconv.AppendInt(b.AvailableBuffer(), exp, 10))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// nextLine splits the first line off d.
func nextLine(d []byte) (line, rest []byte) {
	if i := bytes.IndexByte(d, '\n'); i >= 0 {
		return d[:i], d[i+1:]
	}
	return d, nil
}

// lineKey is an enforced line's entry key ("TYPE VALUE"): lines are in
// the order of their keys.
func lineKey(l []byte) []byte {
	i := bytes.IndexByte(l, ' ')
	if i < 0 {
		return l
	}
	if j := bytes.IndexByte(l[i+1:], ' '); j >= 0 {
		return l[:i+1+j]
	}
	return l
}

// walkEnforced walks two enforced lists of one chain, both in key order,
// calling visit once a key with its line in each (nil in the one that
// has none): the one merge of two lists, for their stored delta and for
// the change of the sets between them.
func walkEnforced(from, to []byte, visit func(old, new []byte) error) error {
	var ol, nl []byte
	ol, from = nextLine(from)
	nl, to = nextLine(to)
	for len(ol) > 0 || len(nl) > 0 {
		c := 0
		switch {
		case len(ol) == 0:
			c = 1
		case len(nl) == 0:
			c = -1
		default:
			c = bytes.Compare(lineKey(ol), lineKey(nl))
		}
		var o, n []byte
		if c <= 0 {
			o = ol
			ol, from = nextLine(from)
		}
		if c >= 0 {
			n = nl
			nl, to = nextLine(to)
		}
		if err := visit(o, n); err != nil {
			return err
		}
	}
	return nil
}

// enforcedDelta is the change from one enforced list to another (both in
// key order): "-" and the line for each line that went, "+" and the line
// for each that came; a changed line is its "-" then its "+".
func enforcedDelta(from, to []byte) []byte {
	var out bytes.Buffer
	put := func(sign byte, l []byte) {
		out.WriteByte(sign)
		out.Write(l)
		out.WriteByte('\n')
	}
	walkEnforced(from, to, func(o, n []byte) error {
		if o != nil && n != nil && bytes.Equal(o, n) {
			return nil
		}
		if o != nil {
			put('-', o)
		}
		if n != nil {
			put('+', n)
		}
		return nil
	})
	return out.Bytes()
}

// enforcedStats counts an enforced list's endpoints and finds the earliest
// of their expiries (Unix seconds, 0 when none expires).
func enforcedStats(data []byte, rev string) (endpoints int, expires int64, err error) {
	for n := 1; len(data) > 0; n++ {
		var l []byte
		l, data = nextLine(data)
		x, err := parseEnforced(l)
		if err != nil {
			return 0, 0, badLine(rev, "enforced list", n, err)
		}
		if !x.endpoint() {
			continue
		}
		endpoints++
		if x.exp != 0 && (expires == 0 || x.exp < expires) {
			expires = x.exp
		}
	}
	return endpoints, expires, nil
}

// elemKey is an element's identity, without formatting.
type elemKey struct {
	dst   netip.Addr
	proto string
	port  uint16
}

func keyOf(e firewall.Element) elemKey { return elemKey{e.Dst, e.Proto, e.Port} }

// liveAt reports whether an expiry (Unix seconds, 0 for none) is still to
// come at t (Unix seconds; 0 ignores expiry).
func liveAt(exp, t int64) bool { return exp == 0 || t == 0 || exp > t }

// unixOf is t in Unix seconds, 0 for the zero time (expiry ignored).
func unixOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}

// verdictOf is an enforced line's verdict: "-" (no verdict of its own,
// or probation's) is rate-limit.
func verdictOf(v []byte) firewall.Verdict {
	switch string(v) {
	case "-", string(firewall.RateLimit):
		return firewall.RateLimit
	case string(firewall.Forward):
		return firewall.Forward
	}
	return firewall.Verdict(v)
}

// expiryOf reads an enforced line's expiry: decimal digits, at most 18
// (none overflows).
func expiryOf(d []byte) (exp int64, ok bool) {
	if len(d) == 0 || len(d) > 18 {
		return 0, false
	}
	for _, c := range d {
		if c < '0' || c > '9' {
			return 0, false
		}
		exp = exp*10 + int64(c-'0')
	}
	return exp, true
}

// enforcedLine is one line of an enforced list, "TYPE VALUE VERDICT
// EXPIRES" with the expiry in Unix seconds (0 for none), read in place.
type enforcedLine struct {
	typ, value []byte
	// el is an endpoint's element, its verdict the line's ("-" and
	// probation's are rate-limit).
	el  firewall.Element
	exp int64
}

func (x *enforcedLine) endpoint() bool { return string(x.typ) == records.AllowEndpoint }

var errMalformed = errors.New("not TYPE VALUE VERDICT EXPIRES")

var endpointPrefix = []byte(records.AllowEndpoint + " ")

// parseEnforced is the one reader of an enforced line. The lines of big
// lists, IPv4 endpoints, take the first branch: a few calls and no
// allocation. Any other line, or one that branch does not take, is read
// field by field with the same meaning (TestParseEnforced).
func parseEnforced(l []byte) (x enforcedLine, err error) {
	if rest, ok := bytes.CutPrefix(l, endpointPrefix); ok {
		if sp := bytes.IndexByte(rest, ' '); sp > 0 {
			value, tail := rest[:sp], rest[sp+1:]
			if ep, ok := endpt.ParseIPv4(value); ok {
				if sp = bytes.IndexByte(tail, ' '); sp > 0 {
					if exp, ok := expiryOf(tail[sp+1:]); ok {
						x.typ, x.value, x.exp = l[:len(records.AllowEndpoint)], value, exp
						x.el = firewall.Element{Dst: ep.Addr, Proto: ep.Proto, Port: ep.Port, Verdict: verdictOf(tail[:sp])}
						return x, nil
					}
				}
			}
		}
	}
	var f [4][]byte
	n := 0
	for n < 4 && len(l) > 0 {
		i := bytes.IndexByte(l, ' ')
		if i < 0 {
			f[n], l = l, nil
		} else {
			f[n], l = l[:i], l[i+1:]
		}
		n++
	}
	var ok bool
	if n != 4 || len(l) > 0 {
		return x, errMalformed
	}
	if x.exp, ok = expiryOf(f[3]); !ok {
		return x, errMalformed
	}
	x.typ, x.value = f[0], f[1]
	if x.endpoint() {
		ep, err := endpt.Parse(string(f[1]))
		if err != nil {
			return x, err
		}
		x.el = firewall.Element{Dst: ep.Addr, Proto: ep.Proto, Port: ep.Port, Verdict: verdictOf(f[2])}
	}
	return x, nil
}

// badLine is the tamper error of line n of a revision's enforced list or
// delta.
func badLine(rev, list string, n int, err error) error {
	return &TamperError{Revision: rev, Reason: fmt.Sprintf("%s line %d: %v", list, n, err)}
}

// live folds the enforced lists of revisions into a lease's live list,
// the entries whose expiry is still to come at now (every entry with now
// zero). It reads the compact lines in place: apply of 100,000 entries
// parses 100,000 lines.
func (b *Book) live(ctx context.Context, lease string, revs []*revRef, now time.Time) (*Live, error) {
	l := &Live{Lease: lease}
	total := 0
	for _, r := range revs {
		total += r.Active
	}
	l.Elements = make([]firewall.Element, 0, total)
	// One chain's entries are unique by key: only a union needs the map.
	var seen map[elemKey]bool
	if len(revs) > 1 {
		seen = make(map[elemKey]bool, total)
	}
	t := unixOf(now)
	for _, r := range revs {
		l.Revisions = append(l.Revisions, r.ID)
		data, err := b.enforcedBlob(ctx, r.ID, r.Enforce, r.EnforceSHA256)
		if err != nil {
			return nil, err
		}
		for n := 1; len(data) > 0; n++ {
			var line []byte
			line, data = nextLine(data)
			x, err := parseEnforced(line)
			if err != nil {
				return nil, badLine(r.ID, "enforced list", n, err)
			}
			if !liveAt(x.exp, t) {
				continue
			}
			switch {
			case x.endpoint():
				if seen != nil {
					k := keyOf(x.el)
					if seen[k] {
						continue
					}
					seen[k] = true
				}
				l.Elements = append(l.Elements, x.el)
			case string(x.typ) == records.AllowDomain:
				l.Names = append(l.Names, string(x.value))
			}
		}
	}
	sort.Strings(l.Names)
	return l, nil
}

// Desired computes a lease's live allow list now from the heads of
// its chains.
func (b *Book) Desired(ctx context.Context, lease string, now time.Time) (*Live, error) {
	heads, err := b.heads(ctx, lease)
	if err != nil {
		return nil, err
	}
	return b.live(ctx, lease, heads, now)
}

func (b *Book) heads(ctx context.Context, lease string) ([]*revRef, error) {
	var out []*revRef
	for _, c := range b.ChainsOf(lease) {
		h, err := b.headRef(ctx, c)
		if err != nil {
			return nil, err
		}
		if h != nil {
			out = append(out, h)
		}
	}
	return out, nil
}

// revRef is what apply needs of a revision. The revision record itself
// holds the whole changeset (megabytes for 100,000 entries), so apply
// reads these instead: a copy of the head's, kept next to the head index
// and checked against it, and those of the revisions last applied.
type revRef struct {
	ID            string `json:"id"`
	Chain         string `json:"chain"`
	Previous      string `json:"previous,omitempty"`
	Enforce       string `json:"enforce"`
	EnforceSHA256 string `json:"enforce_sha256"`
	Delta         string `json:"delta,omitempty"`
	DeltaSHA256   string `json:"delta_sha256,omitempty"`
	Active        int    `json:"active"`
	// Endpoints counts the active endpoints; Expires is the earliest of
	// their expiries (Unix seconds, 0 when none expires).
	Endpoints int   `json:"endpoints"`
	Expires   int64 `json:"expires,omitempty"`
	// V is refVersion; a head ref of an older version is rebuilt.
	V int `json:"v"`
}

const refVersion = 2

// refOf is a revision's ref, with the counts of its enforced list.
func (b *Book) refOf(ctx context.Context, r *records.AllowRevision, enforced []byte) (*revRef, error) {
	ref := &revRef{ID: r.ID, Chain: r.Chain, Previous: r.Previous, Enforce: r.Enforce, EnforceSHA256: r.EnforceSHA256,
		Delta: r.EnforceDelta, DeltaSHA256: r.EnforceDeltaSHA256, Active: r.Active, V: refVersion}
	if enforced == nil {
		var err error
		if enforced, err = b.enforcedBlob(ctx, r.ID, r.Enforce, r.EnforceSHA256); err != nil {
			return nil, err
		}
	}
	var err error
	ref.Endpoints, ref.Expires, err = enforcedStats(enforced, r.ID)
	return ref, err
}

func (b *Book) headRefPath(c Chain) string { return b.St.Path("allow", "heads", c.indexKey()+".json") }

func (b *Book) writeHeadRef(c Chain, ref *revRef) error {
	data, err := json.Marshal(ref)
	if err != nil {
		return err
	}
	return writeFile(b.headRefPath(c), data)
}

// headRef is the head revision of a chain (nil when it has none).
func (b *Book) headRef(ctx context.Context, c Chain) (*revRef, error) {
	id, err := b.headID(c.Key())
	if err != nil || id == "" {
		return nil, err
	}
	if ref := b.writtenRef(c.Key(), id); ref != nil {
		return ref, nil
	}
	var ref revRef
	if data, err := os.ReadFile(b.headRefPath(c)); err == nil && json.Unmarshal(data, &ref) == nil && ref.ID == id && ref.V == refVersion {
		return &ref, nil
	}
	var r records.AllowRevision
	if err := b.St.Get(id, &r); err != nil {
		return nil, err
	}
	h, err := b.refOf(ctx, &r, nil)
	if err != nil {
		return nil, err
	}
	return h, b.writeHeadRef(c, h)
}

// appliedState is what the last apply left in a lease's sets: the
// endpoints of its revisions whose expiry was still to come at At, the
// time it compared expiries with (Elements of them). It is forgotten
// before each change is sent and written after the change succeeds, so
// that an apply cut short (a crash, an error) leaves none, and the next
// one reads the live set.
type appliedState struct {
	Revisions []*revRef `json:"revisions"`
	At        time.Time `json:"at"`
	Elements  int       `json:"elements"`
	// V is refVersion; a record of an older version is not trusted.
	V int `json:"v"`
}

// The record of the last apply is the first line of its file, which is
// overwritten in place rather than replaced: creating a file costs up to
// a millisecond here (ext4), a write a few microseconds. One write of a
// whole line either happens or not when the process dies, and a line
// that does not decode (a shorter one leaves the rest of a longer one
// after its newline) is no record. Nothing is synced: the kernel's sets
// do not outlive the machine, and no record only makes the next apply
// read the live set.
func (b *Book) appliedPath(lease string) string { return b.St.Path("allow", "applied", lease+".json") }

func (b *Book) readApplied(lease string) *appliedState {
	data, err := os.ReadFile(b.appliedPath(lease))
	if err != nil {
		return nil
	}
	i := bytes.IndexByte(data, '\n')
	if i < 0 {
		return nil
	}
	var a appliedState
	if json.Unmarshal(data[:i], &a) != nil || a.V != refVersion {
		return nil
	}
	return &a
}

func (b *Book) writeApplied(lease string, revs []*revRef, at time.Time, elements int) error {
	data, err := json.Marshal(appliedState{Revisions: revs, At: at, Elements: elements, V: refVersion})
	if err != nil {
		return err
	}
	p := b.appliedPath(lease)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o600)
	if errors.Is(err, os.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(p), 0o750); err == nil {
			f, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o600)
		}
	}
	if err != nil {
		return err
	}
	_, err = f.WriteAt(append(data, '\n'), 0)
	return errors.Join(err, f.Close())
}

// forgetApplied leaves an empty first line: no record.
func (b *Book) forgetApplied(lease string) error {
	f, err := os.OpenFile(b.appliedPath(lease), os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = f.WriteAt([]byte{'\n'}, 0)
	return errors.Join(err, f.Close())
}

// writeFile replaces a small file of tb-allow's own atomically.
func writeFile(p string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return err
	}
	return files.WriteAtomic(p, data, 0o600)
}

// Reconcile makes a lease's live set match its chains, reading the live
// set from the kernel: what "tb-allow apply" does.
func (b *Book) Reconcile(ctx context.Context, fw firewall.Firewall, lease string) (Applied, error) {
	unlock, err := b.St.Lock(ctx, "allow-apply-"+lease)
	if err != nil {
		return Applied{Lease: lease}, err
	}
	defer unlock()
	return b.reconcile(ctx, fw, lease)
}

func (b *Book) reconcile(ctx context.Context, fw firewall.Firewall, lease string) (Applied, error) {
	heads, err := b.heads(ctx, lease)
	if err != nil {
		return Applied{Lease: lease}, err
	}
	now := b.St.Now()
	l, err := b.live(ctx, lease, heads, now)
	if err != nil {
		return Applied{Lease: lease}, err
	}
	if err := b.forgetApplied(lease); err != nil {
		return Applied{Lease: lease}, err
	}
	res, err := ApplyLease(ctx, fw, l)
	if err == nil && res.Skipped == "" {
		err = b.writeApplied(lease, heads, now, len(l.Elements))
	}
	// Skipped: the lease's rules are gone; whatever applies them next
	// starts from its own set, so the next apply must read it.
	return res, err
}

// Update pushes the change from what was last applied to a lease to what
// its chains hold now, without reading the live set: the promote,
// rollback, approve, revoke and expire path. Without a record of the last
// apply it reconciles.
func (b *Book) Update(ctx context.Context, fw firewall.Firewall, lease string) (Applied, error) {
	// One apply of a lease at a time: the record of the last apply must
	// describe the kernel's set.
	unlock, err := b.St.Lock(ctx, "allow-apply-"+lease)
	if err != nil {
		return Applied{Lease: lease}, err
	}
	defer unlock()
	prev := b.readApplied(lease)
	if prev == nil {
		return b.reconcile(ctx, fw, lease)
	}
	now := b.St.Now()
	heads, err := b.heads(ctx, lease)
	if err != nil {
		return Applied{Lease: lease}, err
	}
	res := Applied{Lease: lease}
	for _, h := range heads {
		res.Revisions = append(res.Revisions, h.ID)
	}
	add, del, total, err := b.changeSince(ctx, lease, prev, heads, now)
	if err != nil {
		return b.reconcile(ctx, fw, lease)
	}
	res.Elements, res.Added, res.Deleted = total, len(add), len(del)
	if len(add)+len(del) == 0 {
		res.Unchanged = true
		if sameRevisions(prev.Revisions, heads) {
			// The record still describes the sets: nothing expired since.
			return res, nil
		}
		return res, b.writeApplied(lease, heads, now, total)
	}
	if err := b.forgetApplied(lease); err != nil {
		return res, err
	}
	if err := fw.ApplyAllowSet(ctx, lease, add, del); err != nil {
		if errors.Is(err, firewall.ErrNoLease) {
			res.Skipped = "the lease has no rules applied (tb-capture start applies them)"
			return res, nil
		}
		return res, err
	}
	return res, b.writeApplied(lease, heads, now, total)
}

func sameRevisions(a, b []*revRef) bool {
	return slices.EqualFunc(a, b, func(x, y *revRef) bool { return x.ID == y.ID })
}

// changeSince is the element change from what the last apply left in the
// sets to the current heads. When one chain changed and the others
// enforce nothing, it is the head's stored delta if the head follows the
// revision last applied and none of its endpoints has expired, else the
// merge of the two enforced lists; otherwise both sides are folded whole.
func (b *Book) changeSince(ctx context.Context, lease string, prev *appliedState, heads []*revRef, now time.Time) (add, del []firewall.Element, total int, err error) {
	oldBy := map[string]*revRef{}
	for _, r := range prev.Revisions {
		oldBy[r.Chain] = r
	}
	var changedOld, changedNew *revRef
	changed, others, expiring := 0, 0, false
	t, at := now.Unix(), unixOf(prev.At)
	for _, h := range heads {
		o := oldBy[h.Chain]
		delete(oldBy, h.Chain)
		if !liveAt(h.Expires, t) {
			expiring = true
		}
		if o != nil && o.ID == h.ID {
			if h.Endpoints > 0 {
				others++
			}
			continue
		}
		changed++
		changedOld, changedNew = o, h
	}
	switch {
	case len(oldBy) > 0:
	case changed == 0 && !expiring:
		// Nothing changed and nothing expired since.
		return nil, nil, prev.Elements, nil
	case changed == 1 && others == 0:
		h := changedNew
		follows := changedOld == nil && h.Previous == "" || changedOld != nil && h.Previous == changedOld.ID
		if h.Delta != "" && follows && !expiring {
			return b.deltaChange(ctx, h, at)
		}
		if changedOld != nil {
			return b.mergeDiff(ctx, changedOld, h, at, t)
		}
	}
	had, err := b.live(ctx, lease, prev.Revisions, prev.At)
	if err != nil {
		return nil, nil, 0, err
	}
	want, err := b.live(ctx, lease, heads, now)
	if err != nil {
		return nil, nil, 0, err
	}
	add, del = SetDiff(had.Elements, want.Elements)
	return add, del, len(want.Elements), nil
}

// pairs collects what the sets need, from the old and new lines of each
// endpoint (either absent): at is when the old lines were applied (which
// of them are in the sets), t is now.
type pairs struct {
	at, t    int64
	add, del []firewall.Element
	total    int
}

func (p *pairs) visit(old enforcedLine, hasOld bool, new enforcedLine, hasNew bool) {
	in := hasOld && liveAt(old.exp, p.at)
	want := hasNew && liveAt(new.exp, p.t)
	switch {
	case want:
		p.total++
		if !in || old.el.Verdict != new.el.Verdict {
			p.add = append(p.add, new.el) // a verdict change moves it
		}
	case in:
		p.del = append(p.del, old.el)
	}
}

// deltaChange reads a head's stored delta: its "+" lines are all wanted
// (none has expired), its "-" lines leave the sets unless they had
// expired when they were applied.
func (b *Book) deltaChange(ctx context.Context, h *revRef, at int64) (add, del []firewall.Element, total int, err error) {
	data, err := b.enforcedBlob(ctx, h.ID, h.Delta, h.DeltaSHA256)
	if err != nil {
		return nil, nil, 0, err
	}
	p := pairs{at: at, add: make([]firewall.Element, 0, bytes.Count(data, []byte("\n+"))+1)}
	var gone enforcedLine
	var goneKey []byte
	hasGone := false
	for n := 1; len(data) > 0; n++ {
		var l []byte
		l, data = nextLine(data)
		if len(l) < 2 || (l[0] != '-' && l[0] != '+') {
			return nil, nil, 0, badLine(h.ID, "enforced delta", n, errors.New("no - or +"))
		}
		x, err := parseEnforced(l[1:])
		if err != nil {
			return nil, nil, 0, badLine(h.ID, "enforced delta", n, err)
		}
		if !x.endpoint() {
			continue
		}
		// A changed line's "-" comes just before its "+".
		paired := hasGone && l[0] == '+' && bytes.Equal(goneKey, lineKey(l[1:]))
		if hasGone && !paired {
			p.visit(gone, true, enforcedLine{}, false)
		}
		hasGone = false
		switch {
		case l[0] == '-':
			gone, goneKey, hasGone = x, lineKey(l[1:]), true
		case paired:
			p.visit(gone, true, x, true)
		default:
			p.visit(enforcedLine{}, false, x, true)
		}
	}
	if hasGone {
		p.visit(gone, true, enforcedLine{}, false)
	}
	return p.add, p.del, h.Endpoints, nil
}

// mergeDiff is the change of the sets between two enforced lists of one
// chain, merged by walkEnforced; an unchanged line is parsed once.
func (b *Book) mergeDiff(ctx context.Context, from, to *revRef, at, t int64) (add, del []firewall.Element, total int, err error) {
	od, err := b.enforcedBlob(ctx, from.ID, from.Enforce, from.EnforceSHA256)
	if err != nil {
		return nil, nil, 0, err
	}
	nd, err := b.enforcedBlob(ctx, to.ID, to.Enforce, to.EnforceSHA256)
	if err != nil {
		return nil, nil, 0, err
	}
	p := pairs{at: at, t: t}
	parse := func(l []byte, rev string) (enforcedLine, bool, error) {
		if l == nil {
			return enforcedLine{}, false, nil
		}
		x, err := parseEnforced(l)
		if err != nil {
			return x, false, &TamperError{Revision: rev, Reason: fmt.Sprintf("enforced line %q: %v", l, err)}
		}
		return x, x.endpoint(), nil
	}
	err = walkEnforced(od, nd, func(o, n []byte) error {
		old, hasOld, err := parse(o, from.ID)
		if err != nil {
			return err
		}
		nw, hasNew := old, hasOld
		if n == nil || !bytes.Equal(o, n) {
			if nw, hasNew, err = parse(n, to.ID); err != nil {
				return err
			}
		}
		if hasOld || hasNew {
			p.visit(old, hasOld, nw, hasNew)
		}
		return nil
	})
	return p.add, p.del, p.total, err
}
