package cycle

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// BenchmarkFleetScale drives b.N cycles of a queue that stays
// TB_FLEET_QUEUE long (default 100,000: b.N more are queued before the
// clock starts) with each number of workers in TB_FLEET_WORKERS (default
// 10,100), each a simulated host with a store of its own on one real
// PostgreSQL (fsync on), whose guests are the fake guest: a cycle takes
// milliseconds, so what is measured is the scheduler and the store.
// claim-p99-ms is the 99th percentile of the time from a worker's slot
// freeing (its cycle ended) to its next cycle being taken (the worker logs
// "driving"). Each worker holds up to four connections (its fleet
// listener, a cycle's lock, its lease's lock, a query), as a real host
// does, and the cluster allows that many for the most workers run.
// Each worker beats every TB_FLEET_HEARTBEAT (default 5s, tb-run
// worker's default): every beat is a write of its record, so that a
// fleet's heartbeats alone are workers/heartbeat writes a second.
// TB_FLEET_STATEMENTS=N logs, after each run, the N statements PostgreSQL
// spent the most time on in it (pg_stat_statements): what bounds the run
// on the server's side.
//
// TB_FLEET_CYCLE=D makes each cycle's sample run for D (default: it exits
// at once), with the runner's default polls of a running sample, and
// starts the workers spread over D: a fleet asking the store for
// workers/D cycles a second, steadily, which may be less than the store
// can complete. Without it, every worker asks for the next cycle as soon
// as its last ended, and the claims wait for the store (Little's law: the
// mean claim is about workers/(cycles/s) when cycles take no time).
//
// testing runs each benchmark once with b.N = 1 before the run it
// reports: that run has one worker, so that it leaves no cycle mid-way
// for the next run's workers to find as a dead host's.
func BenchmarkFleetScale(b *testing.B) {
	queue := 100_000
	if s := os.Getenv("TB_FLEET_QUEUE"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("TB_FLEET_QUEUE=%q: %v", s, err)
		}
		queue = n
	}
	fleets := []int{10, 100}
	if s := os.Getenv("TB_FLEET_WORKERS"); s != "" {
		fleets = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				b.Fatalf("TB_FLEET_WORKERS=%q: %q is not a number of workers", s, f)
			}
			fleets = append(fleets, n)
		}
	}
	heartbeat := 5 * time.Second
	if s := os.Getenv("TB_FLEET_HEARTBEAT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			b.Fatalf("TB_FLEET_HEARTBEAT=%q: not a duration", s)
		}
		heartbeat = d
	}
	var cycle time.Duration
	if s := os.Getenv("TB_FLEET_CYCLE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			b.Fatalf("TB_FLEET_CYCLE=%q: not a duration", s)
		}
		cycle = d
	}
	statements := 0
	if s := os.Getenv("TB_FLEET_STATEMENTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("TB_FLEET_STATEMENTS=%q: not a number of statements", s)
		}
		statements = n
	}
	opts := []pgtest.Option{pgtest.WithMaxConnections(4*slices.Max(fleets) + 50)}
	if statements > 0 {
		opts = append(opts, pgtest.WithStatementStats())
	}
	// One queue for every run: each tops it up by what it drives.
	f := newBenchFleet(b, pgtest.Start(b, opts...), queue, cycle)
	f.statements, f.heartbeat = statements, heartbeat
	for _, workers := range fleets {
		b.Run(fmt.Sprintf("workers=%d/queue=%d", workers, queue), func(b *testing.B) {
			f.run(b, workers)
		})
	}
}

// benchFleet is a fleet's shared store with its queue of cycles of one
// plan, kept across the runs.
type benchFleet struct {
	url, blobs string
	st         *state.Store
	plan       string
	sample     string
	queued     int
	runs       int
	// statements is how many of the costliest statements a run logs.
	statements int
	heartbeat  time.Duration
	db         string
	// cycle is how long a cycle's sample runs (0: it exits at once).
	cycle time.Duration
}

