package state

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// batchCaptures commits a batch of n captures of lease, each under index
// key "<prefix><i>" of index "cap".
func batchCaptures(t *testing.T, s *Store, lease, prefix string, n int) []string {
	t.Helper()
	b := s.NewBatch()
	var ids []string
	for i := range n {
		c := &records.Capture{Lease: lease}
		records.Init(c, records.KindCapture, s.Now())
		if line, err := b.Create(c); err != nil || line == nil {
			t.Fatalf("Create %d = %q, %v", i, line, err)
		}
		key := fmt.Sprintf("%s%d", prefix, i)
		if ok, err := b.TryLockIndex("cap", key); !ok || err != nil {
			t.Fatalf("TryLockIndex %s = %v, %v", key, ok, err)
		}
		if err := b.SetIndex("cap", key, c.ID); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func findLease(t *testing.T, s *Store, lease string) []string {
	t.Helper()
	got, err := FindBy[records.Capture](s, records.KindCapture, records.KeyLease, lease, nil)
	if err != nil {
		t.Fatal(err)
	}
	return idsOf(got)
}

// sorted is ids in the order FindBy gives (IDs made in one millisecond are
// not in the order they were made).
func sorted(ids []string) []string { return slices.Sorted(slices.Values(ids)) }

// TestBatchKeysInPartitions: a batch's index keys and record keys are lines
// of one partition file per directory, not a file each, and every reader
// finds them: Lookup, FindBy, Check. A key's own file (SetIndex) shadows the
// line; a later batch replaces either.
func TestBatchKeysInPartitions(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openT(t, dir)
	ids := batchCaptures(t, s, "lease_a", "k", 5)
	for _, d := range []string{filepath.Join(dir, "index", "cap"), s.keyDir(records.KindCapture, records.KeyLease, "lease_a")} {
		ents, err := os.ReadDir(d)
		if err != nil || len(ents) != 1 || ents[0].Name() != partitionFile {
			t.Fatalf("%s holds %v, %v; want only %s", d, ents, err, partitionFile)
		}
	}
	if got := findLease(t, s, "lease_a"); !slices.Equal(got, sorted(ids)) {
		t.Errorf("FindBy lease_a = %v, want %v", got, ids)
	}
	for i, id := range ids {
		if got, err := s.Lookup("cap", fmt.Sprintf("k%d", i)); err != nil || got != id {
			t.Errorf("Lookup k%d = %s, %v; want %s", i, got, err, id)
		}
	}
	// Another store (another process) reads what this one appends later.
	other := openT(t, dir)
	if got, err := other.Lookup("cap", "k0"); err != nil || got != ids[0] {
		t.Fatalf("other store: Lookup k0 = %s, %v", got, err)
	}
	more := batchCaptures(t, s, "lease_a", "m", 2)
	if got, err := other.Lookup("cap", "m1"); err != nil || got != more[1] {
		t.Errorf("other store after a second batch: Lookup m1 = %s, %v; want %s", got, err, more[1])
	}

	// SetIndex writes the key's own file, which shadows the batch's line.
	if err := s.SetIndex("cap", "k0", ids[1]); err != nil {
		t.Fatal(err)
	}
	if got, err := other.Lookup("cap", "k0"); err != nil || got != ids[1] {
		t.Errorf("Lookup k0 after SetIndex = %s, %v; want %s", got, err, ids[1])
	}
	// A batch setting a key that has its own file replaces the file; one
	// that is only a line gets a later line, which wins.
	if err := s.Delete(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, ids[2]); err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	var newer []string
	for _, key := range []string{"k0", "k2"} {
		c := &records.Capture{Lease: "lease_b"}
		records.Init(c, records.KindCapture, s.Now())
		if line, err := b.Create(c); err != nil || line == nil {
			t.Fatal(err)
		}
		if ok, err := b.TryLockIndex("cap", key); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if err := b.SetIndex("cap", key, c.ID); err != nil {
			t.Fatal(err)
		}
		newer = append(newer, c.ID)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	for i, key := range []string{"k0", "k2"} {
		for _, st := range []*Store{s, other} {
			if got, err := st.Lookup("cap", key); err != nil || got != newer[i] {
				t.Errorf("Lookup %s after a second batch = %s, %v; want %s", key, got, err, newer[i])
			}
		}
	}
	want := append([]string{ids[0]}, append(ids[3:], more...)...)
	if got := findLease(t, other, "lease_a"); !slices.Equal(got, sorted(want)) {
		t.Errorf("FindBy lease_a after deletes = %v, want %v", got, want)
	}
	if got := findLease(t, other, "lease_b"); !slices.Equal(got, sorted(newer)) {
		t.Errorf("FindBy lease_b = %v, want %v", got, newer)
	}
	assertConsistent(t, s)

	// Check finds a record its partition file lost, and Repair restores it.
	part := filepath.Join(s.keyDir(records.KindCapture, records.KeyLease, "lease_a"), partitionFile)
	data, err := os.ReadFile(part)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(part, bytes.Replace(data, []byte(ids[3]+"\n"), nil, 1), 0o640); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Check(ctx, CheckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 1 || rep.Problems[0].ID != ids[3] || !strings.Contains(rep.Problems[0].Err, "not found under its key lease=lease_a") {
		t.Fatalf("Check of a lost key line: %+v", rep.Problems)
	}
	if rep, err := s.Check(ctx, CheckOptions{Repair: true}); err != nil || len(rep.Repaired) != 1 {
		t.Fatalf("Check --repair: %+v, %v", rep, err)
	}
	if got := findLease(t, s, "lease_a"); !slices.Equal(got, sorted(want)) {
		t.Errorf("FindBy lease_a after repair = %v, want %v", got, want)
	}
	assertConsistent(t, s)
}

// TestBatchKeysTornAppend: a batch killed halfway through appending its
// record keys (before its journal append: nothing committed) leaves a torn
// line, which readers ignore and the next batch trims before it appends,
// so that its first ID is not glued to the torn one.
func TestBatchKeysTornAppend(t *testing.T) {
	dir, snap := t.TempDir(), filepath.Join(t.TempDir(), "snap")
	s := openT(t, dir)
	s.crashAt = func(point string) {
		if point == crashPartitionTorn {
			if _, err := os.Stat(snap); err != nil {
				copyTree(t, dir, snap)
			}
		}
	}
	batchCaptures(t, s, "lease_a", "k", 3)
	s.crashAt = nil
	part := filepath.Join(s.keyDir(records.KindCapture, records.KeyLease, "lease_a"), partitionFile)
	r := openT(t, snap)
	torn, err := os.ReadFile(filepath.Join(snap, strings.TrimPrefix(part, dir)))
	if err != nil || len(torn) == 0 || torn[len(torn)-1] == '\n' {
		t.Fatalf("no torn key line in the snapshot: %q, %v", torn, err)
	}
	if got := findLease(t, r, "lease_a"); len(got) != 0 {
		t.Errorf("FindBy after a crash before the journal append = %v, want none", got)
	}
	ids := batchCaptures(t, r, "lease_a", "k", 3)
	if got := findLease(t, r, "lease_a"); !slices.Equal(got, sorted(ids)) {
		t.Errorf("FindBy after the next batch = %v, want %v", got, ids)
	}
	assertConsistent(t, r)
}

// TestPartitionLinesOfHostileValues: an index key or field value taken from
// a guest's traffic (an observable's value) cannot add a line of its own to
// a partition file: a key with a space or newline is refused, and a field
// value is a directory name (hex when it is not a plain token), never a line.
func TestPartitionLinesOfHostileValues(t *testing.T) {
	s := openT(t, t.TempDir())
	victim := batchCaptures(t, s, "lease_a", "k", 1)[0]
	b := s.NewBatch()
	c := &records.Capture{Lease: "lease_x\n" + victim}
	records.Init(c, records.KindCapture, s.Now())
	if line, err := b.Create(c); err != nil || line == nil {
		t.Fatal(line, err)
	}
	// Either would, written as a line, point k0 at the guest's record.
	for _, key := range []string{"evil\nk0", "k0 x\nk0"} {
		if ok, err := b.TryLockIndex("cap", key); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if err := b.SetIndex("cap", key, c.ID); err == nil {
			t.Errorf("SetIndex of key %q accepted", key)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Lookup("cap", "k0"); err != nil || got != victim {
		t.Errorf("Lookup k0 = %s, %v; want %s", got, err, victim)
	}
	if got := findLease(t, s, "lease_x\n"+victim); !slices.Equal(got, []string{c.ID}) {
		t.Errorf("FindBy of the value with a newline = %v, want %s", got, c.ID)
	}
	if got := findLease(t, s, "lease_x"); len(got) != 0 {
		t.Errorf("FindBy lease_x = %v, want none", got)
	}
}

// TestUpdateOfABatchedRecordKeepsItsKeyLines: a later write of a record
// whose keys a batch stored as lines finds them there, and gives it no file
// per key (which made every merge into a parse run's observables cost two
// more inodes).
func TestUpdateOfABatchedRecordKeepsItsKeyLines(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	ids := batchCaptures(t, s, "lease_a", "k", 2)
	var c records.Capture
	if err := s.Update(ctx, ids[0], &c, func(bool) error { c.Iface = "tap9"; return nil }); err != nil {
		t.Fatal(err)
	}
	dir := s.keyDir(records.KindCapture, records.KeyLease, "lease_a")
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 1 {
		t.Errorf("%s after an update holds %v, %v; want only %s", dir, ents, err, partitionFile)
	}
	if got := findLease(t, s, "lease_a"); !slices.Equal(got, sorted(ids)) {
		t.Errorf("FindBy = %v, want %v", got, sorted(ids))
	}
	// A new value still gets its key.
	if err := s.Update(ctx, ids[1], &c, func(bool) error { c.Lease = "lease_b"; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := findLease(t, s, "lease_b"); !slices.Equal(got, []string{ids[1]}) {
		t.Errorf("FindBy lease_b = %v", got)
	}
	assertConsistent(t, s)
}

// TestKeyPartitionCacheHoldsOnlyBatchedKeys: a long-running writer's cache
// of partition lines grows with the key directories batches wrote, not with
// every key it ever wrote by a single write.
func TestKeyPartitionCacheHoldsOnlyBatchedKeys(t *testing.T) {
	s := openT(t, t.TempDir())
	for i := range 50 {
		newCapture(t, s, fmt.Sprintf("lease_%d", i))
	}
	if n := len(s.keyParts); n != 0 {
		t.Errorf("after 50 single writes with their own keys the cache holds %d key directories, want 0", n)
	}
	ids := batchCaptures(t, s, "lease_batched", "k", 2)
	var c records.Capture
	if err := s.Update(context.Background(), ids[0], &c, func(bool) error { c.Iface = "tap9"; return nil }); err != nil {
		t.Fatal(err)
	}
	if n := len(s.keyParts); n != 1 {
		t.Errorf("after an update of a batched record the cache holds %d key directories, want 1", n)
	}
}
