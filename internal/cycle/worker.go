package cycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Worker drives the cycles of a fleet that fit its host, from a store the
// fleet shares: those whose lease is on its host, and those that still need
// a lease of a platform its host can boot (and are pinned to no other
// host), which it acquires on its host. It drives up to Slots at once,
// each under the cycle's lock, so that a cycle is driven by one worker; it
// says it is alive (and how many slots are free: its host's capacity) in
// its worker record, every Heartbeat, whenever it takes a cycle, and when
// one ends and the look that follows leaves the slot free.
//
// A cycle left on a host whose workers all fell silent for DeadAfter (the
// host died, or its worker was killed and not restarted) and that no one
// drives is replaced: a new pending cycle of the same request, on a fresh
// lease (Replaces names the old one), and the old one fails naming its
// replacement (ReplacedBy). The replacement is claimed under the old
// cycle's ID, so however many workers see the dead host, it is made once.
type Worker struct {
	R *Runner
	// Host is the fleet host the worker runs cycles on, as tb-lease names
	// it; R pins leases to it.
	Host      string
	Lab       string
	Slots     int
	Heartbeat time.Duration
	DeadAfter time.Duration
	// UntilIdle ends Run when the worker drives nothing and no open cycle
	// is left that is not driven by someone.
	UntilIdle bool
	// Ended is called with each cycle the worker drove to its end (or
	// left, with the error).
	Ended func(c *records.Cycle, err error)
	// BlobURL is where the worker serves its host's blobs, advertised in
	// its record ("": it does not).
	BlobURL string
	// Ready, when set, says whether the host may take cycles now: its lab
	// is up and its containment check passed. The worker does not start
	// without it, and takes no new cycle while it fails.
	Ready func(ctx context.Context) error
	// Capabilities, when set, says which guest platforms the host can
	// lease now (platforms: an image of each has its files here) and
	// which of them it runs under KVM (native). It is asked when the
	// worker starts and at every heartbeat, and its answer advertised in
	// the worker record; the worker takes a cycle that needs a lease only
	// if its plan's platform is among them. Without it the worker takes
	// cycles of any platform, and advertises none.
	// Without it, the Leaser's, if it is an Inspector.
	Capabilities func(ctx context.Context) (platforms, native []string, err error)

	rec     *records.Worker
	running map[string]bool
	// yielded: the last look left queued cycles to better placed workers.
	yielded bool
	// paused: Ready failed, and the heartbeat offers no free slot.
	paused bool
	// unsaid: a cycle ended since the record was last written.
	unsaid bool
	// planPlatform caches each plan's platform (a plan never changes).
	planPlatform map[string]string
	// waiting holds the waits already logged: a platform no live host
	// boots, a pinned host that cannot take its cycle.
	waiting map[string]bool
	// lookedForWaits is when the worker last looked for them.
	lookedForWaits time.Time
	// live are the other live workers as read at the last sweep: which
	// hosts are dead, and who could take a cycle that waits.
	live []*records.Worker
	// sweepAt is when the worker next reads every active cycle and every
	// live worker, for dead hosts' cycles (every look of an idle check).
	sweepAt time.Time
}

// replacementIndex keys a dead host's cycle to its replacement.
const replacementIndex = "replacement"

type driven struct {
	id  string
	c   *records.Cycle
	err error
}

func (w *Worker) heartbeat() time.Duration { return orDur(w.Heartbeat, 5*time.Second) }
func (w *Worker) deadAfter() time.Duration { return orDur(w.DeadAfter, 30*time.Second) }

