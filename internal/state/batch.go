package state

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// dirBatch creates many new records, and index keys naming them, with one
// intent file and one journal append for all of them: the intent (every
// record's journal entry, then every key) is written, the entries appended
// to the journal in one write, which commits them, then the records are put
// in place: a batch of at least packMin records keeps them in its intent,
// linked into packs/ (pack.go), a smaller one gives each record its file
// (the files of different directories in parallel); then the keys, and the
// intent is removed. The locks of its keys and updated records are held
// from the moment they are queued until Commit, those of its new records
// from the start of Commit (lockNew) to its end. A crash leaves
// each record committed or not, as a crash between single writes would,
// never half of one; recovery (Open) gives a committed record its file and
// its keys from the intent, and discards the rest.
//
// A dirBatch never waits for a lock: a record or key another writer holds is
// refused (TryLockIndex false, Update nil), and the caller commits the batch
// before writing that one the ordinary way, so that a batch never holds
// locks while it waits for another (which could deadlock with a second
// batch). Nor may the caller write, through the Store, a record or key the
// batch has locked before Commit: the Store would wait for the batch's lock.
//
// A dirBatch is used by one goroutine.
type dirBatch struct {
	s *dirStore
	// fds holds one descriptor per lock file, through which every byte lock
	// of the batch in that file is taken (from the store's lockFDs, given
	// back unlocked by release).
	fds map[string]int
	// held: locked by the batch, or, for a new record, claimed by it and
	// locked by Commit (lockNew).
	held map[heldLock]bool
	// fdLocked: the lock files whose descriptor holds a lock taken before
	// Commit (a key's, an updated record's).
	fdLocked map[string]bool
	// atCommit holds the names whose locks Commit takes (lockNew) by lock
	// file: the new records' IDs, and the keys claimed (ClaimIndex).
	atCommit map[string][]string
	recs     []batchRec
	keys     []batchKey
	// lockPaths holds the lock file paths of the kinds and indexes the
	// batch has locked in, rather than joining them for every lock.
	lockPaths map[heldLock]*[lockShards]string
	indexDirs map[string]string // indexDir's
	// lines are the partition lines of a commit's keys (appendKeys,
	// placeKeys), in buffers kept from one commit to the next.
	lines partLines
	// body is the intent as it is built: each record's journal entry is
	// appended to it by Create, the keys' lines by commit. It is kept from
	// one commit to the next, so that a long run reuses one buffer.
	body []byte
	// seq numbers the locks taken before Commit, in order (lockSeq); view
	// serves reads for those taken before it (batch_view.go).
	seq     int64
	lockSeq map[heldLock]int64
	view    *batchView
	// forUpdate are the records TryLockRecords locked for an Update to come.
	forUpdate map[string]bool
}

// heldLock is a lock a batch holds: a name's byte in a lock file.
type heldLock struct{ path, name string }

type batchRec struct {
	kind, id string
	r        records.Record
	saved    records.Meta // the caller's header, given back if not stored
	data     []byte       // the record's line, in body
	off      int64        // where data is in the batch's intent (body)
	// update: a new version of a stored record (Update), whose keys were
	// oldKeys, and whose stored version was its own file (loose) or a
	// pack's copy. asFile: a packed batch gives it a file all the same
	// (packRecords).
	update  bool
	loose   bool
	asFile  bool
	oldKeys []records.IndexKey
}

// inPack tells whether a packed batch puts r in its pack.
func (r *batchRec) inPack() bool { return !r.update || !r.loose && !r.asFile }

// batchKey is an index key a batch sets, as its intent holds it.
type batchKey struct {
	Op    string `json:"op"` // opIndex
	Index string `json:"index"`
	Key   string `json:"key"`
	ID    string `json:"id"`
	dir   string // its index's directory (SetIndex checked the key)
}

// newDirBatch starts an empty batch.
func (s *dirStore) newBatch() batcher { return s.newDirBatch() }

