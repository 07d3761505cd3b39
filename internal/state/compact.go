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
	"sort"
	"strconv"

	"github.com/talkbox-sandbox/talkbox/internal/lines"
	"github.com/tidwall/gjson"
)

// Compaction keeps the journal proportional to the records it describes.
// Every put embeds the whole record, so a record updated every cycle of a
// week-long lease would otherwise make the journal grow without bound.
//
// A compaction rewrites the journal so that it keeps, of each record, only
// its last entry: the last put of a record that exists, and the delete of a
// record whose file or delete marker is still there (a delete in flight,
// which recovery rolls forward on the journal's word). Torn lines and every
// earlier entry go. What recovery and Check read — the last entry of each
// ID, and Replay's final state — is therefore the same before and after.
//
// The kept entries are copied in their order, each prefixed with its
// position (the generation and offset where it was first appended), after a
// header line naming the new generation. The new file is written in tmp/,
// fsynced, and renamed over journal.jsonl while the old file's flock is held;
// appenders in every process check under that flock that their descriptor
// is still the file at the journal's path (lockJournal), so no append lands
// in the replaced file. A process killed at any point leaves either the old
// journal or the new one in place, both complete.

// Crash points of a compaction (like the write protocol's, in write.go).
const (
	crashCompactWritten = "compact:written" // new journal complete in tmp/, not yet renamed
	crashCompactRenamed = "compact:renamed" // new journal in place, old one's flock still held
	crashCompactRead    = "compact:read"    // journal read, nothing written (tests count the reads)
)

// CompactStats describes one compaction.
type CompactStats struct {
	// Generation is the number of compactions the journal has had.
	Generation int64 `json:"generation"`
	Before     int64 `json:"before_bytes"`
	After      int64 `json:"after_bytes"`
	// Kept counts the entries kept; Dropped, the superseded entries,
	// tombstones and torn lines removed.
	Kept    int `json:"kept"`
	Dropped int `json:"dropped"`
}

// Compact compacts the journal now, whatever its size. Writes by this and
// other processes wait for it (they need the journal's flock). A journal
// that has not changed since its last compaction is left alone.
func (s *dirStore) Compact(ctx context.Context) (CompactStats, error) {
	s.journalMu.Lock()
	defer s.journalMu.Unlock()
	f, size, err := s.lockJournal()
	if err != nil {
		return CompactStats{}, err
	}
	if size == s.journalBase {
		gen, _, err := readHeader(f)
		s.unlockJournal(f, false)
		return CompactStats{Generation: gen, Before: size, After: size}, err
	}
	stats, retired, err := s.compactLocked(ctx, f, size, false)
	s.unlockJournal(f, retired)
	return stats, err
}

func (s *dirStore) compactTempPath() string { return filepath.Join(s.root, "tmp", "journal.compact") }

// kept is a journal line a compaction may keep.
type kept struct {
	off, n int64
	op, id string
	pos    bool // the line carries its position already
}

// errTornSurvivor: a line the quick reading took for a record's last entry
// is not valid JSON (a torn line whose start was whole).
var errTornSurvivor = errors.New("a kept journal line is torn")

// compactLocked compacts the journal f, of the given size, whose flock the
// caller holds. retired reports that f was replaced (even if an error
// followed), so that the caller drops the descriptor. When due (a
// compaction the store starts as the journal grows, not Compact), the
// journal is rewritten only if that drops a quarter of it or the limit's
// worth, whichever is less (errNotWorthIt otherwise): a journal of new
// records, what tb-parse and tb-plan append, keeps every line, and
// rewriting it would cost its size for nothing (5% of tb-parse's run on a
// 1 GiB capture).
//
// Decoding every line would be most of the cost (a line is mostly its
// record): the first pass reads only the members before the record
// (quickEntry), and only the lines kept are checked in full (as JSON) as
// they are copied. If one of them turns out torn, the compaction starts
// again decoding every line.
func (s *dirStore) compactLocked(ctx context.Context, f *os.File, size int64, due bool) (CompactStats, bool, error) {
	stats, retired, err := s.compactOnce(ctx, f, size, false, due)
	if errors.Is(err, errTornSurvivor) {
		stats, retired, err = s.compactOnce(ctx, f, size, true, due)
	}
	return stats, retired, err
}

