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
	"reflect"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Crash points: the test hook (Store.crashAt) is called with these names at
// the steps of the write protocol, so that tests can kill the process in each
// window. They are no-ops in production.
const (
	crashPutIntent       = "put:intent"       // intent written, journal not yet appended
	crashPutJournaled    = "put:journaled"    // journal appended (committed), not yet renamed
	crashPutRenamed      = "put:renamed"      // record file replaced, lock still held
	crashDeleteIntent    = "delete:intent"    // delete marker written, journal not yet appended
	crashDeleteJournaled = "delete:journaled" // journal appended (committed), file not yet removed
	crashDeleteRemoved   = "delete:removed"   // file removed, marker still there
	crashJournalTorn     = "journal:torn"     // half of a journal line written
	crashBlobTemp        = "blob:temp"        // blob content in tmp/, not yet linked
	crashBlobLinked      = "blob:linked"      // blob linked into place
	crashClaimCreated    = "claim:created"    // Claim's record created, index not yet written
	crashPgWritten       = "pg:written"       // a PostgreSQL write's statements done, not yet committed
	crashPgSending       = "pg:sending"       // a PostgreSQL write's statements and COMMIT about to be sent
	crashPgCommitted     = "pg:committed"     // committed, the caller not yet told
)

func (s *dirStore) hook(point string) {
	if s.crashAt != nil {
		s.crashAt(point)
	}
}

// Create stores a new record. r must already have a kind and ID
// (records.Init); it fails with ErrExists if that ID is taken, leaving r as
// it was. The stored version is rev 1.
func (s *Store) Create(ctx context.Context, r records.Record) error {
	return s.rec.create(ctx, r)
}

// create is the directory's Create: a write under the record's lock that
// finds no record.
func (s *dirStore) create(ctx context.Context, r records.Record) error {
	h := r.Header()
	return s.commitLocked(ctx, h.ID, func(prev []byte) (records.Record, []records.Record, error) {
		if prev != nil {
			return nil, nil, fmt.Errorf("%s: %w", h.ID, ErrExists)
		}
		return r, nil, nil
	})
}

// Put stores r whole, replacing any previous version, under the record's
// lock. The revision continues from the stored version and its created_at is
// kept; both are written back into r.
func (s *Store) Put(ctx context.Context, r records.Record) error {
	h := r.Header()
	if err := records.Validate(h); err != nil {
		return err
	}
	return s.rec.commitLocked(ctx, h.ID, func(prev []byte) (records.Record, []records.Record, error) {
		return r, nil, nil
	})
}

// Update is the read-modify-write of one record: under the record's lock it
// loads the stored version into r (when there is one), calls fn, and stores
// the result. fn may return ErrNoChange to leave the record untouched. When
// the record does not exist, r is passed as the caller prepared it; if fn
// leaves its ID and kind empty they are taken from id.
//
// r is reset to its zero value before the stored version is decoded into it,
// so a struct reused across calls never carries stale fields or map entries.
// The store owns rev (the stored one plus one), updated_at and, for a record
// that exists, created_at: what fn sets there is overwritten. fn must not
// write the same record (its lock is held).
func (s *Store) Update(ctx context.Context, id string, r records.Record, fn func(exists bool) error) error {
	return s.UpdateAndCreate(ctx, id, r, func(exists bool) ([]records.Record, error) {
		return nil, fn(exists)
	})
}

// UpdateAndCreate is Update whose fn also returns new records to create
// with the update (a cycle's transition and its event): on PostgreSQL in
// the update's transaction, so that a transition costs one commit, not
// two; on the directory each right after the update, under its lock (a
// crash between them leaves the update without them, as an Update and a
// Create would). Each must be new (ErrExists otherwise, the update not
// stored on PostgreSQL, stored on the directory) and neither a cycle nor
// a worker, whose writes keep the fleet's keys. Nothing is created when
// fn returns ErrNoChange.
func (s *Store) UpdateAndCreate(ctx context.Context, id string, r records.Record, fn func(exists bool) ([]records.Record, error)) error {
	return s.rec.commitLocked(ctx, id, func(prev []byte) (records.Record, []records.Record, error) {
		if prev != nil {
			resetRecord(r)
			if err := records.Unmarshal(prev, r); err != nil {
				return nil, nil, fmt.Errorf("%s: stored record does not decode: %w", id, err)
			}
		}
		created, err := fn(prev != nil)
		if err != nil {
			return nil, nil, err
		}
		for _, c := range created {
			if k := c.Header().Kind; k == records.KindCycle || k == records.KindWorker {
				return nil, nil, fmt.Errorf("%s: a %s is not created with another record's update", c.Header().ID, k)
			}
		}
		h := r.Header()
		if prev == nil && h.ID == "" && h.Kind == "" {
			h.ID, h.Kind = id, records.KindOf(id)
		}
		return r, created, nil
	})
}

