package cycle

import (
	"bytes"
	"context"
	"io"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Watch prints events as JSON lines in the order the journal committed
// them. With cycles, it prints their events from the start and returns once
// every one of them has ended; without, it follows every cycle's new events
// (all of them from the start if all is set) until ctx ends. It follows the
// journal across compactions, which keep every event (events are written
// once and never updated) and which the follower reads past without
// repeating or missing one.
func Watch(ctx context.Context, st *state.Store, w io.Writer, cycles []string, all bool) error {
	want := map[string]bool{}
	for _, id := range cycles {
		want[id] = true
	}
	left := len(want)
	fl, err := st.FollowJournal(ctx, len(want) > 0 || all)
	if err != nil {
		return err
	}
	defer fl.Close()
	for {
		e, err := fl.Next()
		if err != nil {
			return err
		}
		if e == nil {
			if err := fl.Wait(ctx); err != nil {
				return nil
			}
			continue
		}
		if e.Op != "put" || e.Kind != records.KindEvent {
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
