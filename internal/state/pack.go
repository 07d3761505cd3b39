package state

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// A large batch keeps its records in one pack instead of a file each:
// creating a file is the dominant cost of a write on ext4, and a parse run
// stores thousands of observables. The pack is the batch's intent itself
// (every record's journal line), linked into packs/ once the journal append
// has committed it; a partition file per kind says where each record is:
//
//	packs/<batch>.batch    a committed batch's intent, kept
//	packs/<kind>/.batched  "<id> <batch> <offset> <length>" a line: where a
//	                       record is in its pack; "<id> -": deleted
//
// A record's own file, records/<kind>/<id>.json, comes first: a later single
// write of a packed record gives it one (the pack's copy is then stale), a
// delete removes that file and appends the "-" line. Of a record's lines
// the last counts: a packed batch's new version of a packed record (Update)
// is a new line, within a budget of stale copies (budgetUpdates); of a
// record with its own file, a new file. Readers load a kind's lines once
// and then only what was appended since (the file's size tells). Packs are
// never removed: a record updated or deleted leaves its earlier versions'
// bytes in their packs.
//
// Smaller batches (fewer than defaultPackMin records: a Claim, a plan's few
// records) give each record its file as single writes do: a reader of such
// a record needs no kind's pack lines, which grow with every packed record.
// Sixteen, not more: a lease's hourly --merge run stores a few dozen
// observables, and a file each (an inode, and a rename over the old one
// for each merge) made its writes half its time (issue 29: the day shape).
const defaultPackMin = 16

// crashPackLinked: a test kills a batch after its pack is linked into
// packs/, before its records' lines are appended.
const crashPackLinked = "pack:linked"

// packLoc is where a packed record's bytes are; an empty batch marks a
// deleted one.
type packLoc struct {
	batch string
	off   int64
	n     int64
}

// packIndex is what this store has read of a kind's pack lines: each ID's
// last line, up to end; and the bytes of the records the lines name (live)
// and of those later lines superseded (dead: a pack's stale copies).
type packIndex struct {
	end        int64
	locs       map[string]packLoc
	live, dead int64
}

// set records a line: id's record is at loc (a deleted one: no batch).
func (p *packIndex) set(id string, loc packLoc) {
	if old, ok := p.locs[id]; ok && old.batch != "" {
		p.live -= old.n
		p.dead += old.n
	}
	if loc.batch != "" {
		p.live += loc.n
	}
	p.locs[id] = loc
}

// defaultPackSlack is how many bytes of stale copies a kind's packs may hold
// beyond as many as they hold live (budgetUpdates).
const defaultPackSlack = 64 << 20

// budgetUpdates bounds what new versions of packed records add to packs,
// which are never rewritten: a batch's new version of a packed record is a
// pack line only while the kind's stale copies, with those it would add,
// stay within its live bytes or packSlack, whichever is larger; beyond,
// the batch gives its new versions files (rewritten in place by the next
// version), as a single write does, and a batch left with fewer than
// packMin records to pack is not packed at all (commit).
func (s *dirStore) budgetUpdates(recs []batchRec) {
	adds := make(map[string]int64)
	for _, r := range recs {
		if r.update && r.inPack() {
			adds[r.kind] += int64(len(r.data))
		}
	}
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	for kind, n := range adds {
		p := s.packs[kind]
		if p != nil && p.dead+n <= max(p.live, s.packSlack) {
			delete(adds, kind)
		}
	}
	for i := range recs {
		if _, over := adds[recs[i].kind]; over && recs[i].update {
			recs[i].asFile = true
		}
	}
}

func (s *dirStore) packDir(kind string) string { return filepath.Join(s.root, "packs", kind) }

func (s *dirStore) packPath(batch string) string {
	return filepath.Join(s.root, "packs", batch+batchIntentSuffix)
}

// packIndexOf reads what was appended to a kind's pack lines since the last
// call. The caller holds partsMu.
func (s *dirStore) packIndexOf(kind string) (*packIndex, error) {
	p := s.packs[kind]
	if p == nil {
		p = &packIndex{locs: make(map[string]packLoc)}
		if s.packs == nil {
			s.packs = make(map[string]*packIndex)
		}
		s.packs[kind] = p
	}
	dir := s.packDir(kind)
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, partitionFile), &st); err == unix.ENOENT || err == nil && st.Size <= p.end {
		return p, nil
	} else if err != nil {
		return nil, pathErr("stat", filepath.Join(dir, partitionFile), err)
	}
	lines, end, err := partitionLines(dir, p.end)
	if err != nil {
		return nil, err
	}
	for _, l := range lines {
		// The store alone writes these lines: one that does not parse
		// (which Check reports) names no record.
		if id, loc, ok := parsePackLine(l); ok && records.KindOf(id) == kind {
			p.set(id, loc)
		}
	}
	p.end = end
	return p, nil
}

