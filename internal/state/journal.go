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
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

const (
	opPut    = "put"
	opDelete = "delete"
)

// entry is one line of the journal.
type entry struct {
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

func (s *Store) journalPath() string { return filepath.Join(s.root, "journal", "journal.jsonl") }

// appendJournal appends one entry as a single write under the journal's
// flock. If a killed writer left a torn last line, it is closed with a
// newline first so that this entry starts a line of its own. A write that
// fails is cut back off, so that an entry whose caller saw an error is not
// half there.
func (s *Store) appendJournal(e *entry) error {
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
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	if s.journal == nil {
		f, err := os.OpenFile(s.journalPath(), os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o640) // read too: the last byte is checked
		if err != nil {
			return err
		}
		s.journal = f
	}
	f := s.journal
	// The flock orders appends between processes; journalMu, between this
	// process's goroutines, which share the descriptor and so the flock.
	if err := flockRetry(int(f.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	defer flockRetry(int(f.Fd()), unix.LOCK_UN)
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if size > 0 {
		var last [1]byte
		if _, err := unix.Pread(int(f.Fd()), last[:], size-1); err != nil {
			return err
		}
		if last[0] != '\n' {
			line = append([]byte{'\n'}, line...)
		}
	}
	if err := s.writeJournalLine(f, line); err != nil {
		if terr := f.Truncate(size); terr != nil {
			return fmt.Errorf("%w (and cutting the partial entry off: %v)", err, terr)
		}
		return err
	}
	if s.durability == SyncEachWrite {
		if err := f.Sync(); err != nil {
			// Whether the entry is on disk is unknown; it is in the file.
			return err
		}
		if size == 0 {
			return s.syncDir(filepath.Dir(s.journalPath()))
		}
	}
	return nil
}

// writeJournalLine writes the line in one call, or, when a test hook is set,
// in two with the hook between them so that a test can leave a torn line.
func (s *Store) writeJournalLine(f *os.File, line []byte) error {
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
func (s *Store) Replay(ctx context.Context) (map[string][]byte, JournalStats, error) {
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

func (s *Store) scanJournal(ctx context.Context, fn func(*entry)) (JournalStats, error) {
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
			if json.Unmarshal(line, &e) != nil || !e.valid() {
				stats.Torn++
			} else {
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
func (s *Store) lastJournalEntry(id string) (*entry, error) {
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

func (s *Store) lastJournalEntryOnce(id string) (*entry, error) {
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
func (s *Store) resolveIntent(kind, id string) error {
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
		if err := s.syncDir(filepath.Dir(path)); err != nil {
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
func (s *Store) recoverIntents(ctx context.Context) error {
	ents, err := os.ReadDir(filepath.Join(s.root, "intents"))
	if err != nil {
		return err
	}
	done := make(map[string]bool)
	for _, e := range ents {
		kind, id, ok := parseIntentName(e.Name())
		if !ok || done[id] {
			continue
		}
		done[id] = true
		unlock, locked, err := lockFile(ctx, s.recordLockPath(kind), lockOffset(id), false)
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
