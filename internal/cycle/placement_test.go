package cycle

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// fleet is a store as a fleet's worker sees it: plans of a few platforms,
// the worker records of other hosts (no processes behind them) and a
// clock the test moves.
type fleet struct {
	st    *state.Store
	clock *testClock
	plans map[string]string // platform → plan
	log   *syncBuffer
}

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// syncBuffer is a log that cycles' goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

const fleetDeadAfter = time.Minute

func newFleet(t *testing.T, platforms ...string) *fleet {
	t.Helper()
	ctx := context.Background()
	f := &fleet{clock: &testClock{t: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)}, plans: map[string]string{}, log: &syncBuffer{}}
	st, err := state.Open(ctx, t.TempDir(), state.WithDurability(state.SyncOnFlush), state.WithClock(f.clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	f.st = st
	b, err := st.PutBlob(ctx, strings.NewReader("out beacon\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pl := range platforms {
		p := &records.Plan{SampleSHA256: b.SHA256, Runnable: true, Image: records.ImageNeeds{Platform: pl},
			Network:  records.NetPolicy{Mode: "sinkhole"},
			Timeouts: records.Timeouts{Execution: records.Duration(time.Minute)}, Sample: "sample_01JD0000000000000000000000"}
		records.Init(p, records.KindPlan, st.Now())
		if err := st.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		f.plans[pl] = p.ID
	}
	return f
}

// host writes the record of another host's live worker with slots, of
// which running are taken.
func (f *fleet) host(t *testing.T, name string, slots, running int, platforms, native []string) *records.Worker {
	t.Helper()
	o := &records.Worker{Host: name, Slots: slots, Heartbeat: f.clock.Now(), DeadAfter: records.Duration(fleetDeadAfter),
		Platforms: platforms, Native: native}
	for i := range running {
		o.Running = append(o.Running, "cycle_busy"+string(rune('a'+i)))
	}
	records.Init(o, records.KindWorker, f.clock.Now())
	if err := f.st.Create(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	return o
}

// alive rewrites another host's worker record: its heartbeat is now.
func (f *fleet) alive(t *testing.T, o *records.Worker) {
	t.Helper()
	var rec records.Worker
	if err := f.st.Update(context.Background(), o.ID, &rec, func(bool) error {
		rec.Heartbeat = f.clock.Now()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// submit stores a pending cycle of the platform's plan, as tb-run submit
// [--host pinnedTo] does.
func (f *fleet) submit(t *testing.T, platform, pinnedTo string) string {
	t.Helper()
	r := &Runner{St: f.st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c, err := r.Create(context.Background(), Request{Plan: f.plans[platform], PinnedTo: pinnedTo})
	if err != nil {
		t.Fatal(err)
	}
	return c.ID
}

// worker is a worker on host, its host booting platforms (native: under
// KVM), its guests, leases and post-processing the fakes. It is not
// registered yet.
func (f *fleet) worker(host string, slots int, platforms, native []string, leaser Leaser) *Worker {
	g := newFakeGuest()
	if leaser == nil {
		leaser = &hostLeaser{st: f.st, host: host}
	}
	r := &Runner{St: f.st, Log: slog.New(slog.NewTextHandler(f.log, nil)).With("host", host), Post: &fakePost{st: f.st},
		Leaser:  leaser,
		Connect: func(ctx context.Context, l *records.SandboxLease) (Guest, error) { return g, nil },
		Poll:    time.Millisecond, Stream: time.Millisecond, Host: host, FleetHost: host}
	return &Worker{R: r, Host: host, Slots: slots, Heartbeat: 50 * time.Millisecond, DeadAfter: fleetDeadAfter,
		Capabilities: func(ctx context.Context) ([]string, []string, error) { return platforms, native, nil }}
}

// registered is worker, registered as Run does.
func (f *fleet) registered(t *testing.T, host string, slots int, platforms, native []string) *Worker {
	t.Helper()
	w := f.worker(host, slots, platforms, native, nil)
	if err := w.register(context.Background()); err != nil {
		t.Fatal(err)
	}
	return w
}

// takes has the worker look for cycles once and returns those it started
// driving, once they ended.
func (f *fleet) takes(t *testing.T, w *Worker) []string {
	t.Helper()
	ctx := context.Background()
	done := make(chan driven)
	if _, err := w.take(ctx, done, true); err != nil {
		t.Fatal(err)
	}
	var started []string
	for id := range w.running {
		started = append(started, id)
	}
	for range len(w.running) {
		d := <-done
		if d.err != nil {
			t.Errorf("driving %s: %v", d.id, d.err)
		}
		w.finish(ctx, d)
	}
	slices.Sort(started)
	return started
}

func (f *fleet) cycle(t *testing.T, id string) *records.Cycle {
	t.Helper()
	return get(t, f.st, id, &records.Cycle{})
}

// TestPlacementOnlyOnHostsWithThePlatform: a worker takes a cycle that
// needs a lease only if its host has an image of the plan's platform,
// even when it has more free slots than the host that has one.
func TestPlacementOnlyOnHostsWithThePlatform(t *testing.T) {
	f := newFleet(t, "amd64", "mipsel")
	f.host(t, "host-z", 1, 0, []string{"mipsel"}, nil)
	w := f.registered(t, "host-m", 3, []string{"amd64"}, nil)
	amd := f.submit(t, "amd64", "")
	mips := f.submit(t, "mipsel", "")

	if got := f.takes(t, w); !slices.Equal(got, []string{amd}) {
		t.Fatalf("host-m (amd64 only) started %v, want only the amd64 cycle %s", got, amd)
	}
	if c := f.cycle(t, amd); c.State != records.CycleCompleted || c.Host != "host-m" {
		t.Errorf("the amd64 cycle is %s on %q", c.State, c.Host)
	}
	// Long past DeadAfter, when any worker may take a waiting cycle, the
	// platform still decides.
	f.clock.Add(2 * fleetDeadAfter)
	if got := f.takes(t, w); len(got) != 0 {
		t.Fatalf("host-m started %v, a mipsel cycle it has no image for", got)
	}
	if c := f.cycle(t, mips); c.State != records.CyclePending || c.Lease != "" {
		t.Errorf("the mipsel cycle is %s on lease %q; want pending for host-z", c.State, c.Lease)
	}
	var rec records.Worker
	if err := f.st.Get(w.rec.ID, &rec); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rec.Platforms, []string{"amd64"}) {
		t.Errorf("the worker record advertises platforms %v, want [amd64]", rec.Platforms)
	}
}

// TestPlacementNativeFirst: among the live hosts that boot the platform
// and have a free slot, one that runs it under KVM takes the cycle before
// one that does not; then the most free slots; then the host name.
func TestPlacementNativeFirst(t *testing.T) {
	arm := []string{"arm64"}
	for _, tc := range []struct {
		name              string
		other             string
		slots, running    int
		platforms, native []string
		mySlots           int
		myNative          []string
		wantTaken         bool
	}{
		{name: "a native host wins over more free slots", other: "host-z", slots: 1, platforms: arm, native: arm, mySlots: 3, wantTaken: false},
		{name: "a native worker wins over more free slots elsewhere", other: "host-a", slots: 4, platforms: arm, mySlots: 1, myNative: arm, wantTaken: true},
		{name: "a full native host does not", other: "host-z", slots: 1, running: 1, platforms: arm, native: arm, mySlots: 1, wantTaken: true},
		{name: "both native: most free slots", other: "host-z", slots: 3, platforms: arm, native: arm, mySlots: 2, myNative: arm, wantTaken: false},
		{name: "neither native: most free slots", other: "host-z", slots: 2, platforms: arm, mySlots: 1, wantTaken: false},
		{name: "neither native, as free: first host name", other: "host-a", slots: 2, platforms: arm, mySlots: 2, wantTaken: false},
		{name: "neither native, as free: first host name is mine", other: "host-z", slots: 2, platforms: arm, mySlots: 2, wantTaken: true},
		{name: "a native host without the image does not count", other: "host-z", slots: 4, platforms: []string{"amd64"}, native: []string{"amd64"}, mySlots: 1, wantTaken: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, "arm64")
			f.host(t, tc.other, tc.slots, tc.running, tc.platforms, tc.native)
			w := f.registered(t, "host-m", tc.mySlots, arm, tc.myNative)
			id := f.submit(t, "arm64", "")
			got := f.takes(t, w)
			if taken := slices.Contains(got, id); taken != tc.wantTaken {
				t.Errorf("host-m took the cycle: %v, want %v", taken, tc.wantTaken)
			}
		})
	}
}

// TestPlacementPinned: a cycle pinned to a host (tb-run submit --host) is
// taken by that host's worker only, even when another host has more free
// slots; one pinned to a dead host waits for it, neither taken nor
// replaced.
func TestPlacementPinned(t *testing.T) {
	f := newFleet(t, "amd64")
	a := f.host(t, "host-a", 5, 0, []string{"amd64"}, nil)
	f.host(t, "host-d", 1, 0, []string{"amd64"}, nil)
	w := f.registered(t, "host-m", 1, []string{"amd64"}, nil)
	toA := f.submit(t, "amd64", "host-a")
	toM := f.submit(t, "amd64", "host-m")
	toD := f.submit(t, "amd64", "host-d")

	if got := f.takes(t, w); !slices.Equal(got, []string{toM}) {
		t.Fatalf("host-m started %v, want only the cycle pinned to it (%s)", got, toM)
	}
	if c := f.cycle(t, toM); c.PinnedTo != "host-m" || c.State != records.CycleCompleted {
		t.Errorf("the cycle pinned to host-m is %s, pinned to %q", c.State, c.PinnedTo)
	}
	// host-d's worker falls silent for long; host-a's stays alive.
	f.clock.Add(3 * fleetDeadAfter)
	f.alive(t, a)
	w.beat(context.Background())
	if got := f.takes(t, w); len(got) != 0 {
		t.Fatalf("host-m started %v, cycles pinned to other hosts", got)
	}
	for _, id := range []string{toA, toD} {
		if c := f.cycle(t, id); c.State != records.CyclePending || c.ReplacedBy != "" || c.Lease != "" {
			t.Errorf("pinned cycle %s is %s (replaced by %q, lease %q); want pending for its host", id, c.State, c.ReplacedBy, c.Lease)
		}
	}
	if n := strings.Count(f.log.String(), "the host it is pinned to has no live worker"); n != 1 {
		t.Errorf("the wait for host-d logged %d times, want once:\n%s", n, f.log)
	}
}

// TestPinnedReplacementWaitsForItsHost: a pinned cycle leased on a host
// that died is replaced, and the replacement keeps the pin: no other host
// takes it. When the host's worker comes back it destroys the lease left
// from before (its cycle was replaced) and runs the replacement.
func TestPinnedReplacementWaitsForItsHost(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, "amd64")
	d := f.host(t, "host-d", 1, 0, []string{"amd64"}, nil)
	w := f.registered(t, "host-m", 2, []string{"amd64"}, nil)
	old := f.submit(t, "amd64", "host-d")
	// host-d leased for it and was running it.
	l := &records.SandboxLease{State: records.LeaseBusy, Health: records.HealthHealthy, VMName: "tb-d", Host: "host-d", Holder: old, Plan: f.plans["amd64"]}
	records.Init(l, records.KindLease, f.clock.Now())
	if err := f.st.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	var c records.Cycle
	if err := f.st.Update(ctx, old, &c, func(bool) error {
		c.State, c.Lease, c.Host = records.CycleExecuting, l.ID, "host-d"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	f.clock.Add(2 * fleetDeadAfter)
	w.beat(ctx)
	if got := f.takes(t, w); len(got) != 0 {
		t.Fatalf("host-m started %v", got)
	}
	o := f.cycle(t, old)
	if o.State != records.CycleFailed || o.ReplacedBy == "" {
		t.Fatalf("the dead host's cycle is %s, replaced by %q", o.State, o.ReplacedBy)
	}
	n := f.cycle(t, o.ReplacedBy)
	if n.PinnedTo != "host-d" || n.State != records.CyclePending || !n.FreshLease {
		t.Fatalf("the replacement is %s, pinned to %q (fresh lease %v); want pending, pinned to host-d", n.State, n.PinnedTo, n.FreshLease)
	}
	if got := f.takes(t, w); len(got) != 0 {
		t.Fatalf("host-m started %v: the replacement is pinned to host-d", got)
	}
	if c := f.cycle(t, n.ID); c.State != records.CyclePending || c.ReplacedBy != "" {
		t.Fatalf("the waiting replacement is %s, replaced by %q", c.State, c.ReplacedBy)
	}

	// host-d comes back: a new worker there.
	var stopped records.Worker
	if err := f.st.Update(ctx, d.ID, &stopped, func(bool) error { stopped.Stopped = true; return nil }); err != nil {
		t.Fatal(err)
	}
	rl := &releasingLeaser{hostLeaser: hostLeaser{st: f.st, host: "host-d"}}
	back := f.worker("host-d", 1, []string{"amd64"}, nil, rl)
	back.UntilIdle = true
	runUntilIdle(t, back)
	if !slices.Equal(rl.released, []string{l.ID}) {
		t.Errorf("host-d's worker released %v, want the abandoned lease %s", rl.released, l.ID)
	}
	if c := f.cycle(t, n.ID); c.State != records.CycleCompleted || c.Host != "host-d" {
		t.Errorf("the replacement ended %s on %q, want completed on host-d", c.State, c.Host)
	}
}

// runUntilIdle runs a worker with UntilIdle and fails if it does not end
// on its own.
func runUntilIdle(t *testing.T, w *Worker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the worker on %s did not end once idle", w.Host)
	}
}

// releasingLeaser is hostLeaser that also destroys leases (tb-lease
// release), noting which.
type releasingLeaser struct {
	hostLeaser
	released []string
}

func (l *releasingLeaser) Release(ctx context.Context, lease string) error {
	l.released = append(l.released, lease)
	var rec records.SandboxLease
	return l.st.Update(ctx, lease, &rec, func(bool) error {
		rec.State = records.LeaseReleased
		return nil
	})
}

// TestWorkerReleasesAbandonedLeases: a worker starting on a host destroys
// the host's leases whose cycle ended replaced on another host, and no
// other lease.
func TestWorkerReleasesAbandonedLeases(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, "amd64")
	cycleIn := func(state, replacedBy string) string {
		id := f.submit(t, "amd64", "")
		var c records.Cycle
		if err := f.st.Update(ctx, id, &c, func(bool) error {
			c.State, c.ReplacedBy = state, replacedBy
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	lease := func(host, state, holder string) string {
		l := &records.SandboxLease{State: state, Health: records.HealthHealthy, VMName: "tb-" + host, Host: host, Holder: holder}
		records.Init(l, records.KindLease, f.clock.Now())
		if err := f.st.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
		return l.ID
	}
	replaced := cycleIn(records.CycleFailed, "cycle_01JD0000000000000000000REP")
	abandoned := lease("host-m", records.LeaseBusy, replaced)
	lease("host-a", records.LeaseBusy, cycleIn(records.CycleFailed, "cycle_01JD0000000000000000000REQ")) // another host's
	lease("host-m", records.LeaseReleased, cycleIn(records.CycleFailed, "cycle_01JD0000000000000000000RER"))
	lease("host-m", records.LeaseBusy, cycleIn(records.CycleFailed, "")) // failed here, not replaced
	executing := cycleIn(records.CycleExecuting, "")
	lease("host-m", records.LeaseBusy, executing) // still the host's
	lease("host-m", records.LeaseIdle, "")        // in the idle pool
	rl := &releasingLeaser{hostLeaser: hostLeaser{st: f.st, host: "host-m"}}
	w := f.worker("host-m", 1, nil, nil, rl)
	w.UntilIdle = true
	// The executing cycle is driven by another process: the worker
	// leaves it.
	unlock, ok, err := f.st.TryLock(ctx, cycleLock(executing))
	if err != nil || !ok {
		t.Fatal(err)
	}
	defer unlock()
	runUntilIdle(t, w)
	if !slices.Equal(rl.released, []string{abandoned}) {
		t.Errorf("released %v, want only the abandoned lease %s", rl.released, abandoned)
	}
	if !strings.Contains(f.log.String(), "released a lease abandoned") || !strings.Contains(f.log.String(), abandoned) {
		t.Errorf("the release is not logged:\n%s", f.log)
	}
}

// TestWorkerUntilIdleEndsWhenNoLiveHostFits: with UntilIdle, cycles that
// no live host can take (no image of their platform anywhere, or pinned
// to a dead host) do not keep the worker running; it says so once.
func TestWorkerUntilIdleEndsWhenNoLiveHostFits(t *testing.T) {
	f := newFleet(t, "amd64", "mipsel")
	f.host(t, "host-z", 1, 0, []string{"amd64"}, nil)
	dead := f.host(t, "host-d", 1, 0, []string{"amd64"}, nil)
	var rec records.Worker
	if err := f.st.Update(context.Background(), dead.ID, &rec, func(bool) error { rec.Stopped = true; return nil }); err != nil {
		t.Fatal(err)
	}
	mips := f.submit(t, "mipsel", "")
	pinned := f.submit(t, "amd64", "host-d")
	// Cycles this worker does take: more than one look for cycles.
	var amd []string
	for range 3 {
		amd = append(amd, f.submit(t, "amd64", "host-m"))
	}
	w := f.worker("host-m", 1, []string{"amd64"}, nil, nil)
	w.UntilIdle = true
	runUntilIdle(t, w)
	for _, id := range amd {
		if c := f.cycle(t, id); c.State != records.CycleCompleted {
			t.Errorf("amd64 cycle %s is %s", id, c.State)
		}
	}
	for _, id := range []string{mips, pinned} {
		if c := f.cycle(t, id); c.State != records.CyclePending {
			t.Errorf("cycle %s, which no live host can take, is %s", id, c.State)
		}
	}
	log := f.log.String()
	if n := strings.Count(log, "no live host has an image for its platform"); n != 1 || !strings.Contains(log, "platform=mipsel") {
		t.Errorf("the mipsel wait is logged %d times, want once with its platform:\n%s", n, log)
	}
	if n := strings.Count(log, "the host it is pinned to has no live worker"); n != 1 {
		t.Errorf("the wait for host-d is logged %d times, want once:\n%s", n, log)
	}
}

// TestLookBetweenSweepsTakesItsHostsCycles: a look that is not a sweep
// (which reads every active cycle) still finds the cycles its own host
// must go on with: one submitted onto a lease of its host (no host has
// driven it yet), and not one submitted onto another live host's lease.
func TestLookBetweenSweepsTakesItsHostsCycles(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, "amd64")
	f.host(t, "host-o", 1, 0, []string{"amd64"}, nil)
	w := f.registered(t, "host-m", 1, []string{"amd64"}, nil)
	if got := f.takes(t, w); len(got) != 0 { // the first look sweeps
		t.Fatalf("host-m started %v", got)
	}
	sweepAt := w.sweepAt
	onLease := func(host string) string {
		l := &records.SandboxLease{State: records.LeaseIdle, Health: records.HealthHealthy, VMName: "tb-" + host, Host: host,
			Plan: f.plans["amd64"]}
		records.Init(l, records.KindLease, f.clock.Now())
		if err := f.st.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
		r := &Runner{St: f.st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		c, err := r.Create(ctx, Request{Plan: f.plans["amd64"], Lease: l.ID})
		if err != nil {
			t.Fatal(err)
		}
		return c.ID
	}
	mine, theirs := onLease("host-m"), onLease("host-o")
	if got := f.takes(t, w); !slices.Equal(got, []string{mine}) {
		t.Fatalf("host-m started %v, want its lease's cycle %s", got, mine)
	}
	if w.sweepAt != sweepAt {
		t.Fatalf("the look swept (next sweep %s, was %s): it should have been a look between sweeps", w.sweepAt, sweepAt)
	}
	if c := f.cycle(t, mine); c.State != records.CycleCompleted || c.Host != "host-m" {
		t.Errorf("host-m's lease's cycle ended %s on %q", c.State, c.Host)
	}
	if c := f.cycle(t, theirs); c.State != records.CyclePending {
		t.Errorf("host-o's lease's cycle is %s, want pending for host-o", c.State)
	}
}

// TestFirstSweepSpreadInALargeFleet: workers started together do not all
// sweep (read every live worker and every active cycle) at their first
// look: in a fleet of more than sweepsPerHeartbeat live workers a new
// worker's first sweep is at a random point of its period; in a smaller
// one it is at its first look.
func TestFirstSweepSpreadInALargeFleet(t *testing.T) {
	f := newFleet(t, "amd64")
	small := f.registered(t, "host-small", 1, []string{"amd64"}, nil)
	if !small.sweepAt.IsZero() {
		t.Errorf("in a fleet of one, the first sweep is at %s, want the first look", small.sweepAt)
	}
	for i := range 40 {
		f.host(t, fmt.Sprintf("host-%02d", i), 1, 0, []string{"amd64"}, nil)
	}
	now := f.clock.Now()
	w := f.registered(t, "host-m", 1, []string{"amd64"}, nil)
	period := w.sweepPeriod(42)
	if w.sweepAt.Before(now) || !w.sweepAt.Before(now.Add(period)) {
		t.Errorf("in a fleet of 42, the first sweep is at %s, want within %s of %s", w.sweepAt, period, now)
	}
}

// TestClaimPutsOffADueSweep: a look that a cycle's end (or a wake) brings
// takes its cycle without sweeping, though a sweep is due: a sweep reads
// every live worker and every cycle being driven in the fleet, and the
// claim would wait for it. The heartbeat's look that follows makes it.
func TestClaimPutsOffADueSweep(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, "amd64")
	f.host(t, "host-o", 1, 1, []string{"amd64"}, nil)
	w := f.registered(t, "host-m", 1, []string{"amd64"}, nil)
	if !w.sweepAt.IsZero() {
		t.Fatalf("in a fleet of two, the first sweep is at %s, want due now", w.sweepAt)
	}
	id := f.submit(t, "amd64", "")
	done := make(chan driven)
	if _, err := w.take(ctx, done, false); err != nil {
		t.Fatal(err)
	}
	if !w.running[id] {
		t.Fatalf("the look after a cycle's end started %v, want %s", w.running, id)
	}
	if !w.sweepAt.IsZero() || w.live != nil {
		t.Errorf("the look after a cycle's end swept (next sweep at %s, live workers read %d)", w.sweepAt, len(w.live))
	}
	w.finish(ctx, <-done)
	if _, err := w.take(ctx, done, true); err != nil {
		t.Fatal(err)
	}
	if w.sweepAt.IsZero() || len(w.live) != 1 {
		t.Errorf("the heartbeat's look did not sweep (next sweep at %s, live workers read %d)", w.sweepAt, len(w.live))
	}
}