// Run registers the worker and drives cycles until ctx ends (or, with
// UntilIdle, until there is nothing left to drive); the cycles it drives
// when ctx ends are left in their states for another worker or a resume.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.register(ctx); err != nil {
		return err
	}
	defer func() {
		// A clean stop tells the fleet at once; a killed worker is found
		// silent after DeadAfter.
		w.rec.Stopped = true
		w.beat(context.WithoutCancel(ctx))
	}()
	w.R.Log.Info("worker started", "worker", w.rec.ID, "host", w.Host, "slots", w.Slots,
		"platforms", w.rec.Platforms, "native", w.rec.Native)
	w.releaseAbandoned(ctx)

	// A cycle queued, a worker gone or with fewer slots: there may be
	// work to take (WatchFleet). A cancel of a cycle driven here rings
	// the runner's bell, which the cycles it executes wait on instead of
	// reading their records every second.
	wctx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	sig, err := w.R.St.WatchFleet(wctx, w.R.Host)
	if err != nil {
		return err
	}
	changed := sig.Work
	if w.R.Cancels == nil {
		w.R.Cancels = NewBell()
	}
	go func() {
		for range sig.Cancels {
			w.R.Cancels.Ring()
		}
	}()
	done := make(chan driven)
	tick := time.NewTicker(w.heartbeat())
	defer tick.Stop()
	// The first look and the heartbeat's may sweep; a look that a cycle's
	// end or a wake brings puts a due sweep off to the next heartbeat, so
	// that the claim it makes does not wait on reading every cycle being
	// driven and every live worker of the fleet.
	look, heartbeat := true, true
	// recheck fires a look soon after one that left queued cycles to
	// better placed workers and took none: nothing wakes this worker if
	// one of those takes another cycle instead.
	var recheck <-chan time.Time
	for {
		if look {
			idle, err := w.take(ctx, done, heartbeat)
			if err != nil {
				w.R.Log.Warn("looking for cycles", "err", err)
			}
			recheck = nil
			if w.yielded && len(w.running) < w.Slots {
				recheck = time.After(min(w.heartbeat()/4, time.Second))
			}
			if w.unsaid {
				// The slots a cycle's end freed and the look left free.
				w.beat(ctx)
			}
			if w.UntilIdle && idle && len(w.running) == 0 {
				w.R.Log.Info("worker idle: nothing left to drive", "worker", w.rec.ID)
				return nil
			}
		}
		look, heartbeat = true, false
		select {
		case <-ctx.Done():
			for range len(w.running) {
				w.finish(context.WithoutCancel(ctx), <-done)
			}
			return nil
		case d := <-done:
			// The record says the slot is free after the look that
			// follows, which most often fills it again: a slot freed and
			// taken is one write of the record (by start), not two.
			w.finish(ctx, d)
		case <-recheck:
		case <-tick.C:
			if err := w.capabilities(ctx); err != nil {
				w.R.Log.Warn("what this host can boot; keeping the last answer", "err", err)
			}
			w.beat(ctx)
			heartbeat = true
		case <-changed:
			// A worker with no free slot has nothing to take: the
			// cycles of dead hosts are looked for every heartbeat, and
			// an idle check needs every look.
			look = w.UntilIdle || len(w.running) < w.Slots
		}
	}
}

// Pooler gives a lease back to its host's idle pool, running, so that the
// next cycle of its sample needs no boot (Tools: tb-lease release --keep);
// tb-lease reverts it before another sample's cycle gets it.
type Pooler interface {
	Keep(ctx context.Context, lease string) error
}

// register checks that the host may take cycles and writes the worker's
// record, with what its host can boot.
func (w *Worker) register(ctx context.Context) error {
	if w.Host == "" {
		return errors.New("a worker needs its fleet host's name")
	}
	if w.Slots <= 0 {
		w.Slots = 1
	}
	if w.Ready != nil {
		if err := w.Ready(ctx); err != nil {
			return err
		}
	}
	if in, ok := w.R.Leaser.(Inspector); ok && w.Capabilities == nil {
		w.Capabilities = in.Capabilities
	}
	now := w.R.St.Now()
	w.rec = &records.Worker{Host: w.Host, PID: os.Getpid(), Lab: w.Lab, Slots: w.Slots, BlobURL: w.BlobURL,
		Heartbeat: now, DeadAfter: records.Duration(w.deadAfter())}
	if err := w.capabilities(ctx); err != nil {
		return err
	}
	records.Init(w.rec, records.KindWorker, now)
	if err := w.R.St.Create(ctx, w.rec); err != nil {
		return err
	}
	// Workers started together (a fleet brought up, or its store back)
	// would all sweep at their first look, each reading every live
	// worker: in a larger fleet a worker's first sweep comes at a random
	// point of its period. Its own host's cycles are read at every look.
	live, err := state.CountLiveWorkers(ctx, w.R.St, now)
	if err != nil {
		return err
	}
	if live > sweepsPerHeartbeat {
		w.sweepAt = now.Add(rand.N(w.sweepPeriod(live)))
	}
	w.running = map[string]bool{}
	w.planPlatform = map[string]string{}
	w.waiting = map[string]bool{}
	return nil
}