func newBenchFleet(b *testing.B, pg *pgtest.Cluster, queue int, cycle time.Duration) *benchFleet {
	ctx := context.Background()
	db := pg.NewDatabase(b)
	f := &benchFleet{url: db + "&pool_max_conns=4", blobs: b.TempDir(), db: db, cycle: cycle}
	st, err := state.Open(ctx, b.TempDir(), state.WithShared(f.url), state.WithSharedBlobs(f.blobs))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	f.st = st
	sample := "out beacon\nexit 0\n"
	if cycle > 0 {
		sample = "out beacon\nsleep " + cycle.String() + "\n"
	}
	blob, err := st.PutBlob(ctx, strings.NewReader(sample))
	if err != nil {
		b.Fatal(err)
	}
	p := &records.Plan{SampleSHA256: blob.SHA256, Runnable: true, Image: records.ImageNeeds{Platform: "amd64"},
		Network:  records.NetPolicy{Mode: "allowlist", Promote: true},
		Timeouts: records.Timeouts{Execution: records.Duration(f.timeout())}, Sample: "sample_01JD0000000000000000000000"}
	records.Init(p, records.KindPlan, st.Now())
	if err := st.Create(ctx, p); err != nil {
		b.Fatal(err)
	}
	f.plan, f.sample = p.ID, blob.SHA256
	start := time.Now()
	f.enqueue(b, queue)
	b.Logf("queued %d cycles in %s", queue, time.Since(start).Round(time.Millisecond))
	// A fleet's database has its statistics and its pages written out as
	// autovacuum and the checkpointer leave them, not those of a bulk
	// insert a moment ago.
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{`VACUUM ANALYZE`, `CHECKPOINT`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	return f
}

// timeout is a cycle's: a minute more than its sample runs.
func (f *benchFleet) timeout() time.Duration { return f.cycle + time.Minute }

// enqueue stores n pending cycles, as tb-run submit does, a thousand to a
// transaction.
func (f *benchFleet) enqueue(b *testing.B, n int) {
	for n > 0 {
		batch := f.st.NewBatch()
		for range min(n, 1000) {
			now := f.st.Now()
			c := &records.Cycle{State: records.CyclePending, Plan: f.plan, Sample: f.sample,
				Timeout: records.Duration(f.timeout()), Post: []string{StepRotate, StepParse, StepPromote},
				RequestedAt: now, Seq: 1}
			records.Init(c, records.KindCycle, now)
			if _, err := batch.Create(c); err != nil {
				b.Fatal(err)
			}
			n--
			f.queued++
		}
		if err := batch.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

// claimLog times each worker's claims: from the end of its last cycle to
// the next "driving".
type claimLog struct {
	mu     sync.Mutex
	freed  map[string]time.Time
	claims []time.Duration
}

func (l *claimLog) ended(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.freed[host] = time.Now()
}

func (l *claimLog) driving(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.freed[host]; ok {
		l.claims = append(l.claims, time.Since(t))
		delete(l.freed, host)
	}
}

// drivingHandler tells the claim log when a worker starts driving a cycle.
type drivingHandler struct {
	slog.Handler
	host string
	log  *claimLog
}

func (h drivingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "driving" {
		h.log.driving(h.host)
	}
	return nil
}

func (f *benchFleet) run(b *testing.B, workers int) {
	statements := f.statements
	if b.N == 1 {
		// testing's first run (BenchmarkFleetScale says why), whose log
		// would take the lines testing prints of a benchmark's log.
		workers, statements = 1, 0
	}
	f.runs++
	f.enqueue(b, b.N)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	claims := &claimLog{freed: map[string]time.Time{}}
	var (
		mu      sync.Mutex
		ended   int
		failed  []string
		running sync.WaitGroup
	)
	var ws []*Worker
	for i := range workers {
		// Hosts of a run of their own: the cycles an earlier run left
		// mid-way are a dead host's, not this one's to resume.
		host := fmt.Sprintf("run%d-host-%03d", f.runs, i)
		st, err := state.Open(ctx, filepath.Join(b.TempDir(), host), state.WithShared(f.url), state.WithSharedBlobs(f.blobs))
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		g := newFakeGuest()
		log := slog.New(drivingHandler{Handler: slog.NewTextHandler(io.Discard, nil), host: host, log: claims})
		r := &Runner{St: st, Log: log, Post: &fakePost{st: st}, Leaser: &hostLeaser{st: st, host: host},
			Connect: func(ctx context.Context, l *records.SandboxLease) (Guest, error) { return g, nil },
			Host:    host, FleetHost: host, PID: os.Getpid()}
		if f.cycle == 0 {
			r.Poll, r.Stream = time.Millisecond, time.Millisecond
		}
		ws = append(ws, &Worker{R: r, Host: host, Slots: 1, Heartbeat: f.heartbeat, DeadAfter: time.Minute,
			Capabilities: func(ctx context.Context) ([]string, []string, error) {
				return []string{"amd64"}, nil, nil
			},
			Ended: func(c *records.Cycle, err error) {
				claims.ended(host)
				mu.Lock()
				defer mu.Unlock()
				if ended >= b.N {
					return // cut short when the run ended
				}
				if c == nil || c.State != records.CycleCompleted {
					failed = append(failed, fmt.Sprintf("%v %v", c, err))
				}
				if ended++; ended == b.N {
					cancel()
				}
			}})
	}
	if statements > 0 {
		f.statementStats(ctx, b, `SELECT pg_stat_statements_reset()`)
	}
	b.ResetTimer()
	start := time.Now()
	for i, w := range ws {
		running.Add(1)
		go func() {
			defer running.Done()
			// Spread over a cycle's length: the fleet's cycles then end
			// steadily, not all at once every cycle's length.
			select {
			case <-ctx.Done():
				return
			case <-time.After(f.cycle * time.Duration(i) / time.Duration(len(ws))):
			}
			if err := w.Run(ctx); err != nil {
				b.Error(err)
			}
		}()
	}
	running.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if len(failed) > 0 {
		b.Fatalf("%d cycles did not complete, the first: %s", len(failed), failed[0])
	}
	b.ReportMetric(float64(ended)/elapsed.Seconds(), "cycles/s")
	slices.Sort(claims.claims)
	if n := len(claims.claims); n > 0 {
		b.ReportMetric(float64(claims.claims[(n*99)/100].Microseconds())/1000, "claim-p99-ms")
	}
	b.ReportMetric(0, "ns/op")
	if statements > 0 {
		f.statementStats(context.Background(), b, `SELECT calls, round(total_exec_time)::bigint, rows,
				regexp_replace(left(query, 160), '\s+', ' ', 'g')
			FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
			ORDER BY total_exec_time DESC LIMIT $1`, statements)
	}
}

// statementStats runs a query of pg_stat_statements on the fleet's
// database and logs its rows.
func (f *benchFleet) statementStats(ctx context.Context, b *testing.B, query string, args ...any) {
	conn, err := pgx.Connect(ctx, f.db)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		b.Fatal(err)
	}
	rows, err := conn.Query(ctx, query, args...)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			b.Fatal(err)
		}
		if len(vals) > 1 {
			b.Logf("calls %v, %v ms, rows %v: %v", vals...)
		}
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
}
