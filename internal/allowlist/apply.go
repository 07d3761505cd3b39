package allowlist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/dnsname"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Live is what a lease's allow list should be now: the firewall elements
// and DNS names of the active entries of its chains, and the revisions
// they come from.
type Live struct {
	Lease     string             `json:"lease"`
	Revisions []string           `json:"revisions"`
	Elements  []firewall.Element `json:"-"`
	Names     []string           `json:"names,omitempty"`
}

// ChainsOf are the chains whose entries apply to a lease: its own, its
// sample's (when the lease's plan names one) and the global one.
func (b *Book) ChainsOf(lease string) []Chain {
	cs := []Chain{{Scope: records.ScopeLease, Lease: lease}}
	if s := b.SampleOf(lease); s != "" {
		cs = append(cs, Chain{Scope: records.ScopeSample, Sample: s})
	}
	return append(cs, Chain{Scope: records.ScopeGlobal})
}

// SampleOf is the sample of a lease, from its plan ("" when unknown).
func (b *Book) SampleOf(lease string) string {
	var l records.Generic
	if records.CheckID(lease) != nil || b.St.Get(lease, &l) != nil {
		return ""
	}
	var planID string
	if raw, ok := l.Extra["plan"]; ok {
		_ = json.Unmarshal(raw, &planID)
	}
	var p records.Plan
	if planID == "" || records.CheckID(planID) != nil || b.St.Get(planID, &p) != nil {
		return ""
	}
	if p.SampleSHA256 != "" {
		return p.SampleSHA256
	}
	return p.Sample
}

// owned are the verdicts tb-allow manages in a lease's set; redirect and
// drop elements belong to the plan (tb-capture) and are left alone.
func owned(v firewall.Verdict) bool { return v == firewall.Forward || v == firewall.RateLimit }

// SetDiff is what turns the live set cur into want: the additions (new
// elements and verdict moves) and deletions of elements tb-allow owns.
func SetDiff(cur, want []firewall.Element) (add, del []firewall.Element) {
	have := make(map[elemKey]firewall.Verdict, len(cur))
	for _, e := range cur {
		have[keyOf(e)] = e.Verdict
	}
	wanted := make(map[elemKey]bool, len(want))
	for _, e := range want {
		k := keyOf(e)
		wanted[k] = true
		if v, ok := have[k]; !ok || v != e.Verdict {
			add = append(add, e)
		}
	}
	for _, e := range cur {
		if owned(e.Verdict) && !wanted[keyOf(e)] {
			del = append(del, e)
		}
	}
	return add, del
}

// Applied is what one apply did to one lease.
type Applied struct {
	Lease     string   `json:"lease"`
	Revisions []string `json:"revisions"`
	Elements  int      `json:"elements"`
	Added     int      `json:"added"`
	Deleted   int      `json:"deleted"`
	// Unchanged is true when the live set already matched.
	Unchanged bool   `json:"unchanged"`
	Skipped   string `json:"skipped,omitempty"`
	// Names are the names the lease's chains enforce. NamesNotEnforced
	// says why the lab's DNS sinkhole does not forward them when it
	// cannot (a lab without an upstream resolver): they stay sinkholed.
	Names            []string `json:"names,omitempty"`
	NamesNotEnforced string   `json:"names_not_enforced,omitempty"`
}

// ApplyLease makes a lease's live allow set match its chains in one
// atomic batch; nothing is sent when it already does.
func ApplyLease(ctx context.Context, fw firewall.Firewall, l *Live) (Applied, error) {
	out := Applied{Lease: l.Lease, Revisions: l.Revisions, Elements: len(l.Elements)}
	cur, err := fw.AllowSet(ctx, l.Lease)
	if errors.Is(err, firewall.ErrNoLease) {
		out.Skipped = "the lease has no rules applied (tb-capture start applies them)"
		return out, nil
	}
	if err != nil {
		return out, err
	}
	add, del := SetDiff(cur, l.Elements)
	out.Added, out.Deleted = len(add), len(del)
	if len(add)+len(del) == 0 {
		out.Unchanged = true
		return out, nil
	}
	return out, fw.ApplyAllowSet(ctx, l.Lease, add, del)
}

// LabNames is one lab's DNS forward list: the names enforced now for the
// leases that have rules in its firewall, leaving out those whose lease
// record is final (released, failed, expired), with each of those leases'
// names. Other labs' leases, and a fleet's other hosts, forward nothing
// here. A name that may not be forwarded (a revision written before names
// were checked) is left out and passed to warnf: it never fails the list.
func (b *Book) LabNames(ctx context.Context, fw firewall.Firewall, now time.Time, warnf func(string, ...any)) ([]string, map[string][]string, error) {
	leases, err := LeasesWithRules(ctx, fw)
	if err != nil {
		return nil, nil, err
	}
	set := map[string]bool{}
	byLease := map[string][]string{}
	for _, lease := range leases {
		var l records.SandboxLease
		if err := b.St.Get(lease, &l); err == nil && records.LeaseGone(l.State) {
			continue
		}
		names, err := b.LeaseNames(ctx, lease, now, warnf)
		if err != nil {
			return nil, nil, fmt.Errorf("lease %s: %w", lease, err)
		}
		if len(names) > 0 {
			byLease[lease] = names
		}
		for _, n := range names {
			set[n] = true
		}
	}
	return slices.Sorted(maps.Keys(set)), byLease, nil
}

// LeaseNames are the names enforced for one lease now, read from the
// enforced lists of its chains' heads, each checked by dnsname.
func (b *Book) LeaseNames(ctx context.Context, lease string, now time.Time, warnf func(string, ...any)) ([]string, error) {
	heads, err := b.heads(ctx, lease)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	t := now.Unix()
	for _, h := range heads {
		if h.Active == h.Endpoints {
			continue // no names
		}
		data, err := b.enforcedBlob(ctx, h.ID, h.Enforce, h.EnforceSHA256)
		if err != nil {
			return nil, err
		}
		for len(data) > 0 {
			var l []byte
			l, data = nextLine(data)
			x, err := parseEnforced(l)
			if err != nil || string(x.typ) != records.AllowDomain || !liveAt(x.exp, t) {
				continue
			}
			n, err := dnsname.Forwardable(string(x.value))
			if err != nil {
				warnf("revision %s: name left out of the DNS forward list: %v", h.ID, err)
				continue
			}
			set[n] = true
		}
	}
	return slices.Sorted(maps.Keys(set)), nil
}

// CurrentNames reads the names the lab's DNS sinkhole forwards now.
func CurrentNames(labDir string) ([]string, error) {
	b, err := os.ReadFile(netlab.AllowNamesFile(labDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "server=/")
		if !ok {
			continue
		}
		if name, _, ok := strings.Cut(rest, "/"); ok {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// ApplyNames updates the DNS sinkhole's forward list when it differs.
func ApplyNames(labDir string, names []string) (changed bool, err error) {
	cur, err := CurrentNames(labDir)
	if err != nil {
		return false, err
	}
	if strings.Join(cur, "\n") == strings.Join(names, "\n") {
		return false, nil
	}
	return true, netlab.SetAllowedNames(labDir, names)
}

// LeasesWithRules lists the leases that have rules in the firewall.
func LeasesWithRules(ctx context.Context, fw firewall.Firewall) ([]string, error) {
	s, err := fw.Status(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range s.Leases {
		// The firewall names leases by their lower-cased ULID.
		id := "lease_" + strings.ToUpper(l.Lease)
		if records.CheckID(id) == nil {
			out = append(out, id)
		}
	}
	return out, nil
}