// Inspector says what the host can lease (Tools: tb-lease inspect host).
type Inspector interface {
	Capabilities(ctx context.Context) (platforms, native []string, err error)
}

// Releaser destroys a lease (Tools: tb-lease release).
type Releaser interface {
	Release(ctx context.Context, lease string) error
}

// capabilities asks what the host can boot now, for the worker record.
func (w *Worker) capabilities(ctx context.Context) error {
	if w.Capabilities == nil {
		return nil
	}
	platforms, native, err := w.Capabilities(ctx)
	if err != nil {
		return err
	}
	w.rec.Platforms, w.rec.Native = platforms, native
	return nil
}

// releaseAbandoned destroys the leases of this host whose cycles were
// replaced on other hosts while this one was taken for dead: their guests
// may still run, and no cycle will use them again.
func (w *Worker) releaseAbandoned(ctx context.Context) {
	rl, ok := w.R.Leaser.(Releaser)
	if !ok {
		return
	}
	st := w.R.St
	leases, err := state.Find(st, records.KindLease, func(l *records.SandboxLease) bool {
		return l.Host == w.Host && !records.LeaseGone(l.State) && records.KindOf(l.Holder) == records.KindCycle
	})
	if err != nil {
		w.R.Log.Warn("looking for abandoned leases", "err", err)
		return
	}
	for _, l := range leases {
		var c records.Cycle
		if err := st.Get(l.Holder, &c); err != nil {
			if !errors.Is(err, state.ErrNotFound) {
				w.R.Log.Warn("abandoned lease's cycle", "lease", l.ID, "cycle", l.Holder, "err", err)
			}
			continue
		}
		if !records.CycleTerminal(c.State) || c.ReplacedBy == "" {
			continue
		}
		if err := rl.Release(ctx, l.ID); err != nil {
			w.R.Log.Warn("releasing an abandoned lease", "lease", l.ID, "cycle", c.ID, "err", err)
			continue
		}
		w.R.Log.Warn("released a lease abandoned while this host was taken for dead", "lease", l.ID,
			"cycle", c.ID, "replaced_by", c.ReplacedBy)
	}
}

func (w *Worker) finish(ctx context.Context, d driven) {
	delete(w.running, d.id)
	w.rec.Running = slices.DeleteFunc(w.rec.Running, func(id string) bool { return id == d.id })
	w.unsaid = true
	if errors.Is(d.err, ErrBusy) {
		return // another worker took it first
	}
	if p, ok := w.R.Leaser.(Pooler); ok && d.c != nil && records.CycleTerminal(d.c.State) && !d.c.Detach && d.c.Lease != "" {
		// A detached sample still runs on its lease; any other cycle's
		// lease is free for the next one (reverted by tb-lease first if
		// that one's sample is another).
		if err := p.Keep(ctx, d.c.Lease); err != nil {
			w.R.Log.Warn("returning the lease to the pool", "lease", d.c.Lease, "err", err)
		}
	}
	if w.Ended != nil && (d.c != nil || d.err != nil) {
		w.Ended(d.c, d.err)
	}
}

// beat rewrites the worker record: alive now, with these cycles.
func (w *Worker) beat(ctx context.Context) {
	var rec records.Worker
	err := w.R.St.Update(ctx, w.rec.ID, &rec, func(bool) error {
		rec.Heartbeat, rec.Running, rec.Stopped, rec.Slots = w.R.St.Now(), w.rec.Running, w.rec.Stopped, w.Slots
		rec.Platforms, rec.Native = w.rec.Platforms, w.rec.Native
		if w.paused {
			rec.Slots = len(rec.Running)
		}
		return nil
	})
	if err != nil {
		w.R.Log.Warn("heartbeat", "err", err)
		return
	}
	w.unsaid = false
}