func (s *dirStore) newDirBatch() *dirBatch {
	return &dirBatch{s: s, fds: make(map[string]int), held: make(map[heldLock]bool), fdLocked: make(map[string]bool),
		atCommit: make(map[string][]string), lockSeq: make(map[heldLock]int64), forUpdate: make(map[string]bool)}
}

// Idle reports whether the batch holds nothing: no record, key or lock.
func (b *dirBatch) Idle() bool { return len(b.recs) == 0 && len(b.keys) == 0 && len(b.held) == 0 }

// tryLock takes byte off of the lock file path for the batch without
// waiting. False: another holder has it, or the batch already does under
// the same name (a second write of one record or key in a batch).
func (b *dirBatch) tryLock(path, name string) (bool, error) {
	k := heldLock{path, name}
	if b.held[k] {
		return false, nil
	}
	fd, err := b.fd(path)
	if err != nil {
		return false, err
	}
	err = ofdLock(fd, lockOffset(name), false)
	if err == unix.EAGAIN || err == unix.EACCES {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", path, err)
	}
	b.held[k] = true
	b.fdLocked[path] = true
	b.seq++
	b.lockSeq[k] = b.seq
	return true, nil
}

// fd is the batch's descriptor of the lock file path.
func (b *dirBatch) fd(path string) (int, error) {
	fd, ok := b.fds[path]
	if !ok {
		var err error
		if fd, err = b.s.lockFDs.get(path); err != nil {
			return -1, err
		}
		b.fds[path] = fd
	}
	return fd, nil
}

// lockNew takes the locks that Create and ClaimIndex leave to Commit: a
// new record's ID is new (records.Init), so no other writer can ask for it
// before the journal names it, and the lock is what makes a writer that
// then does wait until the record is in place; a claimed key's lock keeps
// other writers of the key out from the journal append until the key is in
// place. A lock each at Create and ClaimIndex was a system call each (a
// fifth of tb-parse's run with the state). A lock file in which the batch
// holds nothing else is locked whole, one call for all its names; in the
// others each name's byte.
// Another writer's lock in the way (a batch committing holds whole files)
// fails the attempt: it lets go of what it took, and tries again after a
// pause, for at most newLockPatience, since a batch never waits for a lock
// while it holds others.
//
// Whole files held by committing batches are let go within milliseconds;
// a single writer's lock is one byte, which only a record of the same ID
// (or the same lock byte) would meet.
func (b *dirBatch) lockNew() error {
	if len(b.atCommit) == 0 {
		return nil
	}
	deadline := time.Now().Add(b.s.newLockPatience)
	pause := 500 * time.Microsecond
	for {
		ok, err := b.tryLockNew()
		if ok || err != nil {
			return err
		}
		b.s.hook(hookNewLocksBusy)
		if time.Now().After(deadline) {
			return fault.TempFail(fmt.Errorf("the locks of a batch's %d new records and %d keys: other writers held them for %s", len(b.recs), len(b.keys), b.s.newLockPatience))
		}
		time.Sleep(pause/2 + time.Duration(rand.Int64N(int64(pause))))
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// hookNewLocksBusy: an attempt of lockNew found a lock taken (crashAt).
const hookNewLocksBusy = "new-locks-busy"

// defaultNewLockPatience is how long lockNew tries before Commit fails
// (exit 75: retry later).
const defaultNewLockPatience = 30 * time.Second

// tryLockNew is one attempt of lockNew: false, holding none of the locks it
// took, when another writer holds one.
func (b *dirBatch) tryLockNew() (bool, error) {
	type taken struct {
		fd  int
		off int64 // -1: the whole file
	}
	var took []taken
	undo := func() {
		for _, t := range took {
			start, n := t.off, int64(1)
			if t.off < 0 {
				start, n = 0, 0
			}
			lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: 0, Start: start, Len: n}
			unix.FcntlFlock(uintptr(t.fd), unix.F_OFD_SETLK, &lk)
		}
	}
	for path, names := range b.atCommit {
		fd, err := b.fd(path)
		if err != nil {
			undo()
			return false, err
		}
		if !b.fdLocked[path] {
			err := ofdLockRange(fd, 0, 0, false)
			if err == nil {
				took = append(took, taken{fd, -1})
				continue
			}
			if err != unix.EAGAIN && err != unix.EACCES {
				undo()
				return false, fmt.Errorf("lock %s: %w", path, err)
			}
		}
		for _, name := range names {
			off := lockOffset(name)
			err := ofdLock(fd, off, false)
			if err == nil {
				took = append(took, taken{fd, off})
				continue
			}
			undo()
			if err == unix.EAGAIN || err == unix.EACCES {
				return false, nil
			}
			return false, fmt.Errorf("lock %s: %w", path, err)
		}
	}
	return true, nil
}

// TryLockIndex takes an index key's lock for the batch. False: another
// writer holds it, or this batch does already.
func (b *dirBatch) TryLockIndex(name, key string) (bool, error) {
	if !records.ValidKind(name) {
		// The key itself is checked by SetIndex; any key names a lock byte.
		return false, fmt.Errorf("invalid index name %q", name)
	}
	return b.tryLock(b.lockPath("index", name, key), key)
}

// Lookup is the ID the index key names, the key's lock held by the batch
// (TryLockIndex): read without a look for the record, which a merge reads
// next anyway (Update), so that a merged observable's record is looked for
// once, not twice.
func (b *dirBatch) Lookup(name, key string) (string, error) {
	k := heldLock{b.lockPath("index", name, key), key}
	if !b.held[k] {
		return "", fmt.Errorf("index key %s/%s looked up in a batch that does not hold its lock", name, key)
	}
	var (
		id string
		ok bool
	)
	viewed, err := b.servedByView(k)
	if err == nil && viewed {
		id, ok, err = b.viewIndexEntry(name, key)
	} else if err == nil {
		id, ok, err = b.s.indexEntry(name, key)
	}
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("%s %s: %w", name, key, ErrNotFound)
	}
	return id, nil
}

