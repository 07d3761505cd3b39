// Package cycle drives observation cycles (SandboxCycle): pending →
// leasing → preparing → executing → post_processing → completed, failed,
// timed_out or cancelled. Every transition is a compare-and-set of the
// cycle record under its lock (so journaled by the state store) followed by
// an event record; a cycle is driven by one process at a time (a named
// lock), and any process can resume a cycle from its last state without
// ever starting its sample twice.
package cycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Leaser acquires a lease for a plan (the leasing state of a cycle given
// only a plan), recording holder (the cycle) on it.
type Leaser interface {
	Acquire(ctx context.Context, plan, holder string, fresh bool) (string, error)
}

// Post is post-processing: the capture of the lease, its rotation into an
// artifact, parsing and allow-list promotion. The real one runs tb-capture,
// tb-parse and tb-allow.
type Post interface {
	// EnsureCapture makes sure a capture runs on the lease (containment
	// rules applied) with the allow set its chains enforce, and returns
	// the capture's ID.
	EnsureCapture(ctx context.Context, lease string) (string, error)
	Rotate(ctx context.Context, lease, cycle string) ([]string, error)
	Parse(ctx context.Context, artifacts []string) (int, error)
	Promote(ctx context.Context, lease, cycle string) (string, error)
	// Dump writes the lease's guest memory as an artifact of the cycle
	// and returns its ID.
	Dump(ctx context.Context, lease, cycle string) (string, error)
	// PlanDropped plans files the cycle's sample dropped in the guest,
	// copied out to the host, as samples whose lineage names the cycle,
	// and returns their sample IDs.
	PlanDropped(ctx context.Context, cycle string, files []DroppedFile) ([]string, error)
}

// DroppedFile is a file the sample left in the guest, copied out.
type DroppedFile struct {
	GuestPath, HostPath string
}

// Post-processing steps a cycle may run, in this order.
const (
	StepDump    = "dump" // the guest's memory at the end of execution
	StepRotate  = "rotate"
	StepParse   = "parse"
	StepDrops   = "drops" // the files the trace says the sample dropped, copied out and planned
	StepPromote = "promote"
)

// NewRunner is the runner the tools use: cycles in st, guests reached over
// libvirt, leases and post-processing done by running tb-lease,
// tb-capture, tb-parse and tb-allow from toolsDir on the lab.
// A fleet host (a worker's) pins its leases to that tb-lease host and
// names the cycles it drives after it; without one, tb-lease places leases
// and cycles carry the machine's hostname.
func NewRunner(st *state.Store, log *slog.Logger, toolsDir, lab, fleetHost string) *Runner {
	tools := &Tools{Dir: toolsDir, St: st, Log: log, Lab: lab, Host: fleetHost}
	host := fleetHost
	if host == "" {
		host, _ = os.Hostname()
	}
	return &Runner{St: st, Log: log, Connect: LibvirtGuest, Leaser: tools, Post: tools, Host: host, FleetHost: fleetHost, PID: os.Getpid()}
}

// Runner drives cycles.
type Runner struct {
	St      *state.Store
	Log     *slog.Logger
	Connect Connector
	Leaser  Leaser
	Post    Post
	// Poll is the longest wait between two looks at a running sample
	// (default 50 ms, one cheap agent round trip; the first looks come
	// sooner); Stream how often its
	// output is copied out (default 1 s).
	Poll   time.Duration
	Stream time.Duration
	// CancelRecheck is how often a running sample's cycle record is read
	// for a cancel request when the cancel bell (Cancels) can ring
	// (default 30 s): the bell, rung by the store's notification to the
	// driving host, is the way a cancel is heard, the read a fallback for
	// a lost one. Without a bell the record is read every Stream.
	CancelRecheck time.Duration
	// KillWait is how long a sample killed at its timeout is waited for
	// (killed again every 5 s) before its cycle goes on without it,
	// recording it as still running (default guestagent.Grace, 2 min).
	KillWait time.Duration
	// Cancels, when set, rings when a cancel of a cycle this runner
	// drives may have been committed (a Worker rings it from
	// state.FleetSignals.Cancels).
	Cancels *Bell
	// MaxOutput bounds the stdout and stderr kept per cycle (default 64 MiB).
	MaxOutput int64
	Host      string
	// FleetHost, when set, is the fleet host the runner drives cycles on:
	// it adopts no lease of another host.
	FleetHost string
	PID       int
}

func (r *Runner) poll() time.Duration   { return orDur(r.Poll, 50*time.Millisecond) }
func (r *Runner) stream() time.Duration { return orDur(r.Stream, time.Second) }

// cancelRecheck is how often a running sample's cycle is read for a
// cancel request with no bell ringing.
func (r *Runner) cancelRecheck() time.Duration {
	if r.Cancels == nil {
		return r.stream()
	}
	return orDur(r.CancelRecheck, 30*time.Second)
}

// Bell tells whoever waits on it that something may have changed: each
// Ring closes the channel Rung returned before it, so that every waiter
// hears it, however many there are.
type Bell struct {
	mu   sync.Mutex
	rung chan struct{}
}

// NewBell returns a bell not yet rung.
func NewBell() *Bell { return &Bell{rung: make(chan struct{})} }

// Rung returns a channel closed at the next Ring. A waiter takes it
// before it reads what the ring is about, so that a ring after the read
// is not missed.
func (b *Bell) Rung() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rung
}

