package state

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

const (
	opPut    = "put"
	opDelete = "delete"
	// opCompact marks the first line of a compacted journal (journalHeader).
	opCompact = "compact"
)

// entry is one line of the journal.
type entry struct {
	// Pos is set on the entries a compaction copied: where the entry was
	// first appended (see position). An entry without it was appended to the
	// file it is in, at its own offset.
	Pos    *position       `json:"pos,omitempty"`
	At     time.Time       `json:"at"`
	Op     string          `json:"op"`
	Kind   string          `json:"kind"`
	ID     string          `json:"id"`
	Rev    int64           `json:"rev,omitempty"`
	Record json.RawMessage `json:"record,omitempty"`
}

// valid reports whether a decoded line is a whole entry.
func (e *entry) valid() bool {
	switch e.Op {
	case opPut:
		return e.ID != "" && len(e.Record) > 0
	case opDelete:
		return e.ID != ""
	}
	return false
}

// position is where an entry was appended: the generation of the journal
// file (0 for one never compacted, n for the file the nth compaction wrote)
// and the entry's byte offset in it. Positions order entries as they were
// committed, across compactions; a journal follower uses them to return
// every entry once.
type position [2]int64

func (p position) less(q position) bool {
	return p[0] < q[0] || p[0] == q[0] && p[1] < q[1]
}

// journalHeader is the first line of a journal a compaction wrote.
type journalHeader struct {
	At  time.Time `json:"at"`
	Op  string    `json:"op"`
	Gen int64     `json:"gen"`
	// Body is the length of what the compaction wrote after this line; the
	// file grows by appends from there.
	Body int64 `json:"body"`
	// From is the size of the journal the compaction replaced.
	From int64 `json:"from"`
}

// readHeader returns a journal file's generation and the size it had when
// it was written (0 and 0 for a journal never compacted).
func readHeader(f *os.File) (gen, base int64, err error) {
	var buf [512]byte
	n, err := f.ReadAt(buf[:], 0)
	if err != nil && err != io.EOF {
		return 0, 0, err
	}
	nl := bytes.IndexByte(buf[:n], '\n')
	if nl < 0 || !bytes.Contains(buf[:nl], []byte(`"op":"compact"`)) {
		return 0, 0, nil
	}
	var h journalHeader
	if json.Unmarshal(buf[:nl], &h) != nil || h.Op != opCompact {
		return 0, 0, nil
	}
	return h.Gen, int64(nl+1) + h.Body, nil
}

func (s *dirStore) journalPath() string { return filepath.Join(s.root, "journal", "journal.jsonl") }

// DefaultJournalLimit is the journal's growth since its last compaction
// that makes the store compact it (WithJournalLimit).
const DefaultJournalLimit = 16 << 20

// appendJournal appends one entry as a single write under the journal's
// flock. If a killed writer left a torn last line, it is closed with a
// newline first so that this entry starts a line of its own. A write that
// fails is cut back off, so that an entry whose caller saw an error is not
// half there. When the journal has outgrown its limit, the same flock then
// covers its compaction.
func (s *dirStore) appendJournal(e *entry) error {
	// The record is embedded verbatim: json.Marshal would re-escape <, > and
	// & inside it, and then the journal's copy would no longer be
	// byte-for-byte the record file (which recovery compares).
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil {
		return err
	}
	line := buf.Bytes()
	if bytes.IndexByte(line[:len(line)-1], '\n') >= 0 {
		return fmt.Errorf("journal entry for %s spans lines", e.ID)
	}
	return s.appendJournalLines(line)
}