func parsePackLine(l string) (string, packLoc, bool) {
	f := strings.Fields(l)
	if len(f) == 2 && f[1] == "-" && records.CheckID(f[0]) == nil {
		return f[0], packLoc{}, true
	}
	if len(f) != 4 || records.CheckID(f[0]) != nil || records.KindOf(f[1]) != batchIntentKind || records.CheckID(f[1]) != nil {
		return "", packLoc{}, false
	}
	off, err1 := strconv.ParseInt(f[2], 10, 64)
	n, err2 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil || off < 0 || n <= 0 {
		return "", packLoc{}, false
	}
	return f[0], packLoc{batch: f[1], off: off, n: n}, true
}

// packed returns where a record is in its pack; false if it is in none, or
// was deleted since.
func (s *dirStore) packed(kind, id string) (packLoc, bool, error) {
	return s.packedAsOf(kind, id, false)
}

// packedAsOf is packed without reading the kind's pack lines again when
// fresh: the caller read them after it took the record's lock, so that no
// line for it can have been appended since.
func (s *dirStore) packedAsOf(kind, id string, fresh bool) (packLoc, bool, error) {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	p := s.packs[kind]
	if !fresh || p == nil {
		var err error
		if p, err = s.packIndexOf(kind); err != nil {
			return packLoc{}, false, err
		}
	}
	loc, ok := p.locs[id]
	return loc, ok && loc.batch != "", nil
}

// packedAsOfNow reads a kind's pack lines and returns a test of whether a
// record is packed (and not deleted) that does not read them again: for a
// caller that holds the locks of the records it asks about, so that no line
// for them can be appended meanwhile.
func (s *dirStore) packedAsOfNow(kind string) (func(id string) bool, error) {
	s.partsMu.Lock()
	_, err := s.packIndexOf(kind)
	s.partsMu.Unlock()
	if err != nil {
		return nil, err
	}
	return func(id string) bool {
		_, ok, _ := s.packedAsOf(kind, id, true)
		return ok
	}, nil
}

// packedIDs lists the packed records of a kind that were not deleted since,
// with where each is.
func (s *dirStore) packedIDs(kind string) (map[string]packLoc, error) {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	p, err := s.packIndexOf(kind)
	if err != nil {
		return nil, err
	}
	live := make(map[string]packLoc, len(p.locs))
	for id, loc := range p.locs {
		if loc.batch != "" {
			live[id] = loc
		}
	}
	return live, nil
}

// readPacked reads a record's bytes from its pack.
func (s *dirStore) readPacked(loc packLoc) ([]byte, error) {
	p, err := s.openPack(loc.batch)
	if err != nil {
		return nil, err
	}
	defer s.donePack(p)
	buf := make([]byte, loc.n)
	if _, err := p.f.ReadAt(buf, loc.off); errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: ends before the record at %d", p.f.Name(), loc.off)
	} else if err != nil {
		return nil, err
	}
	return buf, nil
}

// maxPackFiles bounds the packs a store keeps open.
const maxPackFiles = 32

// openPack is a pack open for reading, and its readers.
type openPack struct {
	f    *os.File
	refs int
	// dropped: no longer among the open packs; closed by its last reader.
	dropped bool
}

// openPack returns the pack of a batch, open for reading, for the caller
// to hand back (donePack). Packs stay open, since a pack is never rewritten
// or removed, and a reader of many packed records (a merge, a report) would
// otherwise open and close it for each; past maxPackFiles all are dropped,
// each closed once no one reads it.
func (s *dirStore) openPack(batch string) (*openPack, error) {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	p, ok := s.packFiles[batch]
	if !ok {
		if len(s.packFiles) >= maxPackFiles {
			s.dropPacks()
		}
		f, err := os.Open(s.packPath(batch))
		if err != nil {
			return nil, err
		}
		p = &openPack{f: f}
		if s.packFiles == nil {
			s.packFiles = make(map[string]*openPack)
		}
		s.packFiles[batch] = p
	}
	p.refs++
	return p, nil
}

func (s *dirStore) donePack(p *openPack) {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	p.refs--
	if p.dropped && p.refs == 0 {
		p.f.Close()
	}
}