// Ring wakes every waiter on Rung.
func (b *Bell) Ring() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.rung)
	b.rung = make(chan struct{})
}

func (r *Runner) maxOutput() int64 {
	if r.MaxOutput > 0 {
		return r.MaxOutput
	}
	return 64 << 20
}

func orDur(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Request is a new cycle. Empty fields come from the plan; Previous, when
// empty, is found (the latest cycle of the same sample on the lease).
type Request struct {
	Plan    string
	Lease   string
	Args    []string
	Env     map[string]string
	Workdir string
	Timeout *time.Duration
	Detach  *bool
	Window  *time.Duration
	// Post overrides the plan's post-processing steps.
	Post []string
	// FreshLease boots a new lease when none is given.
	FreshLease bool
	// PinnedTo is the fleet host whose worker alone may take the cycle.
	PinnedTo string
}

// GuestRoot is where cycles keep their files in the guest.
const GuestRoot = "/var/tmp/talkbox"

// Create stores a pending cycle for a request.
func (r *Runner) Create(ctx context.Context, req Request) (*records.Cycle, error) {
	if req.Plan == "" && req.Lease == "" {
		return nil, fault.Usage(errors.New("a cycle needs --plan, --lease or both"))
	}
	if req.Plan == "" {
		var l records.SandboxLease
		if err := r.St.Get(req.Lease, &l); err != nil {
			return nil, notFound("lease", req.Lease, err)
		}
		if l.Plan == "" {
			return nil, fault.Usage(fmt.Errorf("lease %s has no plan: give --plan", req.Lease))
		}
		req.Plan = l.Plan
	}
	var p records.Plan
	if err := r.St.Get(req.Plan, &p); err != nil {
		return nil, notFound("plan", req.Plan, err)
	}
	if records.KindOf(req.Plan) != records.KindPlan {
		return nil, fault.Usage(fmt.Errorf("%s is not a plan", req.Plan))
	}
	if !p.Runnable {
		return nil, fault.DataErr(fmt.Errorf("plan %s is not runnable: %s", p.ID, p.Reason))
	}
	if req.Lease != "" {
		if records.KindOf(req.Lease) != records.KindLease {
			return nil, fault.Usage(fmt.Errorf("%s is not a lease", req.Lease))
		}
		if !r.St.Exists(req.Lease) {
			return nil, fault.Usage(fmt.Errorf("lease %s: not found", req.Lease))
		}
	}
	c := &records.Cycle{
		State: records.CyclePending, Plan: p.ID, Sample: p.SampleSHA256, Lease: req.Lease,
		Args: p.Execution.Args, Env: p.Execution.Env, Workdir: p.Execution.Workdir,
		Timeout: p.Timeouts.Execution, Detach: p.Execution.Detach, Window: p.Timeouts.Window,
		Post: []string{StepRotate, StepParse}, FreshLease: req.FreshLease, PinnedTo: req.PinnedTo,
	}
	if p.Instruments("trace") {
		// An emulated sample too: strace runs around its emulator.
		c.Tracer = TracerStrace
		c.Post = slices.Insert(c.Post, slices.Index(c.Post, StepParse)+1, StepDrops)
	}
	if p.Network.Promote {
		c.Post = append(c.Post, StepPromote)
	}
	if p.Instruments("memory") {
		c.Post = append([]string{StepDump}, c.Post...)
	}
	if req.Args != nil {
		c.Args = req.Args
	}
	if req.Env != nil {
		c.Env = req.Env
	}
	if req.Workdir != "" {
		c.Workdir = req.Workdir
	}
	if req.Timeout != nil {
		c.Timeout = records.Duration(*req.Timeout)
	}
	if req.Detach != nil {
		c.Detach = *req.Detach
	}
	if req.Window != nil {
		c.Window = records.Duration(*req.Window)
	}
	if req.Post != nil {
		c.Post = req.Post
	}
	for _, s := range c.Post {
		if s != StepDump && s != StepRotate && s != StepParse && s != StepDrops && s != StepPromote {
			return nil, fault.Usage(fmt.Errorf("unknown post-processing step %q (dump, rotate, parse, drops, promote)", s))
		}
	}
	if c.Detach && c.Window <= 0 {
		return nil, fault.Usage(errors.New("a detached cycle needs an observation window (--window)"))
	}
	if !c.Detach && c.Timeout <= 0 {
		return nil, fault.Usage(errors.New("a cycle that is not detached needs a timeout (--timeout)"))
	}
	if c.Workdir != "" && !path.IsAbs(c.Workdir) {
		return nil, fault.Usage(fmt.Errorf("--workdir %q must be an absolute guest path", c.Workdir))
	}
	if err := r.St.EnsureBlob(ctx, c.Sample); errors.Is(err, state.ErrNotFound) {
		return nil, fault.DataErr(fmt.Errorf("plan %s: sample %s is not in the blob store, nor served by a worker of the fleet", p.ID, c.Sample))
	} else if err != nil {
		return nil, err
	}
	now := r.St.Now()
	records.Init(c, records.KindCycle, now)
	c.RequestedAt = now
	c.Seq = 1
	if err := r.St.Create(ctx, c); err != nil {
		return nil, err
	}
	if err := r.emit(ctx, c, "", records.CyclePending, ""); err != nil {
		return nil, err
	}
	r.Log.Info("cycle created", "cycle", c.ID, "plan", c.Plan, "lease", c.Lease)
	return c, nil
}

func notFound(what, id string, err error) error {
	if errors.Is(err, state.ErrNotFound) {
		return fault.Usage(fmt.Errorf("%s %s: not found", what, id))
	}
	if records.CheckID(id) != nil {
		return fault.Usage(err)
	}
	return err
}

// ErrBusy is returned when another process drives the cycle or uses the
// lease.
var ErrBusy = errors.New("busy")

func cycleLock(id string) string { return "tb-run/cycle/" + id }
func leaseLock(id string) string { return "tb-run/lease/" + id }

// retry errors leave the cycle in its state for a later resume (the
// hypervisor cannot be reached: nothing was done).
type retry struct{ err error }

func (r *retry) Error() string {
	return r.err.Error() + " (the cycle stays in its state; resume it later)"
}
func (r *retry) Unwrap() error { return r.err }

// stop errors end a cycle in a state other than failed.
type stop struct{ state, why string }

func (s *stop) Error() string { return s.why }

// Drive runs a cycle from its current state to a terminal one. If ctx is
// cancelled (tb-run interrupted) the cycle is left in its state for resume.
func (r *Runner) Drive(ctx context.Context, id string) (*records.Cycle, error) {
	unlock, ok, err := r.St.TryLock(ctx, cycleLock(id))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fault.TempFail(fmt.Errorf("cycle %s: %w: another tb-run drives it", id, ErrBusy))
	}
	return r.driveLocked(ctx, id, unlock)
}