// appendJournalLines appends whole journal lines (each ending in a newline)
// in one write, under the journal's flock, and compacts the journal when it
// is due.
func (s *dirStore) appendJournalLines(lines []byte) error {
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	f, size, err := s.lockJournal()
	if err != nil {
		return err
	}
	size, err = s.appendLocked(f, size, lines)
	retired := false
	if err == nil && s.compactDue(size) {
		// The entries are committed whatever happens to the compaction; a
		// failed one, or one not worth writing, leaves the journal as it
		// was and is tried again only after as much growth again, so that
		// a persistent failure (a full disk) does not make every write
		// rewrite the journal, nor a journal of live records every write
		// read it.
		var cerr error
		_, retired, cerr = s.compactLocked(context.Background(), f, size, true)
		switch {
		case errors.Is(cerr, errNotWorthIt):
			// Read again once the journal has doubled: the reads stay
			// proportional to the bytes appended. Every tool's store is
			// told (noteCompactChecked), not only this one.
			s.journalRetryAt = size + max(s.journalLimit, size)
			noteCompactChecked(f, s.journalRetryAt)
		case cerr != nil:
			s.journalRetryAt = size + max(s.journalLimit, s.journalBase)
		}
	}
	s.unlockJournal(f, retired)
	return err
}

// compactDue reports whether a journal of size bytes, of which the last
// compaction wrote journalBase, should be compacted now: when it has grown
// by more than the limit and by more than its compacted size, so that the
// cost of a compaction (its size) is at most about twice the bytes appended
// since the last one.
func (s *dirStore) compactDue(size int64) bool {
	if s.journalLimit <= 0 || size < s.journalRetryAt {
		return false
	}
	return size-s.journalBase > max(s.journalLimit, s.journalBase)
}

// compactCheckedXattr names the extended attribute of the journal file
// that holds the size it must reach before the next due compaction is
// read for: a read that found a compaction not worth writing (a journal
// of live records) is then not repeated by every tool that opens the
// state, each of which would read the whole journal at its first write.
// The attribute goes with the file: a compaction's new journal has none.
const compactCheckedXattr = "user.talkbox.compact-at"

// compactCheckedTo is the size noted by noteCompactChecked on the journal
// f, or 0: none, or a file system without user extended attributes, where
// each tool reads a due journal once.
func compactCheckedTo(f *os.File) int64 {
	var buf [24]byte
	n, err := unix.Fgetxattr(int(f.Fd()), compactCheckedXattr, buf[:])
	if err != nil {
		return 0
	}
	at, err := strconv.ParseInt(string(buf[:n]), 10, 64)
	if err != nil || at < 0 {
		return 0
	}
	return at
}

// noteCompactChecked notes on the journal f that no due compaction is to
// be read for until it reaches size at. Best effort: it only saves reads.
func noteCompactChecked(f *os.File, at int64) {
	unix.Fsetxattr(int(f.Fd()), compactCheckedXattr, strconv.AppendInt(nil, at, 10), 0)
}

// lockJournal returns the store's descriptor of the current journal file,
// flocked, and its size. A compaction in any process replaces the file by
// rename(2) while it holds the flock of the old one, so a descriptor that no
// longer names the file at the journal's path, checked under the flock, is
// stale: appending to it would lose the entry. It is dropped for a new one.
// The caller holds journalMu.
func (s *dirStore) lockJournal() (*os.File, int64, error) {
	for {
		if s.journal == nil {
			f, err := os.OpenFile(s.journalPath(), os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o640) // read too: the last byte is checked
			if err != nil {
				return nil, 0, err
			}
			s.journal = f
			s.journalBase, s.journalRetryAt = -1, 0
		}
		f := s.journal
		// The flock orders appends between processes; journalMu, between this
		// process's goroutines, which share the descriptor and so the flock.
		if err := flockRetry(int(f.Fd()), unix.LOCK_EX); err != nil {
			return nil, 0, err
		}
		// Raw stat calls: this runs on every append, and os.Stat allocates.
		var st, cur unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			s.unlockJournal(f, false)
			return nil, 0, pathErr("stat", f.Name(), err)
		}
		err := unix.Stat(s.journalPath(), &cur)
		if err == nil && st.Dev == cur.Dev && st.Ino == cur.Ino {
			if s.journalBase < 0 {
				// A header is written with its file and never changes.
				if _, s.journalBase, err = readHeader(f); err != nil {
					s.unlockJournal(f, false)
					return nil, 0, err
				}
				s.journalRetryAt = compactCheckedTo(f)
			}
			return f, st.Size, nil
		}
		if err != nil && err != unix.ENOENT {
			s.unlockJournal(f, false)
			return nil, 0, pathErr("stat", s.journalPath(), err)
		}
		s.unlockJournal(f, true)
	}
}

