package state

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// dirBatch creates many new records, and index keys naming them, with one
// intent file and one journal append for all of them: the intent (every
// record's journal entry, then every key) is written, the entries appended
// to the journal in one write, which commits them, then the records are put
// in place: a batch of at least packMin records keeps them in its intent,
// linked into packs/ (pack.go), a smaller one gives each record its file
// (the files of different directories in parallel); then the keys, and the
// intent is removed. The locks of its records and keys
// are held from the moment they are queued until Commit. A crash leaves
// each record committed or not, as a crash between single writes would,
// never half of one; recovery (Open) gives a committed record its file and
// its keys from the intent, and discards the rest.
//
// A dirBatch never waits for a lock: a record or key another writer holds is
// refused (TryLockIndex false, Create nil), and the caller commits the batch
// before writing that one the ordinary way, so that a batch never holds
// locks while it waits for another (which could deadlock with a second
// batch). Nor may the caller write, through the Store, a record or key the
// batch has locked before Commit: the Store would wait for the batch's lock.
//
// A dirBatch is used by one goroutine.
type dirBatch struct {
	s *dirStore
	// fds holds one descriptor per lock file, through which every byte lock
	// of the batch in that file is taken; closing it releases them all.
	fds  map[string]int
	held map[string]bool // "<lock file>\x00<key>" locked by the batch
	recs []batchRec
	keys []batchKey
}

type batchRec struct {
	kind, id string
	r        records.Record
	saved    records.Meta // the caller's header, given back if not stored
	data     []byte
	off      int64 // where data is in the batch's intent (intentBody)
}

// batchKey is an index key a batch sets, as its intent holds it.
type batchKey struct {
	Op    string `json:"op"` // opIndex
	Index string `json:"index"`
	Key   string `json:"key"`
	ID    string `json:"id"`
	path  string // its own file's (indexPath), checked by SetIndex
}

// intentEntryHead and intentKeyLine are about the bytes of an intent line
// besides its record, and of a key's line: what intentBody reserves.
const (
	intentEntryHead = 160
	intentKeyLine   = 320
)

// newDirBatch starts an empty batch.
func (s *dirStore) newBatch() batcher { return s.newDirBatch() }

func (s *dirStore) newDirBatch() *dirBatch {
	return &dirBatch{s: s, fds: make(map[string]int), held: make(map[string]bool)}
}

// Idle reports whether the batch holds nothing: no record, key or lock.
func (b *dirBatch) Idle() bool { return len(b.recs) == 0 && len(b.keys) == 0 && len(b.held) == 0 }

// tryLock takes byte off of the lock file path for the batch without
// waiting. False: another holder has it, or the batch already does under
// the same name (a second write of one record or key in a batch).
func (b *dirBatch) tryLock(path, name string) (bool, error) {
	k := path + "\x00" + name
	if b.held[k] {
		return false, nil
	}
	fd, ok := b.fds[path]
	if !ok {
		var err error
		if fd, err = openRetry(path, unix.O_RDWR|unix.O_CREAT, 0o640); err != nil {
			if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
				return false, err
			}
			if fd, err = openRetry(path, unix.O_RDWR|unix.O_CREAT, 0o640); err != nil {
				return false, err
			}
		}
		b.fds[path] = fd
	}
	err := ofdLock(fd, lockOffset(name), false)
	if err == unix.EAGAIN || err == unix.EACCES {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", path, err)
	}
	b.held[k] = true
	return true, nil
}

// TryLockIndex takes an index key's lock for the batch. False: another
// writer holds it, or this batch does already.
func (b *dirBatch) TryLockIndex(name, key string) (bool, error) {
	if !records.ValidKind(name) {
		// The key itself is checked by SetIndex; any key names a lock byte.
		return false, fmt.Errorf("invalid index name %q", name)
	}
	return b.tryLock(b.s.indexLockPath(name), key)
}

// Create queues a new record, as Store.Create would store it: r has its kind
// and ID (records.Init), and Commit fails if the ID is taken. Its header
// (rev 1, updated_at, v) is set now, and given back as it was if the record
// is not stored. It returns the record as it will be stored: one line of
// JSON, without the newline. Nil, and no error: the record's lock is held
// elsewhere, or r's ID is in the batch already.
func (b *dirBatch) Create(r records.Record) ([]byte, error) {
	h := r.Header()
	kind, err := checkRef(h.ID)
	if err != nil {
		return nil, err
	}
	ok, err := b.tryLock(b.s.recordLockPath(kind), h.ID)
	if !ok || err != nil {
		return nil, err
	}
	saved := *h
	data, err := b.s.stamp(h.ID, nil, r)
	if err != nil {
		h.Rev, h.CreatedAt, h.UpdatedAt, h.V = saved.Rev, saved.CreatedAt, saved.UpdatedAt, saved.V
		return nil, err
	}
	b.recs = append(b.recs, batchRec{kind: kind, id: h.ID, r: r, saved: saved, data: data})
	return data, nil
}

// checkNew fails with ErrExists if a queued record's ID is taken. A
// single write's intent in the way can only be a dead writer's: it is
// settled as commitLocked settles it, and the ID checked again, since
// settling may have rolled a committed write forward. packed tells the
// kind's packed records, intents the names in intents/ when the batch
// held its locks (no write's intent for one of its records can come later).
func (b *dirBatch) checkNew(r *batchRec, packed func(id string) bool, intents map[string]bool) error {
	s := b.s
	if packed(r.id) {
		return fmt.Errorf("%s: %w", r.id, ErrExists)
	}
	for try := 0; ; try++ {
		var st unix.Stat_t
		if err := unix.Lstat(s.recordPath(r.kind, r.id), &st); err == nil {
			return fmt.Errorf("%s: %w", r.id, ErrExists)
		} else if err != unix.ENOENT {
			return pathErr("stat", s.recordPath(r.kind, r.id), err)
		}
		if !intents[filepath.Base(s.intentPath(r.kind, r.id))] || try > 0 {
			return nil
		}
		if err := s.resolveIntent(r.kind, r.id); err != nil {
			return err
		}
	}
}

