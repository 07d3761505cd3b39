package allowlist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	endpt "github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

func testBook(t *testing.T, now *time.Time) *Book {
	t.Helper()
	st, err := state.Open(context.Background(), t.TempDir(), state.WithDurability(state.SyncOnFlush),
		state.WithClock(func() time.Time { return *now }))
	if err != nil {
		t.Fatal(err)
	}
	return &Book{St: st}
}

// promotion is a beacon to one endpoint, whose far side answered as a C2
// in an earlier cycle that let it through, a name that needs approval and its
// endpoint.
func promotion(t *testing.T, now time.Time) Promotion {
	pol := DefaultPolicy()
	pol.compile()
	t0 := pcapgen.Start
	const earlier = "cycle_01JCZZZZZZZZZZZZZZZZZZZZZZ"
	var obs []*records.Observable
	obs = append(obs, obsDomain("raw.githubusercontent.com", t0, "185.199.108.133"))
	c2 := obsEndpoint("91.92.240.11", 8443, 6, t0, t0.Add(5*time.Minute))
	c2.Cycle, c2.Endpoint.RespBytes = earlier, 1800
	c2.Endpoint.AnsweredIn, c2.Endpoint.SpokeIn, c2.Endpoint.ConfirmedIn = []string{earlier}, []string{earlier}, []string{earlier}
	obs = append(obs, obsEndpoint("185.199.108.133", 443, 6, t0, t0.Add(25*time.Minute)), c2)
	return Promotion{Chain: Chain{Scope: records.ScopeLease, Lease: testLease}, Cycle: "cycle_01JD0000000000000000000000",
		Dests: Classify(obs, &pol), Policy: &pol, Validator: pubValidator(), Now: now,
		InForce: map[string]map[string]bool{earlier: {"endpoint 91.92.240.11:8443/tcp": true}}}
}

func statuses(es []*records.AllowEntry) map[string]string {
	m := map[string]string{}
	for _, e := range es {
		m[EntryKey(e)] = e.Status
	}
	return m
}

