package cycle

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// lineCounter is a Watch output that says when it has n lines.
type lineCounter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	n    int
	full chan struct{}
}

func (w *lineCounter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.n -= bytes.Count(p, []byte("\n")); w.n == 0 {
		close(w.full)
	}
	return len(p), nil
}

// eventIDs decodes watch output into event IDs, checking each is an event.
func eventIDs(t *testing.T, out []byte) []string {
	t.Helper()
	var ids []string
	rd := records.NewReader(bytes.NewReader(out), "watch")
	for {
		l, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return ids
		}
		if err != nil {
			t.Fatal(err)
		}
		var ev records.Event
		if err := records.Unmarshal(l.Data, &ev); err != nil || ev.Kind != records.KindEvent {
			t.Fatalf("watch printed %s (%v)", l.Data, err)
		}
		ids = append(ids, ev.ID)
	}
}

// TestWatchAcrossCompactions: while the journal is compacted every few
// writes (a small limit, and a record rewritten between events), watches
// of cycles and of everything print each event once, in commit order.
func TestWatchAcrossCompactions(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(ctx, t.TempDir(), state.WithDurability(state.SyncOnFlush), state.WithJournalLimit(4<<10))
	if err != nil {
		t.Fatal(err)
	}
	cycles := []string{records.NewID(records.KindCycle, st.Now()), records.NewID(records.KindCycle, st.Now())}
	const n = 60
	var want []string // event IDs in commit order

	var forCycles bytes.Buffer
	cyclesDone := make(chan error, 1)
	go func() { cyclesDone <- Watch(ctx, st, &forCycles, cycles, false) }()
	everything := &lineCounter{n: 2 * n, full: make(chan struct{})}
	followCtx, stop := context.WithCancel(ctx)
	defer stop()
	followDone := make(chan error, 1)
	go func() { followDone <- Watch(followCtx, st, everything, nil, true) }()

	var pad records.Generic
	records.Init(&pad, "padding", st.Now())
	for i := 0; i < n; i++ {
		for _, c := range cycles {
			to := records.CycleExecuting
			if i == n-1 {
				to = records.CycleCompleted
			}
			e := &records.Event{Type: "cycle.state", Subject: c, Cycle: c, Seq: i, To: to, At: st.Now()}
			records.Init(e, records.KindEvent, st.Now())
			if err := st.Create(ctx, e); err != nil {
				t.Fatal(err)
			}
			want = append(want, e.ID)
		}
		// Superseded at once: what compaction drops.
		pad.Extra = map[string]json.RawMessage{"fill": json.RawMessage(`"` + strings.Repeat("p", 3000) + `"`)}
		if err := st.Put(ctx, &pad); err != nil {
			t.Fatal(err)
		}
	}

	if err := <-cyclesDone; err != nil {
		t.Fatal(err)
	}
	<-everything.full
	stop()
	if err := <-followDone; err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string][]byte{"watch of the cycles": forCycles.Bytes(), "watch --all": everything.buf.Bytes()} {
		if got := eventIDs(t, out); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s printed %d events:\n%v\nwant %d:\n%v", name, len(got), got, len(want), want)
		}
	}
	// The journal was compacted many times under the watches.
	f, err := os.Open(st.Path("journal", "journal.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var head struct {
		Op  string `json:"op"`
		Gen int    `json:"gen"`
	}
	if line, err := bufio.NewReader(f).ReadBytes('\n'); err != nil || json.Unmarshal(line, &head) != nil || head.Op != "compact" || head.Gen < 10 {
		t.Fatalf("journal header %q: %+v, %v; want ten compactions or more", line, head, err)
	}
}
