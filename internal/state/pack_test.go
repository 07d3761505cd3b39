package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// TestBatchPacked: a batch of defaultPackMin records keeps them in one
// pack, not a file each, and every reader finds them there, in this store
// and in another (process) on the same directory: ReadRaw, Get, Exists,
// List, Kinds, FindBy, Lookup, Check, Replay, Compact. A later write gives
// a record its file, which comes first; a delete hides the pack's copy.
func TestBatchPacked(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openT(t, dir)
	b := s.NewBatch()
	var ids []string
	lines := make(map[string][]byte)
	for i := range defaultPackMin {
		c := &records.Capture{Lease: "lease_p"}
		records.Init(c, records.KindCapture, s.Now())
		line, err := b.Create(c)
		if err != nil || line == nil {
			t.Fatalf("Create %d = %q, %v", i, line, err)
		}
		key := fmt.Sprintf("p%d", i)
		if ok, err := b.TryLockIndex("cap", key); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if err := b.SetIndex("cap", key, c.ID); err != nil {
			t.Fatal(err)
		}
		ids, lines[c.ID] = append(ids, c.ID), line
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(filepath.Join(dir, "records", records.KindCapture)); err == nil && len(ents) > 0 {
		t.Fatalf("a packed batch left %d record files", len(ents))
	}
	if packs, _ := filepath.Glob(filepath.Join(dir, "packs", "*"+batchIntentSuffix)); len(packs) != 1 {
		t.Fatalf("packs: %v, want one", packs)
	}
	other := openT(t, dir)
	for _, st := range []*Store{s, other} {
		for i, id := range ids {
			if raw, err := st.ReadRaw(id); err != nil || !bytes.Equal(raw, lines[id]) {
				t.Fatalf("ReadRaw %s = %s, %v; want %s", id, raw, err, lines[id])
			}
			var c records.Capture
			if err := st.Get(id, &c); err != nil || c.Lease != "lease_p" || c.Rev != 1 {
				t.Fatalf("Get %s = %+v, %v", id, c, err)
			}
			if !st.Exists(id) {
				t.Fatalf("Exists %s = false", id)
			}
			if got, err := st.Lookup("cap", fmt.Sprintf("p%d", i)); err != nil || got != id {
				t.Fatalf("Lookup p%d = %s, %v", i, got, err)
			}
		}
		if got, err := st.List(records.KindCapture); err != nil || !slices.Equal(got, sorted(ids)) {
			t.Fatalf("List = %v, %v; want %v", got, err, sorted(ids))
		}
		if kinds, err := st.Kinds(); err != nil || !slices.Contains(kinds, records.KindCapture) {
			t.Fatalf("Kinds = %v, %v", kinds, err)
		}
		if got := findLease(t, st, "lease_p"); !slices.Equal(got, sorted(ids)) {
			t.Fatalf("FindBy = %v", got)
		}
	}
	assertConsistent(t, s)

	// A later write gives the record its file, which shadows the pack.
	updated, deleted, both := ids[0], ids[1], ids[2]
	for _, id := range []string{updated, both} {
		var c records.Capture
		if err := s.Update(ctx, id, &c, func(bool) error { c.Lease = "lease_q"; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	var c records.Capture
	if err := other.Get(updated, &c); err != nil || c.Rev != 2 || c.Lease != "lease_q" {
		t.Fatalf("Get of an updated packed record = %+v, %v", c, err)
	}
	// A delete hides the pack's copy, with or without a file of its own.
	for _, id := range []string{deleted, both} {
		if err := s.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	live := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == deleted || id == both })
	for _, st := range []*Store{s, other} {
		for _, id := range []string{deleted, both} {
			if _, err := st.ReadRaw(id); !errors.Is(err, ErrNotFound) || st.Exists(id) {
				t.Errorf("deleted %s: ReadRaw %v, Exists %v", id, err, st.Exists(id))
			}
		}
		if got, err := st.List(records.KindCapture); err != nil || !slices.Equal(got, sorted(live)) {
			t.Errorf("List after deletes = %v, %v; want %v", got, err, sorted(live))
		}
		if got := findLease(t, st, "lease_p"); !slices.Equal(got, sorted(slices.DeleteFunc(slices.Clone(live), func(id string) bool { return id == updated }))) {
			t.Errorf("FindBy lease_p after the update and deletes = %v", got)
		}
		if got := findLease(t, st, "lease_q"); !slices.Equal(got, []string{updated}) {
			t.Errorf("FindBy lease_q = %v", got)
		}
	}
	// An ID in a pack is taken, for a batch and for a single write.
	b = s.NewBatch()
	taken := &records.Capture{Lease: "lease_p"}
	records.Init(taken, records.KindCapture, s.Now())
	taken.ID = ids[3]
	if line, err := b.Create(taken); err != nil || line == nil {
		t.Fatal(line, err)
	}
	if err := b.Commit(); !errors.Is(err, ErrExists) {
		t.Errorf("batch Create of a packed ID: %v", err)
	}
	taken = &records.Capture{Lease: "lease_p"}
	records.Init(taken, records.KindCapture, s.Now())
	taken.ID = ids[3]
	if err := s.Create(ctx, taken); !errors.Is(err, ErrExists) {
		t.Errorf("Create of a packed ID: %v", err)
	}
	want := assertConsistent(t, s)
	if _, err := s.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	diffStates(t, "before compacting", want, "after", assertConsistent(t, openT(t, dir)))

	// Check reads the packs: a record whose pack copy differs from the
	// journal is reported.
	pack, _ := filepath.Glob(filepath.Join(dir, "packs", "*"+batchIntentSuffix))
	data, err := os.ReadFile(pack[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pack[0], bytes.ReplaceAll(data, []byte(ids[3]), []byte(ids[4])), 0o640); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Check(ctx, CheckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) == 0 || slices.ContainsFunc(rep.Problems, func(p Problem) bool { return p.ID != ids[3] }) {
		t.Errorf("Check of a tampered pack: %+v", rep.Problems)
	}
	// A packed record that does not decode is named by its pack.
	loc, ok, err := s.packed(records.KindCapture, ids[5])
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	f, err := os.OpenFile(pack[0], os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte("["), int(loc.n)), loc.off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := s.Get(ids[5], &c); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%s (at %d): stored record does not decode", pack[0], loc.off)) {
		t.Errorf("Get of a packed record that does not decode: %v", err)
	}
}
