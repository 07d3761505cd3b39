package state

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func newCapture(t *testing.T, s *Store, lease string) *records.Capture {
	t.Helper()
	c := &records.Capture{Lease: lease}
	records.Init(c, records.KindCapture, s.Now())
	if err := s.Create(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	return c
}

// idsOf lists the records' IDs, in their order.
func idsOf[R records.Record](rs []R) []string {
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.Header().ID)
	}
	return ids
}

// TestFindBy: a record is found under the values it has now, not those it
// had, nor once deleted; Latest and Find agree with FindBy.
func TestFindBy(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	a := newCapture(t, s, "lease_a")
	b := newCapture(t, s, "lease_b")
	a2 := newCapture(t, s, "lease_a")
	moved := newCapture(t, s, "lease_a")
	var u records.Capture
	if err := s.Update(ctx, moved.ID, &u, func(bool) error { u.Lease = "lease:b/odd name"; return nil }); err != nil {
		t.Fatal(err)
	}
	gone := newCapture(t, s, "lease_a")
	if err := s.Delete(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	got, err := FindBy[records.Capture](s, records.KindCapture, records.KeyLease, "lease_a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ids := idsOf(got); len(ids) != 2 || ids[0] != a.ID || ids[1] != a2.ID {
		t.Errorf("lease_a: %v, want %s %s", ids, a.ID, a2.ID)
	}
	odd, err := FindBy[records.Capture](s, records.KindCapture, records.KeyLease, "lease:b/odd name", nil)
	if err != nil || len(odd) != 1 || odd[0].ID != moved.ID {
		t.Errorf("odd value: %v, %v", idsOf(odd), err)
	}
	last, err := LatestBy[records.Capture](s, records.KindCapture, records.KeyLease, "lease_a", nil)
	if err != nil || last.ID != a2.ID {
		t.Errorf("LatestBy: %v, %v", last, err)
	}
	if _, err := LatestBy[records.Capture](s, records.KindCapture, records.KeyLease, "lease_none", nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("LatestBy of no record: %v", err)
	}
	all, err := Find(s, records.KindCapture, func(c *records.Capture) bool { return c.Lease != "lease_a" })
	if ids := idsOf(all); err != nil || len(ids) != 2 || ids[0] != b.ID || ids[1] != moved.ID {
		t.Errorf("Find: %v, %v", ids, err)
	}
	if _, err := os.Stat(filepath.Join(s.keyDir(records.KindCapture, records.KeyLease, "lease_a"), gone.ID)); err == nil {
		t.Errorf("the deleted record's key remains")
	}
}

// TestBatchKeys: records a batch creates are found by their keys.
func TestBatchKeys(t *testing.T) {
	s := openT(t, t.TempDir())
	want := batchObservables(t, s, s.NewBatch(), records.Observable{Type: records.ObsDomain, Value: "c2.example",
		Lease: "lease_x", Cycle: "cycle_2", Cycles: []string{"cycle_1", "cycle_2"}})
	for _, cycle := range []string{"cycle_1", "cycle_2"} {
		got, err := FindBy[records.Observable](s, records.KindObservable, records.KeyCycle, cycle, nil)
		if err != nil || len(got) != len(want) {
			t.Errorf("cycle %s: %d observables, %v", cycle, len(got), err)
		}
	}
}

// A batch's update adds the keys the new version has and the stored one
// had not, once: the record is found under each, and a key it had already
// gets no second line.
func TestBatchUpdateKeys(t *testing.T) {
	for _, packMin := range []int{1, defaultPackMin} {
		t.Run(fmt.Sprint(packMin), func(t *testing.T) {
			s := openT(t, t.TempDir())
			s.packMin = packMin
			ids := batchObservablesUpdated(t, s, func(cur *records.Observable) {
				cur.Cycle, cur.Cycles = "cycle_2", []string{"cycle_1", "cycle_2"}
			})
			for _, cycle := range []string{"cycle_1", "cycle_2"} {
				got, err := FindBy[records.Observable](s, records.KindObservable, records.KeyCycle, cycle, nil)
				if err != nil || len(got) != len(ids) {
					t.Errorf("cycle %s: %d observables, %v", cycle, len(got), err)
				}
			}
			if packMin == 1 {
				lines, _, err := partitionLines(s.rec.(*dirStore).keyDir(records.KindObservable, records.KeyLease, "lease_x"), 0)
				if err != nil || len(lines) != len(ids) {
					t.Errorf("lease key: %d lines, %v; want %d", len(lines), err, len(ids))
				}
			}
			assertConsistent(t, s)
		})
	}
}

// TestCheckKeys: Check reports a record missing from its key, and Repair
// puts it back.
func TestCheckKeys(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	c := newCapture(t, s, "lease_a")
	if err := os.Remove(filepath.Join(s.keyDir(records.KindCapture, records.KeyLease, "lease_a"), c.ID)); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Check(ctx, CheckOptions{})
	if err != nil || rep.OK() {
		t.Fatalf("Check missed the lost key: %+v, %v", rep, err)
	}
	if rep, err = s.Check(ctx, CheckOptions{Repair: true}); err != nil || !rep.OK() || len(rep.Repaired) != 1 {
		t.Fatalf("Check with Repair: %+v, %v", rep, err)
	}
	if got, err := FindBy[records.Capture](s, records.KindCapture, records.KeyLease, "lease_a", nil); err != nil || len(got) != 1 {
		t.Errorf("after repair: %v, %v", idsOf(got), err)
	}
}

// TestBackfillKeys: a store written before keys existed gets them at its
// next Open.
func TestBackfillKeys(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	c := newCapture(t, s, "lease_a")
	if err := os.RemoveAll(filepath.Join(dir, "keys")); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir)
	got, err := FindBy[records.Capture](s, records.KindCapture, records.KeyLease, "lease_a", nil)
	if err != nil || len(got) != 1 || got[0].ID != c.ID {
		t.Errorf("after backfill: %v, %v", idsOf(got), err)
	}
}