// driveLocked is Drive under the cycle's lock, which the caller took (a
// worker's claim) and which unlock lets go of when it returns.
func (r *Runner) driveLocked(ctx context.Context, id string, unlock func()) (*records.Cycle, error) {
	defer unlock()
	c, err := r.Get(id)
	if err != nil {
		return nil, err
	}
	if records.CycleTerminal(c.State) {
		return c, nil
	}
	c, err = r.update(ctx, id, func(c *records.Cycle) error { c.Host, c.PID = r.Host, r.PID; return nil })
	if err != nil {
		return nil, err
	}
	var g Guest
	defer func() {
		if g != nil {
			g.Close()
		}
	}()
	var unlockLease func()
	defer func() {
		if unlockLease != nil {
			unlockLease()
		}
	}()
	for !records.CycleTerminal(c.State) {
		if c.Cancel {
			err = &stop{records.CycleCancelled, "cancelled"}
		} else {
			switch c.State {
			case records.CyclePending:
				c, err = r.transition(ctx, c, records.CycleLeasing, "", nil)
			case records.CycleLeasing:
				c, err = r.lease(ctx, c, &unlockLease)
			default:
				if unlockLease == nil {
					if unlockLease, err = r.lockLease(ctx, c.Lease); err != nil {
						break
					}
				}
				if g == nil {
					if g, err = r.connect(ctx, c); err != nil {
						break
					}
				}
				switch c.State {
				case records.CyclePreparing:
					c, err = r.prepare(ctx, c, g)
				case records.CycleExecuting:
					c, err = r.execute(ctx, c, g)
				case records.CyclePostProcessing:
					c, err = r.post(ctx, c)
				default:
					err = fmt.Errorf("unknown state %q", c.State)
				}
			}
		}
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			r.Log.Warn("interrupted; the cycle stays in its state for 'tb-run resume'", "cycle", id, "state", c.State)
			return c, ctx.Err()
		}
		var rt *retry
		if errors.Is(err, ErrBusy) || errors.As(err, &rt) {
			return c, err
		}
		to, why := records.CycleFailed, err.Error()
		var s *stop
		if errors.As(err, &s) {
			to, why = s.state, s.why
		}
		cur, gerr := r.Get(id)
		if gerr != nil {
			return c, gerr
		}
		c, err = r.transition(context.WithoutCancel(ctx), cur, to, why, func(c *records.Cycle) error {
			if to == records.CycleFailed {
				c.Error = why
			}
			return nil
		})
		if err != nil {
			return c, err
		}
		r.Log.Warn("cycle ended", "cycle", id, "state", to, "why", why)
	}
	return c, nil
}

