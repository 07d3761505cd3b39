package state

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Secondary keys of records that implement records.Keyed live under
//
//	keys/<kind>/<field>/<value>/<id>       (empty files: single writes)
//	keys/<kind>/<field>/<value>/.batched   (one ID a line: batches)
//
// A key is created before the record version that has it is written, and
// never removed by a write: a record is always found under each of its keys,
// and a key may outlive the value (the record changed it, was deleted, or
// its write failed). Readers therefore check each record they find against
// the key (FindBy). Delete removes the deleted record's keys; Check reports
// the keys a record lacks and, with Repair, adds them.

func (s *dirStore) keyDir(kind, field, value string) string {
	return filepath.Join(s.root, "keys", kind, field, keyName(value))
}

// keyName makes a value a file name: as it is when it is an ID-like token,
// hex after a "~" otherwise ("lease:<id>", names with slashes).
func keyName(v string) string {
	for _, c := range []byte(v) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return "~" + hex.EncodeToString([]byte(v))
		}
	}
	if v == "" || v[0] == '.' {
		return "~" + hex.EncodeToString([]byte(v))
	}
	return v
}

func indexKeys(r records.Record) []records.IndexKey {
	if k, ok := r.(records.Keyed); ok {
		return k.IndexKeys()
	}
	return nil
}

// setKeys makes sure the record is found under each of keys, durably
// before its version with them is written.
func (s *dirStore) setKeys(kind, id string, keys []records.IndexKey) error {
	for _, k := range keys {
		dir := s.keyDir(kind, k.Field, k.Value)
		// A record a batch stored has its keys as partition lines: a later
		// write of it must not give it a file per key as well.
		if packed, err := s.inKeyPartition(dir, id); err != nil {
			return err
		} else if packed {
			continue
		}
		if err := s.ensureDir(dir); err != nil {
			return err
		}
		fd, err := unix.Open(filepath.Join(dir, id), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o640)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return fmt.Errorf("key %s=%s of %s: %w", k.Field, k.Value, id, err)
		}
		unix.Close(fd)
		if err := s.syncDir(dir); err != nil {
			return err
		}
	}
	return nil
}

// appendKeys makes sure each of a batch's records is found under each of
// its keys, durably before the batch's journal append: one line per record
// in the partition file of each key's directory, one append per directory
// (partition.go).
func (s *dirStore) appendKeys(recs []batchRec, lines *partLines) error {
	lines.reset()
	// The key directories met so far: a batch's records share most of
	// their keys (a parse run's observables, its lease's).
	type kindKey struct {
		kind string
		key  records.IndexKey
	}
	keyDirs := make(map[kindKey]string)
	for _, r := range recs {
		for _, k := range indexKeys(r.r) {
			if r.update && slices.Contains(r.oldKeys, k) {
				continue // the stored version has it: found under it already
			}
			dir, ok := keyDirs[kindKey{r.kind, k}]
			if !ok {
				dir = s.keyDir(r.kind, k.Field, k.Value)
				keyDirs[kindKey{r.kind, k}] = dir
			}
			buf := lines.of(dir)
			*buf = append(append(*buf, r.id...), '\n')
		}
	}
	if err := lines.appendTo(s); err != nil {
		return fmt.Errorf("keys of a batch: %w", err)
	}
	return nil
}

// dropKeys removes a deleted record's keys; one left behind is harmless,
// as is the line a batch appended for it, which stays.
func (s *dirStore) dropKeys(kind, id string, prev []byte) {
	rec, err := records.Decode(prev)
	if err != nil {
		return
	}
	for _, k := range indexKeys(rec) {
		os.Remove(filepath.Join(s.keyDir(kind, k.Field, k.Value), id))
	}
}

// ByKey lists the IDs of the records of a kind stored with field = value,
// oldest first: the key directory's files (single writes) and the lines of
// its partition file (batches). It may name a record that has since
// changed the field or been deleted; FindBy and LatestBy check.
func (s *dirStore) ByKey(kind, field, value string) ([]string, error) {
	if !records.ValidKind(kind) {
		return nil, fmt.Errorf("invalid kind %q", kind)
	}
	dir := s.keyDir(kind, field, value)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(ents))
	for _, e := range ents {
		if e.Name() == partitionFile {
			packed, _, err := partitionLines(dir, 0)
			if err != nil {
				return nil, err
			}
			ids = append(ids, packed...)
			continue
		}
		ids = append(ids, e.Name())
	}
	ids = slices.DeleteFunc(ids, func(id string) bool {
		return records.CheckID(id) != nil || records.KindOf(id) != kind
	})
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// keyChecker tells whether a record is found under a key, reading each
// key directory's partition file once per Check.
type keyChecker struct {
	s      *dirStore
	packed map[string]map[string]bool // key directory -> IDs in its partition file
}

func (c *keyChecker) has(dir, id string) (bool, error) {
	if _, err := os.Stat(filepath.Join(dir, id)); err == nil {
		return true, nil
	}
	ids, ok := c.packed[dir]
	if !ok {
		lines, _, err := partitionLines(dir, 0)
		if err != nil {
			return false, err
		}
		ids = make(map[string]bool, len(lines))
		for _, l := range lines {
			ids[l] = true
		}
		if c.packed == nil {
			c.packed = make(map[string]map[string]bool)
		}
		c.packed[dir] = ids
	}
	return ids[id], nil
}

// checkKeys reports (and with repair, adds) the keys a stored record lacks.
func (c *keyChecker) checkKeys(rep *CheckReport, rec records.Record, path string, repair bool) error {
	h := rec.Header()
	for _, k := range indexKeys(rec) {
		ok, err := c.has(c.s.keyDir(h.Kind, k.Field, k.Value), h.ID)
		if err != nil {
			return err
		}
		if ok {
			continue
		}
		if !repair {
			rep.problem(h.ID, path, "not found under its key %s=%s", k.Field, k.Value)
			continue
		}
		if err := c.s.setKeys(h.Kind, h.ID, []records.IndexKey{k}); err != nil {
			return err
		}
		rep.Repaired = append(rep.Repaired, fmt.Sprintf("%s: key %s=%s", h.ID, k.Field, k.Value))
	}
	return nil
}

// keysComplete marks a store whose keyed records all have their keys: new
// ones get them as they are written, and a store made before keys existed
// gets them once, at its first Open since (backfillKeys).
const keysComplete = ".complete"

func (s *dirStore) backfillKeys(ctx context.Context) error {
	done := filepath.Join(s.root, "keys", keysComplete)
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	unlock, err := s.Lock(ctx, "keys-backfill")
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	kinds, err := s.Kinds()
	if err != nil {
		return err
	}
	for _, kind := range kinds {
		if _, ok := records.New(kind).(records.Keyed); !ok {
			continue
		}
		ids, err := s.List(kind)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if err := ctx.Err(); err != nil {
				return err
			}
			rec := records.New(kind)
			if err := getRecord(s, id, rec); err != nil {
				continue // deleted meanwhile, or reported by Check
			}
			if err := s.setKeys(kind, id, indexKeys(rec)); err != nil {
				return err
			}
		}
	}
	if err := s.writeFile(done, nil); err != nil {
		return err
	}
	return s.syncDir(filepath.Dir(done))
}
