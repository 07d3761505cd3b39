package allowlist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/files"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// encodeEnforced is the compact list of a content's active entries, in key
// order, that apply reads instead of the whole content.
func encodeEnforced(es []*records.AllowEntry) []byte {
	var b bytes.Buffer
	for _, e := range es {
		if e.Status != records.StatusActive {
			continue
		}
		v := e.Verdict
		if v == "" {
			v = "-"
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
		b.Write(strconv.AppendInt(nil, exp, 10))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// elemKey is an element's identity, without formatting.
type elemKey struct {
	dst   netip.Addr
	proto string
	port  uint16
}

func keyOf(e firewall.Element) elemKey { return elemKey{e.Dst, e.Proto, e.Port} }

// live folds the enforced lists of revisions into a lease's live list;
// with now zero, expiry is ignored (what may be in the kernel). It reads
// the compact lines in place: apply of 100,000 entries parses 100,000 lines.
func (b *Book) live(lease string, revs []*revRef, now time.Time) (*Live, error) {
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
	deadline := int64(0)
	if !now.IsZero() {
		deadline = now.Unix()
	}
	for _, r := range revs {
		l.Revisions = append(l.Revisions, r.ID)
		data, err := b.blob(r.ID, r.Enforce, r.EnforceSHA256)
		if err != nil {
			return nil, err
		}
		for n := 1; len(data) > 0; n++ {
			line := data
			if i := bytes.IndexByte(data, '\n'); i >= 0 {
				line, data = data[:i], data[i+1:]
			} else {
				data = nil
			}
			typ, value, verdict, exp, ok := splitEnforced(line)
			if !ok {
				return nil, &TamperError{Revision: r.ID, Reason: fmt.Sprintf("enforced list line %d is malformed", n)}
			}
			if deadline != 0 && exp != 0 && exp <= deadline {
				continue
			}
			switch string(typ) {
			case records.AllowEndpoint:
				a, proto, port, err := ParseEndpoint(string(value))
				if err != nil {
					return nil, &TamperError{Revision: r.ID, Reason: err.Error()}
				}
				el := firewall.Element{Dst: a, Proto: proto, Port: port, Verdict: firewall.RateLimit}
				if string(verdict) != "-" {
					el.Verdict = firewall.Verdict(verdict)
				}
				if seen != nil {
					k := keyOf(el)
					if seen[k] {
						continue
					}
					seen[k] = true
				}
				l.Elements = append(l.Elements, el)
			case records.AllowDomain:
				l.Names = append(l.Names, string(value))
			}
		}
	}
	sort.Strings(l.Names)
	return l, nil
}

// splitEnforced splits "TYPE VALUE VERDICT EXPIRES" without allocating.
func splitEnforced(line []byte) (typ, value, verdict []byte, exp int64, ok bool) {
	var f [4][]byte
	n := 0
	for n < 4 && len(line) > 0 {
		i := bytes.IndexByte(line, ' ')
		if i < 0 {
			f[n], line = line, nil
		} else {
			f[n], line = line[:i], line[i+1:]
		}
		n++
	}
	if n != 4 || len(line) > 0 || len(f[3]) == 0 {
		return nil, nil, nil, 0, false
	}
	for _, c := range f[3] {
		if c < '0' || c > '9' {
			return nil, nil, nil, 0, false
		}
		exp = exp*10 + int64(c-'0')
	}
	return f[0], f[1], f[2], exp, true
}

// Desired computes a lease's live allow list now from the heads of its
// chains.
func (b *Book) Desired(lease string, now time.Time) (*Live, error) {
	heads, err := b.heads(lease)
	if err != nil {
		return nil, err
	}
	return b.live(lease, heads, now)
}

func (b *Book) heads(lease string) ([]*revRef, error) {
	var out []*revRef
	for _, c := range b.ChainsOf(lease) {
		h, err := b.headRef(c)
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
	Enforce       string `json:"enforce"`
	EnforceSHA256 string `json:"enforce_sha256"`
	Active        int    `json:"active"`
}

func refOf(r *records.AllowRevision) *revRef {
	return &revRef{ID: r.ID, Chain: r.Chain, Enforce: r.Enforce, EnforceSHA256: r.EnforceSHA256, Active: r.Active}
}

func (b *Book) headRefPath(c Chain) string { return b.St.Path("allow", "heads", c.indexKey()+".json") }

func (b *Book) writeHeadRef(c Chain, r *records.AllowRevision) error {
	data, err := json.Marshal(refOf(r))
	if err != nil {
		return err
	}
	return writeFile(b.headRefPath(c), data)
}

// headRef is the head revision of a chain (nil when it has none).
func (b *Book) headRef(c Chain) (*revRef, error) {
	id, err := b.St.Lookup(headIndex, c.indexKey())
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	var ref revRef
	if data, err := os.ReadFile(b.headRefPath(c)); err == nil && json.Unmarshal(data, &ref) == nil && ref.ID == id {
		return &ref, nil
	}
	var r records.AllowRevision
	if err := b.St.Get(id, &r); err != nil {
		return nil, err
	}
	return refOf(&r), b.writeHeadRef(c, &r)
}

// appliedState is what was last applied to a lease: the revisions whose
// enforced lists make up its live set.
type appliedState struct {
	Revisions []*revRef `json:"revisions"`
	At        time.Time `json:"at"`
}

func (b *Book) appliedPath(lease string) string { return b.St.Path("allow", "applied", lease+".json") }

func (b *Book) readApplied(lease string) *appliedState {
	data, err := os.ReadFile(b.appliedPath(lease))
	if err != nil {
		return nil
	}
	var a appliedState
	if json.Unmarshal(data, &a) != nil {
		return nil
	}
	return &a
}

func (b *Book) writeApplied(lease string, revs []*revRef) error {
	data, err := json.Marshal(appliedState{Revisions: revs, At: b.St.Now()})
	if err != nil {
		return err
	}
	return writeFile(b.appliedPath(lease), data)
}

func (b *Book) forgetApplied(lease string) error {
	err := os.Remove(b.appliedPath(lease))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
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
	heads, err := b.heads(lease)
	if err != nil {
		return Applied{Lease: lease}, err
	}
	l, err := b.live(lease, heads, b.St.Now())
	if err != nil {
		return Applied{Lease: lease}, err
	}
	res, err := ApplyLease(ctx, fw, l)
	switch {
	case err != nil:
	case res.Skipped != "":
		// The lease's rules are gone; whatever applies them next starts
		// from its own set, so the next apply must read it.
		err = b.forgetApplied(lease)
	default:
		err = b.writeApplied(lease, heads)
	}
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
	heads, err := b.heads(lease)
	if err != nil {
		return Applied{Lease: lease}, err
	}
	var ids []string
	for _, h := range heads {
		ids = append(ids, h.ID)
	}
	add, del, total, err := b.changeSince(lease, prev.Revisions, heads, now)
	if err != nil {
		return b.reconcile(ctx, fw, lease)
	}
	res := Applied{Lease: lease, Revisions: ids, Elements: total, Added: len(add), Deleted: len(del)}
	if len(add)+len(del) == 0 {
		res.Unchanged = true
	} else if err := fw.ApplyAllowSet(ctx, lease, add, del); err != nil {
		if errors.Is(err, firewall.ErrNoLease) {
			res.Skipped = "the lease has no rules applied (tb-capture start applies them)"
			return res, b.forgetApplied(lease)
		}
		return res, err
	}
	return res, b.writeApplied(lease, heads)
}

// changeSince is the element change from the revisions last applied to
// the current heads. When one chain changed and the others enforce
// nothing, the two sorted enforced lists are merged line by line, so that
// only the changed lines are parsed; otherwise both sides are folded whole.
func (b *Book) changeSince(lease string, old, heads []*revRef, now time.Time) (add, del []firewall.Element, total int, err error) {
	oldBy := map[string]*revRef{}
	for _, r := range old {
		oldBy[r.Chain] = r
	}
	var changedOld, changedNew *revRef
	changed, others := 0, 0
	for _, h := range heads {
		o := oldBy[h.Chain]
		delete(oldBy, h.Chain)
		if o != nil && o.ID == h.ID {
			if h.Active > 0 {
				others++
			}
			continue
		}
		changed++
		changedOld, changedNew = o, h
	}
	if changed == 1 && others == 0 && len(oldBy) == 0 && changedOld != nil {
		return b.mergeDiff(changedOld, changedNew, now)
	}
	had, err := b.live(lease, old, time.Time{})
	if err != nil {
		return nil, nil, 0, err
	}
	want, err := b.live(lease, heads, now)
	if err != nil {
		return nil, nil, 0, err
	}
	add, del = SetDiff(had.Elements, want.Elements)
	return add, del, len(want.Elements), nil
}

// mergeDiff walks two enforced lists of one chain (both in key order) and
// parses only the lines that differ, or that have expired.
func (b *Book) mergeDiff(from, to *revRef, now time.Time) (add, del []firewall.Element, total int, err error) {
	od, err := b.blob(from.ID, from.Enforce, from.EnforceSHA256)
	if err != nil {
		return nil, nil, 0, err
	}
	nd, err := b.blob(to.ID, to.Enforce, to.EnforceSHA256)
	if err != nil {
		return nil, nil, 0, err
	}
	next := func(d []byte) (line, rest []byte) {
		if i := bytes.IndexByte(d, '\n'); i >= 0 {
			return d[:i], d[i+1:]
		}
		return d, nil
	}
	// key is the line without its expiry; expired reads the expiry.
	key := func(l []byte) []byte { return l[:max(bytes.LastIndexByte(l, ' '), 0)] }
	deadline := now.Unix()
	expired := func(l []byte) bool {
		var e int64
		for _, c := range l[bytes.LastIndexByte(l, ' ')+1:] {
			e = e*10 + int64(c-'0')
		}
		return e != 0 && e <= deadline
	}
	endpoint := []byte(records.AllowEndpoint + " ")
	elem := func(l []byte, rev string) (firewall.Element, bool, error) {
		typ, value, verdict, _, ok := splitEnforced(l)
		if !ok {
			return firewall.Element{}, false, &TamperError{Revision: rev, Reason: fmt.Sprintf("enforced line %q is malformed", l)}
		}
		if string(typ) != records.AllowEndpoint {
			return firewall.Element{}, false, nil
		}
		a, proto, port, err := ParseEndpoint(string(value))
		if err != nil {
			return firewall.Element{}, false, &TamperError{Revision: rev, Reason: err.Error()}
		}
		v := firewall.RateLimit
		if string(verdict) != "-" {
			v = firewall.Verdict(verdict)
		}
		return firewall.Element{Dst: a, Proto: proto, Port: port, Verdict: v}, true, nil
	}
	var ol, nl []byte
	ol, od = next(od)
	nl, nd = next(nd)
	for len(ol) > 0 || len(nl) > 0 {
		var c int
		switch {
		case len(ol) == 0:
			c = 1
		case len(nl) == 0:
			c = -1
		default:
			c = bytes.Compare(key(ol), key(nl))
			if c == 0 && !bytes.Equal(ol, nl) {
				c = 2 // same element, new expiry
			}
		}
		switch c {
		case 0, 2:
			switch {
			case !bytes.HasPrefix(nl, endpoint):
			case expired(nl):
				e, _, err := elem(nl, to.ID)
				if err != nil {
					return nil, nil, 0, err
				}
				del = append(del, e)
			default:
				total++
			}
			ol, od = next(od)
			nl, nd = next(nd)
		case -1: // gone
			e, ok, err := elem(ol, from.ID)
			if err != nil {
				return nil, nil, 0, err
			}
			if ok {
				del = append(del, e)
			}
			ol, od = next(od)
		case 1: // new
			e, ok, err := elem(nl, to.ID)
			if err != nil {
				return nil, nil, 0, err
			}
			if ok && !expired(nl) {
				add = append(add, e)
				total++
			}
			nl, nd = next(nd)
		}
	}
	// A verdict change is a deletion and an addition of one element: the
	// addition moves it.
	moved := map[elemKey]bool{}
	for _, e := range add {
		moved[keyOf(e)] = true
	}
	kept := del[:0]
	for _, e := range del {
		if !moved[keyOf(e)] {
			kept = append(kept, e)
		}
	}
	return add, kept, total, nil
}

func isNotFound(err error) bool { return errors.Is(err, state.ErrNotFound) }
