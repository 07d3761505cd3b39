// Package cycle drives observation cycles (SandboxCycle): pending →
// leasing → preparing → executing → post_processing → completed, failed,
// timed_out or cancelled. Every transition is a compare-and-set of the
// cycle record under its lock (so journaled by the state store) followed by
// an event record; a cycle is driven by one process at a time (a named
// lock), and any process can resume a cycle from its last state without
// ever starting its sample twice.
package cycle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
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
	// rules applied) and returns its ID.
	EnsureCapture(ctx context.Context, lease string) (string, error)
	Rotate(ctx context.Context, lease, cycle string) ([]string, error)
	Parse(ctx context.Context, artifacts []string) (int, error)
	Promote(ctx context.Context, lease, cycle string) (string, error)
	// Dump writes the lease's guest memory as an artifact of the cycle
	// and returns its ID.
	Dump(ctx context.Context, lease, cycle string) (string, error)
}

// Post-processing steps a cycle may run, in this order.
const (
	StepDump    = "dump" // the guest's memory at the end of execution
	StepRotate  = "rotate"
	StepParse   = "parse"
	StepPromote = "promote"
)

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
	// output is copied out and a cancel request looked for (default 1 s).
	Poll   time.Duration
	Stream time.Duration
	// MaxOutput bounds the stdout and stderr kept per cycle (default 64 MiB).
	MaxOutput int64
	Host      string
	PID       int
}

func (r *Runner) poll() time.Duration   { return orDur(r.Poll, 50*time.Millisecond) }
func (r *Runner) stream() time.Duration { return orDur(r.Stream, time.Second) }
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
}

// GuestRoot is where cycles keep their files in the guest.
const GuestRoot = "/var/tmp/talkbox"

// Create stores a pending cycle for a request.
func (r *Runner) Create(ctx context.Context, req Request) (*records.Cycle, error) {
	if req.Plan == "" && req.Lease == "" {
		return nil, cli.Usage(errors.New("a cycle needs --plan, --lease or both"))
	}
	if req.Plan == "" {
		var l records.SandboxLease
		if err := r.St.Get(req.Lease, &l); err != nil {
			return nil, notFound("lease", req.Lease, err)
		}
		if l.Plan == "" {
			return nil, cli.Usage(fmt.Errorf("lease %s has no plan: give --plan", req.Lease))
		}
		req.Plan = l.Plan
	}
	var p records.Plan
	if err := r.St.Get(req.Plan, &p); err != nil {
		return nil, notFound("plan", req.Plan, err)
	}
	if records.KindOf(req.Plan) != records.KindPlan {
		return nil, cli.Usage(fmt.Errorf("%s is not a plan", req.Plan))
	}
	if !p.Runnable {
		return nil, cli.DataErr(fmt.Errorf("plan %s is not runnable: %s", p.ID, p.Reason))
	}
	if req.Lease != "" {
		if records.KindOf(req.Lease) != records.KindLease {
			return nil, cli.Usage(fmt.Errorf("%s is not a lease", req.Lease))
		}
		if !r.St.Exists(req.Lease) {
			return nil, cli.Usage(fmt.Errorf("lease %s: not found", req.Lease))
		}
	}
	c := &records.Cycle{
		State: records.CyclePending, Plan: p.ID, Sample: p.SampleSHA256, Lease: req.Lease,
		Args: p.Execution.Args, Env: p.Execution.Env, Workdir: p.Execution.Workdir,
		Timeout: p.Timeouts.Execution, Detach: p.Execution.Detach, Window: p.Timeouts.Window,
		Post: []string{StepRotate, StepParse}, FreshLease: req.FreshLease,
	}
	if p.Instruments("trace") {
		c.Tracer = TracerStrace
		if p.Emulation != nil {
			c.Tracer = TracerQEMU
		}
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
		if s != StepDump && s != StepRotate && s != StepParse && s != StepPromote {
			return nil, cli.Usage(fmt.Errorf("unknown post-processing step %q (dump, rotate, parse, promote)", s))
		}
	}
	if c.Detach && c.Window <= 0 {
		return nil, cli.Usage(errors.New("a detached cycle needs an observation window (--window)"))
	}
	if !c.Detach && c.Timeout <= 0 {
		return nil, cli.Usage(errors.New("a cycle that is not detached needs a timeout (--timeout)"))
	}
	if c.Workdir != "" && !path.IsAbs(c.Workdir) {
		return nil, cli.Usage(fmt.Errorf("--workdir %q must be an absolute guest path", c.Workdir))
	}
	if !r.St.HasBlob(c.Sample) {
		return nil, cli.DataErr(fmt.Errorf("plan %s: sample %s is not in the blob store", p.ID, c.Sample))
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
		return cli.Usage(fmt.Errorf("%s %s: not found", what, id))
	}
	if records.CheckID(id) != nil {
		return cli.Usage(err)
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
		return nil, cli.TempFail(fmt.Errorf("cycle %s: %w: another tb-run drives it", id, ErrBusy))
	}
	defer unlock()
	c, err := r.get(id)
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
		cur, gerr := r.get(id)
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
		return nil, cli.TempFail(fmt.Errorf("lease %s: %w: another cycle runs on it", lease, ErrBusy))
	}
	return unlock, nil
}