// errNotWorthIt: a due compaction would drop too little to be written.
var errNotWorthIt = errors.New("compaction would drop too little of the journal")

func (s *dirStore) compactOnce(ctx context.Context, f *os.File, size int64, decodeAll, due bool) (stats CompactStats, retired bool, err error) {
	stats.Before = size
	var gen int64
	last := make(map[string]kept)
	lines := 0
	end, err := eachLine(ctx, io.NewSectionReader(f, 0, size), func(off int64, line []byte) error {
		lines++
		var k kept
		ok := false
		if !decodeAll {
			k, ok = quickEntry(line)
		}
		if !ok {
			var e entry
			if json.Unmarshal(line, &e) != nil {
				return nil
			}
			if e.Op == opCompact {
				var h journalHeader
				if off == 0 && json.Unmarshal(line, &h) == nil {
					gen = h.Gen
				}
				lines--
				return nil
			}
			if !e.valid() {
				return nil
			}
			k = kept{op: e.Op, id: e.ID, pos: e.Pos != nil}
		}
		k.off, k.n = off, int64(len(line))
		last[k.id] = k
		return nil
	})
	if err != nil {
		return stats, false, err
	}
	if end < size {
		lines++ // a torn last line
	}
	keep := make([]kept, 0, len(last))
	for _, k := range last {
		if k.op == opDelete && !s.tombstoneNeeded(k.id) {
			continue
		}
		keep = append(keep, k)
	}
	sort.Slice(keep, func(i, j int) bool { return keep[i].off < keep[j].off })
	stats.Generation = gen + 1
	stats.Kept = len(keep)
	stats.Dropped = lines - len(keep)

	var body int64
	for _, k := range keep {
		body += k.n
		if !k.pos {
			body += int64(len(posField(gen, k.off)))
		}
	}
	s.hook(crashCompactRead)
	if due && size-body < min(s.journalLimit, size/4) {
		return stats, false, errNotWorthIt
	}
	head, err := json.Marshal(journalHeader{At: s.Now(), Op: opCompact, Gen: gen + 1, Body: body, From: size})
	if err != nil {
		return stats, false, err
	}
	head = append(head, '\n')
	stats.After = int64(len(head)) + body

	tmpPath := s.compactTempPath()
	if err := s.writeCompacted(ctx, f, size, gen, head, keep, tmpPath, stats.After); err != nil {
		os.Remove(tmpPath)
		return stats, false, err
	}
	s.hook(crashCompactWritten)
	if err := rename(tmpPath, s.journalPath()); err != nil {
		os.Remove(tmpPath)
		return stats, false, err
	}
	s.hook(crashCompactRenamed)
	// Appends to the new file follow as soon as the flock is released: its
	// name must not revert to the old file on a power cut, whatever the
	// store's durability (the old file does not have them).
	return stats, true, syncDirAlways(filepath.Dir(s.journalPath()))
}

// quickEntry reads the op and ID of a line as appendJournal or a compaction
// writes it — members in entry's order, the ID right after the kind — without
// decoding the rest. ok is false for any other line, which the caller decodes.
// A torn line whose start is whole passes; the caller checks the lines it
// keeps.
func quickEntry(line []byte) (k kept, ok bool) {
	first := `{"at":"`
	rest, pos := bytes.CutPrefix(line, []byte(`{"pos":[`))
	if pos {
		i := bytes.Index(rest, []byte(`],`))
		if i < 0 {
			return k, false
		}
		rest, first = rest[i+2:], `"at":"`
	}
	var op, id []byte
	for _, m := range []struct {
		prefix string
		val    *[]byte
	}{{first, nil}, {`,"op":"`, &op}, {`,"kind":"`, nil}, {`,"id":"`, &id}} {
		if rest, ok = bytes.CutPrefix(rest, []byte(m.prefix)); !ok {
			return k, false
		}
		i := bytes.IndexByte(rest, '"')
		if i < 0 {
			return k, false
		}
		if m.val != nil {
			*m.val = rest[:i]
		}
		rest = rest[i+1:]
	}
	switch {
	case len(id) == 0 || bytes.IndexByte(id, '\\') >= 0:
		return k, false
	case string(op) == opPut || string(op) == opDelete:
		return kept{op: string(op), id: string(id), pos: pos}, true
	}
	return k, false
}

