package state

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// TestPostgresWrite checks what a PostgreSQL write sends in its pipelines
// (commitLocked, create), where the COMMIT goes with the writes: a cycle's
// fleet keys that stay are kept and do not wake the fleet's workers; a
// cycle queued (new, or again) or submitted onto a lease wakes them, one
// leaving the queue or ending does not, nor a worker taking a cycle or
// freeing its slot, and a worker stopping or losing slots does; a row changed behind the
// record's lock fails the write and leaves nothing of it; a Create of a
// taken id fails with ErrExists and leaves nothing of it, and the
// caller's record as it was; a queued cycle's key names its plan's
// platform, or none when the plan is gone.
func TestPostgresWrite(t *testing.T) {
	ctx := context.Background()
	c := pgtest.Start(t, pgtest.WithoutFsync())
	url := c.NewDatabase(t)
	st := openT(t, t.TempDir(), WithShared(url))
	defer st.Close()
	planID := createPlan(t, st, "amd64")
	newCycle := func(state string) string {
		cy := &records.Cycle{State: state, Plan: planID, Sample: "sha256-x"}
		records.Init(cy, records.KindCycle, st.Now())
		if err := st.Create(ctx, cy); err != nil {
			t.Fatal(err)
		}
		return cy.ID
	}
	queuedID, activeID := newCycle(records.CyclePending), newCycle(records.CycleExecuting)
	update := func(id string, fn func(*records.Cycle)) error {
		var cy records.Cycle
		return st.Update(ctx, id, &cy, func(bool) error { fn(&cy); return nil })
	}
	expect := func(what string, got []*records.Cycle, err error, want string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(got) != 1 || got[0].ID != want {
			var ids []string
			for _, cy := range got {
				ids = append(ids, cy.ID)
			}
			t.Fatalf("%s: got %v, want [%s]", what, ids, want)
		}
	}
	amd64 := QueueFilter{Host: "host-a", Platforms: []string{"amd64"}}

	listen := pgtest.Connect(t, url)
	if _, err := listen.Exec(ctx, `LISTEN `+pgFleetChannel); err != nil {
		t.Fatal(err)
	}
	// nextWake is the payload of the next notification to the fleet: the
	// store's are empty, the test's own marker is not. Notifications come
	// in the order their transactions committed.
	nextWake := func() string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, time.Minute) // a hang guard
		defer cancel()
		n, err := listen.WaitForNotification(wctx)
		if err != nil {
			t.Fatal(err)
		}
		return n.Payload
	}
	marker := func() {
		t.Helper()
		if _, err := st.rec.(*pgStore).pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, pgFleetChannel); err != nil {
			t.Fatal(err)
		}
	}
	// wakes tells whether the writes of do woke the fleet.
	wakes := func(do func()) bool {
		t.Helper()
		do()
		marker()
		woke := false
		for nextWake() != "marker" {
			woke = true
		}
		return woke
	}

	t.Run("keys that stay", func(t *testing.T) {
		if err := update(queuedID, func(cy *records.Cycle) { cy.Allowed++ }); err != nil {
			t.Fatal(err)
		}
		if err := update(activeID, func(cy *records.Cycle) { cy.Allowed++ }); err != nil {
			t.Fatal(err)
		}
		marker()
		if p := nextWake(); p != "marker" {
			t.Errorf("a write that kept a cycle's fleet keys woke the fleet (notification %q before the marker)", p)
		}
		got, err := Queued(ctx, st, amd64, 10)
		expect("queued after a write that kept it queued", got, err, queuedID)
		refs, err := ActiveRefs(ctx, st)
		if err != nil || len(refs) != 1 || refs[0].ID != activeID {
			t.Fatalf("active after a write that kept it active: got %v (%v), want [%s]", refs, err, activeID)
		}
	})

	t.Run("new queued cycle", func(t *testing.T) {
		id := newCycle(records.CyclePending)
		marker()
		if p := nextWake(); p != "" {
			t.Errorf("a new queued cycle did not wake the fleet (notification %q first)", p)
		} else {
			for nextWake() != "marker" {
			}
		}
		// Out of the queue again, so that the subtests below see one.
		if err := update(id, func(cy *records.Cycle) { cy.State = records.CycleFailed }); err != nil {
			t.Fatal(err)
		}
		marker()
		for nextWake() != "marker" {
		}
	})

	t.Run("keys that change", func(t *testing.T) {
		if wakes(func() {
			if err := update(queuedID, func(cy *records.Cycle) { cy.State, cy.Host = records.CycleLeasing, "host-a" }); err != nil {
				t.Fatal(err)
			}
		}) {
			t.Errorf("a cycle that left the queue woke the fleet")
		}
		got, err := Queued(ctx, st, QueueFilter{}, 10)
		if err != nil || len(got) != 0 {
			t.Fatalf("queued after leaving the queue: %v, %v", got, err)
		}
		if !wakes(func() {
			if err := update(queuedID, func(cy *records.Cycle) { cy.State, cy.Host = records.CyclePending, "" }); err != nil {
				t.Fatal(err)
			}
		}) {
			t.Errorf("a cycle queued again did not wake the fleet")
		}
		got, err = Queued(ctx, st, amd64, 10)
		expect("queued again", got, err, queuedID)
		var ended string
		wakes(func() { ended = newCycle(records.CycleExecuting) }) // active on no host yet: it wakes
		if wakes(func() {
			if err := update(ended, func(cy *records.Cycle) { cy.State = records.CycleCompleted }); err != nil {
				t.Fatal(err)
			}
		}) {
			t.Errorf("a cycle that ended woke the fleet")
		}
	})

	t.Run("submitted onto a lease", func(t *testing.T) {
		cy := &records.Cycle{State: records.CyclePending, Plan: planID, Sample: "sha256-x", Lease: "lease_01JD0000000000000000000000"}
		records.Init(cy, records.KindCycle, st.Now())
		if !wakes(func() {
			if err := st.Create(ctx, cy); err != nil {
				t.Fatal(err)
			}
		}) {
			t.Errorf("a cycle submitted onto a lease did not wake the fleet")
		}
		if err := update(cy.ID, func(cy *records.Cycle) { cy.State = records.CycleFailed }); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("workers", func(t *testing.T) {
		w := &records.Worker{Host: "host-w", Slots: 2, Heartbeat: st.Now(), DeadAfter: records.Duration(time.Minute),
			Platforms: []string{"amd64"}}
		records.Init(w, records.KindWorker, st.Now())
		if wakes(func() {
			if err := st.Create(ctx, w); err != nil {
				t.Fatal(err)
			}
		}) {
			t.Errorf("a new worker woke the fleet")
		}
		write := func(fn func(*records.Worker)) func() {
			return func() {
				var rec records.Worker
				if err := st.Update(ctx, w.ID, &rec, func(bool) error { fn(&rec); return nil }); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, c := range []struct {
			what string
			fn   func(*records.Worker)
			want bool
		}{
			{"a worker taking a cycle", func(r *records.Worker) { r.Running = []string{queuedID} }, false},
			{"a worker's heartbeat", func(r *records.Worker) { r.Heartbeat = st.Now() }, false},
			{"a worker freeing its slot", func(r *records.Worker) { r.Running = nil }, false},
			{"a worker losing a slot", func(r *records.Worker) { r.Slots = 1 }, true},
			{"a worker's host booting another platform", func(r *records.Worker) { r.Platforms = []string{"arm64"} }, true},
			{"a worker stopping", func(r *records.Worker) { r.Stopped = true }, true},
		} {
			if got := wakes(write(c.fn)); got != c.want {
				t.Errorf("%s woke the fleet: %v, want %v", c.what, got, c.want)
			}
		}
	})

	t.Run("row changed behind the lock", func(t *testing.T) {
		raw := pgtest.Connect(t, url)
		var journaled int
		count := func() int {
			t.Helper()
			var n int
			if err := raw.QueryRow(ctx, `SELECT count(*) FROM talkbox_journal WHERE id = $1`, queuedID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		journaled = count()
		// A writer that does not take the record's lock (none of this
		// store's do) moves the row on between the read and the write.
		err := update(queuedID, func(cy *records.Cycle) {
			if _, err := raw.Exec(ctx, `UPDATE talkbox_records SET rev = rev + 10 WHERE id = $1`, queuedID); err != nil {
				t.Error(err)
			}
			cy.State = records.CycleLeasing
		})
		if err == nil || !strings.Contains(err.Error(), "changed by another writer") {
			t.Fatalf("write over a row changed behind its lock: %v, want the changed-by-another-writer error", err)
		}
		if n := count(); n != journaled {
			t.Errorf("journal entries of %s: %d, was %d before the failed write", queuedID, n, journaled)
		}
		var cy records.Cycle
		if err := st.Get(queuedID, &cy); err != nil || cy.State != records.CyclePending {
			t.Errorf("stored cycle after the failed write: state %q, %v", cy.State, err)
		}
		got, err := Queued(ctx, st, amd64, 10)
		expect("queued after the failed write", got, err, queuedID)
	})
	t.Run("create of a taken id", func(t *testing.T) {
		raw := pgtest.Connect(t, url)
		var journaled int
		if err := raw.QueryRow(ctx, `SELECT count(*) FROM talkbox_journal`).Scan(&journaled); err != nil {
			t.Fatal(err)
		}
		var stored records.Cycle
		if err := st.Get(activeID, &stored); err != nil {
			t.Fatal(err)
		}
		// The active cycle's id, queued: had it been stored, it would be
		// in the queue.
		dup := &records.Cycle{State: records.CyclePending, Plan: planID, Sample: "sha256-dup"}
		dup.Meta = records.Meta{ID: activeID, Kind: records.KindCycle}
		want := *dup
		if err := st.Create(ctx, dup); !errors.Is(err, ErrExists) {
			t.Fatalf("Create of a taken id: %v, want ErrExists", err)
		}
		if !reflect.DeepEqual(*dup, want) {
			t.Errorf("a failed Create changed the caller's record: %+v, was %+v", *dup, want)
		}
		var n int
		if err := raw.QueryRow(ctx, `SELECT count(*) FROM talkbox_journal`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != journaled {
			t.Errorf("journal entries after a failed Create: %d, was %d", n, journaled)
		}
		var after records.Cycle
		if err := st.Get(activeID, &after); err != nil || after.Rev != stored.Rev || after.State != stored.State {
			t.Errorf("stored record after a failed Create: rev %d state %q (%v), was rev %d state %q", after.Rev, after.State, err, stored.Rev, stored.State)
		}
		got, err := Queued(ctx, st, amd64, 10)
		expect("queued after a failed Create", got, err, queuedID)
	})
	t.Run("queued on a plan that is gone", func(t *testing.T) {
		// The queue's key of a queued cycle is its plan's platform, read
		// by the write's own statement: a plan that is gone gives no
		// platform, as fleetKeys's does, which any host's look takes.
		cy := &records.Cycle{State: records.CyclePending, Plan: "plan_gone", Sample: "sha256-y"}
		records.Init(cy, records.KindCycle, st.Now())
		if err := st.Create(ctx, cy); err != nil {
			t.Fatal(err)
		}
		var value string
		if err := st.rec.(*pgStore).pool.QueryRow(ctx, `SELECT value FROM talkbox_keys WHERE id = $1 AND field = $2`, cy.ID, keyQueued).Scan(&value); err != nil || value != "/" {
			t.Fatalf("queue key of a cycle whose plan is gone: %q (%v), want %q", value, err, "/")
		}
		got, err := Queued(ctx, st, QueueFilter{Host: "host-a", Platforms: []string{"arm64"}}, 10)
		expect("queued on a plan that is gone, for an arm64 host", got, err, cy.ID)
	})
}