func (r *Runner) get(id string) (*records.Cycle, error) {
	var c records.Cycle
	if err := r.St.Get(id, &c); err != nil {
		return nil, notFound("cycle", id, err)
	}
	if c.Kind != records.KindCycle {
		return nil, cli.Usage(fmt.Errorf("%s is not a cycle", id))
	}
	return &c, nil
}

// update changes fields of a cycle (no transition).
func (r *Runner) update(ctx context.Context, id string, fn func(c *records.Cycle) error) (*records.Cycle, error) {
	var c records.Cycle
	err := r.St.Update(ctx, id, &c, func(exists bool) error {
		if !exists {
			return fmt.Errorf("cycle %s: %w", id, state.ErrNotFound)
		}
		return fn(&c)
	})
	return &c, err
}

// transition moves a cycle from the state c is in to `to`, if it still is
// in that state, and emits the event. fn may change other fields in the
// same write.
func (r *Runner) transition(ctx context.Context, c *records.Cycle, to, detail string, fn func(c *records.Cycle) error) (*records.Cycle, error) {
	from := c.State
	next, err := r.update(ctx, c.ID, func(n *records.Cycle) error {
		if n.State != from {
			return fmt.Errorf("cycle %s is %s, not %s (changed by another process)", n.ID, n.State, from)
		}
		if fn != nil {
			if err := fn(n); err != nil {
				return err
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
		return nil
	})
	if err != nil {
		return c, err
	}
	r.Log.Info("cycle state", "cycle", next.ID, "from", from, "to", to, "lease", next.Lease)
	if err := r.emit(ctx, next, from, to, detail); err != nil {
		return next, err
	}
	if records.CycleTerminal(to) {
		return next, r.St.Flush()
	}
	return next, nil
}

// emit stores the event of a cycle's latest transition.
func (r *Runner) emit(ctx context.Context, c *records.Cycle, from, to, detail string) error {
	now := r.St.Now()
	e := &records.Event{Type: "cycle.state", Subject: c.ID, Cycle: c.ID, Seq: c.Seq, From: from, To: to, Detail: detail, At: now}
	records.Init(e, records.KindEvent, now)
	return r.St.Create(ctx, e)
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

// heldLease returns the live lease acquired for the cycle, if there is one.
func (r *Runner) heldLease(cycle string) (string, error) {
	ids, err := r.St.List(records.KindLease)
	if err != nil {
		return "", err
	}
	for _, id := range ids {
		var l records.SandboxLease
		if err := r.St.Get(id, &l); err != nil {
			if errors.Is(err, state.ErrNotFound) {
				continue
			}
			return "", err
		}
		if l.Holder == cycle && !records.LeaseGone(l.State) {
			return l.ID, nil
		}
	}
	return "", nil
}

// lease binds the cycle to a live lease and records its lineage.
func (r *Runner) lease(ctx context.Context, c *records.Cycle, unlock *func()) (*records.Cycle, error) {
	var err error
	if c.Lease == "" {
		if r.Leaser == nil {
			return c, errors.New("no lease given and no way to acquire one")
		}
		start := time.Now()
		// A tb-run that died after its acquire ended, but before it
		// recorded the lease here, left the lease busy under this cycle's
		// name: adopt it rather than leak it until its TTL.
		id, err := r.heldLease(c.ID)
		if err == nil && id == "" {
			id, err = r.Leaser.Acquire(ctx, c.Plan, c.ID, c.FreshLease)
		}
		if err != nil {
			return c, fmt.Errorf("acquiring a lease: %w", err)
		}
		if c, err = r.timed(ctx, c, "lease", start, func(n *records.Cycle) error { n.Lease = id; return nil }); err != nil {
			return c, err
		}
	}
	var l records.SandboxLease
	if err := r.St.Get(c.Lease, &l); err != nil {
		return c, fmt.Errorf("lease %s: %w", c.Lease, err)
	}
	if records.LeaseGone(l.State) {
		return c, fmt.Errorf("lease %s is %s", l.ID, l.State)
	}
	if l.State == records.LeaseCreating {
		return c, fmt.Errorf("lease %s is still being created", l.ID)
	}
	if *unlock == nil {
		if *unlock, err = r.lockLease(ctx, c.Lease); err != nil {
			return c, err
		}
	}
	prev, err := r.previous(c)
	if err != nil {
		return c, err
	}
	rev, err := currentRevision(r.St, "lease:"+c.Lease)
	if err != nil {
		return c, err
	}
	return r.transition(ctx, c, records.CyclePreparing, "", func(n *records.Cycle) error {
		n.Previous = prev
		if rev != nil {
			n.Revision, n.Forwarding, n.Allowed = rev.ID, rev.EnforceSHA256, rev.Active
		}
		return nil
	})
}

// previous is the latest other cycle of the same sample on the same lease.
func (r *Runner) previous(c *records.Cycle) (string, error) {
	ids, err := r.St.List(records.KindCycle)
	if err != nil {
		return "", err
	}
	for i := len(ids) - 1; i >= 0; i-- {
		if ids[i] == c.ID || ids[i] > c.ID {
			continue
		}
		var o records.Cycle
		if err := r.St.Get(ids[i], &o); err != nil {
			continue
		}
		if o.Lease == c.Lease && o.Sample == c.Sample {
			return o.ID, nil
		}
	}
	return "", nil
}

// currentRevision is the latest revision of an allow-list chain, or nil.
func currentRevision(st *state.Store, chain string) (*records.AllowRevision, error) {
	ids, err := st.List(records.KindRevision)
	if err != nil {
		return nil, err
	}
	var best *records.AllowRevision
	for _, id := range ids {
		var rv records.AllowRevision
		if err := st.Get(id, &rv); err != nil {
			continue
		}
		if rv.Chain == chain && (best == nil || rv.Seq > best.Seq) {
			best = &rv
		}
	}
	return best, nil
}

func (r *Runner) connect(ctx context.Context, c *records.Cycle) (Guest, error) {
	var l records.SandboxLease
	if err := r.St.Get(c.Lease, &l); err != nil {
		return nil, fmt.Errorf("lease %s: %w", c.Lease, err)
	}
	if records.LeaseGone(l.State) {
		return nil, fmt.Errorf("lease %s is %s", l.ID, l.State)
	}
	g, err := r.Connect(ctx, &l)
	if err != nil {
		return nil, &retry{err}
	}
	return g, nil
}

// prepare checks the guest is ready, makes sure the capture runs, and
// pushes the sample (or finds the detached one of the previous cycle).
func (r *Runner) prepare(ctx context.Context, c *records.Cycle, g Guest) (*records.Cycle, error) {
	var l records.SandboxLease
	if err := r.St.Get(c.Lease, &l); err != nil {
		return c, err
	}
	start := time.Now()
	if err := waitPing(ctx, g, 30*time.Second); err != nil {
		return c, fmt.Errorf("guest of lease %s is not ready: %w", l.ID, err)
	}
	addrs, err := g.Addresses(ctx)
	if err != nil {
		return c, fmt.Errorf("guest of lease %s: %w", l.ID, err)
	}
	if l.IP != "" && !slices.ContainsFunc(addrs, func(a string) bool { return strings.SplitN(a, "/", 2)[0] == l.IP }) {
		return c, fmt.Errorf("guest of lease %s: network not up (want %s, has %v)", l.ID, l.IP, addrs)
	}
	if c, err = r.timed(ctx, c, "ready", start, nil); err != nil {
		return c, err
	}
	if slices.Contains(c.Post, StepRotate) && r.Post != nil {
		start = time.Now()
		capID, err := r.Post.EnsureCapture(ctx, c.Lease)
		if err != nil {
			return c, fmt.Errorf("capture on lease %s: %w", c.Lease, err)
		}
		if c, err = r.timed(ctx, c, "capture", start, func(n *records.Cycle) error { n.Capture = capID; return nil }); err != nil {
			return c, err
		}
	}
	if c.Detach && c.Previous != "" {
		if att, err := r.attachable(ctx, c, g); err != nil {
			return c, err
		} else if att != nil {
			return r.transition(ctx, c, records.CycleExecuting, "observing the sample of "+att.ID, func(n *records.Cycle) error {
				n.Attached, n.GuestPID, n.GuestPath, n.GuestOut = att.ID, att.GuestPID, att.GuestPath, att.GuestOut
				n.StdoutFrom, n.StderrFrom = att.StdoutTo, att.StderrTo
				n.Tracer, n.TraceFrom = att.Tracer, att.TraceTo
				if n.Workdir == "" {
					n.Workdir = att.Workdir
				}
				return nil
			})
		}
	}
	// The sample runs from the lease's sample cache, named by its sha256:
	// pushed by the first cycle, hashed again in the guest by every cycle
	// (a sample may rewrite or delete its own file; it is then pushed
	// again).
	sample := GuestRoot + "/samples/" + c.Sample
	start = time.Now()
	got, err := guestSHA256(ctx, g, sample)
	if err != nil {
		return c, err
	}
	if got != c.Sample {
		if res, err := g.Run(ctx, "/bin/mkdir", "-p", "-m", "0700", GuestRoot+"/samples"); err != nil {
			return c, err
		} else if res.ExitCode != 0 {
			return c, fmt.Errorf("mkdir in the guest: %s", strings.TrimSpace(string(res.Stderr)))
		}
		f, err := r.St.OpenBlob(c.Sample)
		if err != nil {
			return c, fmt.Errorf("sample %s: %w", c.Sample, err)
		}
		n, err := g.WriteFile(ctx, sample, f)
		f.Close()
		if err != nil {
			return c, fmt.Errorf("pushing the sample: %w", err)
		}
		if c, err = r.timed(ctx, c, "push", start, nil); err != nil {
			return c, err
		}
		start = time.Now()
		if got, err = guestSHA256(ctx, g, sample); err != nil {
			return c, err
		}
		if got != c.Sample {
			return c, fmt.Errorf("sample pushed to %s does not verify in the guest: sha256 %q, want %s (%d bytes written)", sample, got, c.Sample, n)
		}
	}
	if c, err = r.timed(ctx, c, "verify", start, nil); err != nil {
		return c, err
	}
	return r.transition(ctx, c, records.CycleExecuting, "", func(n *records.Cycle) error {
		n.GuestPath, n.GuestOut = sample, GuestRoot+"/"+n.ID
		if n.Workdir == "" {
			n.Workdir = GuestRoot
		}
		return nil
	})
}

// guestSHA256 hashes a file inside the guest ("" if it is not there). One
// process, no shell: each fork costs tens of milliseconds under TCG.
func guestSHA256(ctx context.Context, g Guest, path string) (string, error) {
	res, err := g.Run(ctx, "/usr/bin/sha256sum", path)
	if err != nil {
		return "", fmt.Errorf("hashing the sample in the guest: %w", err)
	}
	if res.ExitCode != 0 {
		return "", nil
	}
	sum, _, _ := strings.Cut(strings.TrimSpace(string(res.Stdout)), " ")
	return sum, nil
}

func waitPing(ctx context.Context, g Guest, max time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, max)
	defer cancel()
	wait := 10 * time.Millisecond
	for {
		err := g.Ping(ctx)
		if err == nil {
			return nil
		}
		if sleepCtx(ctx, wait) != nil {
			return err
		}
		wait = min(2*wait, time.Second)
	}
}

// attachable is the previous cycle whose detached sample still runs.
func (r *Runner) attachable(ctx context.Context, c *records.Cycle, g Guest) (*records.Cycle, error) {
	prev, err := r.get(c.Previous)
	if err != nil {
		return nil, err
	}
	if !prev.Detach || prev.GuestPID == 0 || prev.GuestOut == "" {
		return nil, nil
	}
	alive, err := r.alive(ctx, g, prev.GuestPID)
	if err != nil || !alive {
		return nil, err
	}
	return prev, nil
}

func (r *Runner) alive(ctx context.Context, g Guest, pid int) (bool, error) {
	p, err := g.Status(ctx, pid)
	if err == nil {
		return !p.Exited, nil
	}
	// The agent forgets a process once its exit was reported, and all of
	// them when it restarts: ask the guest's /proc.
	res, rerr := g.Run(ctx, aliveArgv(pid)...)
	if rerr != nil {
		return false, rerr
	}
	return res.ExitCode == 0, nil
}

// agentGrace is how long the watch of a running sample tolerates a guest
// agent that does not answer before the cycle fails.
const agentGrace = 2 * time.Minute

func guestFiles(c *records.Cycle) (pidfile, stdout, stderr, trace string) {
	return c.GuestOut + ".pid", c.GuestOut + ".stdout", c.GuestOut + ".stderr", c.GuestOut + ".trace"
}

// execute starts the sample (once) or attaches to it, watches it until it
// exits, times out, its window ends or the cycle is cancelled, and stores
// its output and an execution record.
func (r *Runner) execute(ctx context.Context, c *records.Cycle, g Guest) (*records.Cycle, error) {
	pidfile, outPath, errPath, tracePath := guestFiles(c)
	var err error
	observeFrom := r.St.Now()
	if c.Attached == "" && c.GuestPID == 0 {
		if c.Launch {
			// A crash between asking the agent to start the sample and
			// recording its PID: the launcher says whether it ran.
			pid, err := r.findLaunch(ctx, g, pidfile)
			if err != nil {
				return c, err
			}
			now := r.St.Now()
			if c, err = r.update(ctx, c.ID, func(n *records.Cycle) error { n.GuestPID, n.LaunchedAt = pid, &now; return nil }); err != nil {
				return c, err
			}
		} else {
			if c, err = r.update(ctx, c.ID, func(n *records.Cycle) error { n.Launch = true; return nil }); err != nil {
				return c, err
			}
			// Whatever else a power cut loses, it must not lose this mark.
			if err := r.St.Flush(); err != nil {
				return c, err
			}
			argv := append([]string{c.GuestPath}, c.Args...)
			launchStart := time.Now()
			pid, err := g.Spawn(ctx, launchArgv(c.Workdir, pidfile, outPath, errPath, traceSpec(c.Tracer, tracePath), argv), guestEnv(c.Env))
			if err != nil {
				return c, fmt.Errorf("starting the sample: %w", err)
			}
			now := r.St.Now()
			if c, err = r.timed(ctx, c, "launch", launchStart, func(n *records.Cycle) error { n.GuestPID, n.LaunchedAt = pid, &now; return nil }); err != nil {
				return c, err
			}
			r.Log.Info("sample started", "cycle", c.ID, "guest_pid", pid, "detach", c.Detach)
		}
	}
	ex := &records.ExecutionSnapshot{Cycle: c.ID, Lease: c.Lease, Sample: c.Sample, GuestPID: c.GuestPID,
		Argv: append([]string{c.GuestPath}, c.Args...), Detached: c.Detach, StartedAt: observeFrom}
	runStart := time.Now()
	deadline := runStart.Add(c.Window.D())
	if !c.Detach {
		if c.LaunchedAt != nil { // a resumed run keeps its deadline
			runStart = *c.LaunchedAt
		}
		deadline = runStart.Add(c.Timeout.D())
	}
	spool := newSpool(r, c)
	defer spool.close()
	wait := 5 * time.Millisecond
	lastStream := time.Now()
	cancelled := false
	var unanswered time.Time // since when the agent has not answered
	for {
		p, err := g.Status(ctx, c.GuestPID)
		if err != nil {
			alive, aerr := r.alive(ctx, g, c.GuestPID)
			if aerr != nil {
				// A slow guest (TCG, a busy sample) can leave its agent
				// unanswered for a while: give it agentGrace before the
				// cycle fails.
				if unanswered.IsZero() {
					unanswered = time.Now()
					r.Log.Warn("the guest agent does not answer; waiting", "cycle", c.ID, "err", aerr, "grace", agentGrace)
				}
				if time.Since(unanswered) < agentGrace && ctx.Err() == nil {
					if err := sleepCtx(ctx, time.Second); err != nil {
						return c, err
					}
					continue
				}
				return c, fmt.Errorf("watching the sample: %v (%v; no answer for %s)", err, aerr, time.Since(unanswered).Round(time.Second))
			}
			if !alive {
				p = Proc{Exited: true, ExitCode: -1}
			}
		}
		unanswered = time.Time{}
		if p.Exited {
			code := p.ExitCode
			if p.Signal != 0 {
				code = 128 + p.Signal
			}
			if code >= 0 {
				ex.ExitCode = &code
			}
			break
		}
		now := time.Now()
		if !now.Before(deadline) {
			if c.Detach {
				ex.Running = true
				break
			}
			if err := r.kill(ctx, g, c.GuestPID); err != nil {
				return c, err
			}
			ex.TimedOut, ex.Killed = true, true
			wait = 5 * time.Millisecond
			deadline = now.Add(time.Hour) // only the exit is awaited now
			continue
		}
		if now.Sub(lastStream) >= r.stream() {
			lastStream = now
			if err := spool.pull(ctx, g, false); err != nil {
				return c, err
			}
			cur, err := r.get(c.ID)
			if err != nil {
				return c, err
			}
			if cur.Cancel {
				cancelled = true
				if err := r.kill(ctx, g, c.GuestPID); err != nil {
					return c, err
				}
				ex.Killed = true
				code := 137
				ex.ExitCode = &code
				break
			}
		}
		if err := sleepCtx(ctx, min(wait, time.Until(deadline)+time.Millisecond)); err != nil {
			return c, err
		}
		wait = min(2*wait, r.poll())
	}
	end := r.St.Now()
	ex.EndedAt = &end
	ex.Duration = records.Duration(time.Since(runStart))
	collectStart := time.Now()
	if err := spool.pull(ctx, g, true); err != nil {
		return c, err
	}
	arts, err := spool.store(ctx, ex)
	if err != nil {
		return c, err
	}
	records.Init(ex, records.KindExecution, end)
	if err := r.St.Create(ctx, ex); err != nil {
		return c, err
	}
	if c, err = r.timed(ctx, c, "collect", collectStart, func(n *records.Cycle) error {
		n.Timings["run"] = ex.Duration
		n.Execution, n.ExitCode, n.TimedOut = ex.ID, ex.ExitCode, ex.TimedOut
		n.Artifacts = append(n.Artifacts, arts...)
		n.StdoutTo, n.StderrTo = n.StdoutFrom+spool.stream(ArtifactStdout).n, n.StderrFrom+spool.stream(ArtifactStderr).n
		n.TraceTo = n.TraceFrom + spool.stream(ArtifactTrace).n
		return nil
	}); err != nil {
		return c, err
	}
	if cancelled {
		return c, &stop{records.CycleCancelled, "cancelled while executing; the sample was killed"}
	}
	return r.transition(ctx, c, records.CyclePostProcessing, execSummary(ex), nil)
}

// findLaunch looks for the launcher of an interrupted start for a few
// seconds (the agent may have forked it a moment ago).
func (r *Runner) findLaunch(ctx context.Context, g Guest, pidfile string) (int, error) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		res, err := g.Run(ctx, findLaunchArgv(pidfile)...)
		if err != nil {
			return 0, err
		}
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(res.Stdout))); res.ExitCode == 0 && perr == nil && pid > 0 {
			r.Log.Info("adopting the sample an interrupted start launched", "guest_pid", pid)
			return pid, nil
		}
		if time.Now().After(deadline) {
			return 0, errors.New("the sample's launch was interrupted and no launcher is found in the guest; it is not started again")
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

func execSummary(ex *records.ExecutionSnapshot) string {
	switch {
	case ex.TimedOut:
		return "timed out after " + ex.Duration.D().Round(time.Millisecond).String() + "; killed"
	case ex.Running:
		return "window ended; the sample keeps running"
	case ex.ExitCode != nil:
		return "exited " + strconv.Itoa(*ex.ExitCode)
	}
	return "exited"
}

func (r *Runner) kill(ctx context.Context, g Guest, pid int) error {
	res, err := g.Run(ctx, killArgv(pid)...)
	if err != nil {
		return fmt.Errorf("killing the sample (guest pid %d): %w", pid, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("killing the sample (guest pid %d): %s", pid, strings.TrimSpace(string(res.Stderr)))
	}
	r.Log.Info("sample killed", "guest_pid", pid)
	return nil
}

// lastLines keeps the last n lines of b, at most max bytes.
func lastLines(b []byte, n, max int) []byte {
	if len(b) > max {
		b = b[len(b)-max:]
	}
	t := bytes.TrimRight(b, "\n")
	for i, k := len(t)-1, 0; i >= 0; i-- {
		if t[i] == '\n' {
			if k++; k == n {
				return append([]byte(nil), b[i+1:]...)
			}
		}
	}
	return append([]byte(nil), b...)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