// take starts driving the cycles this worker should drive now, as slots
// allow, and, at a sweep, replaces those of dead hosts. A sweep is made at
// the heartbeat's look once one is due (sweepEvery), and at every look of
// an idle check. idle reports that no open cycle was left undriven (known
// only at a sweep). A look reads where the active cycles of its
// own host go on (as many as it drives, with their leases' hosts, not the
// records), the first queued ones this host may take (never the whole
// queue) and the capacity of at most freeWorkersRead other workers with a
// free slot; a sweep reads the same of every active cycle, and every live
// worker (see sweepEvery).
func (w *Worker) take(ctx context.Context, done chan<- driven, heartbeat bool) (idle bool, err error) {
	st := w.R.St
	now := st.Now()
	sweep := w.UntilIdle || heartbeat && !now.Before(w.sweepAt)
	if sweep {
		if err := w.readLive(ctx); err != nil {
			return false, err
		}
	}
	alive := map[string]bool{w.Host: true}
	for _, o := range w.live {
		alive[o.Host] = true
	}
	if w.Ready != nil {
		err := w.Ready(ctx)
		if paused := err != nil; paused != w.paused {
			w.paused = paused
			w.beat(ctx)
		}
		if err != nil {
			// Another host takes the cycles that need a lease; this
			// host's own wait until its lab is contained again.
			w.R.Log.Warn("taking no cycle", "err", err)
			return false, nil
		}
	}
	var active []state.ActiveRef
	if sweep {
		active, err = state.ActiveRefs(ctx, st)
	} else {
		active, err = state.ActiveRefsOn(ctx, st, w.Host)
	}
	if err != nil {
		return false, err
	}
	if sweep {
		// Sweeps are made at heartbeats: half of one early, so that
		// the heartbeat's look about sweepEvery from now finds it due
		// however late this look came after its tick.
		w.sweepAt = now.Add(w.sweepEvery() - w.heartbeat()/2)
	}
	idle = sweep
	for _, c := range active {
		if w.running[c.ID] {
			continue
		}
		owner := c.Host
		if c.Lease != "" {
			if !c.LeaseFound {
				w.R.Log.Warn("cycle's lease", "cycle", c.ID, "lease", c.Lease, "err", "not found")
				continue
			}
			owner = c.LeaseHost
		}
		mine := owner == "" || owner == w.Host
		silent := now.Sub(c.UpdatedAt) >= w.deadAfter()
		switch {
		case mine && len(w.running) >= w.Slots:
			// No slot: whether someone drives it is asked when one frees.
			idle = false
			continue
		case !mine && (alive[owner] || !silent) && !w.UntilIdle:
			// Another live host's, or one not silent long enough to be
			// taken for dead, and only an idle check would need to know
			// whether it is driven: no lock round trip per cycle.
			continue
		}
		if mine {
			unlock, ok := w.claim(ctx, c.ID)
			if !ok {
				continue // driven by someone
			}
			idle = false
			w.start(ctx, c.ID, unlock, done)
			continue
		}
		if w.busy(ctx, c.ID) {
			continue // driven by someone
		}
		idle = false
		if sweep && !alive[owner] && silent && !w.hostAlive(ctx, owner, now) {
			if err := w.replace(ctx, c.ID, owner); err != nil {
				w.R.Log.Warn("replacing a dead host's cycle", "cycle", c.ID, "err", err)
			}
		}
		// Otherwise another live host's worker takes it, or its host is
		// not yet silent for long enough.
	}
	busy, err := w.takeQueued(ctx, now, done)
	if err != nil {
		return false, err
	}
	return idle && !busy, nil
}

// sweepsPerHeartbeat is how many workers of a fleet sweep for dead hosts'
// cycles in a heartbeat, together: a sweep reads every active cycle and
// every live worker, as many as the fleet has, so that each worker
// sweeping every heartbeat would make the fleet's reads grow with the
// square of its size.
const sweepsPerHeartbeat = 8

