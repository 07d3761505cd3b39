package state

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// TestBatchViewServesOnlyLocksBeforeIt: a batch that locks many keys, then
// many records, before it reads them reads what may have changed of them
// once (the directory store's batchView); a key or record it locks after
// that reading is read anew, so that another writer's write of it between
// the reading and the lock is seen, not lost. Here another writer sets a
// key and updates a record after the batch's first reading of each kind,
// before the batch locks them.
func TestBatchViewServesOnlyLocksBeforeIt(t *testing.T) {
	eachBackend(t, batchViewServesOnlyLocksBeforeIt)
}

func batchViewServesOnlyLocksBeforeIt(t *testing.T, be testBackend) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), be.opts()...)
	const n = 2*viewMin + 4
	ids := seedKeyed(t, s, n)

	b := s.NewBatch()
	defer b.Discard()
	// The keys: viewMin+1 locked, looked up, then another writer sets
	// the last key before the batch locks it.
	for i := range viewMin + 1 {
		if ok, err := b.TryLockIndex("idx", fmt.Sprintf("k%d", i)); !ok || err != nil {
			t.Fatalf("TryLockIndex k%d = %v, %v", i, ok, err)
		}
	}
	for i := range viewMin + 1 {
		if id, err := b.Lookup("idx", fmt.Sprintf("k%d", i)); id != ids[i] || err != nil {
			t.Fatalf("Lookup k%d = %s, %v; want %s", i, id, err, ids[i])
		}
	}
	last := fmt.Sprintf("k%d", viewMin+1)
	if err := s.SetIndex("idx", last, ids[n-1]); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.TryLockIndex("idx", last); !ok || err != nil {
		t.Fatalf("TryLockIndex %s = %v, %v", last, ok, err)
	}
	if id, err := b.Lookup("idx", last); id != ids[n-1] || err != nil {
		t.Errorf("Lookup of %s, set by another writer before the batch locked it = %s, %v; want %s", last, id, err, ids[n-1])
	}

	// The records: viewMin locked and updated, then another writer
	// updates the next one before the batch locks it.
	bump := func(r *counterRec) func() error { return func() error { r.Total++; return nil } }
	for _, id := range ids[:viewMin] {
		if n, err := b.TryLockRecords([]string{id}); n != 1 || err != nil {
			t.Fatalf("TryLockRecords %s = %d, %v", id, n, err)
		}
	}
	for _, id := range ids[:viewMin] {
		var c counterRec
		if l, err := b.Update(id, &c, bump(&c)); l == nil || err != nil {
			t.Fatalf("Update %s = %s, %v", id, l, err)
		}
	}
	other := ids[viewMin]
	var o counterRec
	if err := s.Update(ctx, other, &o, func(bool) error { o.Note = "other writer"; return nil }); err != nil {
		t.Fatal(err)
	}
	if n, err := b.TryLockRecords([]string{other}); n != 1 || err != nil {
		t.Fatalf("TryLockRecords %s = %d, %v", other, n, err)
	}
	var c counterRec
	if l, err := b.Update(other, &c, bump(&c)); l == nil || err != nil {
		t.Fatalf("Update %s = %s, %v", other, l, err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	got := getCounter(t, s, other)
	if got.Note != "other writer" || got.Total != 10*viewMin+1 || got.Rev != 3 {
		t.Errorf("%s after another writer's update and the batch's: note %q, total %d, rev %d; want %q, %d, 3",
			other, got.Note, got.Total, got.Rev, "other writer", 10*viewMin+1)
	}
	for i, id := range ids[:viewMin] {
		if got := getCounter(t, s, id); got.Total != 10*i+1 || got.Rev != 2 {
			t.Errorf("%s: total %d, rev %d; want %d, 2", id, got.Total, got.Rev, 10*i+1)
		}
	}
}

// TestBatchLocksMany: TryLockIndexes takes keys in order up to the first the
// batch cannot take (one another batch holds, or one named twice),
// LookupAll gives "" for a key never set, and TryLockRecords stops at a
// record another batch holds; what it locked, Update reads as stored when
// it was locked, on both stores (PostgreSQL reads the records with their
// locks, in one round trip).
func TestBatchLocksMany(t *testing.T) { eachBackend(t, batchLocksMany) }

func batchLocksMany(t *testing.T, be testBackend) {
	s := openT(t, t.TempDir(), be.opts()...)
	ids := seedKeyed(t, s, 4)
	other := s.NewBatch()
	defer other.Discard()
	if ok, err := other.TryLockIndex("idx", "k3"); !ok || err != nil {
		t.Fatalf("the other batch's TryLockIndex = %v, %v", ok, err)
	}
	if n, err := other.TryLockRecords(ids[2:3]); n != 1 || err != nil {
		t.Fatalf("the other batch's TryLockRecords = %d, %v", n, err)
	}

	b := s.NewBatch()
	defer b.Discard()
	if n, err := b.TryLockIndexes("idx", []string{"k0", "k1", "absent", "k1", "k2"}); n != 3 || err != nil {
		t.Fatalf("TryLockIndexes with a key named twice = %d, %v; want 3", n, err)
	}
	if n, err := b.TryLockIndexes("idx", []string{"k2", "k3"}); n != 1 || err != nil {
		t.Fatalf("TryLockIndexes of a key another batch holds = %d, %v; want 1", n, err)
	}
	got, err := b.LookupAll("idx", []string{"k0", "absent", "k1", "k2"})
	if err != nil || !slices.Equal(got, []string{ids[0], "", ids[1], ids[2]}) {
		t.Fatalf("LookupAll = %v, %v; want %v", got, err, []string{ids[0], "", ids[1], ids[2]})
	}
	if n, err := b.TryLockRecords(ids[:3]); n != 2 || err != nil {
		t.Fatalf("TryLockRecords of a record another batch holds = %d, %v; want 2", n, err)
	}
	for i, id := range ids[:2] {
		var c counterRec
		l, err := b.Update(id, &c, func() error { c.Total++; return nil })
		if l == nil || err != nil || c.Total != 10*i+1 || c.Rev != 2 {
			t.Fatalf("Update %s = %s, %v: total %d, rev %d; want %d, 2", id, l, err, c.Total, c.Rev, 10*i+1)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids[:2] {
		if c := getCounter(t, s, id); c.Total != 10*i+1 {
			t.Errorf("%s: total %d; want %d", id, c.Total, 10*i+1)
		}
	}
}

// seedKeyed stores n counters in one batch, the i-th with total 10*i under
// the key "k<i>" of index "idx", and returns their IDs in that order.
func seedKeyed(t *testing.T, s *Store, n int) []string {
	t.Helper()
	var ids []string
	seed := s.NewBatch()
	for i := range n {
		c := newCounter(s)
		c.Total = 10 * i
		key := fmt.Sprintf("k%d", i)
		if ok, err := seed.ClaimIndex("idx", key); !ok || err != nil {
			t.Fatalf("ClaimIndex %s = %v, %v", key, ok, err)
		}
		if l, err := seed.Create(c); l == nil || err != nil {
			t.Fatalf("Create = %s, %v", l, err)
		}
		if err := seed.SetIndex("idx", key, c.ID); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	if err := seed.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}