// resetRecord zeroes the struct r points to, so that decoding into it gives
// exactly the stored record (encoding/json merges into maps and leaves absent
// fields alone).
func resetRecord(r records.Record) {
	v := reflect.ValueOf(r)
	if v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().CanSet() {
		v.Elem().SetZero()
	}
}

// stored is what the store keeps from the version being replaced.
type stored struct {
	Rev       int64     `json:"rev"`
	CreatedAt time.Time `json:"created_at"`
}

// prevHeader reads the revision and creation time of the stored version. A
// version that does not decode falls back on the journal's last entry.
func (s *dirStore) prevHeader(id string, prev []byte) stored {
	var old stored
	if prev == nil {
		return old
	}
	if json.Unmarshal(prev, &old) == nil {
		return old
	}
	old = stored{}
	if e, err := s.lastJournalEntry(id); err == nil && e != nil && e.Op == opPut {
		if json.Unmarshal(e.Record, &old) != nil {
			old = stored{Rev: e.Rev}
		}
	}
	return old
}

// stamp sets the fields the store owns — rev, created_at, updated_at, v —
// and encodes r as one compact line. The revision is the stored one plus
// one (1 for a new record) whatever r carried.
func (s *dirStore) stamp(id string, prev []byte, r records.Record) ([]byte, error) {
	return stampRecord(id, s.prevHeader(id, prev), s.Now(), r)
}

// stampRecord sets the fields the store owns on r, given what the store
// keeps of the version it replaces, and encodes it as one line.
func stampRecord(id string, old stored, now time.Time, r records.Record) ([]byte, error) {
	if err := stampHeader(id, old, now, r); err != nil {
		return nil, err
	}
	return appendEncoded(nil, id, r)
}

// stampHeader sets the fields the store owns on r's header.
func stampHeader(id string, old stored, now time.Time, r records.Record) error {
	h := r.Header()
	if h.ID != id {
		return fmt.Errorf("write of %s changed its id to %q", id, h.ID)
	}
	if err := records.Validate(h); err != nil {
		return err
	}
	h.Rev = old.Rev + 1
	h.UpdatedAt = now
	if !old.CreatedAt.IsZero() {
		h.CreatedAt = old.CreatedAt
	} else if h.CreatedAt.IsZero() {
		h.CreatedAt = now
	}
	if h.V == 0 {
		h.V = records.SchemaVersion
	}
	return nil
}

// appendEncoded appends r, stamped, to dst as one compact line (without
// the newline).
func appendEncoded(dst []byte, id string, r records.Record) ([]byte, error) {
	if len(r.Header().Extra) == 0 {
		// json.Marshal's output is compact already (it compacts what
		// MarshalJSON methods return), and so one line; so is a
		// self-encoded record's.
		return records.AppendMarshal(dst, r)
	}
	raw, err := records.Marshal(r)
	if err != nil {
		return dst, err
	}
	// Extra fields are copied verbatim and may be indented: compact so that
	// the record is one line and the journal holds the very same bytes.
	start := len(dst)
	buf := bytes.NewBuffer(dst)
	if err := json.Compact(buf, raw); err != nil {
		return dst, fmt.Errorf("%s: encoded record is not JSON: %w", id, err)
	}
	out := buf.Bytes()
	if bytes.IndexByte(out[start:], '\n') >= 0 {
		return dst, fmt.Errorf("%s: encoded record spans lines", id)
	}
	return out, nil
}

