package state

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// TestFlushSyncsEveryWrite: under SyncOnFlush, every file and directory
// that a write of any kind created or changed is among what Flush fsyncs.
// Flush syncs only those (not the file system), so one a write forgot to
// note would be lost to a power cut after a Flush that said it was safe.
// The state is walked before and after a mix of writes: single creates,
// updates and deletes, index keys, claims, batches packed and not, blobs
// from a reader and from a writer; each path whose inode, size or times
// changed, or that is new, must be noted. Lock files and tmp/ hold nothing
// a reader needs.
func TestFlushSyncsEveryWrite(t *testing.T) {
	testFlushSyncsEveryWrite(t)
	withoutTmpfile(t, testFlushSyncsEveryWrite)
}

func testFlushSyncsEveryWrite(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s := openT(t, root, WithDurability(SyncOnFlush))
	// From the directories Open makes: the journal's first line, the
	// first record of a kind and the first key of an index are among the
	// writes.
	before := walkState(t, root)
	old, gone := newCounter(s), newCounter(s)
	for _, c := range []*counterRec{old, gone} {
		if err := s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	fresh := newCounter(s)
	if err := s.Create(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, old.ID, &counterRec{}, func(bool) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.SetIndex("idx", "single", fresh.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Claim(ctx, "claims", "one", func() (records.Record, error) { return newCounter(s), nil }); err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	queueCounters(t, s, b, 5) // fewer than a pack takes: record files
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	saved := s.packMin
	s.packMin = 1
	b = s.NewBatch()
	queueCounters(t, s, b, 5) // packed
	err := b.Commit()
	s.packMin = saved
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBlob(ctx, strings.NewReader("a blob from a reader")); err != nil {
		t.Fatal(err)
	}
	w, err := s.CreateBlob()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(bytes.Repeat([]byte("a flow log "), 1000)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}

	s.unsynced.mu.Lock()
	noted := make(map[string]bool, len(s.unsynced.paths))
	for p := range s.unsynced.paths {
		noted[p] = true
	}
	s.unsynced.mu.Unlock()
	after := walkState(t, root)
	changed := 0
	for path, now := range after {
		if was, ok := before[path]; ok && was == now {
			continue
		}
		changed++
		if !noted[path] {
			t.Errorf("%s: written, not synced by Flush", path)
		}
	}
	if changed < 10 {
		t.Fatalf("only %d paths changed: the writes did not run", changed)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := len(s.unsynced.paths); n != 0 {
		t.Fatalf("%d paths noted after Flush", n)
	}
}

// fileState is what a write changes in a file or directory.
type fileState struct {
	ino, size    uint64
	mtime, ctime syscall.Timespec
}

// walkState is every path under root but lock files and tmp/, with its
// state.
func walkState(t *testing.T, root string) map[string]fileState {
	t.Helper()
	out := make(map[string]fileState)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() && (rel == "locks" || rel == "tmp" || rel == filepath.Join("blobs", "tmp")) {
			return fs.SkipDir
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		out[path] = fileState{ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim, ctime: st.Ctim}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
