package state

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

var indexKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$`)

func (s *Store) indexPath(name, key string) (string, error) {
	if !records.ValidKind(name) || !indexKey.MatchString(key) {
		return "", fmt.Errorf("invalid index key %s/%s", name, key)
	}
	return filepath.Join(s.root, "index", name, key), nil
}

// Lookup returns the ID stored under an index key, or ErrNotFound. A key whose
// record has gone counts as absent.
func (s *Store) Lookup(name, key string) (string, error) {
	path, err := s.indexPath(name, key)
	if err != nil {
		return "", err
	}
	b, err := readFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%s %s: %w", name, key, ErrNotFound)
	}
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(b))
	if !s.Exists(id) {
		return "", fmt.Errorf("%s %s: %w", name, key, ErrNotFound)
	}
	return id, nil
}

func (s *Store) lockIndex(ctx context.Context, name, key string) (func(), error) {
	unlock, _, err := lockFile(ctx, filepath.Join(s.root, "locks", "index", name), lockOffset(key), true)
	return unlock, err
}

// Claim returns the ID under an index key, calling create to make the record
// when there is none. Concurrent claims of one key (from any process) agree
// on a single ID: create runs under the key's lock. A process killed after
// create and before the key is written leaves an unindexed record, and the
// next Claim creates another.
func (s *Store) Claim(ctx context.Context, name, key string, create func() (string, error)) (id string, created bool, err error) {
	path, err := s.indexPath(name, key)
	if err != nil {
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
	id, err = create()
	if err != nil {
		return "", false, err
	}
	if err := records.CheckID(id); err != nil {
		return "", false, fmt.Errorf("claim %s %s: %w", name, key, err)
	}
	s.hook(crashClaimCreated)
	if err := s.writeAtomic(path, []byte(id+"\n")); err != nil {
		return "", false, err
	}
	return id, true, nil
}

// SetIndex points an index key at an ID, replacing what was there. It takes
// the key's lock, so it does not interleave with a Claim of the key.
func (s *Store) SetIndex(name, key, id string) error {
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
func (s *Store) writeAtomic(path string, data []byte) error {
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
	return s.syncDir(filepath.Dir(path))
}