// sweepEvery is how long a worker waits for its next sweep: a heartbeat in
// a fleet of up to sweepsPerHeartbeat live workers; in a larger one, as
// many heartbeats as keep the fleet's sweeps at about sweepsPerHeartbeat a
// heartbeat, each worker's at a random point of its period so that they
// spread out. A dead host's cycles are then found within about two
// heartbeats of its DeadAfter (a due sweep waits for the heartbeat's
// look), by whichever worker sweeps first.
func (w *Worker) sweepEvery() time.Duration {
	n := len(w.live) + 1
	period := w.sweepPeriod(n)
	if n <= sweepsPerHeartbeat {
		return period
	}
	return period/2 + rand.N(period)
}

// sweepPeriod is the mean time between a worker's sweeps in a fleet of n
// live workers.
func (w *Worker) sweepPeriod(n int) time.Duration {
	if n <= sweepsPerHeartbeat {
		return w.heartbeat()
	}
	return w.heartbeat() * time.Duration(n) / sweepsPerHeartbeat
}

// freeWorkersRead bounds how many other workers with a free slot a claim
// reads, so that a claim costs the same in a fleet of any size. Past it,
// the claim asks for fewer queued cycles than the fleet's free slots and
// yields fewer to better placed hosts than it might: a cycle is then taken
// by a host that is not the least loaded, never left waiting.
const freeWorkersRead = 64

// readLive reads the other live workers, at a sweep. A host taken for
// alive here may have died since; one found dead is asked again before its
// cycles are replaced (hostAlive).
func (w *Worker) readLive(ctx context.Context) error {
	live, err := state.LiveWorkers(ctx, w.R.St, w.R.St.Now())
	if err != nil {
		return err
	}
	w.live = slices.DeleteFunc(live, func(o *records.Worker) bool { return o.ID == w.rec.ID })
	return nil
}

// hostAlive tells whether a live worker is on the host now: its workers'
// records, found by host.
func (w *Worker) hostAlive(ctx context.Context, host string, now time.Time) bool {
	ws, err := state.FindBy(w.R.St, records.KindWorker, records.KeyHost, host, func(o *records.Worker) bool { return o.Alive(now) })
	return err != nil || len(ws) > 0
}

// claimMargin is how many more queued cycles than the fleet's free slots a
// claim asks for: those another worker took a moment ago are passed over.
const claimMargin = 4

// takeQueued starts driving queued cycles (pending, needing a lease) this
// worker should take: its host boots the plan's platform, the cycle is
// pinned to no other host, and no live worker fits it better. keepsBusy
// reports that a queued cycle keeps the worker from being idle: it drives
// one, or a live host's worker will.
func (w *Worker) takeQueued(ctx context.Context, now time.Time, done chan<- driven) (keepsBusy bool, err error) {
	w.yielded = false
	free := w.Slots - len(w.running)
	if free <= 0 {
		// No slot: whether someone drives them is asked when one frees.
		return true, nil
	}
	// The other workers with a free slot, to leave them the cycles they
	// fit better, and to ask for enough to pass over those.
	others, err := state.FreeWorkers(ctx, w.R.St, now, freeWorkersRead+1)
	if err != nil {
		return false, err
	}
	others = slices.DeleteFunc(others, func(o *records.Worker) bool { return o.ID == w.rec.ID })
	others = others[:min(len(others), freeWorkersRead)]
	othersFree := 0
	for _, o := range others {
		othersFree += o.Free()
	}
	// The cycles other workers drive already are passed over at once,
	// not each asked about with a lock's round trips.
	f := w.queueFilter()
	f.Lock = cycleLock
	queued, err := state.Queued(ctx, w.R.St, f, free+othersFree+claimMargin)
	if err != nil {
		return false, err
	}
	ahead := map[string]int{}
	for _, c := range queued {
		if len(w.running) >= w.Slots {
			return true, nil
		}
		if w.running[c.ID] {
			continue // this worker's, not yet leasing
		}
		// Whether someone drives a cycle is asked (a lock's round trips)
		// only of one this worker would take, not of every one it leaves
		// to better placed workers, except by an idle check.
		if c.PinnedTo == "" {
			plat, err := w.platformOf(c.Plan)
			if err != nil {
				w.R.Log.Warn("cycle's plan", "cycle", c.ID, "plan", c.Plan, "err", err)
				continue
			}
			if w.yields(plat, c, others, now, ahead[plat]) {
				if !w.UntilIdle || !w.busy(ctx, c.ID) {
					ahead[plat]++
					keepsBusy, w.yielded = true, true
				}
				continue
			}
		}
		unlock, ok := w.claim(ctx, c.ID)
		if !ok {
			continue // driven by someone
		}
		keepsBusy = true
		w.start(ctx, c.ID, unlock, done)
	}
	if keepsBusy {
		return true, nil
	}
	if w.UntilIdle {
		// Only an idle check needs to know whether another live host's
		// worker will take a queued cycle.
		for _, o := range w.live {
			qs, err := state.Queued(ctx, w.R.St, workerFilter(o), claimMargin)
			if err != nil {
				return false, err
			}
			for _, c := range qs {
				if !w.busy(ctx, c.ID) {
					return true, nil
				}
			}
		}
	}
	w.noteWaiting(ctx, w.live, now)
	return false, nil
}

