package state

import (
	"context"
	"strings"
	"testing"
)

// A record bigger than the reader's buffer (a put of 3 MiB) survives a
// compaction whole: the journal's lines have no bound, so no committed
// entry is dropped for its length.
func TestCompactKeepsLongLines(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), WithJournalLimit(0))
	c := newCounter(s)
	c.Note = "small"
	if err := s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("b", 3<<20)
	bump(t, s, c.ID, big)
	before := lastEntries(t, s, []string{c.ID})[c.ID]
	st, err := s.Compact(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after := lastEntries(t, s, []string{c.ID})[c.ID]
	if st.Kept != 1 || !sameEntry(before, after) || !strings.Contains(string(after.Record), big) {
		t.Fatalf("Compact = %+v; last entry %.80s", st, describe(after))
	}
}
