package state

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// TestUpdateAndCreate stores a cycle's transition and its event with one
// call, on both backends: both are stored, the journal has the update and
// then the event, a record that must not be created with an update (a
// worker) fails the write with nothing stored, and ErrNoChange creates
// nothing. On PostgreSQL the two are one transaction: an event whose ID
// is taken fails the update too; on the directory the update stays.
func TestUpdateAndCreate(t *testing.T) { eachBackend(t, updateAndCreate) }

func updateAndCreate(t *testing.T, be testBackend) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), be.opts()...)
	defer s.Close()
	c := &records.Cycle{State: records.CyclePending, Plan: "plan_x", Sample: "sha256-x"}
	records.Init(c, records.KindCycle, s.Now())
	if err := s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	fl, err := s.FollowJournal(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	event := func(seq int) *records.Event {
		e := &records.Event{Type: "cycle.state", Subject: c.ID, Cycle: c.ID, Seq: seq, From: records.CyclePending, To: records.CycleLeasing, At: s.Now()}
		records.Init(e, records.KindEvent, s.Now())
		return e
	}
	move := func(to string, created ...records.Record) error {
		var n records.Cycle
		return s.UpdateAndCreate(ctx, c.ID, &n, func(exists bool) ([]records.Record, error) {
			if !exists {
				return nil, ErrNotFound
			}
			n.State = to
			n.Seq++
			return created, nil
		})
	}

	e1 := event(1)
	if err := move(records.CycleLeasing, e1); err != nil {
		t.Fatal(err)
	}
	var got records.Event
	if err := s.Get(e1.ID, &got); err != nil || got.Seq != 1 || got.Rev != 1 {
		t.Fatalf("the event: %+v, %v", got, err)
	}
	var stored records.Cycle
	if err := s.Get(c.ID, &stored); err != nil || stored.State != records.CycleLeasing || stored.Rev != 2 {
		t.Fatalf("the cycle: state %s rev %d, %v", stored.State, stored.Rev, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var order []string
	for len(order) < 2 {
		e, err := fl.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e == nil {
			if err := fl.Wait(wctx); err != nil {
				t.Fatalf("journal after %v: %v", order, err)
			}
			continue
		}
		order = append(order, e.ID)
	}
	if order[0] != c.ID || order[1] != e1.ID {
		t.Fatalf("journal order %v, want the cycle then its event", order)
	}

	// A worker is refused: nothing stored.
	w := &records.Worker{Host: "h"}
	records.Init(w, records.KindWorker, s.Now())
	if err := move(records.CyclePending, w); err == nil {
		t.Fatal("a worker created with a cycle's update: no error")
	}
	if err := s.Get(c.ID, &stored); err != nil || stored.Rev != 2 || s.Exists(w.ID) {
		t.Fatalf("after the refused write: cycle rev %d (%v), worker stored %v", stored.Rev, err, s.Exists(w.ID))
	}

	// ErrNoChange creates nothing.
	e2 := event(2)
	var n records.Cycle
	err = s.UpdateAndCreate(ctx, c.ID, &n, func(bool) ([]records.Record, error) { return []records.Record{e2}, ErrNoChange })
	if err != nil || s.Exists(e2.ID) {
		t.Fatalf("ErrNoChange: %v, event stored %v", err, s.Exists(e2.ID))
	}

	// An event whose ID is taken.
	dup := event(2)
	dup.ID = e1.ID
	err = move(records.CyclePending, dup)
	if !errors.Is(err, ErrExists) {
		t.Fatalf("an event whose ID is taken: %v, want ErrExists", err)
	}
	if dup.Rev != 0 {
		t.Fatalf("the refused event's header was left stamped: rev %d", dup.Rev)
	}
	if err := s.Get(c.ID, &stored); err != nil {
		t.Fatal(err)
	}
	want := records.CycleLeasing // one transaction: the update went with the event
	if be.url == "" {
		want = records.CyclePending // the update, then the create that failed
	}
	if stored.State != want {
		t.Fatalf("after the event's ID was taken the cycle is %s, want %s", stored.State, want)
	}
}