// queueFilter is what this worker's host may take.
func (w *Worker) queueFilter() state.QueueFilter {
	if w.Capabilities == nil {
		return state.QueueFilter{Host: w.Host}
	}
	return workerFilter(w.rec)
}

// workerFilter is what a worker's host takes, as its record says.
func workerFilter(o *records.Worker) state.QueueFilter {
	return state.QueueFilter{Host: o.Host, Platforms: append([]string{}, o.Platforms...)}
}

// waitLookAt is how many queued cycles an idle worker looks at, once a
// heartbeat, for those no live host can take.
const waitLookAt = 64

// noteWaiting logs, once each, the platforms (and pinned hosts) of queued
// cycles that no live worker's host can take: nothing but a host that
// comes up, or gets the image, takes them. An idle worker looks at the
// first queued cycles once a heartbeat.
func (w *Worker) noteWaiting(ctx context.Context, others []*records.Worker, now time.Time) {
	if now.Sub(w.lookedForWaits) < w.heartbeat() {
		return
	}
	w.lookedForWaits = now
	qs, err := state.Queued(ctx, w.R.St, state.QueueFilter{}, waitLookAt)
	if err != nil {
		w.R.Log.Warn("looking for cycles no host takes", "err", err)
		return
	}
	for _, c := range qs {
		plat, err := w.platformOf(c.Plan)
		if err != nil {
			w.R.Log.Warn("cycle's plan", "cycle", c.ID, "plan", c.Plan, "err", err)
			continue
		}
		wait := "platform " + orAnyPlatform(plat)
		if c.PinnedTo != "" {
			wait = "host " + c.PinnedTo + " " + wait
		}
		taker := (c.PinnedTo == "" || c.PinnedTo == w.Host) && w.boots(plat) ||
			slices.ContainsFunc(others, func(o *records.Worker) bool {
				return (c.PinnedTo == "" || c.PinnedTo == o.Host) && o.Boots(plat)
			})
		if taker {
			delete(w.waiting, wait)
			continue
		}
		if w.waiting[wait] {
			continue
		}
		w.waiting[wait] = true
		if c.PinnedTo != "" {
			w.R.Log.Warn("a cycle waits: the host it is pinned to has no live worker with an image for its platform",
				"cycle", c.ID, "pinned_to", c.PinnedTo, "platform", orAnyPlatform(plat))
		} else {
			w.R.Log.Warn("a cycle waits: no live host has an image for its platform",
				"cycle", c.ID, "platform", orAnyPlatform(plat))
		}
	}
}

func orAnyPlatform(p string) string { return cmp.Or(p, "any") }

// platformOf is the platform of a plan's guest.
func (w *Worker) platformOf(plan string) (string, error) {
	if p, ok := w.planPlatform[plan]; ok {
		return p, nil
	}
	var p records.Plan
	if err := w.R.St.Get(plan, &p); err != nil {
		return "", err
	}
	w.planPlatform[plan] = p.Image.Platform
	return p.Image.Platform, nil
}

// boots tells whether this worker's host can lease the platform's guests
// (any, without Capabilities).
func (w *Worker) boots(platform string) bool {
	return w.Capabilities == nil || w.rec.Boots(platform)
}