// TestBatchUpdateMovesKeys: a batch's new version is found under its new
// keys and not under those it dropped, on both backends (PostgreSQL
// deletes the dropped keys' rows; the directory's FindBy passes over
// them).
func TestBatchUpdateMovesKeys(t *testing.T) { eachBackend(t, batchUpdateMovesKeys) }

func batchUpdateMovesKeys(t *testing.T, be testBackend) {
	s := openT(t, t.TempDir(), be.opts()...)
	ids := batchObservablesUpdated(t, s, func(cur *records.Observable) {
		cur.Lease, cur.Cycle, cur.Cycles = "lease_y", "cycle_2", []string{"cycle_1", "cycle_2"}
	})
	for _, k := range []struct {
		field, value string
		want         int
	}{
		{records.KeyLease, "lease_x", 0},
		{records.KeyLease, "lease_y", len(ids)},
		{records.KeyCycle, "cycle_1", len(ids)},
		{records.KeyCycle, "cycle_2", len(ids)},
	} {
		got, err := FindBy[records.Observable](s, records.KindObservable, k.field, k.value, nil)
		if err != nil || len(got) != k.want {
			t.Errorf("%s=%s: %d observables, %v; want %d", k.field, k.value, len(got), err, k.want)
		}
	}
	if be.url != "" {
		if stale, err := s.rec.ByKey(records.KindObservable, records.KeyLease, "lease_x"); err != nil || len(stale) != 0 {
			t.Errorf("rows of a dropped key: %v, %v", stale, err)
		}
	}
}

// batchObservablesUpdated stores three observables of lease_x, cycle_1 in
// a batch, then changes each with change in a second batch of the same
// Batch, and returns their IDs.
func batchObservablesUpdated(t *testing.T, s *Store, change func(*records.Observable)) []string {
	t.Helper()
	b := s.NewBatch()
	ids := batchObservables(t, s, b, records.Observable{Type: records.ObsDomain, Value: "c2.example", Lease: "lease_x", Cycle: "cycle_1"})
	for _, id := range ids {
		var cur records.Observable
		line, err := b.Update(id, &cur, func() error {
			change(&cur)
			return nil
		})
		if err != nil || line == nil {
			t.Fatal(line, err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// batchObservables stores three copies of proto through b, and returns
// their IDs.
func batchObservables(t *testing.T, s *Store, b *Batch, proto records.Observable) []string {
	t.Helper()
	var ids []string
	for range 3 {
		o := proto
		records.Init(&o, records.KindObservable, s.Now())
		if data, err := b.Create(&o); err != nil || data == nil {
			t.Fatal(data, err)
		}
		ids = append(ids, o.ID)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}