// TestRevisionChain: promote, idempotence, approve, diff, rollback,
// expiry, and a chain that verifies.
func TestRevisionChain(t *testing.T) {
	ctx := context.Background()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	p := promotion(t, now)
	c := p.Chain

	r1, created, err := b.Promote(ctx, p)
	if err != nil || !created || r1.Seq != 1 || r1.PrevHash != "" {
		t.Fatalf("first promote: %+v %v %v", r1, created, err)
	}
	_, e1, _ := b.Revision(ctx, r1.ID)
	want := map[string]string{
		"endpoint 91.92.240.11:8443/tcp":   records.StatusActive,
		"endpoint 185.199.108.133:443/tcp": records.StatusPending,
		"domain raw.githubusercontent.com": records.StatusPending,
	}
	if got := statuses(e1); len(got) != 3 || got["endpoint 91.92.240.11:8443/tcp"] != records.StatusActive ||
		got["domain raw.githubusercontent.com"] != records.StatusPending {
		t.Fatalf("entries: %v, want %v", got, want)
	}
	if len(r1.Changes.Added) != 3 || r1.Active != 1 {
		t.Fatalf("changeset: %+v", r1.Changes)
	}

	// The same observables again: no new revision.
	now = now.Add(time.Minute)
	p.Now = now
	again, created, err := b.Promote(ctx, p)
	if err != nil || created || again.ID != r1.ID {
		t.Fatalf("second promote: %s %v %v", again.ID, created, err)
	}

	// Approve the name: a new revision changing one entry.
	now = now.Add(time.Minute)
	r2, created, err := b.Change(ctx, c, "approve", func(es []*records.AllowEntry) error {
		for _, e := range es {
			if e.Value == "raw.githubusercontent.com" {
				exp := now.Add(24 * time.Hour)
				return changeOne(e, "approve", "checked by hand", &exp)
			}
		}
		return errors.New("entry not found")
	})
	if err != nil || !created || r2.Previous != r1.ID || r2.PrevHash != Hash(r1) || r2.Seq != 2 {
		t.Fatalf("approve: %+v %v", r2, err)
	}
	cs := r2.Changes
	if len(cs.Changed) != 1 || cs.Changed[0].Key != "domain raw.githubusercontent.com" || cs.Changed[0].From != records.StatusPending ||
		cs.Changed[0].To != records.StatusActive || len(cs.Added)+len(cs.Removed) != 0 {
		t.Fatalf("approve changeset: %+v", cs)
	}
	if _, stored, err := b.FindEntry(ctx, cs.Changed[0].Entry); err != nil || stored.Status != records.StatusActive || stored.Revision != r2.ID || stored.Note != "checked by hand" {
		t.Fatalf("entry after approve: %+v %v", stored, err)
	}

	// Rollback to r1: a new revision with r1's content.
	now = now.Add(time.Minute)
	r3, created, err := b.Rollback(ctx, r1.ID)
	if err != nil || !created || r3.RollbackOf != r1.ID || r3.Seq != 3 || r3.Previous != r2.ID {
		t.Fatalf("rollback: %+v %v", r3, err)
	}
	_, e3, _ := b.Revision(ctx, r3.ID)
	if got := statuses(e3); got["domain raw.githubusercontent.com"] != records.StatusPending {
		t.Fatalf("after rollback: %v", got)
	}
	if d := Diff(e1, e3); !Empty(d) {
		t.Fatalf("rollback content differs from r1: %+v", d)
	}
	if d := Diff(e3, mustContent(t, b, r2.ID)); len(d.Changed) != 1 {
		t.Fatalf("diff r3 r2: %+v", d)
	}
	// Rolling back to the current content changes nothing.
	if same, created, err := b.Rollback(ctx, r1.ID); err != nil || created || same.ID != r3.ID {
		t.Fatalf("second rollback: %v %v", created, err)
	}

	// Expiry: past the TTL, the live set is empty even before "expire"
	// marks the entries; then expire writes a revision.
	live, err := b.Desired(ctx, testLease, now)
	if err != nil || len(live.Elements) != 1 {
		t.Fatalf("live before expiry: %+v %v", live, err)
	}
	later := now.Add(25 * time.Hour)
	if live, _ := b.Desired(ctx, testLease, later); len(live.Elements) != 0 || len(live.Names) != 0 {
		t.Fatalf("live after the TTL: %+v", live)
	}
	now = later
	r4, created, err := b.Change(ctx, c, "expire", Expired(later))
	if err != nil || !created {
		t.Fatalf("expire: %v %v", created, err)
	}
	_, e4, _ := b.Revision(ctx, r4.ID)
	for k, s := range statuses(e4) {
		if s != records.StatusExpired {
			t.Errorf("%s: %s after expire", k, s)
		}
	}
	// Fresh evidence re-activates an expired entry; the same old evidence
	// does not.
	p.Now = now
	if _, created, _ := b.Promote(ctx, p); created {
		t.Fatal("old evidence re-activated expired entries")
	}
	revs, err := b.Verify(ctx, c)
	if err != nil || len(revs) != 4 {
		t.Fatalf("verify: %d revisions, %v", len(revs), err)
	}
}

