// Package state is the state every tb-* tool shares (Store): records
// written atomically under per-record locks, found by the fields they are
// stored with, with an append-only journal of every change (compacted to
// each record's last change as it grows), and a content-addressed blob
// store. The records live in the host's state directory (this file and
// most of the package: dirStore) or, for a fleet, in a PostgreSQL database
// its hosts share (postgres*.go: pgStore, WithShared). Blobs are always
// in a directory, the host's or one the hosts share (WithSharedBlobs), and
// the directories tools keep under Path always in the host's.
//
// Layout of the state directory (the records' parts only when they are
// kept there):
//
//	records/<kind>/<id>.json   current version of each record (comes first)
//	packs/<batch>.batch        the records of a large batch, as committed
//	packs/<kind>/.batched      where each packed record is, or that it was
//	                           deleted (pack.go)
//	journal/journal.jsonl      puts and deletes in commit order: since the last
//	                           compaction, every one; before it, the last of
//	                           each record (compact.go)
//	intents/<kind>~<id>.json   a write in flight (left only by a crash)
//	intents/<kind>~<id>.delete a delete in flight (likewise)
//	intents/<id>.batch         a batch in flight (batch.go; likewise)
//	locks/records/<kind>.<n>   one byte lock per record (fcntl OFD locks), in
//	                           one of lockShards files by the ID's hash
//	locks/index/<name>.<n>     one byte lock per index key, likewise
//	locks/named/…              Lock and TryLock
//	locks/batch, locks/blobs   a byte lock per batch in flight, per blob
//	blobs/sha256/<aa>/<hex>    content-addressed, read-only blobs (this, its
//	                           tmp/ and locks/blobs in the shared blob
//	                           directory with WithSharedBlobs)
//	index/<name>/<key>         unique keys (e.g. sample sha256 -> id): Claim
//	index/<name>/.batched      the keys batches set, "<key> <id>" a line
//	                           (partition.go); a key's own file comes first
//	keys/<kind>/<field>/<v>/<id>  records by field value (keys.go): FindBy
//	keys/<kind>/<field>/<v>/.batched  the same for batches' records, an ID a line
//	locks/partitions           a byte lock per partition file
//	tmp/                       blob and index files being written
//	anything else              the tools' own directories (Path)
package state

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// ErrNotFound is returned (wrapped) when a record, blob or index key is absent.
var ErrNotFound = errors.New("not found")

// ErrExists is returned by Create when the record is already there.
var ErrExists = errors.New("already exists")

// ErrNoChange, returned by an Update callback, leaves the record as it was.
var ErrNoChange = errors.New("no change")

// Durability chooses when data reaches the disk.
type Durability int

const (
	// SyncEachWrite fsyncs every record, journal entry and blob before the
	// call returns: one write survives a power cut as soon as it is made.
	SyncEachWrite Durability = iota
	// SyncOnFlush leaves fsync to Flush, which fsyncs the files and
	// directories written since the last Flush.
	// A killed process still loses nothing (the page cache survives it);
	// a power cut may lose the writes since the last Flush.
	SyncOnFlush
)

// dirStore is an open state directory: the records' backend of a Store
// without WithShared, and the blobs and Path of every Store. It is safe
// for concurrent use by goroutines and by processes sharing the directory.
type dirStore struct {
	root string
	// blobRoot holds blobs/, and the tmp/ and locks/ they are written and
	// locked through: root, or a directory hosts share (WithSharedBlobs).
	blobRoot   string
	durability Durability
	now        func() time.Time
	// minFree is what blob writes leave free (WithMinFree).
	minFree diskspace.Threshold

	// crashAt, when set (by tests only), is called at each step of the
	// write protocol with the step's name (the crash* constants), so that a
	// test process can kill itself in every crash window.
	crashAt func(point string)

	dirs sync.Map // directories known to exist (ensureDir)

	unsynced unsynced // what Flush syncs (flush.go)

	lockFDs lockFDs // lock files' descriptors between batches

	partsMu sync.Mutex
	// parts caches the index keys read from each index's partition file
	// (lookupPacked).
	parts map[string]*indexPart
	// keyParts caches the IDs of key directories' partition files
	// (inKeyPartition), also under partsMu.
	keyParts map[string]*keyPart
	// packs caches each kind's pack lines (pack.go), also under partsMu.
	packs map[string]*packIndex
	// packFiles are the packs open for reading (openPack), under partsMu.
	packFiles map[string]*openPack
	// packMin is the fewest records a batch packs (defaultPackMin; tests
	// lower it).
	packMin int
	// packSlack: budgetUpdates (defaultPackSlack; tests set less).
	packSlack int64
	// newLockPatience bounds how long a batch's Commit tries for the locks
	// of its new records (lockNew; defaultNewLockPatience, tests set less).
	newLockPatience time.Duration

	journalMu sync.Mutex
	// journal is opened on the first append and kept until a compaction
	// replaces the file; the fields below describe it.
	journal *os.File
	// journalBase is the size the journal had when its compaction wrote it
	// (0 if it never was; -1 until its header is read).
	journalBase int64
	// journalRetryAt holds off automatic compaction, after one failed or
	// was not worth writing, until the journal reaches this size.
	journalRetryAt int64
	// journalLimit is the growth past journalBase that triggers automatic
	// compaction (WithJournalLimit).
	journalLimit int64
}

// Close releases the journal's descriptor. A Store is usable until then;
// tools that exit need not call it.
func (s *dirStore) Close() error {
	s.lockFDs.close()
	s.partsMu.Lock()
	s.dropPacks()
	s.partsMu.Unlock()
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	if s.journal == nil {
		return nil
	}
	err := s.journal.Close()
	s.journal = nil
	return err
}

