package cycle

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// workerEnv makes the test binary a fleet host's worker (fakeWorker).
const workerEnv = "TB_CYCLE_TEST_WORKER"

func TestMain(m *testing.M) {
	if host := os.Getenv(workerEnv); host != "" {
		if err := fakeWorker(host); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeWorker is one host of a fleet, in a process of its own so that the
// test can kill it: a Worker on the shared store whose guests, leases and
// post-processing are the fakes. Every lease it acquires is a new one on
// its host.
func fakeWorker(host string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	st, err := state.Open(ctx, os.Getenv("TB_LOCAL"), state.WithShared(os.Getenv("TB_SHARED")),
		state.WithSharedBlobs(os.Getenv("TB_BLOBS")), state.WithDurability(state.SyncOnFlush))
	if err != nil {
		return err
	}
	g := newFakeGuest()
	g.stallAfter, _ = strconv.Atoi(os.Getenv("TB_STALL_AFTER"))
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("host", host)
	r := &Runner{St: st, Log: log, Post: &fakePost{st: st}, Leaser: &hostLeaser{st: st, host: host},
		Connect: func(ctx context.Context, l *records.SandboxLease) (Guest, error) { return g, nil },
		Poll:    time.Millisecond, Stream: time.Millisecond, Host: host, FleetHost: host, PID: os.Getpid()}
	w := &Worker{R: r, Host: host, Slots: 1, Heartbeat: 100 * time.Millisecond, DeadAfter: 1500 * time.Millisecond,
		UntilIdle: true,
		Capabilities: func(ctx context.Context) ([]string, []string, error) {
			return []string{"amd64"}, nil, nil
		},
		Ended: func(c *records.Cycle, err error) {
			if c != nil {
				fmt.Printf("ended %s %s\n", c.ID, c.State)
			}
		}}
	return w.Run(ctx)
}

// hostLeaser boots (in the store) a new lease on its host for each cycle.
type hostLeaser struct {
	st   *state.Store
	host string
}

func (l *hostLeaser) Acquire(ctx context.Context, plan, holder string, fresh bool) (string, error) {
	ls := &records.SandboxLease{State: records.LeaseBusy, Health: records.HealthHealthy, IP: "10.13.37.10",
		VMName: "tb-" + l.host, Host: l.host, Holder: holder, Plan: plan}
	records.Init(ls, records.KindLease, l.st.Now())
	return ls.ID, l.st.Create(ctx, ls)
}

// TestWorkersShareABatch runs a batch over two hosts' workers sharing a
// PostgreSQL store, kills one host's worker while it executes a cycle and
// restarts the database: every cycle of the batch ends completed, the dead
// host's cycle done again on the other host on a fresh lease with lineage
// saying so, and no cycle completed twice.
func TestWorkersShareABatch(t *testing.T) {
	ctx := context.Background()
	pg := pgtest.Start(t, pgtest.WithoutFsync())
	url := pg.NewDatabase(t)
	blobs := t.TempDir()
	st, err := state.Open(ctx, t.TempDir(), state.WithShared(url), state.WithSharedBlobs(blobs))
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.PutBlob(ctx, strings.NewReader("out beacon\nsleep 400ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := &records.Plan{SampleSHA256: b.SHA256, Runnable: true, Image: records.ImageNeeds{Platform: "amd64"},
		Network:  records.NetPolicy{Mode: "allowlist", Promote: true},
		Timeouts: records.Timeouts{Execution: records.Duration(time.Minute)}, Sample: "sample_01JD0000000000000000000000"}
	records.Init(p, records.KindPlan, st.Now())
	if err := st.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	submit := &Runner{St: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	const batch = 8
	var submitted []string
	for range batch {
		c, err := submit.Create(ctx, Request{Plan: p.ID})
		if err != nil {
			t.Fatal(err)
		}
		submitted = append(submitted, c.ID)
	}

	start := func(host string, env ...string) (*exec.Cmd, *strings.Builder, *strings.Builder) {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"="+host, "TB_SHARED="+url, "TB_BLOBS="+blobs,
			"TB_LOCAL="+filepath.Join(t.TempDir(), host))
		cmd.Env = append(cmd.Env, env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, &out, &errb
	}
	// Host A completes one cycle, then its second sample runs until the
	// host dies.
	a, _, aErr := start("host-a", "TB_STALL_AFTER=1")
	bCmd, bOut, bErr := start("host-b")

	// Kill host A's worker once it executes its second cycle.
	var killed *records.Cycle
	deadline := time.Now().Add(2 * time.Minute)
	for killed == nil {
		if time.Now().After(deadline) {
			t.Fatalf("host A never executed a cycle:\n%s", aErr)
		}
		cs, err := state.Find(st, records.KindCycle, func(c *records.Cycle) bool { return c.Host == "host-a" })
		if err != nil {
			t.Fatal(err)
		}
		done := 0
		for _, c := range cs {
			if c.State == records.CycleCompleted {
				done++
			}
		}
		for _, c := range cs {
			if c.State == records.CycleExecuting && done > 0 {
				killed = c
			}
		}
		if killed == nil {
			time.Sleep(20 * time.Millisecond) // polling the shared store; the test has no other signal
		}
	}
	a.Process.Kill()
	a.Wait()
	// The database goes away and comes back while host B works.
	pg.Kill(t)
	pg.StartAgain(t)

	waited := make(chan error, 1)
	go func() { waited <- bCmd.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("host B's worker: %v\n%s", err, bErr)
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("host B's worker did not finish the batch:\n%s", bErr)
	}

	// Every cycle of the batch ended completed, itself or through the
	// chain of its replacements.
	all, err := state.Find[records.Cycle](st, records.KindCycle, nil)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*records.Cycle{}
	for _, c := range all {
		byID[c.ID] = c
	}
	replaced := 0
	for _, id := range submitted {
		c := byID[id]
		for c.ReplacedBy != "" {
			if c.State != records.CycleFailed || !strings.Contains(c.Error, "host-a") {
				t.Errorf("%s was replaced but is %s (%q)", c.ID, c.State, c.Error)
			}
			n := byID[c.ReplacedBy]
			if n == nil || n.Replaces != c.ID || !n.FreshLease {
				t.Fatalf("%s's replacement %s does not name it", c.ID, c.ReplacedBy)
			}
			replaced++
			c = n
		}
		if c.State != records.CycleCompleted {
			t.Errorf("cycle %s of the batch ended %s (%s)", c.ID, c.State, c.Error)
		}
	}
	if byID[killed.ID].ReplacedBy == "" {
		t.Errorf("the cycle host A was executing when it died (%s) was not replaced: %s", killed.ID, byID[killed.ID].State)
	}
	if replaced < 1 || len(all) != batch+replaced {
		t.Errorf("%d cycles for a batch of %d with %d replacements", len(all), batch, replaced)
	}
	// Nothing completed twice: one completed event per completed cycle,
	// and each replacement ran on a lease of host B.
	completions := map[string]int{}
	events, err := state.Find[records.Event](st, records.KindEvent, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if e.To == records.CycleCompleted {
			completions[e.Cycle]++
		}
	}
	for id, n := range completions {
		if n != 1 {
			t.Errorf("cycle %s completed %d times", id, n)
		}
	}
	for _, c := range all {
		if c.Replaces == "" {
			continue
		}
		var l records.SandboxLease
		if err := st.Get(c.Lease, &l); err != nil || l.Host != "host-b" {
			t.Errorf("replacement %s ran on lease %s of host %q (%v)", c.ID, c.Lease, l.Host, err)
		}
	}
	ended := 0
	sc := bufio.NewScanner(strings.NewReader(bOut.String()))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "ended ") {
			ended++
		}
	}
	t.Logf("host B drove %d cycles; %d replaced; B's log:\n%s", ended, replaced, lastLines([]byte(bErr.String()), 15, 1<<20))
}

// TestLookReadsBoundedByFleetSize: what a worker's look reads of the
// store does not grow with the number of hosts in the fleet. Between
// sweeps a look reads the other workers' capacity from the live workers
// with a free slot, at most freeWorkersRead of them, not every worker
// record, and the active cycles of its own host, not every one the fleet
// drives; rows are counted by pg_stat_statements, with 100 and with 1,000
// other live hosts, each with free slots (the most a look could have to
// weigh) and driving a cycle.
func TestLookReadsBoundedByFleetSize(t *testing.T) {
	ctx := context.Background()
	pg := pgtest.Start(t, pgtest.WithoutFsync(), pgtest.WithStatementStats())
	rows := map[int]map[string]int64{}
	for _, hosts := range []int{100, 1000} {
		url := pg.NewDatabase(t)
		st, err := state.Open(ctx, t.TempDir(), state.WithShared(url), state.WithSharedBlobs(t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		blob, err := st.PutBlob(ctx, strings.NewReader("out beacon\n"))
		if err != nil {
			t.Fatal(err)
		}
		p := &records.Plan{SampleSHA256: blob.SHA256, Runnable: true, Image: records.ImageNeeds{Platform: "amd64"},
			Network:  records.NetPolicy{Mode: "sinkhole"},
			Timeouts: records.Timeouts{Execution: records.Duration(time.Minute)}, Sample: "sample_01JD0000000000000000000000"}
		records.Init(p, records.KindPlan, st.Now())
		if err := st.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		b := st.NewBatch()
		for i := range hosts {
			o := &records.Worker{Host: fmt.Sprintf("host-%04d", i), Slots: 4, Heartbeat: st.Now(),
				DeadAfter: records.Duration(time.Hour), Platforms: []string{"amd64"}}
			records.Init(o, records.KindWorker, st.Now())
			if _, err := b.Create(o); err != nil {
				t.Fatal(err)
			}
			// Each drives a cycle of its own, on a lease of its host.
			l := &records.SandboxLease{State: records.LeaseBusy, Health: records.HealthHealthy, Host: o.Host, Plan: p.ID}
			records.Init(l, records.KindLease, st.Now())
			c := &records.Cycle{State: records.CycleExecuting, Plan: p.ID, Sample: blob.SHA256, Lease: l.ID,
				Host: o.Host, RequestedAt: st.Now(), Seq: 4}
			records.Init(c, records.KindCycle, st.Now())
			l.Holder = c.ID
			for _, r := range []records.Record{l, c} {
				if _, err := b.Create(r); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		// Queued cycles that the other hosts, with more free slots, fit
		// better: the look weighs them all and starts none.
		r := &Runner{St: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Host: "host-me", FleetHost: "host-me"}
		for range 5 {
			if _, err := r.Create(ctx, Request{Plan: p.ID}); err != nil {
				t.Fatal(err)
			}
		}
		w := &Worker{R: r, Host: "host-me", Slots: 1, Heartbeat: time.Hour, DeadAfter: time.Hour,
			Capabilities: func(ctx context.Context) ([]string, []string, error) { return []string{"amd64"}, nil, nil }}
		if err := w.register(ctx); err != nil {
			t.Fatal(err)
		}
		done := make(chan driven)
		if _, err := w.take(ctx, done, true); err != nil { // a first look (its sweep comes later in a fleet this size)
			t.Fatal(err)
		}
		pg.StatementRows(t, url)
		if _, err := w.take(ctx, done, true); err != nil {
			t.Fatal(err)
		}
		rows[hosts] = pg.StatementRows(t, url, "talkbox_records", "talkbox_keys")
		if len(w.running) != 0 {
			t.Fatalf("with %d hosts better placed, the worker started %v", hosts, w.running)
		}
	}
	t.Logf("rows a look read: %v", rows)
	for _, table := range []string{"talkbox_records", "talkbox_keys"} {
		if rows[1000][table] > rows[100][table] {
			t.Errorf("a look read %d rows of %s with 1,000 other hosts, %d with 100: it grows with the fleet",
				rows[1000][table], table, rows[100][table])
		}
	}
}

// TestClaimWritesTheWorkerOnce: a worker whose cycle ends and that takes
// the next one at once writes its record once for the two (the next
// cycle's start), not once for the slot freed and again for it taken: each
// write is a commit on the claim's path and a wake of every free worker of
// the fleet. The record still says the slot is free when no cycle is left
// to fill it, and the worker stopped when it ends.
func TestClaimWritesTheWorkerOnce(t *testing.T) {
	f := newFleet(t, "amd64")
	const queued = 6
	for range queued {
		f.submit(t, "amd64", "")
	}
	w := f.worker("host-a", 1, []string{"amd64"}, nil, nil)
	w.Heartbeat, w.UntilIdle = time.Hour, true // no beat but the claims'
	ended := 0
	w.Ended = func(c *records.Cycle, err error) {
		if c == nil || c.State != records.CycleCompleted {
			t.Errorf("cycle ended %v: %v", c, err)
		}
		ended++
	}
	if err := w.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ended != queued {
		t.Fatalf("the worker drove %d cycles, want %d", ended, queued)
	}
	rec := get(t, f.st, w.rec.ID, &records.Worker{})
	if !rec.Stopped || len(rec.Running) != 0 {
		t.Errorf("the worker's last record: stopped %v, running %v; want stopped, running none", rec.Stopped, rec.Running)
	}
	// Its creation, each cycle's start, the slot left free at the end and
	// its stop.
	if want := int64(1 + queued + 2); rec.Rev > want {
		t.Errorf("the worker wrote its record %d times for %d cycles taken one after another, want %d at most", rec.Rev, queued, want)
	}
}

// TestClaimsWakeNoIdleWorker: on PostgreSQL, workers with a free slot and
// nothing they can take (their hosts boot another platform) look again
// when a cycle is queued or a worker stops, not at every cycle another
// worker claims, drives or ends: each look is a few queries, and a fleet
// whose every claim woke every free worker paid as many looks a claim as
// it has free workers. The idle workers' looks while another drives a
// batch are bounded by the batch's queueing and that worker's stop,
// whatever the batch's length.
func TestClaimsWakeNoIdleWorker(t *testing.T) {
	ctx := context.Background()
	st, p, worker := newPgFleet(t)
	const idle, batch = 6, 20
	looks := make(chan string, 1000)
	wctx, stopIdle := context.WithCancel(ctx)
	defer stopIdle()
	var running sync.WaitGroup
	for i := range idle {
		w := worker(fmt.Sprintf("arm-%d", i), "arm64")
		// Ready is asked at every look.
		w.Ready = func(context.Context) error { looks <- w.Host; return nil }
		running.Add(1)
		go func() {
			defer running.Done()
			if err := w.Run(wctx); err != nil {
				t.Error(err)
			}
		}()
	}
	// register's Ready, then the first look's.
	for range 2 * idle {
		<-looks
	}

	// The batch queued in one commit, as tb-run submit --batch does.
	sb := st.NewBatch()
	for range batch {
		c := &records.Cycle{State: records.CyclePending, Plan: p.ID, Sample: p.SampleSHA256,
			Timeout: records.Duration(time.Minute), Post: []string{StepRotate, StepParse}, RequestedAt: st.Now(), Seq: 1}
		records.Init(c, records.KindCycle, st.Now())
		if _, err := sb.Create(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := sb.Commit(); err != nil {
		t.Fatal(err)
	}
	amd := worker("amd-0", "amd64")
	amd.UntilIdle = true
	ended := 0
	amd.Ended = func(c *records.Cycle, err error) {
		if c == nil || c.State != records.CycleCompleted {
			t.Errorf("cycle ended %v: %v", c, err)
		}
		ended++
	}
	if err := amd.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if ended != batch {
		t.Fatalf("the amd64 worker drove %d cycles, want %d", ended, batch)
	}
	// Counted before the idle workers stop: a worker's stop wakes the
	// others.
	perWorker := map[string]int{}
	for counted := false; !counted; {
		select {
		case h := <-looks:
			perWorker[h]++
		default:
			counted = true
		}
	}
	stopIdle()
	running.Wait()
	// The batch's commit wakes them, and the amd64 worker's stop: two
	// looks each at most, however many cycles were claimed; each of the
	// batch's claims, starts and ends waking them would be up to three a
	// cycle.
	for h, n := range perWorker {
		if n > 2 {
			t.Errorf("idle worker %s looked %d times while another drove %d cycles, want 2 at most", h, n, batch)
		}
	}
	t.Logf("idle workers' looks while %d cycles were queued and driven: %v", batch, perWorker)
}

// newPgFleet is a fleet's store on a real PostgreSQL, with a plan of an
// amd64 guest whose sample exits at once, and worker, which makes a
// worker on a host of its own (its own store, as a host has), its host
// booting the platform, with no heartbeat during a test (every look is
// its first, a wake's or a recheck's), not yet running.
func newPgFleet(t *testing.T) (*state.Store, *records.Plan, func(host, platform string) *Worker) {
	ctx := context.Background()
	url := pgtest.Start(t, pgtest.WithoutFsync()).NewDatabase(t)
	blobs := t.TempDir()
	open := func() *state.Store {
		st, err := state.Open(ctx, t.TempDir(), state.WithShared(url), state.WithSharedBlobs(blobs))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	st := open()
	b, err := st.PutBlob(ctx, strings.NewReader("out beacon\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := &records.Plan{SampleSHA256: b.SHA256, Runnable: true, Image: records.ImageNeeds{Platform: "amd64"},
		Network:  records.NetPolicy{Mode: "sinkhole"},
		Timeouts: records.Timeouts{Execution: records.Duration(time.Minute)}, Sample: "sample_01JD0000000000000000000000"}
	records.Init(p, records.KindPlan, st.Now())
	if err := st.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	return st, p, func(host, platform string) *Worker {
		st := open()
		g := newFakeGuest()
		r := &Runner{St: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Post: &fakePost{st: st},
			Leaser:  &hostLeaser{st: st, host: host},
			Connect: func(ctx context.Context, l *records.SandboxLease) (Guest, error) { return g, nil },
			Poll:    time.Millisecond, Stream: time.Millisecond, Host: host, FleetHost: host}
		return &Worker{R: r, Host: host, Slots: 1, Heartbeat: time.Hour, DeadAfter: time.Hour,
			Capabilities: func(ctx context.Context) ([]string, []string, error) { return []string{platform}, nil, nil }}
	}
}

// TestYieldedCycleTakenWhenTheBetterWorkerFills: a worker that left a
// queued cycle to a better placed one (a free slot, a host name that
// sorts first) and took none looks again soon (a recheck), so that it
// takes the cycle once that worker's slots have filled with another: on
// PostgreSQL a worker's slots filling wakes no one, and the heartbeat
// (an hour here) is the only other look.
func TestYieldedCycleTakenWhenTheBetterWorkerFills(t *testing.T) {
	ctx := context.Background()
	st, p, worker := newPgFleet(t)
	better := &records.Worker{Host: "host-a", Slots: 1, Heartbeat: st.Now(), DeadAfter: records.Duration(time.Hour),
		Platforms: []string{"amd64"}}
	records.Init(better, records.KindWorker, st.Now())
	if err := st.Create(ctx, better); err != nil {
		t.Fatal(err)
	}
	submit := &Runner{St: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c, err := submit.Create(ctx, Request{Plan: p.ID})
	if err != nil {
		t.Fatal(err)
	}
	w := worker("host-x", "amd64")
	// register's Ready, the first look's (which yields the cycle to the
	// better worker, free), then the next look's: the better worker's slot
	// fills just before that look reads it.
	looks := 0
	filled := make(chan struct{})
	w.Ready = func(context.Context) error {
		if looks++; looks == 3 {
			var rec records.Worker
			if err := st.Update(ctx, better.ID, &rec, func(bool) error {
				rec.Running, rec.Heartbeat = []string{"cycle_elsewhere"}, st.Now()
				return nil
			}); err != nil {
				t.Error(err)
			}
			close(filled)
		}
		return nil
	}
	ended := make(chan *records.Cycle, 1)
	w.Ended = func(c *records.Cycle, err error) { ended <- c }
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go w.Run(wctx)
	select {
	case got := <-ended:
		select {
		case <-filled:
		default:
			t.Fatal("the worker took the cycle without leaving it to the better worker first")
		}
		if got == nil || got.ID != c.ID || got.State != records.CycleCompleted {
			t.Fatalf("the worker drove %+v, want %s completed", got, c.ID)
		}
	case <-time.After(time.Minute): // a hang guard: the recheck comes within a second
		t.Fatal("the worker did not take the cycle it had yielded once the better worker's slot filled")
	}
}

// TestCancelHeardWithoutReadingTheCycle: a worker's running cycle learns
// of a cancel from the store's notification to its host (the runner's
// bell), not by reading its record every Stream: while the sample runs,
// the cycle's reads do not grow with its polls (on PostgreSQL, counted by
// the server), and a cancel is honoured with the fallback read an hour
// away, on both backends.
func TestCancelHeardWithoutReadingTheCycle(t *testing.T) {
	ctx := context.Background()
	pg := pgtest.Start(t, pgtest.WithoutFsync(), pgtest.WithStatementStats())
	for _, backend := range []string{"directory", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			var url string
			var opts []state.Option
			if backend == "postgres" {
				url = pg.NewDatabase(t)
				opts = append(opts, state.WithShared(url), state.WithSharedBlobs(t.TempDir()))
			}
			st, err := state.Open(ctx, t.TempDir(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			blob, err := st.PutBlob(ctx, strings.NewReader("hang\n"))
			if err != nil {
				t.Fatal(err)
			}
			p := &records.Plan{SampleSHA256: blob.SHA256, Runnable: true, Image: records.ImageNeeds{Platform: "amd64"},
				Network:  records.NetPolicy{Mode: "sinkhole"},
				Timeouts: records.Timeouts{Execution: records.Duration(time.Hour)}, Sample: "sample_01JD0000000000000000000000"}
			records.Init(p, records.KindPlan, st.Now())
			if err := st.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			c, err := (&Runner{St: st, Log: log}).Create(ctx, Request{Plan: p.ID})
			if err != nil {
				t.Fatal(err)
			}

			// The test counts the sample's polls from when it asks.
			g := newFakeGuest()
			spawned := make(chan struct{})
			g.onSpawn = func(int) { close(spawned) }
			var polls atomic.Int64
			polled := make(chan struct{}, 1)
			g.onStatus = func(int) {
				polls.Add(1)
				select {
				case polled <- struct{}{}:
				default:
				}
			}
			r := &Runner{St: st, Log: log, Post: &fakePost{st: st}, Leaser: &hostLeaser{st: st, host: "host-a"},
				Connect: func(ctx context.Context, l *records.SandboxLease) (Guest, error) { return g, nil },
				Poll:    time.Millisecond, Stream: time.Millisecond, CancelRecheck: time.Hour,
				Host: "host-a", FleetHost: "host-a", PID: os.Getpid()}
			ended := make(chan *records.Cycle, 1)
			w := &Worker{R: r, Host: "host-a", Slots: 1, Heartbeat: time.Hour, DeadAfter: time.Hour,
				Capabilities: func(ctx context.Context) ([]string, []string, error) { return []string{"amd64"}, nil, nil },
				Ended:        func(c *records.Cycle, err error) { ended <- c }}
			wctx, stop := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- w.Run(wctx) }()
			defer func() {
				stop()
				if err := <-ran; err != nil {
					t.Error(err)
				}
			}()

			select {
			case <-spawned:
			case <-time.After(time.Minute): // a hang guard
				t.Fatal("the worker did not start the cycle")
			}
			if url != "" {
				const pollsWatched = 200
				pg.StatementRows(t, url)
				for from := polls.Load(); polls.Load() < from+pollsWatched; {
					<-polled
				}
				rows := pg.StatementRows(t, url, "talkbox_records")["talkbox_records"]
				t.Logf("records read while the sample was polled %d times: %d", pollsWatched, rows)
				if rows > pollsWatched/10 {
					t.Errorf("%d records read over %d polls of the sample: the cycle reads its record as it runs", rows, pollsWatched)
				}
			}

			waitFor, err := (&Runner{St: st, Log: log}).Cancel(ctx, []string{c.ID}, t.Logf)
			if err != nil || len(waitFor) != 1 {
				t.Fatalf("cancel: %v, waiting for %v", err, waitFor)
			}
			select {
			case done := <-ended:
				if done == nil || done.State != records.CycleCancelled || !g.proc(done.GuestPID).killed {
					t.Fatalf("the cycle ended %+v", done)
				}
			case <-time.After(time.Minute): // a hang guard: the bell rings at the commit
				t.Fatal("the cancel was not heard: the worker's cycle still runs")
			}
		})
	}
}