// writeCompacted writes the new journal: the header, then the kept lines of
// f in order, each with its position. It is fsynced whatever the store's
// durability: after the rename it is the only copy of the journal.
func (s *dirStore) writeCompacted(ctx context.Context, f *os.File, size, gen int64, head []byte, keep []kept, path string, want int64) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	defer out.Close()
	bw := bufio.NewWriterSize(out, 1<<20)
	bw.Write(head)
	i := 0
	_, err = eachLine(ctx, io.NewSectionReader(f, 0, size), func(off int64, line []byte) error {
		if i == len(keep) || keep[i].off != off {
			return nil
		}
		// A torn line is a strict prefix of a JSON object, never valid.
		// gjson's check is a third of encoding/json's time; the kept
		// lines are most of the journal.
		if !gjson.ValidBytes(line) {
			return errTornSurvivor
		}
		if !keep[i].pos {
			// The line is a JSON object: the position goes in as its first member.
			brace := bytes.IndexByte(line, '{') + 1
			bw.Write(line[:brace])
			bw.WriteString(posField(gen, off))
			line = line[brace:]
		}
		_, err := bw.Write(line)
		i++
		return err
	})
	if err != nil {
		return err
	}
	if i != len(keep) {
		return fmt.Errorf("%s changed while it was compacted", s.journalPath())
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	st, err := out.Stat()
	if err != nil {
		return err
	}
	if st.Size() != want {
		return fmt.Errorf("compacted journal %s: wrote %d bytes, want %d", path, st.Size(), want)
	}
	if err := out.Sync(); err != nil {
		return err
	}
	return out.Close()
}

// posField is the member a compaction adds to an entry of generation gen
// appended at offset off.
func posField(gen, off int64) string {
	return `"pos":[` + strconv.FormatInt(gen, 10) + "," + strconv.FormatInt(off, 10) + "],"
}

// tombstoneNeeded reports whether a compaction must keep a record's delete
// entry: while the record's file or its delete marker remains, the delete
// may be in flight, and recovery rolls it forward only if the journal's last
// word on the record is that delete. Once both are gone nothing reads the
// tombstone. No put of the record can be appended meanwhile: the caller
// holds the journal's flock.
func (s *dirStore) tombstoneNeeded(id string) bool {
	kind, err := checkRef(id)
	if err != nil {
		return true
	}
	for _, p := range []string{s.recordPath(kind, id), s.deleteIntentPath(kind, id)} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			return true
		}
	}
	return false
}

// eachLine calls fn with each complete line of r (its newline included) and
// the line's offset, and returns the offset after the last one. A last line
// without its newline is the tail of a write cut short: it carries no
// committed entry and is skipped. line is valid only during the call. The
// journal's lines have no bound: the store alone writes them, each a whole
// record, and a compaction must not drop a committed entry for its length.
func eachLine(ctx context.Context, r io.Reader, fn func(off int64, line []byte) error) (int64, error) {
	lr := lines.NewReader(bufio.NewReaderSize(r, 1<<20), 0)
	var end int64
	for n := 0; ; n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return end, err
			}
		}
		line, err := lr.Next()
		if err == io.EOF || err == nil && !lines.Complete(line) {
			return end, nil
		}
		if err != nil {
			return end, err
		}
		if err := fn(lr.Offset(), line); err != nil {
			return end, err
		}
		end = lr.Offset() + int64(len(line))
	}
}

// syncDirAlways fsyncs a directory whatever the store's durability.
func syncDirAlways(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