// commitLocked runs the write protocol for one record:
//  1. lock the record and settle any write a dead process left in flight;
//  2. write the new version as an intent file;
//  3. append it to the journal (the commit point);
//  4. rename the intent over the record file.
//
// A process killed between 2 and 3 leaves an intent the journal does not
// know (discarded at recovery); between 3 and 4, one it does (rolled
// forward). Either way the files and the journal agree afterwards.
//
// build returns the record to store given the stored bytes (nil when
// absent), and new records to create after it (each under its own lock,
// while this one's is held); its error, or ErrNoChange, ends the write
// without storing.
func (s *dirStore) commitLocked(ctx context.Context, id string, build func(prev []byte) (records.Record, []records.Record, error)) error {
	kind, err := checkRef(id)
	if err != nil {
		return err
	}
	unlock, err := s.lockRecord(ctx, kind, id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := s.resolveIntent(kind, id); err != nil {
		return err
	}
	prev, err := s.readRecord(kind, id)
	if errors.Is(err, fs.ErrNotExist) {
		prev, err = nil, nil
	}
	if err != nil {
		return err
	}
	r, created, err := build(prev)
	if errors.Is(err, ErrNoChange) {
		return nil
	}
	if err != nil {
		return err
	}
	h := r.Header()
	saved := *h
	data, err := s.stamp(id, prev, r)
	if err == nil {
		err = s.setKeys(kind, id, indexKeys(r))
	}
	if err == nil {
		err = s.commit(kind, id, data, h.Rev, h.UpdatedAt)
	}
	if err != nil {
		// Not stored (or not known to be): give the caller back its record.
		h.Rev, h.CreatedAt, h.UpdatedAt, h.V = saved.Rev, saved.CreatedAt, saved.UpdatedAt, saved.V
		return err
	}
	for _, c := range created {
		if err := s.create(ctx, c); err != nil {
			return fmt.Errorf("%s stored, but not %w", id, err)
		}
	}
	return nil
}

// commit writes data as the new version of a record whose lock is held.
func (s *dirStore) commit(kind, id string, data []byte, rev int64, at time.Time) error {
	path := s.recordPath(kind, id)
	if err := s.ensureDir(filepath.Dir(path)); err != nil {
		return err
	}
	intent := s.intentPath(kind, id)
	if err := s.writeFile(intent, data); err != nil {
		os.Remove(intent)
		return err
	}
	// The intent must be on disk before the journal says it is committed.
	if err := s.syncDir(filepath.Dir(intent)); err != nil {
		os.Remove(intent)
		return err
	}
	s.hook(crashPutIntent)
	if err := s.appendJournal(&entry{At: at, Op: opPut, Kind: kind, ID: id, Rev: rev, Record: data}); err != nil {
		// The entry may or may not have reached the journal: let the journal
		// decide, as recovery would.
		if rerr := s.resolveIntent(kind, id); rerr != nil {
			return fmt.Errorf("%w (and settling the write: %v)", err, rerr)
		}
		return err
	}
	s.hook(crashPutJournaled)
	if err := rename(intent, path); err != nil {
		return fmt.Errorf("%s: committed but not yet in place (recovered on next write): %w", id, err)
	}
	s.hook(crashPutRenamed)
	return s.syncPlaced(path)
}

// Delete removes a record; the journal keeps its history. Like a write, it
// leaves a marker in intents/ while it is in flight, so that a process killed
// after the journal entry and before the file is removed is rolled forward.
func (s *dirStore) Delete(ctx context.Context, id string) error {
	kind, err := checkRef(id)
	if err != nil {
		return err
	}
	unlock, err := s.lockRecord(ctx, kind, id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := s.resolveIntent(kind, id); err != nil {
		return err
	}
	path := s.recordPath(kind, id)
	prev, err := s.readRecord(kind, id)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	if err != nil {
		return err
	}
	marker := s.deleteIntentPath(kind, id)
	if err := s.writeFile(marker, nil); err != nil {
		os.Remove(marker)
		return err
	}
	if err := s.syncDir(filepath.Dir(marker)); err != nil {
		os.Remove(marker)
		return err
	}
	s.hook(crashDeleteIntent)
	old := s.prevHeader(id, prev)
	if err := s.appendJournal(&entry{At: s.Now(), Op: opDelete, Kind: kind, ID: id, Rev: old.Rev}); err != nil {
		if rerr := s.resolveIntent(kind, id); rerr != nil {
			return fmt.Errorf("%w (and settling the delete: %v)", err, rerr)
		}
		return err
	}
	s.hook(crashDeleteJournaled)
	if err := os.Remove(path); err == nil {
		if err := s.syncDir(filepath.Dir(path)); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: deleted in the journal but the file remains (recovered on next write): %w", id, err)
	}
	if err := s.dropPacked(kind, id); err != nil {
		return fmt.Errorf("%s: deleted in the journal but its pack copy remains (recovered on next write): %w", id, err)
	}
	s.hook(crashDeleteRemoved)
	s.dropKeys(kind, id, prev)
	if err := os.Remove(marker); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// writeFile creates path with data, synced when each write must be durable.
func (s *dirStore) writeFile(path string, data []byte) error {
	s.flushLater(path)
	return createFile(path, data, s.durability == SyncEachWrite)
}

// ensureDir creates dir (records/<kind>, a blob prefix, an index) if it is
// missing, and makes its entry durable when each write must be: the files
// about to be written in it are worth nothing if the directory is lost.
func (s *dirStore) ensureDir(dir string) error {
	if _, ok := s.dirs.Load(dir); ok {
		return nil
	}
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		s.dirs.Store(dir, true)
		return nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	if err := s.syncDir(filepath.Dir(dir)); err != nil {
		return err
	}
	s.dirs.Store(dir, true)
	return nil
}

func (s *dirStore) syncDir(dir string) error {
	if s.durability != SyncEachWrite {
		s.flushLater(dir)
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
