package state

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// TestHeartbeatsLeaveWorkerKeys: a worker beating every 5 s for a minute
// (its DeadAfter) moves its live and free keys at most once, not at every
// beat: each move leaves a dead entry in the index range that every read of
// the live or free workers scans (at 1,000 workers, 170 ms a read). And
// the coarse keys say no more than the records do: a worker is live (and
// free) from its keys exactly while its record says so, busy it is not
// free, and dead or stopped it is not live, though its key may still be in
// the range.
func TestHeartbeatsLeaveWorkerKeys(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Start(t, pgtest.WithoutFsync()).NewDatabase(t)
	now := time.Date(2026, 11, 29, 3, 0, 7, 0, time.UTC)
	st := openT(t, t.TempDir(), WithShared(url), WithClock(func() time.Time { return now }))
	defer st.Close()
	conn := pgtest.Connect(t, url)
	// The row versions of the worker's keys: a key deleted and inserted
	// again, even with the same value, is a new version.
	versions := func(id string) map[string]string {
		rows, err := conn.Query(ctx, `SELECT field, value || ' ' || xmin::text || ' ' || ctid::text FROM talkbox_keys
			WHERE kind = $1 AND id = $2 AND field IN ($3, $4)`, records.KindWorker, id, keyLive, keyFree)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		var field, version string
		if _, err := pgx.ForEachRow(rows, []any{&field, &version}, func() error {
			out[field] = version
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	const deadAfter, beat = time.Minute, 5 * time.Second
	w := &records.Worker{Host: "host-a", Slots: 1, Heartbeat: now, DeadAfter: records.Duration(deadAfter)}
	records.Init(w, records.KindWorker, now)
	if err := st.Create(ctx, w); err != nil {
		t.Fatal(err)
	}
	setWorker := func(f func(w *records.Worker)) {
		t.Helper()
		var rec records.Worker
		if err := st.Update(ctx, w.ID, &rec, func(bool) error {
			rec.Heartbeat = now
			f(&rec)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]map[string]bool{keyLive: {}, keyFree: {}}
	for i := 0; i <= int(deadAfter/beat); i++ {
		if i > 0 {
			now = now.Add(beat)
			setWorker(func(*records.Worker) {})
		}
		v := versions(w.ID)
		for _, field := range []string{keyLive, keyFree} {
			if v[field] == "" {
				t.Fatalf("beat %d: the worker, alive with a free slot, has no %s key: %v", i, field, v)
			}
			seen[field][v[field]] = true
		}
	}
	for field, vs := range seen {
		if len(vs) > 2 {
			t.Errorf("over %s of beats every %s the %s key was written %d times: %v", deadAfter, beat, field, len(vs), vs)
		}
	}

	names := func(ws []*records.Worker, err error) []string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, w := range ws {
			out = append(out, w.Host)
		}
		return out
	}
	check := func(when string, live, free bool) {
		t.Helper()
		gotLive := len(names(LiveWorkers(ctx, st, now))) == 1
		gotFree := len(names(FreeWorkers(ctx, st, now, 10))) == 1
		if gotLive != live || gotFree != free {
			t.Errorf("%s: live %v free %v, want live %v free %v", when, gotLive, gotFree, live, free)
		}
	}
	check("just beat", true, true)
	setWorker(func(r *records.Worker) { r.Running = []string{"cycle_a"} })
	check("busy", true, false)
	setWorker(func(r *records.Worker) { r.Running = nil })
	check("free again", true, true)
	last := now
	now = last.Add(deadAfter)
	check("silent for its DeadAfter", true, true)
	now = last.Add(deadAfter + time.Millisecond)
	if n, err := CountLiveWorkers(ctx, st, now); err != nil || n != 1 {
		// Else the check below would not test the records' filter.
		t.Fatalf("a moment after the worker's death its live key is in the range of %d workers (%v), want 1: the key is coarse", n, err)
	}
	check("silent for longer than its DeadAfter", false, false)
	now = last
	setWorker(func(r *records.Worker) { r.Stopped = true })
	check("stopped", false, false)
	if v := versions(w.ID); len(v) != 0 {
		t.Errorf("a stopped worker keeps keys %v", v)
	}
}

// TestWorkerReadsArePlannedWithTheirValues: the reads of live and free
// workers are planned with their values at every call, never with a plan
// the server keeps for any values, which it may settle on after five calls
// and which for these reads sorts the field's whole range (87 ms where the
// index range takes 11 ms, at 200 workers beside 100,000 queued cycles).
// On a store of one connection, after ten reads of each, the connection
// holds no prepared statement of them.
func TestWorkerReadsArePlannedWithTheirValues(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Start(t, pgtest.WithoutFsync()).NewDatabase(t)
	st := openT(t, t.TempDir(), WithShared(url+"&pool_max_conns=1"))
	defer st.Close()
	now := st.Now()
	w := &records.Worker{Host: "host-a", Slots: 1, Heartbeat: now, DeadAfter: records.Duration(time.Minute)}
	records.Init(w, records.KindWorker, now)
	if err := st.Create(ctx, w); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if live, err := LiveWorkers(ctx, st, now); err != nil || len(live) != 1 {
			t.Fatalf("LiveWorkers: %d, %v", len(live), err)
		}
		if free, err := FreeWorkers(ctx, st, now, 8); err != nil || len(free) != 1 {
			t.Fatalf("FreeWorkers: %d, %v", len(free), err)
		}
	}
	var kept []string
	err := st.rec.(*pgStore).pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
		rows, err := c.Query(ctx, `SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%FROM talkbox_keys k JOIN talkbox_records r%'
			AND statement NOT LIKE '%pg_prepared_statements%'`)
		if err != nil {
			return err
		}
		kept, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) > 0 {
		t.Errorf("the connection keeps %d prepared reads of workers, which the server may plan for any values: %q", len(kept), kept)
	}
}