// Option configures Open.
type Option func(*Store)

// WithDurability sets when writes are synced (default SyncEachWrite).
func WithDurability(d Durability) Option { return func(s *Store) { s.durability = d } }

// WithJournalLimit sets how much the journal may grow past its compacted
// size before a write compacts it (default DefaultJournalLimit); it also
// waits until the journal has at least doubled, so that compaction stays
// proportional to the bytes written. n <= 0 turns automatic compaction off
// (Compact still works).
func WithJournalLimit(n int64) Option { return func(s *Store) { s.journalLimit = n } }

// WithClock replaces time.Now, for tests.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

var layout = []string{"records", "journal", "intents", "locks", "blobs/sha256", "index", "keys", "tmp"}

// openDir creates the layout if needed and finishes or discards any write a
// killed process left in flight.
func openDir(ctx context.Context, s *dirStore) error {
	for _, d := range layout {
		if err := os.MkdirAll(filepath.Join(s.root, d), 0o750); err != nil {
			return fmt.Errorf("state directory %s: %w", s.root, err)
		}
	}
	if s.blobRoot != s.root {
		for _, d := range []string{"blobs/sha256", "tmp", "locks"} {
			if err := os.MkdirAll(filepath.Join(s.blobRoot, d), 0o750); err != nil {
				return fmt.Errorf("blob directory %s: %w", s.blobRoot, err)
			}
		}
	}
	if err := s.recoverIntents(ctx); err != nil {
		return err
	}
	return s.backfillKeys(ctx)
}

// Root is the state directory's absolute path.
func (s *dirStore) Root() string { return s.root }

// Path joins elements under the state root; tools use it for their own
// subdirectories (keys, caches) so that everything lives in one place.
func (s *dirStore) Path(elem ...string) string {
	return filepath.Join(append([]string{s.root}, elem...)...)
}

// Now is the store's clock, truncated as records store time.
func (s *dirStore) Now() time.Time { return s.now().UTC().Truncate(time.Microsecond) }

func (s *dirStore) where(id string) string {
	kind := records.KindOf(id)
	path := s.recordPath(kind, id)
	if _, err := os.Lstat(path); err != nil {
		if loc, ok, _ := s.packed(kind, id); ok {
			return fmt.Sprintf("%s (at %d)", s.packPath(loc.batch), loc.off)
		}
	}
	return path
}

func (s *dirStore) recordPath(kind, id string) string {
	return filepath.Join(s.root, "records", kind, id+".json")
}

const (
	putIntentSuffix    = ".json"
	deleteIntentSuffix = ".delete"
)

func (s *dirStore) intentPath(kind, id string) string {
	return filepath.Join(s.root, "intents", intentName(kind, id, putIntentSuffix))
}

func (s *dirStore) deleteIntentPath(kind, id string) string {
	return filepath.Join(s.root, "intents", intentName(kind, id, deleteIntentSuffix))
}

// intentName is the name in intents/ of a record's put or delete intent.
func intentName(kind, id, suffix string) string { return kind + "~" + id + suffix }

func (s *dirStore) recordLockPath(kind, id string) string {
	return s.lockFilePath("records", kind, id)
}

func checkRef(id string) (kind string, err error) {
	if err := records.CheckID(id); err != nil {
		return "", err
	}
	return records.KindOf(id), nil
}

// ReadRaw returns the stored bytes of a record.
func (s *dirStore) ReadRaw(id string) ([]byte, error) {
	kind, err := checkRef(id)
	if err != nil {
		return nil, err
	}
	b, err := s.readRecord(kind, id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	return b, err
}

// Get decodes the record with the given ID into r, which is reset first so
// that nothing from an earlier use of the struct survives.
func (s *Store) Get(id string, r records.Record) error { return getRecord(s.rec, id, r) }

func getRecord(b backend, id string, r records.Record) error {
	raw, err := b.ReadRaw(id)
	if err != nil {
		return err
	}
	resetRecord(r)
	if err := records.Unmarshal(raw, r); err != nil {
		return fmt.Errorf("%s: stored record does not decode: %w", b.where(id), err)
	}
	return nil
}

// Exists reports whether a record is stored.
func (s *dirStore) Exists(id string) bool {
	kind, err := checkRef(id)
	if err != nil {
		return false
	}
	ok, err := s.recordExists(kind, id)
	return ok && err == nil
}

// List returns the IDs of one kind, oldest first: those with their file
// and those in packs.
func (s *dirStore) List(kind string) ([]string, error) {
	if !records.ValidKind(kind) {
		return nil, fmt.Errorf("invalid kind %q", kind)
	}
	ents, err := os.ReadDir(filepath.Join(s.root, "records", kind))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	packed, err := s.packedIDs(kind)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(ents)+len(packed))
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok && records.CheckID(id) == nil {
			if _, dup := packed[id]; !dup {
				ids = append(ids, id)
			}
		}
	}
	for id := range packed {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// Kinds lists the record kinds present in the store (with their files or
// in packs).
func (s *dirStore) Kinds() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.root, "records"))
	if err != nil {
		return nil, err
	}
	packed, err := os.ReadDir(filepath.Join(s.root, "packs"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var kinds []string
	for _, e := range append(ents, packed...) {
		if e.IsDir() && records.ValidKind(e.Name()) {
			kinds = append(kinds, e.Name())
		}
	}
	slices.Sort(kinds)
	return slices.Compact(kinds), nil
}
