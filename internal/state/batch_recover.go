package state

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// A batch's intent is one file, intents/batch_<ULID>.batch, locked (by its
// name) in locks/batch while its writer lives.
const (
	batchIntentKind   = "batch"
	batchIntentSuffix = ".batch"
	opIndex           = "index" // an index key in a batch's intent
)

func (s *dirStore) batchLockPath() string { return filepath.Join(s.root, "locks", "batch") }

// batchIntentName returns the batch named by an intent file name.
func batchIntentName(file string) (string, bool) {
	name, ok := strings.CutSuffix(file, batchIntentSuffix)
	return name, ok && records.KindOf(name) == batchIntentKind && records.CheckID(name) == nil
}

// writeNewFile creates path, which must not exist, whole: through an
// unnamed file linked into place, or a temporary file renamed into place
// where the filesystem has no O_TMPFILE.
func (s *dirStore) writeNewFile(path string, data []byte, mode uint32) error {
	linked, err := s.linkTmpfile(filepath.Dir(path), path, data, mode, "")
	if err != nil || linked {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil {
		return pathErr("create", path, unix.EEXIST)
	}
	return s.writeAtomic(path, data)
}

// placeRecord writes the file of a record whose write the journal has
// committed; the caller holds its lock. A file already there is the same
// record, placed by a recovery that ran first.
func (s *dirStore) placeRecord(kind, id string, data []byte) error {
	path := s.recordPath(kind, id)
	if err := s.ensureDir(filepath.Dir(path)); err != nil {
		return err
	}
	linked, err := s.linkTmpfile(filepath.Dir(path), path, data, 0o640, "")
	if err != nil || linked {
		return err
	}
	return s.writeAtomic(path, data)
}

// placeKey points the index key at path to id, whose record is in place;
// the caller holds the key's lock. A key already there (naming a record
// that is gone) is replaced.
func (s *dirStore) placeKey(path, id string) error {
	if err := s.ensureDir(filepath.Dir(path)); err != nil {
		return err
	}
	data := []byte(id + "\n")
	linked, err := s.linkTmpfile(filepath.Dir(path), path, data, 0o600, "")
	if err != nil || linked {
		return err
	}
	return s.writeAtomic(path, data)
}

// settleBatch finishes or discards a batch whose writer died, or whose
// journal append failed (held: the caller is that batch and holds its
// locks). The journal decides, record by record, as for a single write: a
// record whose last journal entry is the one in the intent is given its
// file if it has none; the rest never committed. An index key is set if it
// is missing and the record it names is there. The intent is removed last,
// so a crash here leaves it to the next recovery.
func (s *dirStore) settleBatch(ctx context.Context, intent string, held bool) error {
	data, err := readFile(intent)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for n, line := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		var head struct {
			Op string `json:"op"`
		}
		if err := json.Unmarshal(line, &head); err != nil {
			return fmt.Errorf("%s:%d: %w", intent, n+1, err)
		}
		lock := func(path, name string) (func(), error) {
			if held {
				return func() {}, nil
			}
			unlock, _, err := lockFile(ctx, path, lockOffset(name), true)
			return unlock, err
		}
		switch head.Op {
		case opPut:
			var e entry
			if err := json.Unmarshal(line, &e); err != nil {
				return fmt.Errorf("%s:%d: %w", intent, n+1, err)
			}
			unlock, err := lock(s.recordLockPath(e.Kind, e.ID), e.ID)
			if err != nil {
				return err
			}
			err = s.settleBatchRecord(&e)
			unlock()
			if err != nil {
				return fmt.Errorf("settling %s: %w", e.ID, err)
			}
		case opIndex:
			var k batchKey
			if err := json.Unmarshal(line, &k); err != nil {
				return fmt.Errorf("%s:%d: %w", intent, n+1, err)
			}
			unlock, err := lock(s.indexLockPath(k.Index, k.Key), k.Key)
			if err != nil {
				return err
			}
			err = s.settleBatchKey(&k)
			unlock()
			if err != nil {
				return fmt.Errorf("settling index key %s/%s: %w", k.Index, k.Key, err)
			}
		default:
			return fmt.Errorf("%s:%d: unknown op %q", intent, n+1, head.Op)
		}
	}
	if err := os.Remove(intent); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return s.syncDir(filepath.Dir(intent))
}

// settleBatchRecord gives a committed record of the batch its file unless
// it has one or is in a pack already: a batch that died while packing its
// records leaves those without their pack line to this. A new version of a
// stored record (rev 2 on) is in place when the stored version is it or a
// later one; else, if the journal committed it, it is given its file, which
// comes before a pack's copy.
func (s *dirStore) settleBatchRecord(e *entry) error {
	if e.Rev <= 1 {
		if ok, err := s.recordExists(e.Kind, e.ID); ok || err != nil {
			return err
		}
	} else {
		cur, err := s.readRecord(e.Kind, e.ID)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err == nil && s.prevHeader(e.ID, cur).Rev >= e.Rev {
			return nil
		}
	}
	last, err := s.lastJournalEntry(e.ID)
	if err != nil || last == nil || last.Op != opPut || !bytes.Equal(bytes.TrimSpace(last.Record), bytes.TrimSpace(e.Record)) {
		return err
	}
	return s.placeRecord(e.Kind, e.ID, bytes.TrimSpace(e.Record))
}

// settleBatchKey sets a committed batch's index key unless it names a
// record already (this one, or one a later write put there), and only if
// its own record is there: a key never names a record the crash left out.
func (s *dirStore) settleBatchKey(k *batchKey) error {
	path, err := s.indexPath(k.Index, k.Key)
	if err != nil {
		return err
	}
	if !s.Exists(k.ID) {
		return nil
	}
	if id, ok, err := s.indexEntry(k.Index, k.Key); err != nil || ok && s.Exists(id) {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == unix.ENOENT {
		_, err := s.appendPartition(filepath.Dir(path), fmt.Appendf(nil, "%s %s\n", k.Key, k.ID))
		return err
	}
	return s.placeKey(path, k.ID)
}

// recoverBatch settles the batch of an intent file if its writer is dead.
// False: the writer lives (it holds the batch's lock).
func (s *dirStore) recoverBatch(ctx context.Context, name string) (bool, error) {
	unlock, locked, err := lockFile(ctx, s.batchLockPath(), lockOffset(name), false)
	if err != nil || !locked {
		return false, err
	}
	defer unlock()
	return true, s.settleBatch(ctx, filepath.Join(s.root, "intents", name+batchIntentSuffix), false)
}