func mustContent(t *testing.T, b *Book, id string) []*records.AllowEntry {
	t.Helper()
	ctx := t.Context()
	_, es, err := b.Revision(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// TestTamperDetection edits revisions and contents behind the tool's back:
// verify names the revision that no longer holds.
func TestTamperDetection(t *testing.T) {
	ctx := context.Background()
	now := pcapgen.Start.Add(time.Hour)
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, b *Book, revs []*records.AllowRevision)
		bad    int // index of the revision named
		reason string
	}{
		{"field edited", func(t *testing.T, b *Book, revs []*records.AllowRevision) {
			editRecord(t, b, revs[1].ID, `"cause":"approve"`, `"cause":"promote"`)
		}, 1, "do not match its hash"},
		{"field edited and own hash recomputed", func(t *testing.T, b *Book, revs []*records.AllowRevision) {
			r := *revs[1]
			r.Cycle = "cycle_01JDZZZZZZZZZZZZZZZZZZZZZZ"
			editRecord(t, b, r.ID, `"hash":"`+r.Hash+`"`, `"hash":"`+Hash(&r)+`"`)
			editRecord(t, b, r.ID, `"cause":"approve"`, `"cause":"approve","cycle":"`+r.Cycle+`"`)
		}, 1, "is not the one revision"},
		{"content replaced", func(t *testing.T, b *Book, revs []*records.AllowRevision) {
			p := b.St.BlobPath(revs[0].ContentSHA256)
			os.Chmod(p, 0o644)
			data, _ := os.ReadFile(p)
			if err := os.WriteFile(p, []byte(strings.Replace(string(data), `"status":"pending-approval"`, `"status":"active"`, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
		}, 0, "does not match its digest"},
		{"enforced delta swapped", func(t *testing.T, b *Book, revs []*records.AllowRevision) {
			editRecord(t, b, revs[2].ID, `"enforce_delta":"`+revs[2].EnforceDelta+`"`, `"enforce_delta":"`+revs[0].EnforceDelta+`"`)
			editRecord(t, b, revs[2].ID, `"enforce_delta_sha256":"`+revs[2].EnforceDeltaSHA256+`"`, `"enforce_delta_sha256":"`+revs[0].EnforceDeltaSHA256+`"`)
		}, 2, "do not match its hash"},
		{"enforced delta swapped, own hash recomputed", func(t *testing.T, b *Book, revs []*records.AllowRevision) {
			r := *revs[2]
			r.EnforceDelta, r.EnforceDeltaSHA256 = revs[0].EnforceDelta, revs[0].EnforceDeltaSHA256
			editRecord(t, b, r.ID, `"enforce_delta":"`+revs[2].EnforceDelta+`"`, `"enforce_delta":"`+r.EnforceDelta+`"`)
			editRecord(t, b, r.ID, `"enforce_delta_sha256":"`+revs[2].EnforceDeltaSHA256+`"`, `"enforce_delta_sha256":"`+r.EnforceDeltaSHA256+`"`)
			editRecord(t, b, r.ID, `"hash":"`+r.Hash+`"`, `"hash":"`+Hash(&r)+`"`)
		}, 2, "enforced delta does not match"},
		{"revision deleted", func(t *testing.T, b *Book, revs []*records.AllowRevision) {
			os.Remove(filepath.Join(b.St.Root(), "records", "revision", revs[1].ID+".json"))
		}, 2, "is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := testBook(t, &now)
			p := promotion(t, now)
			if _, _, err := b.Promote(ctx, p); err != nil {
				t.Fatal(err)
			}
			if _, _, err := b.Change(ctx, p.Chain, "approve", func(es []*records.AllowEntry) error {
				for _, e := range es {
					if e.Status == records.StatusPending {
						e.Status = records.StatusActive
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if _, _, err := b.Change(ctx, p.Chain, "revoke", func(es []*records.AllowEntry) error {
				es[0].Status = records.StatusRevoked
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			revs, err := b.Verify(ctx, p.Chain)
			if err != nil || len(revs) != 3 {
				t.Fatalf("before tampering: %v", err)
			}
			tc.tamper(t, b, revs)
			_, err = b.Verify(ctx, p.Chain)
			var te *TamperError
			if !errors.As(err, &te) || te.Revision != revs[tc.bad].ID || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("got %v, want a TamperError naming %s with %q", err, revs[tc.bad].ID, tc.reason)
			}
		})
	}
}

func editRecord(t *testing.T, b *Book, id, old, new string) {
	t.Helper()
	p := filepath.Join(b.St.Root(), "records", records.KindOf(id), id+".json")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		t.Fatalf("%s has no %s: %s", id, old, data)
	}
	if err := os.WriteFile(p, []byte(strings.Replace(string(data), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeFW is the firewall boundary in memory; the real one is covered by
// the live test.
type fakeFW struct {
	firewall.Firewall
	set     map[string]firewall.Element
	batches int
	// reads counts AllowSet calls; lostAck makes the next change fail
	// after it is made.
	reads   int
	lostAck bool
}

func (f *fakeFW) AllowSet(ctx context.Context, lease string) ([]firewall.Element, error) {
	f.reads++
	var out []firewall.Element
	for _, e := range f.set {
		out = append(out, e)
	}
	return out, nil
}

func (f *fakeFW) ApplyAllowSet(ctx context.Context, lease string, add, del []firewall.Element) error {
	f.batches++
	for _, e := range del {
		delete(f.set, e.Key())
	}
	for _, e := range add {
		f.set[e.Key()] = e
	}
	if f.lostAck {
		// The kernel committed; the answer never came back.
		f.lostAck = false
		return errors.New("netlink receive: interrupted")
	}
	return nil
}

// TestApplyIdempotent: applying twice sends one batch; elements of the
// plan's own verdicts (redirect, drop) are left alone; a rollback deletes.
func TestApplyIdempotent(t *testing.T) {
	ctx := context.Background()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	pinned, _ := firewall.ParseElement("45.9.9.9:80/tcp=drop")
	fw := &fakeFW{set: map[string]firewall.Element{pinned.Key(): pinned}}
	live, _ := b.Desired(ctx, testLease, now)
	if res, err := ApplyLease(ctx, fw, live); err != nil || !res.Unchanged || fw.batches != 0 {
		t.Fatalf("empty apply: %+v %v", res, err)
	}
	p := promotion(t, now)
	r1, _, err := b.Promote(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	live, _ = b.Desired(ctx, testLease, now)
	res, err := ApplyLease(ctx, fw, live)
	if err != nil || res.Added != 1 || res.Deleted != 0 || fw.batches != 1 {
		t.Fatalf("apply: %+v %v", res, err)
	}
	if res, err := ApplyLease(ctx, fw, live); err != nil || !res.Unchanged || fw.batches != 1 {
		t.Fatalf("second apply: %+v %v", res, err)
	}
	if _, ok := fw.set["91.92.240.11/tcp/8443"]; !ok || fw.set[pinned.Key()].Verdict != firewall.Drop {
		t.Fatalf("live set: %v", fw.set)
	}
	if _, _, err := b.Change(ctx, p.Chain, "revoke", func(es []*records.AllowEntry) error {
		for _, e := range es {
			if e.Status == records.StatusActive {
				e.Status = records.StatusRevoked
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	live, _ = b.Desired(ctx, testLease, now)
	if res, err := ApplyLease(ctx, fw, live); err != nil || res.Deleted != 1 || len(fw.set) != 1 {
		t.Fatalf("after revoke: %+v %v %v", res, err, fw.set)
	}
	if _, _, err := b.Rollback(ctx, r1.ID); err != nil {
		t.Fatal(err)
	}
	live, _ = b.Desired(ctx, testLease, now)
	if res, err := ApplyLease(ctx, fw, live); err != nil || res.Added != 1 || len(fw.set) != 2 {
		t.Fatalf("after rollback: %+v %v %v", res, err, fw.set)
	}
}

// TestUpdateIncremental: the promote path sends only the change since the
// last apply: a verdict move, an expiry, a deletion.
func TestUpdateIncremental(t *testing.T) {
	ctx := context.Background()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	fw := &fakeFW{set: map[string]firewall.Element{}}
	p := promotion(t, now)
	if _, _, err := b.Promote(ctx, p); err != nil {
		t.Fatal(err)
	}
	if res, err := b.Update(ctx, fw, testLease); err != nil || res.Added != 1 || fw.batches != 1 {
		t.Fatalf("first update (reconciles): %+v %v", res, err)
	}
	// Approve the pending pair and move the beacon to forward.
	if _, _, err := b.Change(ctx, p.Chain, "approve", func(es []*records.AllowEntry) error {
		for _, e := range es {
			e.Status = records.StatusActive
			if e.Value == "91.92.240.11:8443/tcp" {
				e.Verdict = string(firewall.Forward)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	res, err := b.Update(ctx, fw, testLease)
	if err != nil || res.Added != 2 || res.Deleted != 0 || res.Elements != 2 {
		t.Fatalf("update after approve: %+v %v", res, err)
	}
	if fw.set["91.92.240.11/tcp/8443"].Verdict != firewall.Forward || len(fw.set) != 2 {
		t.Fatalf("live set: %v", fw.set)
	}
	if res, err := b.Update(ctx, fw, testLease); err != nil || !res.Unchanged {
		t.Fatalf("update again: %+v %v", res, err)
	}
	// Past the TTL the entries leave the live set before "expire" runs.
	now = now.Add(48 * time.Hour)
	if _, _, err := b.Change(ctx, p.Chain, "revoke", func(es []*records.AllowEntry) error {
		for _, e := range es {
			if e.Type == records.AllowDomain {
				e.Status = records.StatusRevoked
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if res, err := b.Update(ctx, fw, testLease); err != nil || res.Deleted != 2 || len(fw.set) != 0 {
		t.Fatalf("update after expiry: %+v %v %v", res, err, fw.set)
	}
}

// TestScopes: a lease's live list is its own chain, its sample's (found
// through its plan) and the global one.
func TestScopes(t *testing.T) {
	ctx := context.Background()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	sha := strings.Repeat("ab", 32)
	plan := &records.Plan{Sample: "sample_01JD0000000000000000000001", SampleSHA256: sha}
	records.Init(plan, records.KindPlan, now)
	if err := b.St.Create(ctx, plan); err != nil {
		t.Fatal(err)
	}
	lease := &records.Generic{}
	lease.Kind, lease.ID, lease.V = "lease", testLease, 1
	lease.Extra = map[string]json.RawMessage{"plan": json.RawMessage(`"` + plan.ID + `"`)}
	if err := b.St.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if got := b.SampleOf(testLease); got != sha {
		t.Fatalf("sample of the lease: %q", got)
	}
	other := "lease_01JD0000000000000000000009"
	for _, c := range []Chain{{Scope: records.ScopeSample, Sample: sha}, {Scope: records.ScopeGlobal}} {
		p := promotion(t, now)
		p.Chain = c
		if _, created, err := b.Promote(ctx, p); err != nil || !created {
			t.Fatalf("%s: %v %v", c.Key(), created, err)
		}
		if c.Scope == records.ScopeSample {
			if l, _ := b.Desired(ctx, testLease, now); len(l.Elements) != 1 || len(l.Revisions) != 1 {
				t.Fatalf("lease of the sample: %+v", l)
			}
			if l, _ := b.Desired(ctx, other, now); len(l.Elements) != 0 {
				t.Fatalf("another lease got the sample's entries: %+v", l)
			}
		}
	}
	if l, _ := b.Desired(ctx, other, now); len(l.Elements) != 1 || len(l.Revisions) != 1 {
		t.Fatalf("global entries on another lease: %+v", l)
	}
	if l, _ := b.Desired(ctx, testLease, now); len(l.Elements) != 1 || len(l.Revisions) != 2 {
		t.Fatalf("the lease's chains: %+v", l)
	}
}

// TestPromoteFromState reads a lease's observables of one cycle from the
// state, as "tb-allow promote --lease L --cycle C" does.
func TestPromoteFromState(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := state.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t0 := pcapgen.Start
	cycle, other := "cycle_01JD0000000000000000000001", "cycle_01JD0000000000000000000002"
	starts := every(t0, 6, time.Minute)
	o := obsConns("91.92.240.11", 8443, "tcp", "established", 1, starts...)
	o.Cycle, o.Cycles = cycle, []string{cycle}
	// The same beacon elsewhere: another cycle, another lease.
	o2 := obsConns("37.120.10.5", 443, "tcp", "established", 1, starts...)
	o2.Cycle = other
	o3 := obsConns("5.188.86.3", 443, "tcp", "established", 1, starts...)
	o3.Lease, o3.Cycle = "lease_01JD0000000000000000000009", cycle
	for _, x := range []*records.Observable{o, o2, o3} {
		records.Init(x, records.KindObservable, t0)
		if err := st.Create(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	var out, errb bytes.Buffer
	pol, err := LoadPolicy("")
	if err != nil {
		t.Fatal(err)
	}
	err = Promote(ctx, &Book{St: st}, PromoteRequest{Input: Input{Lease: testLease, Cycle: cycle}, Scope: records.ScopeLease, Policy: pol, NoApply: true},
		cmdout.New("tb-allow", &out, &errb, slog.New(slog.NewTextHandler(&errb, nil))))
	if err != nil {
		t.Fatalf("%v: %s", err, errb.String())
	}
	var rev records.AllowRevision
	if err := records.Unmarshal(bytes.TrimSpace(out.Bytes()), &rev); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if rev.Cycle != cycle || len(rev.Changes.Added) != 1 || rev.Changes.Added[0].Key != "endpoint 91.92.240.11:8443/tcp" {
		t.Fatalf("revision: %+v", rev)
	}
}

// activeEndpoint is an active endpoint entry of the test lease's chain.
func activeEndpoint(i int, verdict firewall.Verdict, expires time.Time) *records.AllowEntry {
	a := netip.AddrFrom4([4]byte{45, 1, byte(i >> 8), byte(i)})
	return &records.AllowEntry{Type: records.AllowEndpoint, Value: netip.AddrPortFrom(a, 443).String() + "/tcp",
		Scope: records.ScopeLease, Lease: testLease, Status: records.StatusActive, Class: ClassC2, Score: 1,
		Verdict: string(verdict), ExpiresAt: &expires}
}

// writeContent writes the next revision of a chain with the given
// content (copied).
func writeContent(t *testing.T, b *Book, c Chain, es []*records.AllowEntry) *records.AllowRevision {
	t.Helper()
	ctx := t.Context()
	head, cur, err := b.Head(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	cp := make([]*records.AllowEntry, len(es))
	for i, e := range es {
		x := *e
		cp[i] = &x
	}
	r, _, err := b.Write(context.Background(), Commit{Chain: c, Cause: "test"}, head, cur, cp)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkSet compares the fake's elements of tb-allow's verdicts with what
// the lease's chains enforce now.
func checkSet(t *testing.T, b *Book, fw *fakeFW, now time.Time, what string) {
	t.Helper()
	ctx := t.Context()
	live, err := b.Desired(ctx, testLease, now)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]firewall.Element{}
	for _, e := range live.Elements {
		want[e.Key()] = e
	}
	got := map[string]firewall.Element{}
	for k, e := range fw.set {
		if e.Verdict == firewall.Forward || e.Verdict == firewall.RateLimit {
			got[k] = e
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d elements in the set, %d enforced", what, len(got), len(want))
	}
	for k, e := range want {
		if got[k] != e {
			t.Fatalf("%s: %s is %v in the set, want %v", what, k, got[k], e)
		}
	}
}

// TestUpdateMatchesChains: whatever the history (entries added, removed,
// moved to another verdict, revoked, renewed, expiring; updates skipped,
// a global chain changing too, applies cut short after the kernel
// changed), the promote path leaves the set holding exactly what the
// chains enforce, and a plan's own element alone.
func TestUpdateMatchesChains(t *testing.T) {
	ctx := context.Background()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	pinned, _ := firewall.ParseElement("46.9.9.9:80/tcp=drop")
	fw := &fakeFW{set: map[string]firewall.Element{pinned.Key(): pinned}}
	lease, global := Chain{Scope: records.ScopeLease, Lease: testLease}, Chain{Scope: records.ScopeGlobal}
	r := rand.New(rand.NewPCG(7, 7))
	contents := map[Chain][]*records.AllowEntry{}
	verdicts := []firewall.Verdict{firewall.RateLimit, firewall.Forward}
	// The lease's chain alone for 150 steps, then the global one too.
	for step := 0; step < 250; step++ {
		c := lease
		if step >= 150 && r.IntN(3) == 0 {
			c = global
		}
		es := contents[c]
		next := make([]*records.AllowEntry, 0, len(es)+3)
		for _, e := range es {
			x := *e
			switch r.IntN(4 * len(es)) {
			case 0:
				continue // removed
			case 1:
				x.Verdict = string(verdicts[r.IntN(2)])
			case 2:
				x.Status = records.StatusRevoked
			case 3:
				x.Status = records.StatusActive
				exp := now.Add(time.Duration(1+r.IntN(5)) * time.Hour)
				x.ExpiresAt = &exp // renewed, maybe after it expired
			default:
				if x.Status == records.StatusActive && !x.ExpiresAt.After(now) && r.IntN(2) == 0 {
					x.Status = records.StatusExpired // tb-allow expire ran
				}
			}
			next = append(next, &x)
		}
		for k := r.IntN(3); k > 0; k-- {
			e := activeEndpoint(r.IntN(200), verdicts[r.IntN(2)], now.Add(time.Duration(1+r.IntN(5))*time.Hour))
			if !slices.ContainsFunc(next, func(x *records.AllowEntry) bool { return x.Value == e.Value }) {
				next = append(next, e)
			}
		}
		sortEntries(next)
		contents[c] = next
		writeContent(t, b, c, next)
		if r.IntN(10) == 0 {
			now = now.Add(time.Duration(r.IntN(60)) * time.Minute)
		}
		switch r.IntN(8) {
		case 0: // no apply: the next one spans several revisions
			continue
		case 1:
			fw.lostAck = true
			before := fw.batches
			if _, err := b.Update(ctx, fw, testLease); (err == nil) != (fw.batches == before) {
				t.Fatalf("step %d: %d changes sent, error %v", step, fw.batches-before, err)
			}
			fw.lostAck = false
			continue
		}
		if _, err := b.Update(ctx, fw, testLease); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		checkSet(t, b, fw, now, fmt.Sprintf("step %d", step))
		if fw.set[pinned.Key()] != pinned {
			t.Fatalf("step %d: the plan's element went: %v", step, fw.set)
		}
	}
}

// updateTest is the start of a test of Update: a Book whose clock stands
// an hour into the test capture, an empty fake firewall, the test lease's
// chain and an expiry a day later.
func updateTest(t *testing.T) (*Book, *fakeFW, Chain, time.Time) {
	now := pcapgen.Start.Add(time.Hour)
	return testBook(t, &now), &fakeFW{set: map[string]firewall.Element{}}, Chain{Scope: records.ScopeLease, Lease: testLease}, now.Add(24 * time.Hour)
}

// TestUpdateReadsOnlyTheDelta: a one-entry promote after an apply is
// pushed from the new revision's delta alone, without reading either
// enforced list or the live set.
func TestUpdateReadsOnlyTheDelta(t *testing.T) {
	ctx := context.Background()
	b, fw, c, exp := updateTest(t)
	var es []*records.AllowEntry
	for i := 0; i < 50; i++ {
		es = append(es, activeEndpoint(i, firewall.RateLimit, exp))
	}
	r1 := writeContent(t, b, c, es)
	if res, err := b.Update(ctx, fw, testLease); err != nil || res.Added != 50 || fw.reads != 1 {
		t.Fatalf("first update (reconciles): %+v %v, %d reads", res, err, fw.reads)
	}
	es = append(es[1:], activeEndpoint(50, firewall.Forward, exp))
	r2 := writeContent(t, b, c, es)
	for _, sha := range []string{r1.EnforceSHA256, r2.EnforceSHA256} {
		if err := os.Remove(b.St.BlobPath(sha)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := b.Update(ctx, fw, testLease)
	if err != nil || res.Added != 1 || res.Deleted != 1 || res.Elements != 50 || fw.reads != 1 {
		t.Fatalf("update: %+v %v, %d reads", res, err, fw.reads)
	}
	if len(fw.set) != 50 || fw.set["45.1.0.50/tcp/443"].Verdict != firewall.Forward {
		t.Fatalf("set: %v", fw.set)
	}
}

// TestUpdateTakesWhatWriteWrote: the apply after a write in the same
// process takes the head's ref, enforced list and delta as written: with
// all three gone from the disk it still pushes the change, where a Book
// of another process (which reads them back) cannot.
func TestUpdateTakesWhatWriteWrote(t *testing.T) {
	ctx := context.Background()
	b, fw, c, exp := updateTest(t)
	es := []*records.AllowEntry{activeEndpoint(1, firewall.RateLimit, exp), activeEndpoint(2, firewall.RateLimit, exp)}
	writeContent(t, b, c, es)
	if _, err := b.Update(ctx, fw, testLease); err != nil {
		t.Fatal(err)
	}
	r2 := writeContent(t, b, c, append(es[1:], activeEndpoint(3, firewall.Forward, exp)))
	for _, p := range []string{b.St.BlobPath(r2.EnforceSHA256), b.St.BlobPath(r2.EnforceDeltaSHA256), b.headRefPath(c)} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := (&Book{St: b.St}).Update(ctx, &fakeFW{set: map[string]firewall.Element{}}, testLease); err == nil {
		t.Fatal("another process's Book applied a revision whose blobs are gone")
	}
	res, err := b.Update(ctx, fw, testLease)
	if err != nil || res.Added != 1 || res.Deleted != 1 || res.Elements != 2 || fw.reads != 1 {
		t.Fatalf("update: %+v %v, %d reads", res, err, fw.reads)
	}
	if len(fw.set) != 2 || fw.set["45.1.0.3/tcp/443"].Verdict != firewall.Forward {
		t.Fatalf("set: %v", fw.set)
	}
}

// TestUpdateAfterLostAck: a change the kernel made but whose answer was
// lost leaves no record of the apply, so the next one reads the live set:
// an element the lost change added and the next revision drops is
// deleted.
func TestUpdateAfterLostAck(t *testing.T) {
	ctx := context.Background()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	fw := &fakeFW{set: map[string]firewall.Element{}}
	c := Chain{Scope: records.ScopeLease, Lease: testLease}
	exp := now.Add(24 * time.Hour)
	a, x := activeEndpoint(1, firewall.RateLimit, exp), activeEndpoint(2, firewall.RateLimit, exp)
	writeContent(t, b, c, []*records.AllowEntry{a})
	if _, err := b.Update(ctx, fw, testLease); err != nil {
		t.Fatal(err)
	}
	writeContent(t, b, c, []*records.AllowEntry{a, x})
	fw.lostAck = true
	if _, err := b.Update(ctx, fw, testLease); err == nil {
		t.Fatal("the lost answer was not reported")
	}
	writeContent(t, b, c, []*records.AllowEntry{a})
	if _, err := b.Update(ctx, fw, testLease); err != nil {
		t.Fatal(err)
	}
	if _, leaked := fw.set["45.1.0.2/tcp/443"]; leaked || len(fw.set) != 1 {
		t.Fatalf("set after the next update: %v", fw.set)
	}
}

// TestUpdateRenewsExpired: an entry that expired (and left the set) and
// is renewed by a later revision comes back, whichever path pushes it.
func TestUpdateRenewsExpired(t *testing.T) {
	ctx := context.Background()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	fw := &fakeFW{set: map[string]firewall.Element{}}
	c := Chain{Scope: records.ScopeLease, Lease: testLease}
	a := activeEndpoint(1, firewall.RateLimit, now.Add(time.Hour))
	long := activeEndpoint(2, firewall.RateLimit, now.Add(48*time.Hour))
	writeContent(t, b, c, []*records.AllowEntry{a, long})
	if _, err := b.Update(ctx, fw, testLease); err != nil || len(fw.set) != 2 {
		t.Fatalf("first update: %v %v", err, fw.set)
	}
	now = now.Add(2 * time.Hour)
	other := activeEndpoint(3, firewall.RateLimit, now.Add(48*time.Hour))
	writeContent(t, b, c, []*records.AllowEntry{a, long, other})
	if res, err := b.Update(ctx, fw, testLease); err != nil || res.Deleted != 1 || len(fw.set) != 2 {
		t.Fatalf("update past the expiry: %+v %v %v", res, err, fw.set)
	}
	renewed := *a
	exp := now.Add(time.Hour)
	renewed.ExpiresAt = &exp
	writeContent(t, b, c, []*records.AllowEntry{&renewed, long, other})
	if res, err := b.Update(ctx, fw, testLease); err != nil || res.Added != 1 || len(fw.set) != 3 {
		t.Fatalf("update after the renewal: %+v %v %v", res, err, fw.set)
	}
}

// TestParseEnforced: the one reader of an enforced line reads an
// endpoint's value as the endpoint package does, "-" as rate-limit, and
// refuses a line that is not four fields with a decimal expiry; the
// lines of big lists (IPv4 endpoints) are read without allocating.
func TestParseEnforced(t *testing.T) {
	for _, l := range []string{
		"endpoint 45.13.7.9:443/tcp rate-limit 1763856000",
		"endpoint 45.13.7.9:53/udp forward 0",
		"endpoint 0.0.0.0:1/tcp - 7",
		"endpoint 255.255.255.255:65535/udp - 1",
		"endpoint 45.13.7.9:0443/tcp rate-limit 1",
		"endpoint 45.013.7.9:443/tcp rate-limit 1",
		"endpoint 45.256.7.9:443/tcp rate-limit 1",
		"endpoint 45.13.7.9:65536/tcp rate-limit 1",
		"endpoint 45.13.7.9:443/sctp rate-limit 1",
		"endpoint 45.13.7.9:443/tcp rate-limit 1x",
		"endpoint 45.13.7.9:443/tcp rate-limit ",
		"endpoint 45.13.7.9:443/tcp rate-limit 1234567890123456789",
		"endpoint 45.13.7:443/tcp rate-limit 1",
		"endpoint [2001:db8::1]:443/tcp rate-limit 1",
		"endpoint 45.13.7.9:443/tcp rate-limit 1 extra",
		"domain c2.example - 1763856000",
	} {
		got, err := parseEnforced([]byte(l))
		f := strings.Split(l, " ")
		digits := len(f) == 4 && f[3] != "" && len(f[3]) <= 18 && strings.Trim(f[3], "0123456789") == ""
		if !digits {
			if err == nil {
				t.Errorf("%q: read as %+v, want malformed", l, got)
			}
			continue
		}
		exp, _ := strconv.ParseInt(f[3], 10, 64)
		if f[0] != records.AllowEndpoint {
			if err != nil || string(got.typ) != f[0] || string(got.value) != f[1] || got.exp != exp {
				t.Errorf("%q: %+v %v", l, got, err)
			}
			continue
		}
		ep, perr := endpt.Parse(f[1])
		if (err != nil) != (perr != nil) {
			t.Errorf("%q: %v, the endpoint package says %v", l, err, perr)
			continue
		}
		verdict := firewall.Verdict(f[2])
		if f[2] == "-" {
			verdict = firewall.RateLimit
		}
		want := firewall.Element{Dst: ep.Addr, Proto: ep.Proto, Port: ep.Port, Verdict: verdict}
		if err == nil && (got.el != want || got.exp != exp) {
			t.Errorf("%q: %+v, want %+v expiring %d", l, got, want, exp)
		}
	}
	for _, l := range []string{"endpoint 45.13.7.9:443/tcp rate-limit 1763856000", "endpoint 45.13.7.9:53/udp forward 0", "endpoint 45.13.7.9:53/udp - 0"} {
		b := []byte(l)
		if n := testing.AllocsPerRun(100, func() { parseEnforced(b) }); n != 0 {
			t.Errorf("%q: %v allocations", l, n)
		}
	}
}
