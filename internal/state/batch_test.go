package state

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// queueCounters queues n new counters in b, each with an index key
// "k<i>" in index "idx", and returns them with their lines.
func queueCounters(t *testing.T, s *Store, b *Batch, n int) ([]*counterRec, [][]byte) {
	t.Helper()
	var recs []*counterRec
	var lines [][]byte
	for i := range n {
		c := newCounter(s)
		c.Seq, c.Note = i, "<a&b>\u2028 json.Marshal escapes these"
		line, err := b.Create(c)
		if err != nil || line == nil {
			t.Fatalf("Create %d = %q, %v", i, line, err)
		}
		key := fmt.Sprintf("k%d", i)
		if ok, err := b.TryLockIndex("idx", key); !ok || err != nil {
			t.Fatalf("TryLockIndex %s = %v, %v", key, ok, err)
		}
		if err := b.SetIndex("idx", key, c.ID); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, c)
		lines = append(lines, line)
	}
	return recs, lines
}

// withoutTmpfile runs fn as on a filesystem without O_TMPFILE.
func withoutTmpfile(t *testing.T, fn func(t *testing.T)) {
	t.Run("no-O_TMPFILE", func(t *testing.T) {
		noTmpfile = true
		defer func() { noTmpfile = false }()
		fn(t)
	})
}

func TestBatchStoresWhatSingleWritesWould(t *testing.T) {
	testBatchStores(t)
	withoutTmpfile(t, testBatchStores)
}

func testBatchStores(t *testing.T) {
	for name, d := range map[string]Durability{"sync-on-flush": SyncOnFlush, "sync-each-write": SyncEachWrite} {
		t.Run(name, func(t *testing.T) {
			s := openT(t, t.TempDir(), WithDurability(d))
			b := s.NewBatch()
			for round := range 2 { // a batch is reusable after Commit
				recs, lines := queueCounters(t, s, b, 5)
				for _, c := range recs {
					if s.Exists(c.ID) {
						t.Fatalf("%s visible before Commit", c.ID)
					}
				}
				if err := b.Commit(); err != nil {
					t.Fatal(err)
				}
				if !b.Idle() {
					t.Fatal("batch not empty after Commit")
				}
				for i, c := range recs {
					raw, err := s.ReadRaw(c.ID)
					if err != nil || !bytes.Equal(raw, lines[i]) {
						t.Fatalf("round %d: stored %s = %s, %v; Create returned %s", round, c.ID, raw, err, lines[i])
					}
					want, err := records.Marshal(c)
					if err != nil || !bytes.Equal(want, raw) {
						t.Fatalf("stored %s, the record encodes as %s", raw, want)
					}
					if got := getCounter(t, s, c.ID); got.Rev != 1 || got.Seq != i || !got.CreatedAt.Equal(c.CreatedAt) {
						t.Fatalf("stored %+v", got)
					}
					if id, err := s.Lookup("idx", fmt.Sprintf("k%d", i)); err != nil || id != c.ID {
						t.Fatalf("Lookup k%d = %s, %v; want %s", i, id, err, c.ID)
					}
				}
			}
			// The journal lines are those appendJournal writes for the same
			// entries, byte for byte.
			j := journalBytes(t, s)
			n := 0
			for line := range bytes.Lines(j) {
				var e entry
				if err := json.Unmarshal(line, &e); err != nil {
					t.Fatal(err)
				}
				var buf bytes.Buffer
				enc := json.NewEncoder(&buf)
				enc.SetEscapeHTML(false)
				if err := enc.Encode(&entry{At: e.At, Op: opPut, Kind: e.Kind, ID: e.ID, Rev: e.Rev, Record: e.Record}); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(buf.Bytes(), line) {
					t.Fatalf("journal line\n%s\nappendJournal would write\n%s", line, buf.Bytes())
				}
				n++
			}
			if n != 10 {
				t.Fatalf("%d journal lines, want 10", n)
			}
			assertConsistent(t, s)
		})
	}
}