// unlockJournal releases the journal's flock and, if the descriptor is
// stale (retired), closes it so that the next append opens the current file.
// The flock is released before the close, while the descriptor is still
// ours: its number may be reused as soon as it is closed.
func (s *dirStore) unlockJournal(f *os.File, retired bool) {
	flockRetry(int(f.Fd()), unix.LOCK_UN)
	if retired {
		f.Close()
		if s.journal == f {
			s.journal = nil
		}
	}
}

// appendLocked writes line at the end of the flocked journal of the given
// size and returns its new size.
func (s *dirStore) appendLocked(f *os.File, size int64, line []byte) (int64, error) {
	if size > 0 {
		var last [1]byte
		if _, err := unix.Pread(int(f.Fd()), last[:], size-1); err != nil {
			return size, err
		}
		if last[0] != '\n' {
			line = append([]byte{'\n'}, line...)
		}
	}
	if err := s.writeJournalLine(f, line); err != nil {
		if terr := f.Truncate(size); terr != nil {
			return size, fmt.Errorf("%w (and cutting the partial entry off: %v)", err, terr)
		}
		return size, err
	}
	s.startWriteback(int(f.Fd()), size, size+int64(len(line)))
	if err := s.syncFile(int(f.Fd()), f.Name()); err != nil {
		// Whether the entry is on disk is unknown; it is in the file.
		return size, err
	}
	if size == 0 {
		return size + int64(len(line)), s.syncDir(filepath.Dir(f.Name()))
	}
	return size + int64(len(line)), nil
}

// writeJournalLine writes the line in one call, or, when a test hook is set,
// in two with the hook between them so that a test can leave a torn line.
func (s *dirStore) writeJournalLine(f *os.File, line []byte) error {
	if s.crashAt != nil {
		half := len(line) / 2
		if _, err := f.Write(line[:half]); err != nil {
			return err
		}
		s.hook(crashJournalTorn)
		line = line[half:]
	}
	_, err := f.Write(line)
	return err
}

// JournalStats summarises a replay.
type JournalStats struct {
	Entries int `json:"entries"`
	// Torn counts lines that do not decode: the tail of a write cut short by
	// a killed process. They never carry a committed change.
	Torn int `json:"torn"`
}

// Replay reads the journal from the start and returns the state it
// describes: for every record ID still present, the bytes of its last version.
func (s *dirStore) Replay(ctx context.Context) (map[string][]byte, JournalStats, error) {
	state := make(map[string][]byte)
	stats, err := s.scanJournal(ctx, func(e *entry) {
		switch e.Op {
		case opPut:
			state[e.ID] = append([]byte(nil), e.Record...)
		case opDelete:
			delete(state, e.ID)
		}
	})
	return state, stats, err
}

func (s *dirStore) scanJournal(ctx context.Context, fn func(*entry)) (JournalStats, error) {
	var stats JournalStats
	f, err := os.Open(s.journalPath())
	if errors.Is(err, fs.ErrNotExist) {
		return stats, nil
	}
	if err != nil {
		return stats, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	for {
		if stats.Entries%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return stats, err
			}
		}
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var e entry
			derr := json.Unmarshal(line, &e)
			switch {
			case derr == nil && e.Op == opCompact:
				// A compacted journal's header.
			case derr != nil || !e.valid():
				stats.Torn++
			default:
				stats.Entries++
				fn(&e)
			}
		}
		if err == io.EOF {
			return stats, nil
		}
		if err != nil {
			return stats, err
		}
	}
}

