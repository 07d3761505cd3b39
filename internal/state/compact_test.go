package state

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// journalLines splits the journal into lines (the last one, if torn, too).
func journalLines(t testing.TB, s *Store) []string {
	t.Helper()
	j := strings.TrimSuffix(string(journalBytes(t, s)), "\n")
	if j == "" {
		return nil
	}
	return strings.Split(j, "\n")
}

func journalSize(t testing.TB, s *Store) int64 {
	t.Helper()
	st, err := os.Stat(s.journalPath())
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// lastEntries is lastJournalEntry for each ID (nil when there is none).
func lastEntries(t testing.TB, s *Store, ids []string) map[string]*entry {
	t.Helper()
	out := make(map[string]*entry)
	for _, id := range ids {
		e, err := s.lastJournalEntry(id)
		if err != nil {
			t.Fatal(err)
		}
		out[id] = e
	}
	return out
}

func sameEntry(a, b *entry) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Op == b.Op && a.ID == b.ID && a.Rev == b.Rev && a.At.Equal(b.At) && bytes.Equal(a.Record, b.Record)
}

func describe(e *entry) string {
	if e == nil {
		return "none"
	}
	return fmt.Sprintf("%s rev %d %s", e.Op, e.Rev, e.Record)
}

func bump(t testing.TB, s *Store, id string, note string) {
	t.Helper()
	var c counterRec
	if err := s.Update(context.Background(), id, &c, func(bool) error { c.Total++; c.Note = note; return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestCompactKeepsWhatRecoveryReads: a compaction keeps each record's last
// entry (and so Replay's state and what recovery reads), a tombstone only
// while the delete may be in flight, and drops torn lines; entries it copied
// keep their first position through later compactions.
func TestCompactKeepsWhatRecoveryReads(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openT(t, dir, WithJournalLimit(0))
	mk := func(note string) string {
		c := newCounter(s)
		c.Note = note
		if err := s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		return c.ID
	}
	hot := mk("hot")
	gone := mk("deleted")
	inFlight := mk("delete in flight")
	odd := mk("<a&b>\u2028 \"id\":\"" + gone + "\"") // escapes, and another ID inside
	for i := 0; i < 5; i++ {
		bump(t, s, hot, strings.Repeat("x", i*100))
	}
	if err := s.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	// A delete a killed process left after its commit point: marker and
	// journal entry written, file still there.
	kind := records.KindOf(inFlight)
	if err := s.writeFile(s.deleteIntentPath(kind, inFlight), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.appendJournal(&entry{At: s.Now(), Op: opDelete, Kind: kind, ID: inFlight, Rev: 1}); err != nil {
		t.Fatal(err)
	}
	// Torn lines mid-journal (each closed by the next append), one of them
	// the last line that names odd, and one at the end.
	f, err := os.OpenFile(s.journalPath(), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"at":"2026-01-01T00:00:00Z","op":"put","kind":"counter","id":"` + hot + `","rev":99,"record":{"kin`)
	bump(t, s, hot, "before last")
	f.WriteString(`{"at":"2026-01-01T00:00:00Z","op":"put","kind":"counter","id":"` + odd + `","rev":99,"record":{"kind":"counter","id":`)
	bump(t, s, hot, "last")
	f.WriteString(`{"at":"2026-01-01T00:00:00Z","op":"put","kind":"coun`)
	f.Close()

	ids := []string{hot, gone, inFlight, odd}
	before := lastEntries(t, s, ids)
	replayBefore, statsBefore, err := s.Replay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if statsBefore.Torn != 3 {
		t.Fatalf("journal before compaction: %+v, want 3 torn lines", statsBefore)
	}
	size := journalSize(t, s)

	st, err := s.Compact(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// hot, odd and the in-flight tombstone; gone's history and the torn lines go.
	if st.Generation != 1 || st.Kept != 3 || st.Dropped != statsBefore.Entries-3+3 || st.Before != size || st.After != journalSize(t, s) {
		t.Errorf("Compact = %+v (journal was %d bytes, %+v)", st, size, statsBefore)
	}
	lines := journalLines(t, s)
	if len(lines) != 4 || !strings.Contains(lines[0], `"op":"compact"`) {
		t.Fatalf("compacted journal:\n%s", strings.Join(lines, "\n"))
	}
	after := lastEntries(t, s, ids)
	for _, id := range ids {
		want := before[id]
		if id == gone {
			want = nil
		}
		if !sameEntry(after[id], want) {
			t.Errorf("%s: last entry after compaction %s, want %s", id, describe(after[id]), describe(want))
		}
	}
	replay, stats, err := s.Replay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	diffStates(t, "replay before", replayBefore, "replay after", replay)
	if stats.Entries != 3 || stats.Torn != 0 {
		t.Errorf("Replay after compaction: %+v", stats)
	}

	// Recovery rolls the delete in flight forward on the kept tombstone.
	s = openT(t, dir, WithJournalLimit(0))
	if s.Exists(inFlight) {
		t.Fatalf("%s survived its delete", inFlight)
	}
	assertConsistent(t, s)

	// Compacted again after more writes: the tombstone, now unread, goes;
	// copied entries keep the position of their first append.
	pos := func(id string) position {
		for _, l := range journalLines(t, s) {
			var e entry
			if json.Unmarshal([]byte(l), &e) == nil && e.ID == id && e.Pos != nil {
				return *e.Pos
			}
		}
		t.Fatalf("no positioned entry for %s", id)
		return position{}
	}
	oddPos := pos(odd)
	if oddPos[0] != 0 || oddPos[1] == 0 {
		t.Errorf("%s copied with position %v, want one in generation 0", odd, oddPos)
	}
	bump(t, s, hot, "after")
	if st, err := s.Compact(ctx); err != nil || st.Generation != 2 || st.Kept != 2 {
		t.Fatalf("second Compact = %+v, %v", st, err)
	}
	if p := pos(odd); p != oddPos {
		t.Errorf("%s moved from %v to %v", odd, oddPos, p)
	}
	if p := pos(hot); p[0] != 1 {
		t.Errorf("%s appended to generation 1 copied with position %v", hot, p)
	}
	if e, err := s.lastJournalEntry(inFlight); err != nil || e != nil {
		t.Errorf("tombstone of %s kept after its delete finished: %+v, %v", inFlight, e, err)
	}
	// Nothing appended since: nothing to do.
	if st, err := s.Compact(ctx); err != nil || st.Generation != 2 || st.Before != st.After {
		t.Errorf("Compact of a compacted journal = %+v, %v", st, err)
	}
	if c := getCounter(t, s, hot); c.Note != "after" || c.Rev != 9 {
		t.Errorf("%s: note %q rev %d", hot, c.Note, c.Rev)
	}
	assertConsistent(t, s)
}

// TestJournalStaysBounded updates one record many times with a small limit:
// the journal must stay within the limit plus the record's last version.
func TestJournalStaysBounded(t *testing.T) {
	ctx := context.Background()
	const limit = 8 << 10
	n := 1000
	if raceEnabled || testing.Short() {
		n = 300
	}
	s := openT(t, t.TempDir(), WithDurability(SyncOnFlush), WithJournalLimit(limit))
	c := newCounter(s)
	if err := s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	var largest int64
	for i := 0; i < n; i++ {
		bump(t, s, c.ID, strconv.Itoa(i))
		largest = max(largest, journalSize(t, s))
	}
	// One compacted entry and header (under 1 KiB) plus the limit plus the
	// entry that crossed it.
	if largest > limit+2<<10 {
		t.Errorf("journal reached %d bytes over %d updates of one record (limit %d)", largest, n, limit)
	}
	if got := getCounter(t, s, c.ID); got.Total != n || got.Rev != int64(n+1) {
		t.Errorf("record at total %d rev %d, want %d and %d", got.Total, got.Rev, n, n+1)
	}
	assertConsistent(t, s)
}

// TestCompactionIsAmortised: with more live data than the limit, the store
// waits for the journal to double before compacting, so that the bytes
// compactions read stay proportional to the bytes written.
func TestCompactionIsAmortised(t *testing.T) {
	ctx := context.Background()
	const limit = 4 << 10
	s := openT(t, t.TempDir(), WithDurability(SyncOnFlush), WithJournalLimit(limit))
	var ids []string
	for i := 0; i < 60; i++ { // about 60 KiB live, fifteen times the limit
		c := newCounter(s)
		c.Note = strings.Repeat("n", 900)
		if err := s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	// Each compaction: the size it read, and the size it left.
	var read, left []int64
	s.crashAt = func(p string) {
		switch p {
		case crashCompactWritten:
			read = append(read, journalSize(t, s))
		case crashCompactRenamed:
			left = append(left, journalSize(t, s))
		}
	}
	n := 600
	if raceEnabled || testing.Short() {
		n = 300
	}
	for i := 0; i < n; i++ {
		bump(t, s, ids[i%len(ids)], strings.Repeat("u", 900))
	}
	s.crashAt = nil
	if len(read) < 2 {
		t.Fatalf("%d compactions over %d updates", len(read), n)
	}
	// Everything appended: the growth before each compaction, and since the last.
	var appended, compacted, base int64
	for k := range read {
		appended += read[k] - base
		compacted += read[k]
		base = left[k]
	}
	appended += journalSize(t, s) - base
	if compacted > 2*appended {
		t.Errorf("%d compactions read %d bytes for %d bytes appended", len(read), compacted, appended)
	}
	assertConsistent(t, s)
}

// TestDueCompactionOnlyWhenItDrops: a journal of new records outgrows its
// limit again and again without being rewritten (a due compaction would
// keep every line), and is read for that only as it doubles; once updates
// make most of it dead, the next due compaction rewrites it, and Compact
// rewrites a live journal whenever it is asked.
func TestDueCompactionOnlyWhenItDrops(t *testing.T) {
	ctx := context.Background()
	const limit = 4 << 10
	dir := t.TempDir()
	s := openT(t, dir, WithDurability(SyncOnFlush), WithJournalLimit(limit))
	compactions, reads := 0, 0
	count := func(p string) {
		switch p {
		case crashCompactRead:
			reads++
		case crashCompactWritten:
			compactions++
		}
	}
	s.crashAt = count
	var ids []string
	for i := 0; i < 60; i++ { // about 60 KiB, fifteen times the limit
		c := newCounter(s)
		c.Note = strings.Repeat("n", 900)
		if err := s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	if compactions != 0 {
		t.Fatalf("a journal of %d new records (%d bytes, limit %d) was compacted %d times", len(ids), journalSize(t, s), limit, compactions)
	}
	// Read as it doubled from the limit: 4, 8, 16, 32 and 64 KiB.
	if reads > 5 {
		t.Errorf("the journal was read %d times for compactions not written over %d bytes", reads, journalSize(t, s))
	}
	// Another tool's store, at its first write, is told by the journal
	// not to read it again yet.
	other := openT(t, dir, WithJournalLimit(limit))
	other.rec.(*dirStore).crashAt = count
	reads = 0
	if err := other.Create(ctx, newCounter(other)); err != nil {
		t.Fatal(err)
	}
	if reads != 0 {
		t.Errorf("another store read the journal %d times at its first write", reads)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; compactions == 0 && i < 200; i++ {
		bump(t, s, ids[0], strings.Repeat("u", 900))
	}
	if compactions != 1 {
		t.Fatalf("200 updates of one record left %d compactions, want 1", compactions)
	}
	for _, id := range ids[1:] {
		bump(t, s, id, "short")
	}
	before := compactions
	if _, err := s.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	if compactions != before+1 {
		t.Errorf("Compact did not rewrite the journal")
	}
	assertConsistent(t, s)
}

// followAll returns what a follower has to give now, as "id@rev" strings.
func followAll(t testing.TB, fl *JournalFollower) []string {
	t.Helper()
	var out []string
	for {
		e, err := fl.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e == nil {
			return out
		}
		out = append(out, fmt.Sprintf("%s@%d", e.ID, e.Rev))
	}
}

// TestFollowerAcrossCompactions: a follower returns every entry once, in
// commit order, whether compactions happen between its reads or not, and
// whether it started before the journal existed, at its start, or at its
// end.
func TestFollowerAcrossCompactions(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), WithDurability(SyncOnFlush), WithJournalLimit(0))
	fromStart, err := s.followFile(true) // before there is a journal
	if err != nil {
		t.Fatal(err)
	}
	defer fromStart.Close()
	if got := followAll(t, fromStart); len(got) != 0 {
		t.Fatalf("follower of no journal returned %v", got)
	}
	hot := newCounter(s)
	if err := s.Create(ctx, hot); err != nil {
		t.Fatal(err)
	}
	var all []string // every entry, in commit order
	all = append(all, hot.ID+"@1")
	event := func() {
		c := newCounter(s)
		if err := s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		all = append(all, c.ID+"@1")
	}
	update := func() {
		bump(t, s, hot.ID, "")
		all = append(all, fmt.Sprintf("%s@%d", hot.ID, getCounter(t, s, hot.ID).Rev))
	}
	compact := func() {
		if _, err := s.Compact(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	read := func() { got = append(got, followAll(t, fromStart)...) }

	event()
	update()
	read()
	fromEnd, err := s.followFile(false)
	if err != nil {
		t.Fatal(err)
	}
	defer fromEnd.Close()
	mark := len(all)
	event()
	update()
	event()
	compact() // one compaction between reads
	read()
	event()
	compact()
	update()
	event()
	compact() // two
	event()
	read()
	read()
	update()
	compact()
	compact()
	event()
	read()

	// The hot record's versions that a compaction dropped before the
	// follower reached them are the only entries it may miss.
	check := func(name string, got, want []string, mayMiss func(string) bool) {
		t.Helper()
		i := 0
		for _, g := range got {
			for i < len(want) && want[i] != g && mayMiss(want[i]) {
				i++
			}
			if i == len(want) || want[i] != g {
				t.Fatalf("%s: returned %v\nwant, in this order, %v", name, got, want)
			}
			i++
		}
		for ; i < len(want); i++ {
			if !mayMiss(want[i]) {
				t.Fatalf("%s: returned %v\nmissing %s of %v", name, got, want[i], want)
			}
		}
	}
	last := all[len(all)-1]
	for _, a := range all {
		if strings.HasPrefix(a, hot.ID+"@") {
			last = a
		}
	}
	superseded := func(e string) bool { return strings.HasPrefix(e, hot.ID+"@") && e != last }
	check("follower from the start", got, all, superseded)
	if len(got) < len(all)-3 {
		t.Errorf("follower from the start returned %d of %d entries", len(got), len(all))
	}
	check("follower from the end", followAll(t, fromEnd), all[mark:], superseded)

	// A new follower from the start reads what compaction kept, in order.
	again, err := s.followFile(true)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	none := func(string) bool { return false }
	var kept []string
	for _, a := range all {
		if !superseded(a) {
			kept = append(kept, a)
		}
	}
	check("new follower", followAll(t, again), kept, none)
}

// TestCompactWhileProcessesWrite compacts the journal over and over while
// processes increment records; their descriptors of the journal go stale at
// every compaction, and not one of their appends may be lost.
func TestCompactWhileProcessesWrite(t *testing.T) {
	procs, n, nrec := 8, 100, 4
	if raceEnabled || testing.Short() {
		n = 30
	}
	ctx := context.Background()
	dir := t.TempDir()
	s := openT(t, dir, WithDurability(SyncOnFlush))
	var ids []string
	for i := 0; i < nrec; i++ {
		c := newCounter(s)
		if err := s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	ws, release := startWorkers(t, procs, "incr", func(w int) []string {
		return []string{"TB_DIR=" + dir, "TB_IDS=" + strings.Join(ids, ","), "TB_DURABILITY=flush",
			"TB_N=" + strconv.Itoa(n), "TB_W=" + strconv.Itoa(w)}
	})
	errs := make([]error, len(ws))
	done := make(chan struct{})
	go func() {
		for w, wk := range ws {
			errs[w] = wk.cmd.Wait()
		}
		close(done)
	}()
	release()
	var gen int64
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			st, err := s.Compact(ctx)
			if err != nil {
				t.Fatal(err)
			}
			gen = st.Generation
		}
	}
	for w, wk := range ws {
		if errs[w] != nil || strings.TrimSpace(wk.stdout.String()) != "ok" {
			t.Fatalf("worker %d: %v %q\n%s", w, errs[w], wk.stdout.String(), wk.stderr.Bytes())
		}
	}
	want := make([]int, nrec)
	for w := 0; w < procs; w++ {
		for i := 0; i < n; i++ {
			if !noop(w, i) {
				want[pick(w, i, nrec)]++
			}
		}
	}
	for r, id := range ids {
		if c := getCounter(t, s, id); c.Total != want[r] || c.Rev != int64(1+want[r]) {
			t.Errorf("%s: total %d rev %d, want %d and %d", id, c.Total, c.Rev, want[r], 1+want[r])
		}
	}
	t.Logf("%d compactions while %d processes wrote", gen, procs)
	assertConsistent(t, s)
	if _, err := s.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	if _, stats, err := s.Replay(ctx); err != nil || stats.Entries != nrec || stats.Torn != 0 {
		t.Errorf("journal after a last compaction: %+v, %v; want %d entries", stats, err, nrec)
	}
	assertConsistent(t, s)
}