// ClaimIndex claims an index key for the batch, whose lock Commit takes
// (lockNew): the key may be set (SetIndex) but not read under the batch's
// lock before Commit, and another writer of it makes Commit try again.
// False: the batch holds or claims it already.
func (b *dirBatch) ClaimIndex(name, key string) (bool, error) {
	if !records.ValidKind(name) {
		return false, fmt.Errorf("invalid index name %q", name)
	}
	path := b.lockPath("index", name, key)
	k := heldLock{path, key}
	if b.held[k] {
		return false, nil
	}
	b.held[k] = true
	b.atCommit[path] = append(b.atCommit[path], key)
	return true, nil
}

// lockPath is s.lockFilePath(of, name, key), remembered: the batch takes
// hundreds of locks in a few files.
func (b *dirBatch) lockPath(of, name, key string) string {
	k := heldLock{of, name}
	paths, ok := b.lockPaths[k]
	if !ok {
		if b.lockPaths == nil {
			b.lockPaths = make(map[heldLock]*[lockShards]string)
		}
		paths = new([lockShards]string)
		b.lockPaths[k] = paths
	}
	i := lockShard(key)
	if paths[i] == "" {
		paths[i] = b.s.lockFilePath(of, name, key)
	}
	return paths[i]
}

// Create queues a new record, as Store.Create would store it: r has its kind
// and ID (records.Init), and Commit fails if the ID is taken. Its header
// (rev 1, updated_at, v) is set now, and given back as it was if the record
// is not stored. It returns the record as it will be stored: one line of
// JSON, without the newline, which stays valid until the batch is used
// again after its Commit. Nil, and no error: r's ID is in the batch
// already. r's ID must be new (records.Init): its lock is taken by Commit.
func (b *dirBatch) Create(r records.Record) ([]byte, error) {
	h := r.Header()
	kind, err := checkRef(h.ID)
	if err != nil {
		return nil, err
	}
	path := b.lockPath("records", kind, h.ID)
	if b.held[heldLock{path, h.ID}] {
		return nil, nil
	}
	saved := *h
	start := len(b.body)
	off, err := b.appendEntry(kind, r, stored{})
	if err != nil {
		b.body = b.body[:start]
		h.Rev, h.CreatedAt, h.UpdatedAt, h.V = saved.Rev, saved.CreatedAt, saved.UpdatedAt, saved.V
		return nil, err
	}
	data := b.body[off : len(b.body)-len(entryTail)]
	b.recs = append(b.recs, batchRec{kind: kind, id: h.ID, r: r, saved: saved, data: data, off: int64(off)})
	b.held[heldLock{path, h.ID}] = true
	b.atCommit[path] = append(b.atCommit[path], h.ID)
	return data, nil
}