// SetIndex points an index key, whose lock the batch holds (TryLockIndex),
// at id. Keys are written after the records, so that a key never names a
// record a crash left unwritten.
func (b *dirBatch) SetIndex(name, key, id string) error {
	path, err := b.s.indexPath(name, key)
	if err != nil {
		return err
	}
	if err := records.CheckID(id); err != nil {
		return err
	}
	if !b.held[b.s.indexLockPath(name)+"\x00"+key] {
		return fmt.Errorf("index key %s/%s set in a batch that does not hold its lock", name, key)
	}
	b.keys = append(b.keys, batchKey{Op: opIndex, Index: name, Key: key, ID: id, path: path})
	return nil
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
		for _, r := range b.recs {
			h := r.r.Header()
			h.Rev, h.CreatedAt, h.UpdatedAt, h.V = r.saved.Rev, r.saved.CreatedAt, r.saved.UpdatedAt, r.saved.V
		}
	}
	return err
}

func (b *dirBatch) commit() error {
	s := b.s
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
	for i := range b.recs {
		if err := b.checkNew(&b.recs[i], packed[b.recs[i].kind], intents); err != nil {
			return err
		}
	}
	if err := s.appendKeys(b.recs); err != nil {
		return err
	}
	body, journalLen, err := b.intentBody()
	if err != nil {
		return err
	}
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
	if len(b.recs) >= s.packMin {
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

// intentBody is the batch's intent: the journal entries of every queued
// record, as appendJournal encodes them (the first journalLen bytes, which
// are appended to the journal as they are), then one line per index key.
// Each entry is encoded without its record, which is spliced in as its last
// field: the record is one compact line already (stamp), and the encoder
// would scan it again to compact it.
func (b *dirBatch) intentBody() (body []byte, journalLen int, err error) {
	var buf, head bytes.Buffer
	// Sized once: growing it by doubling cleared and copied the batch's
	// bytes several times over.
	size := 0
	for _, r := range b.recs {
		size += len(r.data) + intentEntryHead
	}
	buf.Grow(size + len(b.keys)*intentKeyLine)
	enc := json.NewEncoder(&head)
	enc.SetEscapeHTML(false) // see appendJournal
	for i, r := range b.recs {
		h := r.r.Header()
		head.Reset()
		if err := enc.Encode(&entry{At: h.UpdatedAt, Op: opPut, Kind: r.kind, ID: r.id, Rev: h.Rev}); err != nil {
			return nil, 0, err
		}
		line := bytes.TrimSuffix(head.Bytes(), []byte("}\n"))
		if len(line) == head.Len() || bytes.IndexByte(r.data, '\n') >= 0 {
			return nil, 0, fmt.Errorf("journal entry for %s does not encode as one line", r.id)
		}
		buf.Write(line)
		buf.WriteString(`,"record":`)
		b.recs[i].off = int64(buf.Len())
		buf.Write(r.data)
		buf.WriteString("}\n")
	}
	journalLen = buf.Len()
	for _, k := range b.keys {
		head.Reset()
		if err := enc.Encode(k); err != nil {
			return nil, 0, err
		}
		buf.Write(head.Bytes())
	}
	return buf.Bytes(), journalLen, nil
}

// placeRecords gives every queued record its file. Files of one directory
// are created one after the other (the directory's lock serialises them in
// the kernel anyway), directories in parallel.
func (b *dirBatch) placeRecords() error {
	s := b.s
	first := b.recs[0]
	if err := s.placeRecord(first.kind, first.id, first.data); err != nil {
		return err
	}
	s.hook(crashPutRenamed)
	byDir := make(map[string][]func() error)
	for _, r := range b.recs[1:] {
		dir := filepath.Dir(s.recordPath(r.kind, r.id))
		byDir[dir] = append(byDir[dir], func() error { return s.placeRecord(r.kind, r.id, r.data) })
	}
	return inParallel(byDir)
}

// placeKeys writes the queued index keys: a key that has its own file
// (SetIndex wrote it) is replaced there, a directory's one after the other
// and directories in parallel; the rest are appended to their index's
// partition file, one append per index.
func (b *dirBatch) placeKeys() error {
	byDir := make(map[string][]func() error)
	packed := make(map[string][]byte)
	for _, k := range b.keys {
		path := k.path
		dir := filepath.Dir(path)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err == unix.ENOENT {
			packed[dir] = fmt.Appendf(packed[dir], "%s %s\n", k.Key, k.ID)
			continue
		} else if err != nil {
			return pathErr("stat", path, err)
		}
		byDir[dir] = append(byDir[dir], func() error { return b.s.placeKey(path, k.ID) })
	}
	if err := inParallel(byDir); err != nil {
		return err
	}
	for dir, lines := range packed {
		if err := b.s.appendPartition(dir, lines); err != nil {
			return err
		}
	}
	return nil
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

// release closes the batch's lock descriptors, which drops its locks, and
// empties it.
func (b *dirBatch) release() {
	for path, fd := range b.fds {
		unix.Close(fd)
		delete(b.fds, path)
	}
	clear(b.held)
	b.recs, b.keys = b.recs[:0], b.keys[:0]
}