func TestBatchRefusesWhatOthersHold(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openT(t, dir)
	other := openT(t, dir) // another holder: its own descriptors, as another process
	unlockKey, err := other.lockIndex(ctx, "idx", "held")
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	if ok, err := b.TryLockIndex("idx", "held"); ok || err != nil {
		t.Fatalf("TryLockIndex of a key held elsewhere = %v, %v", ok, err)
	}
	if ok, err := b.TryLockIndex("idx", "free"); !ok || err != nil {
		t.Fatalf("TryLockIndex of a free key = %v, %v", ok, err)
	}
	if ok, err := b.TryLockIndex("idx", "free"); ok || err != nil {
		t.Fatalf("TryLockIndex of a key the batch holds = %v, %v", ok, err)
	}
	c := newCounter(s)
	if line, err := b.Create(c); line == nil || err != nil {
		t.Fatalf("Create = %s, %v", line, err)
	}
	if line, err := b.Create(c); line != nil || err != nil {
		t.Fatalf("second Create of one record in a batch = %s, %v", line, err)
	}
	if err := b.SetIndex("idx", "unlocked", c.ID); err == nil {
		t.Fatal("SetIndex of a key the batch does not hold succeeded")
	}
	if err := b.SetIndex("idx", "free", c.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct{ path, name string }{
		{other.recordLockPath(testKind, c.ID), c.ID},
		{other.indexLockPath("idx", "free"), "free"},
	} {
		unlock, ok, err := lockFile(ctx, l.path, lockOffset(l.name), false)
		if !ok || err != nil {
			t.Fatalf("lock of %s still held after Commit (%v)", l.name, err)
		}
		unlock()
	}
	unlockKey()
}

// TestBatchLocksNewRecordsAtCommit: a new record's lock, and a claimed
// key's, is taken by Commit, before the journal names them, and held until
// they are in place; a lock file another batch holds whole is tried again
// until it is let go; a lock another writer keeps fails the Commit as busy
// (exit 75), with nothing stored.
func TestBatchLocksNewRecordsAtCommit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openT(t, dir)
	other := openT(t, dir)
	s.newLockPatience = 100 * time.Millisecond

	// Held at the commit point, free after; a claimed key likewise.
	b := s.NewBatch()
	var locks []byteLock
	for i := range 2 * lockShards {
		c := newCounter(s)
		if line, err := b.Create(c); line == nil || err != nil {
			t.Fatalf("Create = %s, %v", line, err)
		}
		key := fmt.Sprintf("claimed-%d", i)
		if ok, err := b.ClaimIndex("idx", key); !ok || err != nil {
			t.Fatalf("ClaimIndex = %v, %v", ok, err)
		}
		if ok, err := b.ClaimIndex("idx", key); ok || err != nil {
			t.Fatalf("second ClaimIndex of a key = %v, %v", ok, err)
		}
		if err := b.SetIndex("idx", key, c.ID); err != nil {
			t.Fatal(err)
		}
		locks = append(locks, byteLock{other.recordLockPath(testKind, c.ID), c.ID}, byteLock{other.indexLockPath("idx", key), key})
	}
	journaled := false
	s.crashAt = func(point string) {
		if point != crashPutJournaled {
			return
		}
		journaled = true
		for _, l := range locks {
			if ok, err := l.free(ctx); ok || err != nil {
				t.Errorf("another writer took %s's lock once the journal named it (%v)", l.name, err)
			}
		}
	}
	if err := b.Commit(); err != nil || !journaled {
		t.Fatalf("Commit = %v (journaled %v)", err, journaled)
	}
	s.crashAt = nil
	for _, l := range locks {
		if ok, err := l.free(ctx); !ok || err != nil {
			t.Fatalf("%s's lock still held after Commit (%v)", l.name, err)
		}
	}
	if id, err := s.Lookup("idx", "claimed-0"); err != nil || id != locks[0].name {
		t.Fatalf("claimed key = %s, %v; want %s", id, err, locks[0].name)
	}

	// Another batch committing holds its lock files whole: tried again
	// until it lets go.
	c := newCounter(s)
	path := other.recordLockPath(testKind, c.ID)
	fd, err := openLockFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := ofdLockRange(fd, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	busy := 0
	s.crashAt = func(point string) {
		if point == hookNewLocksBusy {
			busy++
			lk := unix.Flock_t{Type: unix.F_UNLCK}
			if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk); err != nil {
				t.Error(err)
			}
		}
	}
	if line, err := b.Create(c); line == nil || err != nil {
		t.Fatalf("Create = %s, %v", line, err)
	}
	if err := b.Commit(); err != nil || busy != 1 {
		t.Fatalf("Commit beside a whole lock file let go = %v, after %d busy attempts; want nil after 1", err, busy)
	}
	s.crashAt = nil
	if got := getCounter(t, s, c.ID); got.Rev != 1 {
		t.Fatalf("stored %+v", got)
	}

	// A lock another writer keeps, a new record's or a claimed key's:
	// busy, nothing stored, the header given back.
	for _, keyHeld := range []bool{false, true} {
		c = newCounter(s)
		d := newCounter(s)
		unlock, err := other.lockRecord(ctx, testKind, c.ID)
		if keyHeld {
			unlock()
			unlock, err = other.lockIndex(ctx, "idx", "held")
		}
		if err != nil {
			t.Fatal(err)
		}
		queue := func() {
			for _, r := range []*counterRec{d, c} {
				if line, err := b.Create(r); line == nil || err != nil {
					t.Fatalf("Create = %s, %v", line, err)
				}
			}
			if ok, err := b.ClaimIndex("idx", "held"); !ok || err != nil {
				t.Fatalf("ClaimIndex = %v, %v", ok, err)
			}
			if err := b.SetIndex("idx", "held", c.ID); err != nil {
				t.Fatal(err)
			}
		}
		queue()
		err = b.Commit()
		if fault.Code(err) != fault.ExitTempFail {
			t.Fatalf("Commit with a lock kept elsewhere (the key's: %v) = %v (exit %d), want exit %d", keyHeld, err, fault.Code(err), fault.ExitTempFail)
		}
		if c.Rev != 0 || d.Rev != 0 || s.Exists(c.ID) || s.Exists(d.ID) {
			t.Fatalf("a refused batch stored or stamped its records: revs %d %d", c.Rev, d.Rev)
		}
		unlock()
		// The batch is empty again and takes the same records.
		queue()
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		if id, err := s.Lookup("idx", "held"); err != nil || id != c.ID {
			t.Fatalf("key = %s, %v; want %s", id, err, c.ID)
		}
	}
	assertConsistent(t, s)
}

func TestBatchCreateOfATakenID(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	c := newCounter(s)
	if err := s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	dup := &counterRec{Meta: records.Meta{Kind: testKind, ID: c.ID}, Total: 5}
	other := newCounter(s)
	b := s.NewBatch()
	for _, r := range []*counterRec{other, dup} {
		if line, err := b.Create(r); line == nil || err != nil {
			t.Fatalf("Create = %s, %v", line, err)
		}
	}
	if err := b.Commit(); !errors.Is(err, ErrExists) {
		t.Fatalf("Commit with a taken ID: %v, want ErrExists", err)
	}
	if dup.Rev != 0 || other.Rev != 0 {
		t.Fatalf("refused records' headers changed: rev %d, %d", dup.Rev, other.Rev)
	}
	if got := getCounter(t, s, c.ID); got.Total != 0 || got.Rev != 1 {
		t.Fatalf("the record in place changed: %+v", got)
	}
	if s.Exists(other.ID) {
		t.Fatal("a record of the refused batch was stored")
	}
	assertConsistent(t, s)
}

func TestBatchSettlesDeadIntents(t *testing.T) {
	testBatchSettles(t)
	withoutTmpfile(t, testBatchSettles)
}