// entryTail ends a journal entry that carries its record.
const entryTail = "}\n"

// appendEntry stamps r as the version after old (a new record: none) and
// appends its journal entry to the batch's body, as appendJournal encodes
// it: the entry's fields, then the record, spliced in as its last field
// (it is one compact line already, which the encoder would scan again to
// compact). It returns where the record starts in the body.
func (b *dirBatch) appendEntry(kind string, r records.Record, old stored) (int, error) {
	h := r.Header()
	if err := stampHeader(h.ID, old, b.s.Now(), r); err != nil {
		return 0, err
	}
	// kind and the ID passed checkRef: letters, digits and _, nothing JSON
	// escapes.
	b.body = append(b.body, `{"at":"`...)
	b.body = h.UpdatedAt.AppendFormat(b.body, time.RFC3339Nano)
	b.body = append(b.body, `","op":"`+opPut+`","kind":"`...)
	b.body = append(b.body, kind...)
	b.body = append(b.body, `","id":"`...)
	b.body = append(b.body, h.ID...)
	b.body = append(b.body, `","rev":`...)
	b.body = strconv.AppendInt(b.body, h.Rev, 10)
	b.body = append(b.body, `,"record":`...)
	off := len(b.body)
	var err error
	if b.body, err = appendEncoded(b.body, h.ID, r); err != nil {
		return 0, err
	}
	if bytes.IndexByte(b.body[off:], '\n') >= 0 {
		return 0, fmt.Errorf("journal entry for %s does not encode as one line", h.ID)
	}
	b.body = append(b.body, entryTail...)
	return off, nil
}

// TryLockRecords takes stored records' locks for Updates of them to come,
// in order, up to the first another writer holds or the batch does
// already.
func (b *dirBatch) TryLockRecords(ids []string) (int, error) {
	for i, id := range ids {
		kind, err := checkRef(id)
		if err != nil {
			return i, err
		}
		if ok, err := b.tryLock(b.lockPath("records", kind, id), id); !ok || err != nil {
			return i, err
		}
		b.forUpdate[id] = true
	}
	return len(ids), nil
}

// TryLockIndexes is TryLockIndex of each key in order, up to the first the
// batch cannot take.
func (b *dirBatch) TryLockIndexes(name string, keys []string) (int, error) {
	for i, key := range keys {
		if ok, err := b.TryLockIndex(name, key); !ok || err != nil {
			return i, err
		}
	}
	return len(keys), nil
}

// LookupAll is Lookup of each key, "" for one not found.
func (b *dirBatch) LookupAll(name string, keys []string) ([]string, error) {
	ids := make([]string, len(keys))
	for i, key := range keys {
		id, err := b.Lookup(name, key)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return ids[:i], err
		}
		ids[i] = id
	}
	return ids, nil
}