// dropPacks closes the open packs, each once no one reads it; the caller
// holds partsMu.
func (s *dirStore) dropPacks() {
	for batch, p := range s.packFiles {
		delete(s.packFiles, batch)
		p.dropped = true
		if p.refs == 0 {
			p.f.Close()
		}
	}
}

// readRecord returns a record's stored bytes: its file, else its pack's
// copy. An error wrapping fs.ErrNotExist: neither.
func (s *dirStore) readRecord(kind, id string) ([]byte, error) {
	b, _, err := s.readStored(kind, id)
	return b, err
}

// readStored is readRecord, and whether the bytes are the record's own
// file (loose) rather than its pack's copy.
func (s *dirStore) readStored(kind, id string) (data []byte, loose bool, err error) {
	b, err := readFile(s.recordPath(kind, id))
	if !errors.Is(err, fs.ErrNotExist) {
		return b, err == nil, err
	}
	loc, ok, perr := s.packed(kind, id)
	if perr != nil {
		return nil, false, perr
	}
	if !ok {
		return nil, false, err
	}
	b, err = s.readPacked(loc)
	return b, false, err
}

// recordExists reports whether a record has its file or a pack's copy.
func (s *dirStore) recordExists(kind, id string) (bool, error) {
	var st unix.Stat_t
	err := unix.Lstat(s.recordPath(kind, id), &st)
	if err == nil {
		return true, nil
	}
	if err != unix.ENOENT {
		return false, pathErr("stat", s.recordPath(kind, id), err)
	}
	_, ok, err := s.packed(kind, id)
	return ok, err
}

// dropPacked marks a deleted record's pack copy deleted, if it has one; the
// caller holds the record's lock and has removed its file.
func (s *dirStore) dropPacked(kind, id string) error {
	if _, ok, err := s.packed(kind, id); !ok || err != nil {
		return err
	}
	_, err := s.appendPartition(s.packDir(kind), []byte(id+" -\n"))
	return err
}

// packRecords keeps a committed batch's records in its intent: the intent
// is linked into packs/, then each kind's records are appended to the
// kind's pack lines. A crash before the lines are whole leaves the records
// without lines to recovery, which gives them their files (settleBatch).
func (b *dirBatch) packRecords(intent, name string) error {
	s := b.s
	pack := s.packPath(name)
	if err := s.ensureDir(filepath.Dir(pack)); err != nil {
		return err
	}
	if err := os.Link(intent, pack); err != nil {
		return err
	}
	if f, err := os.Open(pack); err == nil {
		s.startWriteback(int(f.Fd()), 0, int64(len(b.body)))
		f.Close()
	}
	if err := s.syncPlaced(pack); err != nil {
		return err
	}
	s.hook(crashPackLinked)
	lines := make(map[string][]byte)
	var kinds []string
	var files []batchRec
	for _, r := range b.recs {
		if !r.inPack() {
			files = append(files, r)
			continue
		}
		l, ok := lines[r.kind]
		if !ok {
			kinds = append(kinds, r.kind)
			l = make([]byte, 0, len(b.recs)*(len(r.id)+len(name)+24))
		}
		l = append(append(append(append(l, r.id...), ' '), name...), ' ')
		l = append(strconv.AppendInt(l, r.off, 10), ' ')
		lines[r.kind] = append(strconv.AppendInt(l, int64(len(r.data)), 10), '\n')
	}
	for _, kind := range kinds {
		at, err := s.appendPartition(s.packDir(kind), lines[kind])
		if err != nil {
			return err
		}
		s.notePacked(kind, name, b.recs, at, int64(len(lines[kind])))
	}
	// A record with its own file keeps one: a pack line would be shadowed
	// by it.
	for _, r := range files {
		if err := s.writeAtomic(s.recordPath(r.kind, r.id), r.data); err != nil {
			return err
		}
	}
	return nil
}

// notePacked adds a batch's records of a kind to this store's read of the
// kind's pack lines, which it has just appended at offset at, n bytes,
// when that read ends where they begin: reading them back would parse
// what the batch knows already.
func (s *dirStore) notePacked(kind, batch string, recs []batchRec, at, n int64) {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	p := s.packs[kind]
	if p == nil || p.end != at {
		return
	}
	for _, r := range recs {
		switch {
		case r.kind != kind:
		case r.inPack():
			p.set(r.id, packLoc{batch: batch, off: r.off, n: int64(len(r.data))})
		default:
			p.dead += int64(len(r.data)) // in the pack, but given a file
		}
	}
	p.end = at + n
}
