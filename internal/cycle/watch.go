package cycle

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Watch prints events as JSON lines in the order the journal committed
// them. With cycles, it prints their events from the start and returns once
// every one of them has ended; without, it follows every cycle's new events
// (all of them from the start if all is set) until ctx ends.
func Watch(ctx context.Context, st *state.Store, w io.Writer, cycles []string, all bool) error {
	want := map[string]bool{}
	for _, id := range cycles {
		want[id] = true
	}
	left := len(want)
	f, err := openJournal(ctx, st)
	if err != nil {
		return err
	}
	defer f.Close()
	if len(want) == 0 && !all {
		if _, err := f.Seek(0, io.SeekEnd); err != nil {
			return err
		}
	}
	rd := bufio.NewReaderSize(f, 1<<16)
	var partial []byte
	for {
		line, err := rd.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			// A line without its newline is still being written.
			partial = append(partial, line...)
			// The journal has no change notification; tailing polls it.
			if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
				return nil
			}
			continue
		}
		if err != nil {
			return err
		}
		if len(partial) > 0 {
			line = append(partial, line...)
			partial = nil
		}
		var e struct {
			Op     string          `json:"op"`
			Kind   string          `json:"kind"`
			Record json.RawMessage `json:"record"`
		}
		if json.Unmarshal(line, &e) != nil || e.Op != "put" || e.Kind != records.KindEvent {
			continue
		}
		var ev records.Event
		if records.Unmarshal(e.Record, &ev) != nil {
			continue
		}
		if len(want) > 0 && !want[ev.Cycle] {
			continue
		}
		if _, err := w.Write(append(bytes.TrimSpace(e.Record), '\n')); err != nil {
			return err
		}
		if len(want) > 0 && records.CycleTerminal(ev.To) {
			delete(want, ev.Cycle)
			if left--; left == 0 {
				return nil
			}
		}
	}
}

// openJournal opens the store's journal, waiting for its creation.
func openJournal(ctx context.Context, st *state.Store) (*os.File, error) {
	for {
		f, err := os.Open(st.Path("journal", "journal.jsonl"))
		if !errors.Is(err, fs.ErrNotExist) {
			return f, err
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}