// Update queues a new version of a stored record, as Store.Update would
// write it: under the record's lock it decodes the stored version into r
// and calls fn to change it; the store sets rev (the stored one plus one)
// and updated_at. It returns the record as it will be stored, as Create
// does. Nil, and no error: the record's lock is held elsewhere, or the
// record is in the batch already. ErrNotFound: the record is not stored.
// An error from fn (ErrNoChange included) is returned as it is, and
// nothing is queued; the record's lock stays held until Commit.
//
// The new version takes the place of the stored one where that one is: a
// record with its own file gets a new file, a packed one a new pack line.
func (b *dirBatch) Update(id string, r records.Record, fn func() error) ([]byte, error) {
	s := b.s
	kind, err := checkRef(id)
	if err != nil {
		return nil, err
	}
	k := heldLock{b.lockPath("records", kind, id), id}
	if b.forUpdate[id] {
		delete(b.forUpdate, id)
	} else if ok, err := b.tryLock(k.path, id); !ok || err != nil {
		return nil, err
	}
	var (
		prev  []byte
		loose bool
	)
	viewed, err := b.servedByView(k)
	switch {
	case err != nil:
	case viewed:
		prev, loose, err = b.viewReadStored(kind, id)
	default:
		// A write that a dead process left in flight is settled first,
		// as a single write settles it.
		if err = s.resolveIntent(kind, id); err == nil {
			prev, loose, err = s.readStored(kind, id)
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	resetRecord(r)
	if err := records.Unmarshal(prev, r); err != nil {
		return nil, fmt.Errorf("%s: stored record does not decode: %w", id, err)
	}
	oldKeys := indexKeys(r)
	// What prevHeader would read from prev, which decoded.
	old := stored{Rev: r.Header().Rev, CreatedAt: r.Header().CreatedAt}
	if err := fn(); err != nil {
		return nil, err
	}
	h := r.Header()
	saved := *h
	start := len(b.body)
	off, err := b.appendEntry(kind, r, old)
	if err != nil {
		b.body = b.body[:start]
		h.Rev, h.CreatedAt, h.UpdatedAt, h.V = saved.Rev, saved.CreatedAt, saved.UpdatedAt, saved.V
		return nil, err
	}
	data := b.body[off : len(b.body)-len(entryTail)]
	b.recs = append(b.recs, batchRec{kind: kind, id: id, r: r, saved: saved, data: data, off: int64(off),
		update: true, loose: loose, oldKeys: oldKeys})
	return data, nil
}

// checkNew fails with ErrExists if a queued record's ID is taken. A
// single write's intent in the way can only be a dead writer's: it is
// settled as commitLocked settles it, and the ID checked again, since
// settling may have rolled a committed write forward. packed tells the
// kind's packed records, intents the names in intents/ when the batch
// held its locks (no write's intent for one of its records can come later).
func (b *dirBatch) checkNew(r *batchRec, packed func(id string) bool, intents map[string]bool, stats *dirStats, dir string) error {
	s := b.s
	if packed(r.id) {
		return fmt.Errorf("%s: %w", r.id, ErrExists)
	}
	if ok, err := stats.exists(dir, r.id+".json"); ok || err != nil {
		return cmp.Or(err, fmt.Errorf("%s: %w", r.id, ErrExists))
	}
	if len(intents) == 0 || !intents[filepath.Base(s.intentPath(r.kind, r.id))] {
		return nil
	}
	if err := s.resolveIntent(r.kind, r.id); err != nil {
		return err
	}
	// Settling may have rolled the write forward, after stats read dir.
	var st unix.Stat_t
	if err := unix.Lstat(s.recordPath(r.kind, r.id), &st); err == nil {
		return fmt.Errorf("%s: %w", r.id, ErrExists)
	} else if err != unix.ENOENT {
		return pathErr("stat", s.recordPath(r.kind, r.id), err)
	}
	return nil
}

// SetIndex points an index key, whose lock the batch holds (TryLockIndex)
// or will take (ClaimIndex), at id. Keys are written after the records, so that a key never names a
// record a crash left unwritten.
func (b *dirBatch) SetIndex(name, key, id string) error {
	if !records.ValidKind(name) || !validIndexKey(key) {
		return fmt.Errorf("invalid index key %s/%s", name, key)
	}
	if err := records.CheckID(id); err != nil {
		return err
	}
	if !b.held[heldLock{b.lockPath("index", name, key), key}] {
		return fmt.Errorf("index key %s/%s set in a batch that does not hold its lock", name, key)
	}
	b.keys = append(b.keys, batchKey{Op: opIndex, Index: name, Key: key, ID: id, dir: b.indexDir(name)})
	return nil
}

// indexDir is the directory of the index name's keys (indexPath's).
func (b *dirBatch) indexDir(name string) string {
	if b.indexDirs == nil {
		b.indexDirs = make(map[string]string)
	}
	dir, ok := b.indexDirs[name]
	if !ok {
		dir = filepath.Join(b.s.root, "index", name)
		b.indexDirs[name] = dir
	}
	return dir
}

// Commit writes what is queued and releases the batch's locks; the batch is
// then empty and may be used again. On error no record is known to be
// stored: those that were (an error after the journal append) are rolled
// forward by the next write of the record or by Open, like a single write
// that failed late.
func (b *dirBatch) Commit() error {
	defer b.release()
	err := b.commit()
	if err != nil {
		b.giveBack()
	}
	return err
}

func (b *dirBatch) Discard() {
	b.giveBack()
	b.release()
}

// giveBack restores the headers of records that were not stored.
func (b *dirBatch) giveBack() {
	for _, r := range b.recs {
		h := r.r.Header()
		h.Rev, h.CreatedAt, h.UpdatedAt, h.V = r.saved.Rev, r.saved.CreatedAt, r.saved.UpdatedAt, r.saved.V
	}
}

func (b *dirBatch) commit() error {
	s := b.s
	if err := b.lockNew(); err != nil {
		return err
	}
	if len(b.recs) == 0 {
		return b.placeKeys()
	}
	// The pack lines of the batch's kinds are read once, now that the
	// batch holds its records' locks: no line for them can come later.
	packed := make(map[string]func(id string) bool)
	for _, r := range b.recs {
		if _, ok := packed[r.kind]; !ok {
			in, err := s.packedAsOfNow(r.kind)
			if err != nil {
				return err
			}
			packed[r.kind] = in
		}
	}
	// One read of intents/ rather than a stat per record: it holds only
	// the writes in flight, and dead writers' leftovers.
	ents, err := os.ReadDir(filepath.Join(s.root, "intents"))
	if err != nil {
		return err
	}
	intents := make(map[string]bool, len(ents))
	for _, e := range ents {
		intents[e.Name()] = true
	}
	var stats dirStats
	defer stats.close()
	var kind, dir string
	for i := range b.recs {
		r := &b.recs[i]
		if r.update {
			continue // stored, and locked since it was read
		}
		if r.kind != kind {
			kind, dir = r.kind, filepath.Dir(s.recordPath(r.kind, r.id))
		}
		if err := b.checkNew(r, packed[kind], intents, &stats, dir); err != nil {
			return err
		}
	}
	pack := false
	if len(b.recs) >= s.packMin {
		s.budgetUpdates(b.recs)
		n := 0
		for i := range b.recs {
			if b.recs[i].inPack() {
				n++
			}
		}
		pack = n >= s.packMin
	}
	if err := s.appendKeys(b.recs, &b.lines); err != nil {
		return err
	}
	body, journalLen := b.intentBody()
	name := records.NewID(batchIntentKind, time.Now())
	if ok, err := b.tryLock(s.batchLockPath(), name); !ok || err != nil {
		return cmp.Or(err, fmt.Errorf("batch %s: lock taken", name))
	}
	intent := filepath.Join(s.root, "intents", name+batchIntentSuffix)
	if err := s.writeNewFile(intent, body, 0o640); err != nil {
		return err
	}
	// The intent must be on disk before the journal says its records are
	// committed.
	if err := s.syncDir(filepath.Dir(intent)); err != nil {
		os.Remove(intent)
		return err
	}
	s.hook(crashPutIntent)
	if err := s.appendJournalLines(body[:journalLen]); err != nil {
		// Some entries may have reached the journal: let it decide, as
		// recovery would.
		if rerr := s.settleBatch(context.Background(), intent, true); rerr != nil {
			return fmt.Errorf("%w (and settling batch %s: %v)", err, name, rerr)
		}
		return err
	}
	s.hook(crashPutJournaled)
	place := b.placeRecords
	if pack {
		place = func() error { return b.packRecords(intent, name) }
	}
	if err := place(); err != nil {
		return fmt.Errorf("batch %s committed but not yet in place (recovered when the state is next opened): %w", name, err)
	}
	s.hook(crashClaimCreated)
	if err := b.placeKeys(); err != nil {
		return fmt.Errorf("batch %s committed but its index keys not yet in place (recovered when the state is next opened): %w", name, err)
	}
	if err := os.Remove(intent); err != nil {
		return err
	}
	return s.syncDir(filepath.Dir(intent))
}

// intentBody completes the batch's intent: the journal entries of every
// queued record, as Create appended them (the first journalLen bytes,
// which are appended to the journal as they are), then one line per index
// key.
func (b *dirBatch) intentBody() (body []byte, journalLen int) {
	journalLen = len(b.body)
	for _, k := range b.keys {
		b.body = appendKeyLine(b.body, &k)
	}
	return b.body, journalLen
}

// appendKeyLine appends k's line of an intent, as encoding/json would
// write it: SetIndex checked the index name, the key and the ID, whose
// characters JSON does not escape.
func appendKeyLine(buf []byte, k *batchKey) []byte {
	buf = append(buf, `{"op":"`...)
	buf = append(buf, k.Op...)
	buf = append(buf, `","index":"`...)
	buf = append(buf, k.Index...)
	buf = append(buf, `","key":"`...)
	buf = append(buf, k.Key...)
	buf = append(buf, `","id":"`...)
	buf = append(buf, k.ID...)
	return append(buf, "\"}\n"...)
}

// placeRecords gives every queued record its file. Files of one directory
// are created one after the other (the directory's lock serialises them in
// the kernel anyway), directories in parallel.
func (b *dirBatch) placeRecords() error {
	s := b.s
	place := func(r batchRec) error {
		if r.update && r.loose {
			return s.writeAtomic(s.recordPath(r.kind, r.id), r.data)
		}
		return s.placeRecord(r.kind, r.id, r.data)
	}
	if err := place(b.recs[0]); err != nil {
		return err
	}
	s.hook(crashPutRenamed)
	byDir := make(map[string][]func() error)
	for _, r := range b.recs[1:] {
		dir := filepath.Dir(s.recordPath(r.kind, r.id))
		byDir[dir] = append(byDir[dir], func() error { return place(r) })
	}
	return inParallel(byDir)
}

// placeKeys writes the queued index keys: a key that has its own file
// (SetIndex wrote it) is replaced there, a directory's one after the other
// and directories in parallel; the rest are appended to their index's
// partition file, one append per index.
func (b *dirBatch) placeKeys() error {
	var byDir map[string][]func() error
	b.lines.reset()
	var stats dirStats
	defer stats.close()
	for _, k := range b.keys {
		dir := k.dir
		if ok, err := stats.exists(dir, k.Key); err != nil {
			return err
		} else if !ok {
			buf := b.lines.of(dir)
			*buf = append(append(append(append(*buf, k.Key...), ' '), k.ID...), '\n')
			continue
		}
		if byDir == nil {
			byDir = make(map[string][]func() error)
		}
		byDir[dir] = append(byDir[dir], func() error { return b.s.placeKey(filepath.Join(dir, k.Key), k.ID) })
	}
	if err := inParallel(byDir); err != nil {
		return err
	}
	return b.lines.appendTo(b.s)
}

// inParallel runs each list of steps in order, the lists at once, and
// returns the first error.
func inParallel(lists map[string][]func() error) error {
	errs := make(chan error, len(lists))
	for _, steps := range lists {
		go func() {
			for _, step := range steps {
				if err := step(); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	var first error
	for range lists {
		first = cmp.Or(first, <-errs)
	}
	return first
}

// release drops the batch's locks, gives their descriptors back to the
// store, and empties the batch.
func (b *dirBatch) release() {
	for path, fd := range b.fds {
		b.s.lockFDs.put(path, fd)
		delete(b.fds, path)
	}
	clear(b.held)
	clear(b.fdLocked)
	clear(b.atCommit)
	clear(b.lockSeq)
	clear(b.forUpdate)
	b.seq = 0
	b.dropView()
	clear(b.recs) // the records, for the collector
	b.recs, b.keys, b.body = b.recs[:0], b.keys[:0], b.body[:0]
}

// dirStats tells whether names exist in a few directories: a batch checks
// hundreds of names, most of them absent, in one or two directories, and a
// lookup of each was a tenth of a parse run's time. A directory of at most
// dirListMax bytes is read whole, once; a larger one is asked name by name,
// through one descriptor. Its caller holds the locks of the names it asks
// about, so that none of them appears or goes meanwhile but by its own
// doing.
type dirStats struct{ dirs map[string]*statDir }

type statDir struct {
	fd    int                 // -1: the directory is not there
	names map[string]struct{} // its entries, when it was read whole
}

// dirListMax is the largest directory (by its size on disk) read whole: a
// few blocks, a few hundred names.
const dirListMax = 16 << 10

// exists reports whether dir holds name (not following a symlink); a
// directory that is not there holds nothing.
func (d *dirStats) exists(dir, name string) (bool, error) {
	sd, err := d.open(dir)
	if err != nil || sd.fd < 0 {
		return false, err
	}
	if sd.names != nil {
		_, ok := sd.names[name]
		return ok, nil
	}
	var st unix.Stat_t
	switch err := unix.Fstatat(sd.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err {
	case nil:
		return true, nil
	case unix.ENOENT:
		return false, nil
	default:
		return false, pathErr("stat", filepath.Join(dir, name), err)
	}
}

func (d *dirStats) open(dir string) (*statDir, error) {
	if sd, ok := d.dirs[dir]; ok {
		return sd, nil
	}
	if d.dirs == nil {
		d.dirs = make(map[string]*statDir)
	}
	sd := &statDir{fd: -1}
	fd, err := openRetry(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOENT) {
		d.dirs[dir] = sd
		return sd, nil
	} else if err != nil {
		return nil, err
	}
	sd.fd = fd
	d.dirs[dir] = sd
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, pathErr("stat", dir, err)
	}
	if st.Size <= dirListMax {
		names, err := readDirNames(fd, dir)
		if err != nil {
			return nil, err
		}
		sd.names = names
	}
	return sd, nil
}

// readDirNames reads the names of the directory open as fd.
func readDirNames(fd int, dir string) (map[string]struct{}, error) {
	names := make(map[string]struct{})
	buf := make([]byte, 8<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, pathErr("read", dir, err)
		}
		if n <= 0 {
			return names, nil
		}
		_, _, entries := unix.ParseDirent(buf[:n], -1, nil)
		for _, e := range entries {
			names[e] = struct{}{}
		}
	}
}

func (d *dirStats) close() {
	for _, sd := range d.dirs {
		if sd.fd >= 0 {
			unix.Close(sd.fd)
		}
	}
}