func testBatchSettles(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	// A dead writer committed c (journal) but did not rename its intent:
	// the batch rolls it forward, and the ID is taken.
	c := newCounter(s)
	if err := s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(s.recordPath(testKind, c.ID), s.intentPath(testKind, c.ID)); err != nil {
		t.Fatal(err)
	}
	dup := &counterRec{Meta: records.Meta{Kind: testKind, ID: c.ID}}
	b := s.NewBatch()
	if line, err := b.Create(dup); line == nil || err != nil {
		t.Fatalf("Create = %s, %v", line, err)
	}
	if err := b.Commit(); !errors.Is(err, ErrExists) {
		t.Fatalf("Commit over a committed intent: %v, want ErrExists", err)
	}
	if got := getCounter(t, s, c.ID); got.Rev != 1 {
		t.Fatalf("rolled forward at rev %d", got.Rev)
	}
	// A dead writer's intent the journal does not know: discarded, and the
	// batch's record stored.
	n := newCounter(s)
	if err := os.WriteFile(s.intentPath(testKind, n.ID), []byte(`{"kind":"counter","id":"`+n.ID+`","total":99}`), 0o640); err != nil {
		t.Fatal(err)
	}
	n.Total = 7
	if line, err := b.Create(n); line == nil || err != nil {
		t.Fatalf("Create over an uncommitted intent = %s, %v", line, err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := getCounter(t, s, n.ID); got.Total != 7 || got.Rev != 1 {
		t.Fatalf("stored %+v", got)
	}
	assertConsistent(t, s)
}

// copyTree copies the files under src to dst: what a process killed at
// that moment leaves on disk (its locks die with it).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o750)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestBatchCrashWindows copies the state at each step of a batch's commit,
// as a process killed there would leave it, and opens the copy: every
// record is whole or absent, the records a crash keeps are a prefix of the
// batch's (those whose journal lines are whole), and the index keys of
// those and only those are set: recovery finishes what the intent names.
func TestBatchCrashWindows(t *testing.T) {
	testBatchCrashWindows(t, 4)
	withoutTmpfile(t, func(t *testing.T) { testBatchCrashWindows(t, 4) })
	// Every append that leaves a dead line compacting the journal: a
	// batch's lines are compacted like any others (testBatchCrashWindows
	// leaves one for the batch's append).
	t.Run("compacting", func(t *testing.T) { testBatchCrashWindows(t, 4, WithJournalLimit(1)) })
	// A batch large enough to keep its records in a pack.
	t.Run("packed", func(t *testing.T) { testBatchCrashWindows(t, defaultPackMin) })
	t.Run("packed-compacting", func(t *testing.T) { testBatchCrashWindows(t, defaultPackMin, WithJournalLimit(1)) })
}

// packsBatchOf reports whether the tests' stores pack a batch of n records
// (packMinFromEnv).
func packsBatchOf(n int) bool {
	min, err := strconv.Atoi(os.Getenv("TB_PACK_MIN"))
	if err != nil {
		min = defaultPackMin
	}
	return n >= min
}

func testBatchCrashWindows(t *testing.T, n int, opts ...Option) {
	placed := crashPutRenamed // one placed, the rest rolled forward
	if packsBatchOf(n) {
		placed = crashPackLinked // the pack linked, its lines not appended
	}
	for _, tc := range []struct {
		point string
		kept  func(int) bool // which of the n records (and their keys) recovery keeps
	}{
		{crashPutIntent, func(int) bool { return false }},
		// Half of the batch's journal bytes: the first lines whole.
		{crashJournalTorn, func(i int) bool { return i < n/2 }},
		{crashPutJournaled, func(int) bool { return true }},
		{placed, func(int) bool { return true }},
		{crashClaimCreated, func(int) bool { return true }},
		// Half of the first partition append (the pack's lines, or the
		// index keys'): the first lines whole.
		{crashPartitionTorn, func(int) bool { return true }},
	} {
		t.Run(tc.point, func(t *testing.T) {
			dir := t.TempDir()
			s := openT(t, dir, opts...)
			before := newCounter(s)
			if err := s.Create(context.Background(), before); err != nil {
				t.Fatal(err)
			}
			if len(opts) > 0 {
				// Dead lines for compactions to drop: this store's update
				// of before is compacted at once, another's (with the
				// default limit) at the batch's append.
				bump(t, s, before.ID, "here")
				other := openT(t, dir)
				bump(t, other, before.ID, "elsewhere")
				if err := other.Close(); err != nil {
					t.Fatal(err)
				}
			}
			b := s.NewBatch()
			recs, lines := queueCounters(t, s, b, n)
			r := commitCrashing(t, s, b, tc.point)
			if raw, err := r.ReadRaw(before.ID); err != nil || !bytes.Contains(raw, []byte(before.ID)) {
				t.Fatalf("record from before the batch: %s, %v", raw, err)
			}
			for i, c := range recs {
				raw, err := r.ReadRaw(c.ID)
				switch {
				case tc.kept(i) && (err != nil || !bytes.Equal(raw, lines[i])):
					t.Errorf("record %d after a crash at %s: %s, %v; want %s", i, tc.point, raw, err, lines[i])
				case !tc.kept(i) && !errors.Is(err, ErrNotFound):
					t.Errorf("record %d after a crash at %s: %s, %v; want it absent", i, tc.point, raw, err)
				}
				id, err := r.Lookup("idx", fmt.Sprintf("k%d", i))
				if tc.kept(i) != (err == nil) || err == nil && id != c.ID {
					t.Errorf("key %d after a crash at %s: %s, %v", i, tc.point, id, err)
				}
			}
			if first, _, _ := bytes.Cut(journalBytes(t, s), []byte("\n")); len(opts) > 0 && !bytes.Contains(first, []byte(`"op":"compact"`)) {
				t.Fatalf("journal not compacted: %s", first)
			}
			// The store that went on has everything.
			assertConsistent(t, s)
			for i, c := range recs {
				if id, err := s.Lookup("idx", fmt.Sprintf("k%d", i)); err != nil || id != c.ID {
					t.Errorf("key %d = %s, %v", i, id, err)
				}
			}
		})
	}
}

// TestBatchesOfTwoWritersAgree runs two stores on one directory (as two
// processes: separate lock descriptors) that claim the same keys in
// opposite orders through batches, falling back on Claim for a key the
// other holds. Every key ends with one record, and neither waits for the
// other while it holds a lock (or the test would hang).
func TestBatchesOfTwoWritersAgree(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const keys = 300
	claimed := make([]map[string]string, 2)
	twoWriters(t, dir, keys, func(w int, s *Store, key func(int) string) error {
		claimed[w] = make(map[string]string)
		b := s.NewBatch()
		var queued []string
		commit := func() error {
			err := b.Commit()
			for _, k := range queued {
				if id, lerr := s.Lookup("idx", k); lerr == nil {
					claimed[w][k] = id
				} else if err == nil {
					err = lerr
				}
			}
			queued = queued[:0]
			return err
		}
		for i := range keys {
			k := key(i)
			ok, err := b.TryLockIndex("idx", k)
			if err != nil {
				return err
			}
			if ok {
				if _, err := s.Lookup("idx", k); errors.Is(err, ErrNotFound) {
					c := newCounter(s)
					if line, err := b.Create(c); line == nil || err != nil {
						return fmt.Errorf("Create: %s, %v", line, err)
					}
					if err := b.SetIndex("idx", k, c.ID); err != nil {
						return err
					}
					queued = append(queued, k)
					if len(queued) == 16 {
						if err := commit(); err != nil {
							return err
						}
					}
					continue
				}
			}
			// Held by the other writer, or there already: commit (the
			// batch may hold this key) and claim it the ordinary way.
			if err := commit(); err != nil {
				return err
			}
			id, _, err := s.Claim(ctx, "idx", k, func() (records.Record, error) {
				return newCounter(s), nil
			})
			if err != nil {
				return err
			}
			claimed[w][k] = id
		}
		return commit()
	})
	s := openT(t, dir)
	for i := range keys {
		k := fmt.Sprintf("k%d", i)
		id, err := s.Lookup("idx", k)
		if err != nil || claimed[0][k] != id || claimed[1][k] != id {
			t.Fatalf("key %s: index %s (%v), writers saw %s and %s", k, id, err, claimed[0][k], claimed[1][k])
		}
	}
	assertConsistent(t, s)
}

// TestClaimedKeysOfTwoWritersAgree: two writers (stores of their own, as
// two tb-parse without --merge) set the same keys at once through claimed
// keys, locked at their commits: every commit goes through, and every key
// ends naming a record one of them stored, consistently.
func TestClaimedKeysOfTwoWritersAgree(t *testing.T) {
	dir := t.TempDir()
	const keys = 300
	created := make([]map[string]bool, 2)
	twoWriters(t, dir, keys, func(w int, s *Store, key func(int) string) error {
		created[w] = make(map[string]bool)
		b := s.NewBatch()
		for i := range keys {
			k := key(i)
			if ok, err := b.ClaimIndex("idx", k); !ok || err != nil {
				return fmt.Errorf("ClaimIndex = %v, %v", ok, err)
			}
			c := newCounter(s)
			if line, err := b.Create(c); line == nil || err != nil {
				return fmt.Errorf("Create: %s, %v", line, err)
			}
			if err := b.SetIndex("idx", k, c.ID); err != nil {
				return err
			}
			created[w][c.ID] = true
			if i%16 == 15 {
				if err := b.Commit(); err != nil {
					return err
				}
			}
		}
		return b.Commit()
	})
	s := openT(t, dir)
	for i := range keys {
		id, err := s.Lookup("idx", fmt.Sprintf("k%d", i))
		if err != nil || !created[0][id] && !created[1][id] || !s.Exists(id) {
			t.Fatalf("k%d names %q (%v), a record neither writer stored", i, id, err)
		}
	}
	assertConsistent(t, s)
}

// twoWriters runs write for writers 0 and 1 at once, each with a store of
// its own on dir (separate lock descriptors, as two processes); key gives
// the i-th of n keys, writer 1 taking them in writer 0's reverse order.
func twoWriters(t *testing.T, dir string, n int, write func(w int, s *Store, key func(int) string) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := range 2 {
		s := openT(t, dir)
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := func(i int) string {
				if w == 1 {
					i = n - 1 - i
				}
				return fmt.Sprintf("k%d", i)
			}
			if err := write(w, s, key); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestPutBlobBytes(t *testing.T) {
	testPutBlobBytes(t)
	withoutTmpfile(t, testPutBlobBytes)
}

func testPutBlobBytes(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	data := []byte("content of a sample held in memory")
	sum := sha256.Sum256(data)
	sha := hex.EncodeToString(sum[:])
	blob, err := s.PutBlobBytes(ctx, sha, data)
	if err != nil || blob.SHA256 != sha || blob.Size != int64(len(data)) {
		t.Fatalf("PutBlobBytes = %+v, %v", blob, err)
	}
	st, err := os.Stat(s.BlobPath(sha))
	if err != nil || st.Mode().Perm() != 0o444 {
		t.Fatalf("blob file: %v, %v", st, err)
	}
	got, err := os.ReadFile(s.BlobPath(sha))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("blob content %q, %v", got, err)
	}
	// Stored again: nothing written (the file is the same inode).
	if _, err := s.PutBlobBytes(ctx, sha, data); err != nil {
		t.Fatal(err)
	}
	if st2, err := os.Stat(s.BlobPath(sha)); err != nil || !os.SameFile(st, st2) {
		t.Fatalf("blob rewritten: %v", err)
	}
	// A blob cut short (a power cut before Flush) is replaced.
	if err := os.Remove(s.BlobPath(sha)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.BlobPath(sha), data[:5], 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBlobBytes(ctx, sha, data); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(s.BlobPath(sha)); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("short blob not replaced: %q, %v", got, err)
	}
	if ents, _ := os.ReadDir(s.Path("tmp")); len(ents) > 0 {
		t.Fatalf("tmp/ not empty: %v", ents)
	}
	// A crash before the link leaves nothing.
	other := []byte("another sample")
	osum := sha256.Sum256(other)
	osha := hex.EncodeToString(osum[:])
	snap := filepath.Join(t.TempDir(), "snap")
	s.crashAt = func(point string) {
		if point == crashBlobTemp {
			copyTree(t, s.Root(), snap)
		}
	}
	if _, err := s.PutBlobBytes(ctx, osha, other); err != nil {
		t.Fatal(err)
	}
	s.crashAt = nil
	r := openT(t, snap)
	if r.HasBlob(osha) {
		t.Fatal("blob present after a crash before its link")
	}
	if ents, _ := os.ReadDir(r.Path("tmp")); len(ents) > 0 && !noTmpfile {
		// (Without O_TMPFILE the content waits in tmp/, as PutBlob's does.)
		t.Fatalf("crash left %v in tmp/", ents)
	}
	rep, err := s.Check(ctx, CheckOptions{Blobs: true})
	if err != nil || !rep.OK() || rep.Blobs != 2 {
		t.Fatalf("Check = %+v, %v", rep, err)
	}
}

// BenchmarkSampleWrites stores what tb-plan stores per new sample — a blob,
// two records and an index key, in batches of 64 — and, as "files", does
// only the file operations that costs (the blob, the key and each record
// as an unnamed file linked into place), with nothing else: the floor the state's layout sets. Set
// TB_BENCH_STATE to a directory on the filesystem to measure.
func BenchmarkSampleWrites(b *testing.B) {
	base := os.Getenv("TB_BENCH_STATE")
	newDir := func(b *testing.B) string {
		if base == "" {
			return b.TempDir()
		}
		dir, err := os.MkdirTemp(base, "bench")
		if err != nil {
			b.Fatal(err)
		}
		return dir // kept: removing many files slows what runs next on ext4
	}
	content := make([]byte, 4700)
	rec := bytes.Repeat([]byte("x"), 1200)
	b.Run("state", func(b *testing.B) {
		ctx := context.Background()
		s := openT(b, newDir(b), WithDurability(SyncOnFlush))
		batch := s.NewBatch()
		for i := range b.N {
			copy(content, fmt.Sprintf("sample %012d", i))
			sum := sha256.Sum256(content)
			sha := hex.EncodeToString(sum[:])
			if _, err := s.PutBlobBytes(ctx, sha, content); err != nil {
				b.Fatal(err)
			}
			smp, pl := newCounter(s), newCounter(s)
			smp.Note, pl.Note = string(rec), string(rec)
			for _, r := range []*counterRec{smp, pl} {
				if line, err := batch.Create(r); line == nil || err != nil {
					b.Fatal(err)
				}
			}
			if ok, err := batch.TryLockIndex("bench", sha); !ok || err != nil {
				b.Fatal(err)
			}
			if err := batch.SetIndex("bench", sha, smp.ID); err != nil {
				b.Fatal(err)
			}
			if i%64 == 63 {
				if err := batch.Commit(); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := batch.Commit(); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("files", func(b *testing.B) {
		root := newDir(b)
		s := openT(b, root, WithDurability(SyncOnFlush))
		for _, d := range []string{"index", "records/a", "records/b"} {
			mkdirT(b, root, d)
		}
		for i := range 256 {
			mkdirT(b, root, "blobs", fmt.Sprintf("%02x", i))
		}
		for i := range b.N {
			name := fmt.Sprintf("%064d", i)
			blobs := filepath.Join(root, "blobs", fmt.Sprintf("%02x", i%256))
			for _, f := range []struct {
				dir  string
				data []byte
			}{
				{blobs, content}, {filepath.Join(root, "index"), []byte(name[:34])},
				{filepath.Join(root, "records", "a"), rec}, {filepath.Join(root, "records", "b"), rec},
			} {
				if ok, err := s.linkTmpfile(f.dir, filepath.Join(f.dir, name), f.data, 0o444, ""); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		}
	})
}

// A batch refuses an index key it holds already, and a key whose lock it
// did not take, on both backends: PostgreSQL grants an advisory lock again
// to the transaction that holds it, so its batch keeps the keys it took.
// tb-parse relies on it: an observable emitted twice by one run is written
// on its own the second time, never queued twice under one key.
func TestBatchRefusesAKeyItHolds(t *testing.T) { eachBackend(t, batchRefusesAKeyItHolds) }

func batchRefusesAKeyItHolds(t *testing.T, be testBackend) {
	s := openT(t, t.TempDir(), be.opts()...)
	b := s.NewBatch()
	if ok, err := b.TryLockIndex("idx", "k"); !ok || err != nil {
		t.Fatalf("TryLockIndex of a free key = %v, %v", ok, err)
	}
	if ok, err := b.TryLockIndex("idx", "k"); ok || err != nil {
		t.Fatalf("TryLockIndex of a key the batch holds = %v, %v", ok, err)
	}
	c := newCounter(s)
	if line, err := b.Create(c); line == nil || err != nil {
		t.Fatalf("Create = %s, %v", line, err)
	}
	if err := b.SetIndex("idx", "unlocked", c.ID); err == nil {
		t.Fatal("SetIndex of a key the batch does not hold succeeded")
	}
	if err := b.SetIndex("idx", "k", c.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if id, err := s.Lookup("idx", "k"); err != nil || id != c.ID {
		t.Fatalf("Lookup = %s, %v", id, err)
	}
	if ok, err := b.TryLockIndex("idx", "k"); !ok || err != nil {
		t.Fatalf("TryLockIndex after Commit = %v, %v", ok, err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestBatchLookup: a batch's Lookup of a key it holds names the key's
// record, whether the key has its own file or a batch's line; a key that
// names nothing is ErrNotFound; a key whose record was deleted is
// ErrNotFound at Lookup or at the Update that reads the record (the
// directory does not look for the record at Lookup: Update does).
func TestBatchLookup(t *testing.T) { eachBackend(t, batchLookup) }

func batchLookup(t *testing.T, be testBackend) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), be.opts()...)
	own := newCounter(s) // its key a file of its own (a single write's)
	if err := s.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	if err := s.SetIndex("idx", "own", own.ID); err != nil {
		t.Fatal(err)
	}
	gone := newCounter(s)
	if err := s.Create(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if err := s.SetIndex("idx", "gone", gone.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	line := newCounter(s) // its key a batch's line
	if ok, err := b.ClaimIndex("idx", "line"); !ok || err != nil {
		t.Fatalf("ClaimIndex = %v, %v", ok, err)
	}
	if l, err := b.Create(line); l == nil || err != nil {
		t.Fatalf("Create = %s, %v", l, err)
	}
	if err := b.SetIndex("idx", "line", line.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"own", "line", "gone", "absent"} {
		if ok, err := b.TryLockIndex("idx", k); !ok || err != nil {
			t.Fatalf("TryLockIndex %s = %v, %v", k, ok, err)
		}
	}
	for k, want := range map[string]string{"own": own.ID, "line": line.ID} {
		if id, err := b.Lookup("idx", k); id != want || err != nil {
			t.Errorf("Lookup %s = %s, %v; want %s", k, id, err, want)
		}
	}
	if id, err := b.Lookup("idx", "absent"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup of a key never set = %s, %v; want ErrNotFound", id, err)
	}
	if id, err := b.Lookup("idx", "gone"); err == nil {
		if id != gone.ID {
			t.Errorf("Lookup of a key whose record was deleted = %s; want %s or ErrNotFound", id, gone.ID)
		}
		if _, err := b.Update(id, &counterRec{}, func() error { return nil }); !errors.Is(err, ErrNotFound) {
			t.Errorf("Update of the deleted record the key names: %v, want ErrNotFound", err)
		}
	} else if !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup of a key whose record was deleted: %v", err)
	}
	if be.url == "" {
		// A key that names a record, but another batch's.
		if id, err := s.NewBatch().Lookup("idx", "own"); err == nil {
			t.Errorf("Lookup of a key the batch does not hold = %s", id)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
}

// A writer that has just appended its batch's pack lines adds them to its
// own read of the kind's lines instead of reading them back; it must not
// when another writer appended lines between its last read and its own:
// those would be skipped, and the other writer's records unknown to it.
func TestPackLinesOfAnotherWriterBetween(t *testing.T) {
	dir := t.TempDir()
	a, other := openT(t, dir), openT(t, dir)
	a.packMin, other.packMin = 1, 1
	// a holds the lock file of each of its new records whole while it
	// commits, and here it waits, in the hook, for the other writer's
	// commit: the other writer's records are kept out of those files, or it
	// would wait out newLockPatience for a (a writer that does meet them
	// waits: TestBatchLocksNewRecordsAtCommit).
	committing := map[int]bool{}
	commit := func(s *Store, n int) []string {
		t.Helper()
		b := s.NewBatch()
		var ids []string
		for len(ids) < n {
			c := newCounter(s)
			if s == other && committing[lockShard(c.ID)] {
				continue
			}
			if line, err := b.Create(c); line == nil || err != nil {
				t.Fatalf("Create = %s, %v", line, err)
			}
			ids = append(ids, c.ID)
			if s == a {
				committing[lockShard(c.ID)] = true
			}
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	ids := commit(a, 2)
	clear(committing)
	a.crashAt = func(point string) {
		if point == crashPackLinked {
			a.crashAt = nil
			ids = append(ids, commit(other, 3)...)
		}
	}
	ids = append(ids, commit(a, 2)...)
	if len(ids) != 7 {
		t.Fatalf("%d records stored, want 7", len(ids))
	}
	for _, s := range []*Store{a, other, openT(t, dir)} {
		for _, id := range ids {
			if _, err := s.ReadRaw(id); err != nil {
				t.Fatalf("%v (read by a store that wrote some of them)", err)
			}
		}
		var c counterRec
		if err := s.Get(ids[len(ids)-1], &c); err != nil || c.Rev != 1 {
			t.Fatalf("Get = %+v, %v", c, err)
		}
	}
}

func TestDirStats(t *testing.T) {
	root := t.TempDir()
	small, large := filepath.Join(root, "small"), filepath.Join(root, "large")
	for _, d := range []string{small, large} {
		if err := os.Mkdir(d, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "there"), nil, 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/nonexistent", filepath.Join(d, "dangling")); err != nil {
			t.Fatal(err)
		}
	}
	// Past dirListMax: asked name by name.
	for i := 0; ; i++ {
		var st unix.Stat_t
		if err := unix.Stat(large, &st); err != nil {
			t.Fatal(err)
		}
		if st.Size > dirListMax {
			break
		}
		if err := os.WriteFile(filepath.Join(large, fmt.Sprintf("filler-%04d-%s", i, strings.Repeat("x", 40))), nil, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	var d dirStats
	defer d.close()
	for _, c := range []struct {
		dir, name string
		want      bool
	}{
		{small, "there", true}, {small, "dangling", true}, {small, "absent", false},
		{large, "there", true}, {large, "dangling", true}, {large, "absent", false},
		{filepath.Join(root, "none"), "there", false},
	} {
		got, err := d.exists(c.dir, c.name)
		if err != nil || got != c.want {
			t.Errorf("exists(%s, %s) = %v, %v; want %v", filepath.Base(c.dir), c.name, got, err, c.want)
		}
	}
	if d.dirs[small].names == nil || d.dirs[large].names != nil {
		t.Fatal("the small directory was not read whole, or the large one was")
	}
}

// storedCounters stores n counters: one by one (each its own file) or, with
// packed, in one batch that packs them. It returns them with their lines.
func storedCounters(t *testing.T, s *Store, n int, packed bool) ([]*counterRec, [][]byte) {
	t.Helper()
	var recs []*counterRec
	var lines [][]byte
	if !packed {
		for range n {
			c := newCounter(s)
			if err := s.Create(context.Background(), c); err != nil {
				t.Fatal(err)
			}
			raw, err := s.ReadRaw(c.ID)
			if err != nil {
				t.Fatal(err)
			}
			recs, lines = append(recs, c), append(lines, raw)
		}
		return recs, lines
	}
	saved := s.packMin
	s.packMin = 1
	defer func() { s.packMin = saved }()
	b := s.NewBatch()
	recs, lines = queueCounters(t, s, b, n)
	lines = cloneLines(lines)
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.rec.(*dirStore).packed(testKind, recs[0].ID); !ok || err != nil {
		t.Fatalf("not packed: %v", err)
	}
	return recs, lines
}

// queueUpdates queues an update of each counter in b and returns the lines.
func queueUpdates(t *testing.T, b *Batch, recs []*counterRec) [][]byte {
	t.Helper()
	var lines [][]byte
	for i, c := range recs {
		cur := &counterRec{}
		line, err := b.Update(c.ID, cur, func() error {
			cur.Total += 100 + i
			cur.Note = "updated in a batch"
			return nil
		})
		if err != nil || line == nil {
			t.Fatalf("Update %d = %q, %v", i, line, err)
		}
		lines = append(lines, line)
	}
	return lines
}

// A batch's update is stored as Store.Update would store it, whether the
// stored version is its own file or a pack's copy, and whether the batch
// packs or not.
func TestBatchUpdatesWhatSingleWritesWould(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		c := pgtest.Start(t, pgtest.WithoutFsync())
		batchUpdatesWhatSingleWritesWould(t, openT(t, t.TempDir(), WithShared(c.NewDatabase(t))), 4, false,
			openT(t, t.TempDir(), WithShared(c.NewDatabase(t))))
	})
	for _, prev := range []string{"loose", "packed"} {
		for _, n := range []int{4, defaultPackMin} {
			t.Run(fmt.Sprintf("%s/%d", prev, n), func(t *testing.T) {
				batchUpdatesWhatSingleWritesWould(t, openT(t, t.TempDir()), n, prev == "packed", openT(t, t.TempDir()))
			})
		}
	}
}

// batchUpdatesWhatSingleWritesWould updates n counters of s in a batch,
// and the same counters one by one in single, an empty store.
func batchUpdatesWhatSingleWritesWould(t *testing.T, s *Store, n int, packed bool, single *Store) {
	ctx := context.Background()
	recs, _ := storedCounters(t, s, n, packed)
	b := s.NewBatch()
	lines := queueUpdates(t, b, recs)
	for _, c := range recs {
		if got := getCounter(t, s, c.ID); got.Rev != 1 {
			t.Fatalf("%s updated before Commit: %+v", c.ID, got)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	// The same updates one by one, in a second store, give the
	// same records but for updated_at.
	for i, c := range recs {
		raw, err := s.ReadRaw(c.ID)
		if err != nil || !bytes.Equal(raw, lines[i]) {
			t.Fatalf("stored %s = %s, %v; Update returned %s", c.ID, raw, err, lines[i])
		}
		got := getCounter(t, s, c.ID)
		if got.Rev != 2 || got.Total != 100+i || got.Note == "" || !got.CreatedAt.Equal(c.CreatedAt) {
			t.Fatalf("stored %+v", got)
		}
		want := &counterRec{Meta: records.Meta{Kind: testKind, ID: c.ID, CreatedAt: c.CreatedAt}, Seq: c.Seq}
		if err := single.Create(ctx, want); err != nil {
			t.Fatal(err)
		}
		if err := single.Update(ctx, c.ID, want, func(bool) error { want.Total += 100 + i; want.Note = "updated in a batch"; return nil }); err != nil {
			t.Fatal(err)
		}
		want.UpdatedAt = got.UpdatedAt
		if wb, _ := records.Marshal(want); !bytes.Equal(wb, raw) {
			t.Fatalf("batch stored\n%s\na single update\n%s", raw, wb)
		}
	}
	// The journal has the new versions.
	state, _, err := s.Replay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range recs {
		if !bytes.Equal(state[c.ID], lines[i]) {
			t.Fatalf("journal's %s = %s, stored %s", c.ID, state[c.ID], lines[i])
		}
	}
	if _, ok := s.rec.(*dirStore); ok {
		assertConsistent(t, s)
		assertConsistent(t, openT(t, s.Root()))
	}
}

func TestBatchUpdateRefusals(t *testing.T) { eachBackend(t, batchUpdateRefusals) }

func batchUpdateRefusals(t *testing.T, be testBackend) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), be.opts()...)
	recs, _ := storedCounters(t, s, 2, false)
	b := s.NewBatch()
	queueUpdates(t, b, recs[:1])
	var cur counterRec
	// The same record again: refused.
	if line, err := b.Update(recs[0].ID, &cur, func() error { return nil }); line != nil || err != nil {
		t.Fatalf("second update in a batch = %s, %v", line, err)
	}
	// A record another writer holds: refused.
	other := openT(t, s.Root(), be.opts()...)
	held := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- other.Update(ctx, recs[1].ID, &counterRec{}, func(bool) error {
			close(held)
			<-release
			return ErrNoChange
		})
	}()
	<-held
	if line, err := b.Update(recs[1].ID, &cur, func() error { return nil }); line != nil || err != nil {
		t.Fatalf("update of a record another writer holds = %s, %v", line, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A record that is not stored.
	absent := newCounter(s)
	if _, err := b.Update(absent.ID, &cur, func() error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("update of an absent record: %v, want ErrNotFound", err)
	}
	// fn's error: nothing queued.
	boom := errors.New("boom")
	c := newCounter(s)
	if err := s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Update(c.ID, &cur, func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("fn's error: %v", err)
	}
	if be.url != "" {
		// A worker (or a cycle) keeps the fleet's keys and wakes its
		// workers as it is written: on PostgreSQL it is written on its own.
		w := &records.Worker{Host: "host-a", Slots: 1}
		records.Init(w, records.KindWorker, s.Now())
		if err := s.Create(ctx, w); err != nil {
			t.Fatal(err)
		}
		if line, err := b.Update(w.ID, &records.Worker{}, func() error { return nil }); line != nil || err != nil {
			t.Fatalf("update of a worker in a PostgreSQL batch = %s, %v", line, err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := getCounter(t, s, recs[0].ID); got.Rev != 2 {
		t.Fatalf("the queued update: %+v", got)
	}
	for _, id := range []string{recs[1].ID, c.ID} {
		if got := getCounter(t, s, id); got.Rev != 1 {
			t.Fatalf("%s updated: %+v", id, got)
		}
	}
	assertConsistent(t, s)
}

// TestBatchUpdateCrashWindows is TestBatchCrashWindows for a batch of
// updates: after a crash at each step, every record is its old version or
// its new one as a whole (a prefix of the batch new), whether its old
// version was its own file or a pack's copy, and the files agree with the
// journal.
func TestBatchUpdateCrashWindows(t *testing.T) {
	for _, prev := range []string{"loose", "packed"} {
		for _, n := range []int{4, defaultPackMin} {
			t.Run(fmt.Sprintf("%s/%d", prev, n), func(t *testing.T) { testBatchUpdateCrashWindows(t, n, prev == "packed") })
		}
	}
}

func testBatchUpdateCrashWindows(t *testing.T, n int, prevPacked bool) {
	// A batch of new versions of records with files of their own has
	// nothing to pack: it gives them files.
	placed := crashPutRenamed
	if packsBatchOf(n) && prevPacked {
		placed = crashPackLinked
	}
	points := []struct {
		point string
		kept  func(int) bool
	}{
		{crashPutIntent, func(int) bool { return false }},
		// Half of the batch's journal bytes: the lines whole in the
		// journal that recovery kept (a prefix: checked below).
		{crashJournalTorn, nil},
		{crashPutJournaled, func(int) bool { return true }},
		{placed, func(int) bool { return true }},
		{crashClaimCreated, func(int) bool { return true }},
	}
	if packsBatchOf(n) && prevPacked {
		points = append(points, struct {
			point string
			kept  func(int) bool
		}{crashPartitionTorn, func(int) bool { return true }})
	}
	for _, tc := range points {
		t.Run(tc.point, func(t *testing.T) {
			s := openT(t, t.TempDir())
			recs, old := storedCounters(t, s, n, prevPacked)
			b := s.NewBatch()
			lines := cloneLines(queueUpdates(t, b, recs))
			r := commitCrashing(t, s, b, tc.point)
			kept := tc.kept
			if kept == nil {
				j := journalBytes(t, r)
				kept = func(i int) bool {
					return bytes.Contains(j, append(append([]byte(`"record":`), lines[i]...), '}'))
				}
				if !kept(0) || kept(n-1) {
					t.Fatalf("a torn journal append kept the first record: %v, the last: %v", kept(0), kept(n-1))
				}
				for i := 1; i < n; i++ {
					if kept(i) && !kept(i-1) {
						t.Fatalf("record %d kept, %d not", i, i-1)
					}
				}
			}
			for i, c := range recs {
				want := old[i]
				if kept(i) {
					want = lines[i]
				}
				if raw, err := r.ReadRaw(c.ID); err != nil || !bytes.Equal(raw, want) {
					t.Errorf("record %d after a crash at %s: %s, %v; want %s", i, tc.point, raw, err, want)
				}
			}
			assertConsistent(t, s)
		})
	}
}

// packBytes is the size of the pack files in a state directory.
func packBytes(t *testing.T, root string) int64 {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(root, "packs"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && !e.IsDir() {
			n += fi.Size()
		}
	}
	return n
}

// New versions of packed records go into packs only while the kind's
// stale copies stay within its live bytes (and the slack): a lease's
// observables merged cycle after cycle do not grow the packs without
// bound; past the budget they get files, which later versions rewrite.
func TestBatchUpdatesBoundPackGrowth(t *testing.T) {
	s := openT(t, t.TempDir())
	s.packSlack = 0
	recs, _ := storedCounters(t, s, defaultPackMin, true)
	saved := s.packMin
	s.packMin = 1
	defer func() { s.packMin = saved }()
	sizes := []int64{packBytes(t, s.Root())}
	for round := range 4 {
		b := s.NewBatch()
		queueUpdates(t, b, recs)
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, packBytes(t, s.Root()))
		for _, c := range recs {
			if got := getCounter(t, s, c.ID); got.Rev != int64(round+2) {
				t.Fatalf("round %d: %+v", round, got)
			}
		}
	}
	// The first round's versions are packed (the stale copies they leave
	// are as many bytes as the live ones); the next would double them: the
	// batches give files instead, and are not packed at all.
	if sizes[1] <= sizes[0] || sizes[4] != sizes[1] {
		t.Fatalf("pack bytes after the creates and each round of updates: %v", sizes)
	}
	for i, c := range recs {
		if _, err := os.Stat(s.recordPath(testKind, c.ID)); err != nil {
			t.Fatalf("record %d has no file after the budget was spent: %v", i, err)
		}
	}
	assertConsistent(t, s)
	assertConsistent(t, openT(t, s.Root()))
}

// cloneLines copies a batch's lines, which live until it is used again.
func cloneLines(lines [][]byte) [][]byte {
	out := make([][]byte, len(lines))
	for i, l := range lines {
		out[i] = slices.Clone(l)
	}
	return out
}

// commitCrashing commits b while s's directory is copied as it is at
// point, as a crash there would leave it, and returns the copy opened
// (recovered) and found consistent.
func commitCrashing(t *testing.T, s *Store, b *Batch, point string) *Store {
	t.Helper()
	snap := filepath.Join(t.TempDir(), "snap")
	s.crashAt = func(p string) {
		if p == point {
			if _, err := os.Stat(snap); err != nil {
				copyTree(t, s.Root(), snap)
			}
		}
	}
	err := b.Commit()
	s.crashAt = nil
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(snap); err != nil {
		t.Fatalf("no crash at %s: %v", point, err)
	}
	r := openT(t, snap)
	assertConsistent(t, r)
	return r
}

// Readers of packed records across more packs than a store keeps open, at
// once: every read gives the record's bytes, whether its pack was open,
// opened, or closed under it to make room (openPack).
func TestPackFilesReadConcurrently(t *testing.T) {
	s := openT(t, t.TempDir())
	s.packMin = 1
	var ids []string
	want := map[string][]byte{}
	for range maxPackFiles + 8 {
		recs, lines := storedCounters(t, s, 2, true)
		for i, c := range recs {
			ids = append(ids, c.ID)
			want[c.ID] = lines[i]
		}
	}
	r := openT(t, s.Root())
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 * len(ids) {
				id := ids[(i*7+g*13)%len(ids)]
				raw, err := r.ReadRaw(id)
				if err != nil || !bytes.Equal(raw, want[id]) {
					errs <- fmt.Errorf("%s: %s, %v; want %s", id, raw, err, want[id])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := len(r.rec.(*dirStore).packFiles); n == 0 || n > maxPackFiles {
		t.Fatalf("%d packs open, want 1 to %d", n, maxPackFiles)
	}
}

// TestKeyLinesAreJSON: an intent's key lines, written by hand, are what
// encoding/json writes for the key (recovery decodes them with it).
func TestKeyLinesAreJSON(t *testing.T) {
	for _, k := range []batchKey{
		{Op: opIndex, Index: "observable", Key: "0123abcdef", ID: "observable_01JD0000000000000000000001"},
		{Op: opIndex, Index: "flow_log", Key: "a.b_c:d-e", ID: "flowlog_01JD0000000000000000000002"},
	} {
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(k); err != nil {
			t.Fatal(err)
		}
		if got := appendKeyLine(nil, &k); string(got) != want.String() {
			t.Errorf("key line %q, encoding/json writes %q", got, want.String())
		}
	}
}

// byteLock is a record's or key's lock as another writer takes it.
type byteLock struct{ path, name string }

// free reports whether another writer could take the lock now (and lets it
// go again at once).
func (l byteLock) free(ctx context.Context) (bool, error) {
	unlock, ok, err := lockFile(ctx, l.path, lockOffset(l.name), false)
	if ok {
		unlock()
	}
	return ok, err
}

// TestBatchLocksAreSingleWritersLocks: whatever shard of the lock files a
// key falls in, a batch that locked it as it queued it (TryLockIndex) holds
// the very byte a single writer (another process) locks for it, for enough
// keys to fill every shard several times over, and lets it go at Commit.
// New records' and claimed keys' locks, taken by Commit:
// TestBatchLocksNewRecordsAtCommit.
func TestBatchLocksAreSingleWritersLocks(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openT(t, dir)
	other := openT(t, dir)
	b := s.NewBatch()
	var held []byteLock
	for i := range 8 * lockShards {
		c := newCounter(s)
		if line, err := b.Create(c); line == nil || err != nil {
			t.Fatalf("Create = %s, %v", line, err)
		}
		key := fmt.Sprintf("key-%d", i)
		if ok, err := b.TryLockIndex("idx", key); !ok || err != nil {
			t.Fatalf("TryLockIndex = %v, %v", ok, err)
		}
		held = append(held, byteLock{other.indexLockPath("idx", key), key})
	}
	for _, l := range held {
		if ok, err := l.free(ctx); ok || err != nil {
			t.Fatalf("a single writer took %s in %s while the batch held it (%v)", l.name, l.path, err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, l := range held {
		if ok, err := l.free(ctx); !ok || err != nil {
			t.Fatalf("%s still held after Commit (%v)", l.name, err)
		}
	}
}

// TestBatchDiscard: a discarded batch stores nothing of what it queued (a
// new record and its key, a merge into a stored record), gives the
// records their headers back, and lets go of its locks: another writer
// then takes them at once.
func TestBatchDiscard(t *testing.T) { eachBackend(t, batchDiscard) }

func batchDiscard(t *testing.T, be testBackend) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openT(t, dir, be.opts()...)
	old := newCounter(s)
	if err := s.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := s.SetIndex("idx", "merge", old.ID); err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	for round := range 2 { // a batch is reusable after Discard
		if ok, err := b.TryLockIndex("idx", "merge"); !ok || err != nil {
			t.Fatalf("round %d: TryLockIndex = %v, %v", round, ok, err)
		}
		var cur counterRec
		if line, err := b.Update(old.ID, &cur, func() error { cur.Total = 7; return nil }); line == nil || err != nil {
			t.Fatalf("round %d: Update = %s, %v", round, line, err)
		}
		c := newCounter(s)
		saved := c.Meta
		if ok, err := b.ClaimIndex("idx", "new"); !ok || err != nil {
			t.Fatalf("round %d: ClaimIndex = %v, %v", round, ok, err)
		}
		if line, err := b.Create(c); line == nil || err != nil {
			t.Fatalf("round %d: Create = %s, %v", round, line, err)
		}
		if err := b.SetIndex("idx", "new", c.ID); err != nil {
			t.Fatal(err)
		}
		b.Discard()
		if !b.Idle() {
			t.Fatalf("round %d: batch not empty after Discard", round)
		}
		if c.Rev != saved.Rev || !c.CreatedAt.Equal(saved.CreatedAt) || !c.UpdatedAt.Equal(saved.UpdatedAt) || c.V != saved.V {
			t.Fatalf("round %d: header %+v after Discard, was %+v", round, c.Meta, saved)
		}
		if s.Exists(c.ID) {
			t.Fatalf("round %d: a discarded record was stored", round)
		}
		if _, err := s.Lookup("idx", "new"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("round %d: Lookup of a discarded key = %v", round, err)
		}
		if got := getCounter(t, s, old.ID); got.Total != 0 || got.Rev != old.Rev {
			t.Fatalf("round %d: a discarded merge was stored: %+v", round, got)
		}
	}
	other := openT(t, dir, be.opts()...) // another writer: its own descriptors and connections
	ob := other.NewBatch()
	if ok, err := ob.TryLockIndex("idx", "merge"); !ok || err != nil {
		t.Fatalf("another writer's TryLockIndex after Discard = %v, %v", ok, err)
	}
	var cur counterRec
	if line, err := ob.Update(old.ID, &cur, func() error { cur.Total = 8; return nil }); line == nil || err != nil {
		t.Fatalf("another writer's Update after Discard = %s, %v", line, err)
	}
	if err := ob.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := getCounter(t, s, old.ID); got.Total != 8 {
		t.Fatalf("stored %+v", got)
	}
}

// TestBatchStartsItsWriteback: under SyncOnFlush a batch of 64 records
// of 16 KiB (1 MiB in the journal, 1 MiB in its pack) leaves none of its
// whole pages dirty once committed: their writeback was started then
// (startWriteback), not left to the Flush's syncfs. cachestat(2) counts a
// file's dirty pages in the page cache; the kernel's own flusher would
// not have written them for 30 s.
func TestBatchStartsItsWriteback(t *testing.T) {
	s := openT(t, t.TempDir(), WithDurability(SyncOnFlush))
	b := s.NewBatch()
	for i := range 64 {
		c := newCounter(s)
		c.Seq, c.Note = i, strings.Repeat("x", 16<<10)
		if _, err := b.Create(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	packs, err := filepath.Glob(filepath.Join(s.Root(), "packs", "*"+batchIntentSuffix))
	if err != nil || len(packs) == 0 {
		t.Fatalf("no pack file (%v)", err)
	}
	for _, path := range append(packs, filepath.Join(s.Root(), "journal", "journal.jsonl")) {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var cs unix.Cachestat_t
		err = unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0)
		f.Close()
		if errors.Is(err, unix.ENOSYS) {
			t.Skip("cachestat(2) needs Linux 6.5")
		}
		if err != nil {
			t.Fatal(err)
		}
		// The last page, partly written, is left for the next append.
		if cs.Cache < 256 || cs.Dirty > 1 {
			t.Errorf("%s: %d of its %d cached pages dirty after the commit (%d under writeback)", path, cs.Dirty, cs.Cache, cs.Writeback)
		}
	}
}