// yields leaves a cycle that needs a lease of the platform to a better
// live worker whose host boots it and has a free slot: one whose host runs
// the platform under KVM before one whose host does not (native-arch-first),
// then the one with the most free slots (least-loaded placement, with
// capacities read from the workers' heartbeats), then the first by host
// name. ahead is how many queued cycles of the platform before this one it
// already left to others: once they fill the better workers' free slots,
// it yields no more (a deep queue keeps every worker busy). After
// DeadAfter the cycle waited, it yields to none.
func (w *Worker) yields(platform string, c *records.Cycle, others []*records.Worker, now time.Time, ahead int) bool {
	if now.Sub(c.RequestedAt) > w.deadAfter() {
		return false
	}
	free, native := w.Slots-len(w.running), w.rec.RunsNative(platform)
	better := 0
	for _, o := range others {
		f := o.Free()
		if f == 0 || !o.Boots(platform) {
			continue
		}
		if on := o.RunsNative(platform); on != native {
			if on {
				better += f
			}
			continue
		}
		if f > free || f == free && o.Host < w.Host {
			better += f
		}
	}
	return better > ahead
}

// busy tells whether a process drives the cycle now.
func (w *Worker) busy(ctx context.Context, id string) bool {
	unlock, ok := w.claim(ctx, id)
	if ok {
		unlock()
	}
	return !ok
}

// claim takes the cycle's lock, which whoever drives it holds: ok when no
// one else drives it, and this worker now may.
func (w *Worker) claim(ctx context.Context, id string) (unlock func(), ok bool) {
	unlock, ok, err := w.R.St.TryLock(ctx, cycleLock(id))
	if err != nil {
		w.R.Log.Warn("cycle's lock", "cycle", id, "err", err)
	}
	return unlock, ok && err == nil
}

// start drives a cycle whose lock the claim took (unlock lets go of it):
// handed to the driver, not let go of and taken again, so that no other
// worker takes the cycle in between only for one of them to find it busy.
func (w *Worker) start(ctx context.Context, id string, unlock func(), done chan<- driven) {
	w.running[id] = true
	w.rec.Running = append(w.rec.Running, id)
	go func() {
		c, err := w.R.driveLocked(ctx, id, unlock)
		done <- driven{id: id, c: c, err: err}
	}()
	w.beat(ctx)
	w.R.Log.Info("driving", "cycle", id, "host", w.Host)
}

// replace makes a dead host's cycle again on a fresh lease, and ends the
// old one naming its replacement.
func (w *Worker) replace(ctx context.Context, oldID, host string) error {
	r := w.R
	unlock, ok, err := r.St.TryLock(ctx, cycleLock(oldID))
	if err != nil || !ok {
		return err
	}
	defer unlock()
	old, err := r.Get(oldID)
	if err != nil || records.CycleTerminal(old.State) {
		return err
	}
	id, created, err := r.St.Claim(ctx, replacementIndex, old.ID, func() (records.Record, error) {
		n := &records.Cycle{
			State: records.CyclePending, Plan: old.Plan, Sample: old.Sample,
			Args: old.Args, Env: old.Env, Workdir: old.Workdir, Timeout: old.Timeout, Detach: old.Detach,
			Window: old.Window, Post: old.Post, Tracer: old.Tracer, FreshLease: true, Replaces: old.ID,
			PinnedTo: old.PinnedTo,
		}
		now := r.St.Now()
		records.Init(n, records.KindCycle, now)
		n.RequestedAt, n.Seq = now, 1
		return n, nil
	})
	if err != nil {
		return err
	}
	if created {
		n, err := r.Get(id)
		if err != nil {
			return err
		}
		if err := r.emit(ctx, n, "", records.CyclePending, "replaces "+old.ID); err != nil {
			return err
		}
	}
	where := cmp.Or(host, old.Host)
	why := fmt.Sprintf("host %s went silent (no worker heartbeat for %s) while the cycle was %s; replaced by %s on a fresh lease",
		where, w.deadAfter(), old.State, id)
	_, err = r.transition(ctx, old, records.CycleFailed, why, func(n *records.Cycle) error {
		n.Error, n.ReplacedBy = why, id
		return nil
	})
	if err == nil {
		r.Log.Warn("replaced a dead host's cycle", "cycle", old.ID, "host", where, "replacement", id)
	}
	return err
}