func (r *Runner) lockLease(ctx context.Context, lease string) (func(), error) {
	unlock, ok, err := r.St.TryLock(ctx, leaseLock(lease))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fault.TempFail(fmt.Errorf("lease %s: %w: another cycle runs on it", lease, ErrBusy))
	}
	return unlock, nil
}

// Get reads a cycle; an ID that is not a stored cycle's is a usage error.
func (r *Runner) Get(id string) (*records.Cycle, error) {
	var c records.Cycle
	if err := r.St.Get(id, &c); err != nil {
		return nil, notFound("cycle", id, err)
	}
	if c.Kind != records.KindCycle {
		return nil, fault.Usage(fmt.Errorf("%s is not a cycle", id))
	}
	return &c, nil
}

// update changes fields of a cycle (no transition).
func (r *Runner) update(ctx context.Context, id string, fn func(c *records.Cycle) error) (*records.Cycle, error) {
	return r.updateAndCreate(ctx, id, func(c *records.Cycle) ([]records.Record, error) { return nil, fn(c) })
}

// updateAndCreate changes fields of a cycle and creates the records fn
// returns with it (state.Store.UpdateAndCreate).
func (r *Runner) updateAndCreate(ctx context.Context, id string, fn func(c *records.Cycle) ([]records.Record, error)) (*records.Cycle, error) {
	var c records.Cycle
	err := r.St.UpdateAndCreate(ctx, id, &c, func(exists bool) ([]records.Record, error) {
		if !exists {
			return nil, fmt.Errorf("cycle %s: %w", id, state.ErrNotFound)
		}
		return fn(&c)
	})
	return &c, err
}

// transition moves a cycle from the state c is in to `to`, if it still is
// in that state, and stores its event with it (one commit on PostgreSQL).
// fn may change other fields in the same write.
func (r *Runner) transition(ctx context.Context, c *records.Cycle, to, detail string, fn func(c *records.Cycle) error) (*records.Cycle, error) {
	from := c.State
	n, err := r.updateAndCreate(ctx, c.ID, func(n *records.Cycle) ([]records.Record, error) {
		if n.State != from {
			return nil, fmt.Errorf("cycle %s is %s, not %s (changed by another process)", n.ID, n.State, from)
		}
		if fn != nil {
			if err := fn(n); err != nil {
				return nil, err
			}
		}
		now := r.St.Now()
		n.State = to
		n.Seq++
		if to == records.CycleLeasing && n.StartedAt == nil {
			n.StartedAt = &now
		}
		if records.CycleTerminal(to) {
			n.CompletedAt = &now
			n.PID = 0
		}
		return []records.Record{r.event(n, from, to, detail)}, nil
	})
	if err != nil {
		return c, err
	}
	r.Log.Info("cycle state", "cycle", n.ID, "from", from, "to", to, "lease", n.Lease)
	if records.CycleTerminal(to) {
		return n, r.St.Flush()
	}
	return n, nil
}

// emit stores the event of a cycle's transition that was stored without
// one (its creation).
func (r *Runner) emit(ctx context.Context, c *records.Cycle, from, to, detail string) error {
	return r.St.Create(ctx, r.event(c, from, to, detail))
}

// event is the record of a cycle's latest transition.
func (r *Runner) event(c *records.Cycle, from, to, detail string) *records.Event {
	now := r.St.Now()
	e := &records.Event{Type: "cycle.state", Subject: c.ID, Cycle: c.ID, Seq: c.Seq, From: from, To: to, Detail: detail, At: now}
	records.Init(e, records.KindEvent, now)
	return e
}

// timed records how long a step took.
func (r *Runner) timed(ctx context.Context, c *records.Cycle, step string, start time.Time, fn func(c *records.Cycle) error) (*records.Cycle, error) {
	d := time.Since(start)
	return r.update(ctx, c.ID, func(n *records.Cycle) error {
		if n.Timings == nil {
			n.Timings = map[string]records.Duration{}
		}
		n.Timings[step] = records.Duration(d)
		if fn != nil {
			return fn(n)
		}
		return nil
	})
}