// journalChunk is how much of the journal lastJournalEntry reads at a time
// (a variable so that tests can make lines cross chunk boundaries often).
var journalChunk int64 = 1 << 20

// lastJournalEntry finds the newest journal entry for id by reading the
// journal backwards. Only recovery after a crash needs it. The caller holds
// the record's lock, so no entry for id is being appended meanwhile.
func (s *dirStore) lastJournalEntry(id string) (*entry, error) {
	for try := 0; ; try++ {
		e, err := s.lastJournalEntryOnce(id)
		// The journal only shrinks when an append that failed is cut back
		// off; read it again if that happened under us.
		if errors.Is(err, errJournalShrank) && try < 3 {
			continue
		}
		return e, err
	}
}

var errJournalShrank = errors.New("journal shrank while being read")

func (s *dirStore) lastJournalEntryOnce(id string) (*entry, error) {
	f, err := os.Open(s.journalPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	needle := []byte(`"id":"` + id + `"`)
	match := func(line []byte) *entry {
		if !bytes.Contains(line, needle) {
			return nil
		}
		var e entry
		if json.Unmarshal(line, &e) == nil && e.ID == id && e.valid() {
			return &e
		}
		return nil
	}
	chunk := journalChunk
	end := st.Size()
	// tail holds, latest first, the pieces of the line that began before
	// the chunks read so far; it is joined once, when its start is found, so
	// a line spanning many chunks costs its length and no more.
	var tail [][]byte
	line := func(head []byte) []byte {
		if len(tail) == 0 {
			return head
		}
		n := len(head)
		for _, p := range tail {
			n += len(p)
		}
		out := make([]byte, 0, n)
		out = append(out, head...)
		for i := len(tail) - 1; i >= 0; i-- {
			out = append(out, tail[i]...)
		}
		tail = tail[:0]
		return out
	}
	for end > 0 {
		start := max(end-chunk, 0)
		buf := make([]byte, end-start)
		n, err := f.ReadAt(buf, start)
		if err == io.EOF && n < len(buf) {
			return nil, errJournalShrank
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
		hi := len(buf)
		for {
			nl := bytes.LastIndexByte(buf[:hi], '\n')
			if nl < 0 {
				break
			}
			if e := match(line(buf[nl+1 : hi])); e != nil {
				return e, nil
			}
			hi = nl
		}
		if hi > 0 {
			tail = append(tail, buf[:hi])
		}
		end = start
	}
	if e := match(line(nil)); e != nil {
		return e, nil
	}
	return nil, nil
}

// resolveIntent settles a write or delete that a dead process left in flight
// for one record. The caller holds the record's lock, so no live writer owns
// it. The journal decides: a write is rolled forward if the record's last
// entry is exactly the intent, a delete if its last entry is a delete;
// anything else never committed and is discarded.
func (s *dirStore) resolveIntent(kind, id string) error {
	putIntent := s.intentPath(kind, id)
	delIntent := s.deleteIntentPath(kind, id)
	data, err := readFile(putIntent)
	havePut := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	_, err = os.Lstat(delIntent)
	haveDel := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if !havePut && !haveDel {
		return nil
	}
	last, err := s.lastJournalEntry(id)
	if err != nil {
		return err
	}
	path := s.recordPath(kind, id)
	switch {
	case havePut && last != nil && last.Op == opPut && bytes.Equal(bytes.TrimSpace(last.Record), bytes.TrimSpace(data)):
		// Committed to the journal but not yet renamed: roll forward.
		if err := s.ensureDir(filepath.Dir(path)); err != nil {
			return err
		}
		if err := rename(putIntent, path); err != nil {
			return err
		}
		havePut = false
		if err := s.syncPlaced(path); err != nil {
			return err
		}
	case haveDel && last != nil && last.Op == opDelete:
		// Deleted in the journal but the file may remain: roll forward.
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := s.syncDir(filepath.Dir(path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := s.dropPacked(kind, id); err != nil {
			return err
		}
	}
	// Whatever is left never committed: discard.
	if havePut {
		if err := os.Remove(putIntent); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if haveDel {
		if err := os.Remove(delIntent); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return s.syncDir(filepath.Dir(putIntent))
}

// parseIntentName splits an intent file name into the record's kind and ID.
func parseIntentName(name string) (kind, id string, ok bool) {
	base, ok1 := strings.CutSuffix(name, putIntentSuffix)
	if !ok1 {
		base, ok1 = strings.CutSuffix(name, deleteIntentSuffix)
	}
	kind, id, ok2 := strings.Cut(base, "~")
	if !ok1 || !ok2 {
		return "", "", false
	}
	if _, err := checkRef(id); err != nil || kind != records.KindOf(id) {
		return "", "", false
	}
	return kind, id, true
}

// recoverIntents settles every write left in flight by a process that died.
// Intents whose lock is held belong to live writers and are left alone.
func (s *dirStore) recoverIntents(ctx context.Context) error {
	ents, err := os.ReadDir(filepath.Join(s.root, "intents"))
	if err != nil {
		return err
	}
	done := make(map[string]bool)
	for _, e := range ents {
		if name, ok := batchIntentName(e.Name()); ok {
			if _, err := s.recoverBatch(ctx, name); err != nil {
				return fmt.Errorf("recovering %s: %w", name, err)
			}
			continue
		}
		kind, id, ok := parseIntentName(e.Name())
		if !ok || done[id] {
			continue
		}
		done[id] = true
		unlock, locked, err := lockFile(ctx, s.recordLockPath(kind, id), lockOffset(id), false)
		if err != nil {
			return err
		}
		if !locked {
			continue
		}
		err = s.resolveIntent(kind, id)
		unlock()
		if err != nil {
			return fmt.Errorf("recovering %s: %w", id, err)
		}
	}
	return nil
}

// JournalEntry is one committed change, as a JournalFollower returns it.
type JournalEntry struct {
	At   time.Time
	Op   string // "put" or "delete"
	Kind string
	ID   string
	Rev  int64
	// Record is the record as stored, for a put.
	Record json.RawMessage
}

// JournalFollower reads the journal's entries in commit order as they are
// appended, and goes on across compactions: it returns every entry once,
// except those a compaction dropped before the follower reached them (the
// superseded versions of a record, the history of a deleted one). It polls
// the journal; it is not safe for concurrent use.
type JournalFollower struct {
	path string
	f    *os.File
	rd   *bufio.Reader
	gen  int64 // f's generation
	// start is the offset in f of the line being read, and partial what of
	// it was read before its newline was written.
	start   int64
	partial []byte
	// next is the position of the first entry not yet returned: entries
	// before it were returned, or precede where the follower started.
	next position
	// replaced is set when the journal's path was found to name another
	// file (a compaction's): nothing more will be appended to f.
	replaced bool
}

// followFile returns a follower of the journal file, from its first entry
// (fromStart) or from the next one appended. The journal need not exist yet.
func (s *dirStore) follow(_ context.Context, fromStart bool) (Follower, error) {
	return s.followFile(fromStart)
}

func (s *dirStore) followFile(fromStart bool) (*JournalFollower, error) {
	fl := &JournalFollower{path: s.journalPath()}
	if err := fl.open(); err != nil {
		return nil, err
	}
	if fl.f != nil && !fromStart {
		end, err := fl.f.Seek(0, io.SeekEnd)
		if err != nil {
			fl.Close()
			return nil, err
		}
		fl.rd.Reset(fl.f)
		fl.start, fl.next = end, position{fl.gen, end}
	}
	return fl, nil
}

// Wait polls: the journal file has no change notification.
func (fl *JournalFollower) Wait(ctx context.Context) error {
	t := time.NewTimer(50 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Close releases the journal file.
func (fl *JournalFollower) Close() error {
	if fl.f == nil {
		return nil
	}
	err := fl.f.Close()
	fl.f = nil
	return err
}

// open opens the file at the journal's path, if there is one, and reads its
// generation.
func (fl *JournalFollower) open() error {
	f, err := os.Open(fl.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	gen, _, err := readHeader(f)
	if err != nil {
		f.Close()
		return err
	}
	fl.f, fl.gen, fl.start, fl.partial, fl.replaced = f, gen, 0, nil, false
	if fl.rd == nil {
		fl.rd = bufio.NewReaderSize(f, 1<<16)
	} else {
		fl.rd.Reset(f)
	}
	return nil
}

// Next returns the next entry, or nil when the follower has read everything
// committed so far; call it again later for what is appended meanwhile.
func (fl *JournalFollower) Next() (*JournalEntry, error) {
	for {
		if fl.f == nil {
			if err := fl.open(); err != nil || fl.f == nil {
				return nil, err
			}
		}
		line, err := fl.rd.ReadBytes('\n')
		if err == nil {
			if len(fl.partial) > 0 {
				line = append(fl.partial, line...)
				fl.partial = nil
			}
			at := fl.start
			fl.start += int64(len(line))
			if e := fl.take(line, at); e != nil {
				return e, nil
			}
			continue
		}
		if err != io.EOF {
			return nil, err
		}
		// A line without its newline is still being written.
		fl.partial = append(fl.partial, line...)
		if fl.replaced {
			// f has been read to the end it had when it was replaced; a
			// line left without its newline was torn by a killed writer.
			fl.Close()
			continue
		}
		st, err := fl.f.Stat()
		if err != nil {
			return nil, err
		}
		cur, err := os.Stat(fl.path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil // compactions replace the file, never remove it
		}
		if err != nil {
			return nil, err
		}
		if os.SameFile(st, cur) {
			return nil, nil
		}
		// Replaced, but appends may have reached f between the end read
		// above and the rename: read on to f's end before moving on.
		fl.replaced = true
	}
}

// take decodes a line that starts at offset at of the follower's file, and
// returns its entry unless it is not one (a header, a torn line) or was
// returned already (the follower read it before a compaction copied it).
func (fl *JournalFollower) take(line []byte, at int64) *JournalEntry {
	var e entry
	if json.Unmarshal(line, &e) != nil || !e.valid() {
		return nil
	}
	p := position{fl.gen, at}
	if e.Pos != nil {
		p = *e.Pos
	}
	if p.less(fl.next) {
		return nil
	}
	fl.next = position{p[0], p[1] + 1}
	return &JournalEntry{At: e.At, Op: e.Op, Kind: e.Kind, ID: e.ID, Rev: e.Rev, Record: e.Record}
}

// writebackMin is the least a write hands the disk at once (startWriteback).
const writebackMin = 256 << 10

// startWriteback has the kernel start writing fd's bytes from off to end
// to disk, whole pages only, without waiting for them, when the store
// syncs on Flush and they are at least writebackMin. The pages of a batch
// are then on their way while the writer goes on, and Flush's fsyncs wait
// for less: the kernel would otherwise hold them dirty for up to 30 s,
// and a short-lived writer's Flush would write them all. It is
// advice: an error is Flush's to report.
func (s *dirStore) startWriteback(fd int, off, end int64) {
	if s.durability != SyncOnFlush {
		return
	}
	const page = 4096 // the smallest page size: a larger one only rounds more
	off, end = off&^(page-1), end&^(page-1)
	if end-off < writebackMin {
		return
	}
	unix.SyncFileRange(fd, off, end-off, unix.SYNC_FILE_RANGE_WRITE)
}
