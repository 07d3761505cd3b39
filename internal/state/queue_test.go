package state

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// TestQueue: a host is offered the queued cycles it may take (its
// platforms, pinned to none or to it), oldest first and as many as it asks
// for; the active cycles are the other open ones; a cycle moves between
// them as it is written, and the fleet's watchers are told; a host's
// active cycles are those its runner drove last and those none has yet; on PostgreSQL, a database made before the queue's
// keys gets them when a store opens it.
func TestQueue(t *testing.T) {
	eachBackend(t, func(t *testing.T, be testBackend) {
		ctx := context.Background()
		dir := t.TempDir()
		st, err := Open(ctx, dir, be.opts()...)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if st != nil {
				st.Close()
			}
		}()
		plan := map[string]string{}
		for _, p := range []string{"amd64", "mipsel", ""} {
			plan[p] = createPlan(t, st, p)
		}
		ids := map[string]string{}
		add := func(name string, c *records.Cycle) {
			records.Init(c, records.KindCycle, st.Now())
			if err := st.Create(ctx, c); err != nil {
				t.Fatal(err)
			}
			ids[name] = c.ID
		}
		add("amd64", &records.Cycle{State: records.CyclePending, Plan: plan["amd64"]})
		add("mipsel", &records.Cycle{State: records.CyclePending, Plan: plan["mipsel"]})
		add("pinned-b", &records.Cycle{State: records.CyclePending, Plan: plan["amd64"], PinnedTo: "host-b"})
		add("any", &records.Cycle{State: records.CyclePending, Plan: plan[""]})
		add("leasing", &records.Cycle{State: records.CycleLeasing, Plan: plan["amd64"], Host: "host-a"})
		lease := &records.SandboxLease{State: records.LeaseBusy, Host: "host-c"}
		records.Init(lease, records.KindLease, st.Now())
		if err := st.Create(ctx, lease); err != nil {
			t.Fatal(err)
		}
		add("executing", &records.Cycle{State: records.CycleExecuting, Plan: plan["amd64"], Lease: lease.ID})
		add("completed", &records.Cycle{State: records.CycleCompleted, Plan: plan["amd64"]})
		b := st.NewBatch()
		batched := &records.Cycle{State: records.CyclePending, Plan: plan["amd64"]}
		records.Init(batched, records.KindCycle, st.Now())
		if _, err := b.Create(batched); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		ids["batched"] = batched.ID

		expect := func(what string, got []*records.Cycle, err error, want ...string) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			var wantIDs, gotIDs []string
			for _, w := range want {
				wantIDs = append(wantIDs, ids[w])
			}
			slices.Sort(wantIDs)
			for _, c := range got {
				gotIDs = append(gotIDs, c.ID)
			}
			if !slices.Equal(gotIDs, wantIDs) {
				t.Errorf("%s: got %v, want %v (%v)", what, gotIDs, wantIDs, want)
			}
		}
		// A host's active cycles, or every one (host ""), as refs: each
		// with its lease's host when its lease is there.
		expectRefs := func(what, host string, want ...string) {
			t.Helper()
			refs, err := ActiveRefs(ctx, st)
			if host != "" {
				refs, err = ActiveRefsOn(ctx, st, host)
			}
			var got []*records.Cycle
			for _, ref := range refs {
				var c records.Cycle
				if err := st.Get(ref.ID, &c); err != nil {
					t.Fatal(err)
				}
				if ref.Host != c.Host || ref.Lease != c.Lease || !ref.UpdatedAt.Equal(c.UpdatedAt) {
					t.Errorf("%s: %+v, of a cycle on %q, lease %q, updated at %s", what, ref, c.Host, c.Lease, c.UpdatedAt)
				}
				var l records.SandboxLease
				lerr := st.Get(c.Lease, &l)
				if ref.LeaseFound != (lerr == nil) || ref.LeaseHost != l.Host {
					t.Errorf("%s: %s's lease found %v on %q; the lease: %+v, %v", what, ref.ID, ref.LeaseFound, ref.LeaseHost, l, lerr)
				}
				got = append(got, &c)
			}
			expect(what, got, err, want...)
		}
		queued := func(f QueueFilter, n int) ([]*records.Cycle, error) { return Queued(ctx, st, f, n) }
		amd64 := []string{"amd64"}
		c, err := queued(QueueFilter{Host: "host-a", Platforms: amd64}, 10)
		expect("host-a, amd64", c, err, "amd64", "any", "batched")
		c, err = queued(QueueFilter{Host: "host-b", Platforms: amd64}, 10)
		expect("host-b, amd64", c, err, "amd64", "pinned-b", "any", "batched")
		c, err = queued(QueueFilter{Host: "host-a"}, 10)
		expect("host-a, any platform", c, err, "amd64", "mipsel", "any", "batched")
		c, err = queued(QueueFilter{Host: "host-a", Platforms: []string{}}, 10)
		expect("host-a, no platform", c, err)
		c, err = queued(QueueFilter{}, 10)
		expect("every queued cycle", c, err, "amd64", "mipsel", "pinned-b", "any", "batched")
		// The first two by ID: cycles made in the same millisecond have IDs
		// in no particular order.
		takes := []string{"amd64", "pinned-b", "any", "batched"}
		slices.SortFunc(takes, func(a, b string) int { return strings.Compare(ids[a], ids[b]) })
		c, err = queued(QueueFilter{Host: "host-b", Platforms: amd64}, 2)
		expect("host-b's first two", c, err, takes[:2]...)
		expectRefs("active on host-a, or on none yet", "host-a", "leasing", "executing")
		expectRefs("active on host-b, or on none yet", "host-b", "executing")
		expectRefs("every active one", "", "leasing", "executing")

		// A cycle queued (here in a batch) is heard of by the fleet's
		// watchers; on PostgreSQL, one leaving the queue or ending is
		// not (TestPostgresWrite).
		wctx, stopWatching := context.WithCancel(ctx)
		defer stopWatching()
		changed, err := st.WatchFleet(wctx, "host-b")
		if err != nil {
			t.Fatal(err)
		}
		late := &records.Cycle{State: records.CyclePending, Plan: plan["amd64"]}
		records.Init(late, records.KindCycle, st.Now())
		lb := st.NewBatch()
		if _, err := lb.Create(late); err != nil {
			t.Fatal(err)
		}
		if err := lb.Commit(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed.Work:
		case <-time.After(time.Minute): // a hang guard: the signal comes at the commit
			t.Fatal("no signal to the fleet's watchers when a cycle was queued")
		}
		// A cancel of a cycle host-b drives (it now does) is heard of
		// by host-b's watchers.
		var flagged records.Cycle
		if err := st.Update(ctx, ids["executing"], &flagged, func(bool) error { flagged.Host, flagged.Cancel = "host-b", true; return nil }); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed.Cancels:
		case <-time.After(time.Minute): // a hang guard: the signal comes at the commit
			t.Fatal("no signal to the driving host's watchers when a cycle was flagged for cancel")
		}
		var cy records.Cycle
		for id, to := range map[string]string{late.ID: records.CycleFailed, ids["amd64"]: records.CycleLeasing, ids["executing"]: records.CycleCompleted} {
			if err := st.Update(ctx, id, &cy, func(bool) error { cy.State = to; return nil }); err != nil {
				t.Fatal(err)
			}
		}
		c, err = queued(QueueFilter{Host: "host-a", Platforms: amd64}, 10)
		expect("host-a, amd64, after a lease", c, err, "any", "batched")
		expectRefs("active, after an end", "", "amd64", "leasing")
		expectRefs("active on host-b, or on none yet, after an end", "host-b", "amd64")

		// A write that moves an active cycle to another host moves its key,
		// and back; one that leaves a cycle's keys as they were (most of a
		// cycle's writes, which skip them on PostgreSQL) leaves it found.
		for _, host := range []string{"host-c", "host-a"} {
			if err := st.Update(ctx, ids["leasing"], &cy, func(bool) error { cy.Host = host; return nil }); err != nil {
				t.Fatal(err)
			}
			expectRefs("active on "+host+", after a move", host, "amd64", "leasing")
		}
		for _, name := range []string{"any", "leasing"} {
			if err := st.Update(ctx, ids[name], &cy, func(bool) error { cy.Seq++; return nil }); err != nil {
				t.Fatal(err)
			}
		}
		c, err = queued(QueueFilter{Host: "host-a", Platforms: amd64}, 10)
		expect("host-a, amd64, after writes that keep the keys", c, err, "any", "batched")
		expectRefs("active on host-a, after writes that keep the keys", "host-a", "amd64", "leasing")

		// Closing the store waits for the watcher's connection.
		stopWatching()
		for range changed.Work {
		}
		for range changed.Cancels {
		}
		if be.url == "" {
			return
		}
		// A database made before the queue's keys: none, and no marker.
		conn, err := pgx.Connect(ctx, be.url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DELETE FROM talkbox_keys WHERE field IN ('queued', 'active'); DROP TABLE talkbox_fleet_keys`); err != nil {
			t.Fatal(err)
		}
		st.Close()
		if st, err = Open(ctx, dir, be.opts()...); err != nil {
			t.Fatal(err)
		}
		c, err = queued(QueueFilter{Host: "host-b", Platforms: amd64}, 10)
		expect("host-b, amd64, after the migration", c, err, "pinned-b", "any", "batched")
		expectRefs("active, after the migration", "", "amd64", "leasing")
		expectRefs("active on host-a, after the migration", "host-a", "amd64", "leasing")
	})
}

// TestQueuedUnfilteredReadsWhatItAsks: a look at every queued cycle (an
// idle worker's note of cycles no host takes) reads, and locks, the first n
// rows of the queue's key, not the whole queue: at 1,000 workers the whole
// queue's read took tens of seconds a call, and the writes taking cycles
// out of the queue waited on its locks. Counted with pg_stat_statements.
func TestQueuedUnfilteredReadsWhatItAsks(t *testing.T) {
	ctx := context.Background()
	c := pgtest.Start(t, pgtest.WithoutFsync(), pgtest.WithStatementStats())
	url := c.NewDatabase(t)
	st := openT(t, t.TempDir(), WithShared(url))
	defer st.Close()
	planID := createPlan(t, st, "amd64")
	const queue, asked = 200, 3
	b := st.NewBatch()
	var all []string
	for range queue {
		cy := &records.Cycle{State: records.CyclePending, Plan: planID}
		records.Init(cy, records.KindCycle, st.Now())
		if _, err := b.Create(cy); err != nil {
			t.Fatal(err)
		}
		all = append(all, cy.ID)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	c.StatementRows(t, url) // from here on
	got, err := Queued(ctx, st, QueueFilter{}, asked)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, cy := range got {
		ids = append(ids, cy.ID)
	}
	slices.Sort(all) // by ID: the queue's order
	if first := all[:asked]; !slices.Equal(ids, first) {
		t.Fatalf("Queued(any, %d) = %v, want the first by ID %v", asked, ids, first)
	}
	if rows := c.StatementRows(t, url, "talkbox_keys")["talkbox_keys"]; rows > asked {
		t.Errorf("a look at %d queued cycles read %d rows of a queue of %d: it reads the whole queue", asked, rows, queue)
	}
}

// TestQueuedLeavesOutLockedCycles: asked with the cycles' lock, a read of
// the queue leaves out those whose lock someone holds (a worker drives
// them: they stay queued until it has leased), in one statement, and
// holds none of the locks it tried.
func TestQueuedLeavesOutLockedCycles(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Start(t, pgtest.WithoutFsync()).NewDatabase(t)
	st := openT(t, t.TempDir(), WithShared(url))
	defer st.Close()
	driver := openT(t, t.TempDir(), WithShared(url))
	defer driver.Close()
	planID := createPlan(t, st, "amd64")
	var ids []string
	for range 3 {
		c := &records.Cycle{State: records.CyclePending, Plan: planID}
		records.Init(c, records.KindCycle, st.Now())
		if err := st.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	slices.Sort(ids)
	lock := func(id string) string { return "tb-run/cycle/" + id }
	unlock, ok, err := driver.TryLock(ctx, lock(ids[0]))
	if err != nil || !ok {
		t.Fatalf("locking %s: %v %v", ids[0], ok, err)
	}
	defer unlock()
	f := QueueFilter{Host: "host-a", Platforms: []string{"amd64"}}
	read := func(f QueueFilter) []string {
		t.Helper()
		cs, err := Queued(ctx, st, f, 10)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range cs {
			got = append(got, c.ID)
		}
		return got
	}
	if got := read(f); !slices.Equal(got, ids) {
		t.Errorf("without the lock's name, queued %v, want all %v", got, ids)
	}
	f.Lock = lock
	if got := read(f); !slices.Equal(got, ids[1:]) {
		t.Errorf("with %s's lock held, queued %v, want %v", ids[0], got, ids[1:])
	}
	// Asked for as many as are queued, less the one locked: the locked
	// one is passed over, not counted.
	if got, err := Queued(ctx, st, f, 2); err != nil || !slices.Equal(idsOf(got), ids[1:]) {
		t.Errorf("asked for 2 with %s's lock held, queued %v (%v), want %v", ids[0], idsOf(got), err, ids[1:])
	}
	for _, id := range ids[1:] {
		u, ok, err := driver.TryLock(ctx, lock(id))
		if err != nil || !ok {
			t.Errorf("after the read, %s's lock is held (%v %v)", id, ok, err)
			continue
		}
		u()
	}
}

// TestQueuedUnfilteredReadDoesNotGrowWithTheEnded: a look at every queued
// cycle reads as many index pages with 5,000 ended cycles before the queue
// (IDs sort by age) as with 1,000. Ordered by ID alone, it scanned every
// cycle's keys from the oldest, the ended ones first: at 100,000 cycles,
// 25-35 ms a look, made by every idle worker once a heartbeat. Counted as
// the blocks its statements touched (pg_stat_statements).
func TestQueuedUnfilteredReadDoesNotGrowWithTheEnded(t *testing.T) {
	ctx := context.Background()
	c := pgtest.Start(t, pgtest.WithoutFsync(), pgtest.WithStatementStats())
	blocks := map[int]int64{}
	for _, ended := range []int{1000, 5000} {
		url := c.NewDatabase(t)
		st := openT(t, t.TempDir(), WithShared(url))
		defer st.Close()
		var plans []string
		for _, p := range []string{"amd64", "mipsel"} {
			plans = append(plans, createPlan(t, st, p))
		}
		b := st.NewBatch()
		for i := range ended + 200 {
			cy := &records.Cycle{State: records.CycleCompleted, Plan: plans[i%2], Sample: "sample"}
			if i >= ended {
				cy.State = records.CyclePending
			}
			records.Init(cy, records.KindCycle, st.Now())
			if _, err := b.Create(cy); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		conn := pgtest.Connect(t, url)
		if _, err := conn.Exec(ctx, `VACUUM ANALYZE`); err != nil {
			t.Fatal(err)
		}
		c.StatementRows(t, url) // from here on
		got, err := Queued(ctx, st, QueueFilter{}, 3)
		if err != nil || len(got) != 3 {
			t.Fatalf("Queued(any, 3) = %d cycles, %v", len(got), err)
		}
		var n int64
		if err := conn.QueryRow(ctx, `SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint FROM pg_stat_statements
			WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query ~ '\mtalkbox_keys\M'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		blocks[ended] = n
	}
	t.Logf("blocks a look at the queue touched, by ended cycles before it: %v", blocks)
	if blocks[5000] > blocks[1000]+blocks[1000]/2 {
		t.Errorf("a look at the queue touched %d blocks with 5,000 ended cycles before it, %d with 1,000: it reads the ended ones",
			blocks[5000], blocks[1000])
	}
}
