package state

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// validIndexKey tells whether key may name an index key: 1 to 200 bytes of
// [A-Za-z0-9._:-], the first a letter or digit, so that it is one file name
// and one word of a partition file's line. A hand loop, not a regexp: a
// compiled pattern is package state built at every tool's start, and this
// runs once per observable a batch stores.
func validIndexKey(key string) bool {
	if len(key) == 0 || len(key) > 200 {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == ':' || c == '-'):
		default:
			return false
		}
	}
	return true
}

func (s *dirStore) indexPath(name, key string) (string, error) {
	if !records.ValidKind(name) || !validIndexKey(key) {
		return "", fmt.Errorf("invalid index key %s/%s", name, key)
	}
	return filepath.Join(s.root, "index", name, key), nil
}

// Lookup returns the ID stored under an index key, or ErrNotFound. A key whose
// record has gone counts as absent.
func (s *dirStore) Lookup(name, key string) (string, error) {
	id, ok, err := s.indexEntry(name, key)
	if err != nil {
		return "", err
	}
	if !ok || !s.Exists(id) {
		return "", fmt.Errorf("%s %s: %w", name, key, ErrNotFound)
	}
	return id, nil
}

// indexEntry returns the ID an index key names, whether or not its record
// is there: the key's own file (written by SetIndex, or by a batch when the
// file was there already) if it has one, else the last line a batch
// appended for it to the index's partition file.
func (s *dirStore) indexEntry(name, key string) (string, bool, error) {
	path, err := s.indexPath(name, key)
	if err != nil {
		return "", false, err
	}
	b, err := readFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return s.lookupPacked(name, key)
	}
	if err != nil {
		return "", false, err
	}
	return strings.TrimSpace(string(b)), true, nil
}

func (s *dirStore) indexLockPath(name, key string) string {
	return s.lockFilePath("index", name, key)
}

func (s *dirStore) lockIndex(ctx context.Context, name, key string) (func(), error) {
	unlock, _, err := lockFile(ctx, s.indexLockPath(name, key), lockOffset(key), true)
	return unlock, err
}

// Claim returns the ID under an index key, calling newRecord for a new
// record (with its kind and ID: records.Init) when there is none, and
// storing it and the key together: a batch of one (see dirBatch), so that a
// crash leaves both or neither, never a record without its key. Concurrent
// claims of one key (from any process) agree on a single ID: newRecord runs
// under the key's lock.
func (s *dirStore) Claim(ctx context.Context, name, key string, newRecord func() (records.Record, error)) (id string, created bool, err error) {
	if _, err := s.indexPath(name, key); err != nil {
		return "", false, err
	}
	unlock, err := s.lockIndex(ctx, name, key)
	if err != nil {
		return "", false, err
	}
	defer unlock()
	if id, err := s.Lookup(name, key); err == nil {
		return id, false, nil
	} else if !errors.Is(err, ErrNotFound) {
		return "", false, err
	}
	r, err := newRecord()
	if err != nil {
		return "", false, err
	}
	id = r.Header().ID
	if err := records.CheckID(id); err != nil {
		return "", false, fmt.Errorf("claim %s %s: %w", name, key, err)
	}
	b := s.newDirBatch()
	defer b.release()
	b.held[heldLock{s.indexLockPath(name, key), key}] = true // by lockIndex above
	if line, err := b.Create(r); err != nil || line == nil {
		return "", false, cmp.Or(err, fmt.Errorf("claim %s %s: record %s is locked by another writer", name, key, id))
	}
	if err := b.SetIndex(name, key, id); err != nil {
		return "", false, err
	}
	if err := b.Commit(); err != nil {
		return "", false, err
	}
	return id, true, nil
}

// SetIndex points an index key at an ID, replacing what was there. It takes
// the key's lock, so it does not interleave with a Claim of the key.
func (s *dirStore) SetIndex(name, key, id string) error {
	path, err := s.indexPath(name, key)
	if err != nil {
		return err
	}
	if err := records.CheckID(id); err != nil {
		return err
	}
	unlock, err := s.lockIndex(context.Background(), name, key)
	if err != nil {
		return err
	}
	defer unlock()
	return s.writeAtomic(path, []byte(id+"\n"))
}

// writeAtomic replaces path with data through a temp file and rename.
func (s *dirStore) writeAtomic(path string, data []byte) error {
	if err := s.ensureDir(filepath.Dir(path)); err != nil {
		return err
	}
	tmp, err := createTemp(filepath.Join(s.root, "tmp"), "idx-")
	if err != nil {
		return err
	}
	name := tmp.Name()
	err = writeAll(int(tmp.Fd()), name, data, s.durability == SyncEachWrite)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = rename(name, path)
	}
	if err != nil {
		os.Remove(name)
		return err
	}
	return s.syncPlaced(path)
}
