package state

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Store is the state the tb-* tools share. Its records (with their journal,
// keys, index and named locks) live in one of two backends: the state
// directory, the embedded default for one host, or a PostgreSQL database
// that a fleet of hosts shares (WithShared). Blobs, and the directories
// tools keep under Path, always live in the host's own directory: a blob
// stays on the host that made it, and EnsureBlob brings one from another
// host (WithBlobFetcher).
type Store struct {
	*dirStore
	rec         backend
	shared      string
	lockTimeout time.Duration
	fetchBlob   BlobFetcher
}

// backend is where records live. The directory (dirStore) and PostgreSQL
// (pgStore) give the same guarantees: a record changes only under its lock
// (commitLocked), each change is journalled in commit order, a Claim or a
// batch stores records and index keys together or not at all.
type backend interface {
	// commitLocked writes the record build returns, given its stored
	// version, and creates the new records it returns with it.
	commitLocked(ctx context.Context, id string, build func(prev []byte) (records.Record, []records.Record, error)) error
	// create stores r, which must be new (Store.Create); a backend may
	// take a shorter way than commitLocked to it.
	create(ctx context.Context, r records.Record) error
	ReadRaw(id string) ([]byte, error)
	Exists(id string) bool
	List(kind string) ([]string, error)
	Kinds() ([]string, error)
	ByKey(kind, field, value string) ([]string, error)
	Delete(ctx context.Context, id string) error
	Lookup(name, key string) (string, error)
	Claim(ctx context.Context, name, key string, newRecord func() (records.Record, error)) (string, bool, error)
	SetIndex(name, key, id string) error
	Lock(ctx context.Context, name string) (unlock func(), err error)
	TryLock(ctx context.Context, name string) (unlock func(), ok bool, err error)
	Check(ctx context.Context, opts CheckOptions) (*CheckReport, error)
	Compact(ctx context.Context) (CompactStats, error)
	Replay(ctx context.Context) (map[string][]byte, JournalStats, error)
	newBatch() batcher
	follow(ctx context.Context, fromStart bool) (Follower, error)
	// where names a record's stored form in messages: a file, a row.
	where(id string) string
	Close() error
}

// WithShared keeps the records in the PostgreSQL database at url (a
// "postgres://" or "postgresql://" URL) instead of the directory.
func WithShared(url string) Option { return func(s *Store) { s.shared = url } }

// WithSharedBlobs keeps blobs in dir, a directory the hosts of a fleet
// share (NFS, say), instead of the host's own directory: a sample planned
// on one host is then there for the host that runs it, and a capture for
// any host that reads it.
func WithSharedBlobs(dir string) Option { return func(s *Store) { s.blobRoot = dir } }

// BlobFetcher stores in st the blob with this digest, which st's host
// lacks, from wherever another host keeps it (blobshare: another host's
// worker). It returns an error wrapping ErrNotFound when no one has it.
type BlobFetcher func(ctx context.Context, st *Store, sha string) error

// WithBlobFetcher makes EnsureBlob fetch a blob the host lacks with f.
func WithBlobFetcher(f BlobFetcher) Option { return func(s *Store) { s.fetchBlob = f } }

// WithLockTimeout sets how long a named lock of the shared database
// outlives a holder that stopped answering (default 30 s). A live holder
// never loses its lock: its process keeps the lock's transaction busy.
func WithLockTimeout(d time.Duration) Option { return func(s *Store) { s.lockTimeout = d } }

// IsSharedURL tells a PostgreSQL URL from a state directory's path.
func IsSharedURL(s string) bool {
	return hasPrefixFold(s, "postgres://") || hasPrefixFold(s, "postgresql://")
}

// Open opens the store whose host directory is root, creating its layout if
// needed and finishing or discarding any write a killed process left in
// flight; with WithShared, it also connects to the shared database and
// creates its tables if needed.
func Open(ctx context.Context, root string, opts ...Option) (*Store, error) {
	if root == "" {
		return nil, errors.New("state directory not set")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	s := &Store{dirStore: &dirStore{root: abs, now: time.Now, journalLimit: DefaultJournalLimit, packMin: defaultPackMin, packSlack: defaultPackSlack,
		newLockPatience: defaultNewLockPatience}}
	for _, o := range opts {
		o(s)
	}
	if s.blobRoot == "" {
		s.blobRoot = abs
	} else if s.blobRoot, err = filepath.Abs(s.blobRoot); err != nil {
		return nil, err
	}
	if err := openDir(ctx, s.dirStore); err != nil {
		return nil, err
	}
	s.rec = s.dirStore
	if s.shared != "" {
		pg, err := openShared(ctx, s.shared, s.dirStore, s.lockTimeout)
		if err != nil {
			return nil, err
		}
		s.rec = pg
	}
	return s, nil
}

// Shared is the URL of the shared database, or "" when the records are in
// the directory.
func (s *Store) Shared() string { return s.shared }

// Flags are the global flags that make another tb-* program open this same
// store, with Environ (tools that run each other pass both on). The
// database's URL, which may hold its password, is not among them: every
// user of the host can read a process's command line.
func (s *Store) Flags() []string {
	f := []string{"--state", s.Root()}
	if s.shared != "" {
		f = []string{"--local", s.Root()}
	}
	if s.blobRoot != s.root {
		f = append(f, "--blobs", s.blobRoot)
	}
	return f
}

// Environ is what another tb-* program's environment needs, besides Flags,
// to open this same store: the shared database's URL as TB_STATE, which
// only the process's own user (and root) can read.
func (s *Store) Environ() []string {
	if s.shared == "" {
		return nil
	}
	return []string{"TB_STATE=" + s.shared}
}

// Close releases what the store holds open (the journal, the database's
// connections).
func (s *Store) Close() error {
	err := s.dirStore.Close()
	if s.rec != backend(s.dirStore) {
		err = errors.Join(err, s.rec.Close())
	}
	return err
}

func (s *Store) ReadRaw(id string) ([]byte, error)  { return s.rec.ReadRaw(id) }
func (s *Store) Exists(id string) bool              { return s.rec.Exists(id) }
func (s *Store) List(kind string) ([]string, error) { return s.rec.List(kind) }
func (s *Store) Kinds() ([]string, error)           { return s.rec.Kinds() }
func (s *Store) ByKey(kind, field, value string) ([]string, error) {
	return s.rec.ByKey(kind, field, value)
}
func (s *Store) Delete(ctx context.Context, id string) error           { return s.rec.Delete(ctx, id) }
func (s *Store) Lookup(name, key string) (string, error)               { return s.rec.Lookup(name, key) }
func (s *Store) SetIndex(name, key, id string) error                   { return s.rec.SetIndex(name, key, id) }
func (s *Store) Lock(ctx context.Context, name string) (func(), error) { return s.rec.Lock(ctx, name) }

// Claim returns the ID under an index key, calling newRecord for a new
// record (with its kind and ID: records.Init) when there is none, and
// storing it and the key together, so that a crash leaves both or neither.
// Concurrent claims of one key, from any process or host, agree on one ID.
func (s *Store) Claim(ctx context.Context, name, key string, newRecord func() (records.Record, error)) (string, bool, error) {
	return s.rec.Claim(ctx, name, key, newRecord)
}

// TryLock takes the named lock if no one holds it.
func (s *Store) TryLock(ctx context.Context, name string) (func(), bool, error) {
	return s.rec.TryLock(ctx, name)
}

// Check verifies the records (and, with opts.Blobs, this host's blobs).
func (s *Store) Check(ctx context.Context, opts CheckOptions) (*CheckReport, error) {
	return s.rec.Check(ctx, opts)
}

// Compact drops the journal's superseded entries.
func (s *Store) Compact(ctx context.Context) (CompactStats, error) { return s.rec.Compact(ctx) }

// Replay reads the journal from the start and returns the state it
// describes: for every record still present, its last version's bytes.
func (s *Store) Replay(ctx context.Context) (map[string][]byte, JournalStats, error) {
	return s.rec.Replay(ctx)
}

// NewBatch starts an empty batch of new records and index keys (see the
// batcher's guarantees).
func (s *Store) NewBatch() *Batch { return &Batch{s.rec.newBatch()} }

// Batch creates many new records, new versions of stored ones, and index
// keys naming them, at once: a crash leaves each committed or not, never
// half of one. It never waits for a lock: a record or key another writer
// holds is refused (TryLockIndex false, Create or Update nil), and the
// caller commits the batch before writing that one the ordinary way. A
// created record's ID must be new (records.Init): the directory store
// takes its lock at Commit, before the journal names it, and so never
// refuses it. A Batch is used by one goroutine at a time; batches of one
// Store may commit concurrently.
type Batch struct{ batcher }

type batcher interface {
	TryLockIndex(name, key string) (bool, error)
	// ClaimIndex is TryLockIndex for a key the caller sets and does not
	// read: the directory store takes its lock at Commit, trying again
	// while another writer holds it, and refuses only a key the batch has.
	ClaimIndex(name, key string) (bool, error)
	Create(r records.Record) ([]byte, error)
	// Update is Store.Update in the batch; nil, and no error, when the
	// record must be written the ordinary way (its lock is held, it is in
	// the batch already, or on PostgreSQL it is a cycle or a worker).
	Update(id string, r records.Record, fn func() error) ([]byte, error)
	// TryLockIndexes is TryLockIndex of each key in order, up to the
	// first the batch cannot take: n is how many it took. LookupAll is
	// Lookup of keys the batch holds, "" for each not found.
	// TryLockRecords readies Updates of stored records by taking their
	// locks now, in order, up to the first the batch cannot take. Taken
	// for many at once, the directory store reads what may have changed
	// of them once for all (batch_view.go), and PostgreSQL asks for all
	// of them in one round trip each (TryLockRecords reads the records
	// too, after their locks), where one at a time is one each.
	TryLockIndexes(name string, keys []string) (n int, err error)
	LookupAll(name string, keys []string) ([]string, error)
	TryLockRecords(ids []string) (n int, err error)
	// Lookup is the ID a key the batch holds (TryLockIndex) names, or
	// ErrNotFound. Unlike Store.Lookup it does not look for the record:
	// Update, which reads it, reports ErrNotFound for one that is gone.
	Lookup(name, key string) (string, error)
	SetIndex(name, key, id string) error
	Commit() error
	// Discard drops what is queued, stores nothing, and releases the
	// batch's locks; the batch is then empty and may be used again.
	Discard()
	Idle() bool
}

// Follower reads the journal's entries in commit order as they are
// committed (FollowJournal).
type Follower interface {
	// Next returns the next entry, or nil when everything committed so
	// far was read.
	Next() (*JournalEntry, error)
	// Wait returns when there may be more to read, or when ctx ends.
	Wait(ctx context.Context) error
	Close() error
}

// FollowJournal returns a follower of the journal, from its first entry
// (fromStart) or from the next one committed.
func (s *Store) FollowJournal(ctx context.Context, fromStart bool) (Follower, error) {
	return s.rec.follow(ctx, fromStart)
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
