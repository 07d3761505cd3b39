package cycle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// attachable is the previous cycle whose detached sample still runs (its
// launcher, or what it started in its cgroup).
func (r *Runner) attachable(ctx context.Context, c *records.Cycle, g Guest) (*records.Cycle, error) {
	prev, err := r.Get(c.Previous)
	if err != nil {
		return nil, err
	}
	if !prev.Detach || prev.GuestPID == 0 || prev.GuestOut == "" {
		return nil, nil
	}
	alive, err := r.alive(ctx, g, prev.GuestPID)
	if err == nil && !alive {
		// Its launcher ended, and what it started may run on in its cgroup.
		alive, err = lingering(ctx, g, prev)
	}
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

func guestFiles(c *records.Cycle) (pidfile, stdout, stderr string) {
	return c.GuestOut + ".pid", c.GuestOut + ".stdout", c.GuestOut + ".stderr"
}

// execute starts the sample (once) or attaches to it, watches it until it
// exits, times out, its window ends or the cycle is cancelled, and stores
// its output and an execution record.
func (r *Runner) execute(ctx context.Context, c *records.Cycle, g Guest) (*records.Cycle, error) {
	pidfile, outPath, errPath := guestFiles(c)
	tracePath, err := r.tracePath(c)
	if err != nil {
		return c, err
	}
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
			key, err := r.endKey(c)
			if err != nil {
				return c, err
			}
			launchStart := time.Now()
			pid, err := g.Spawn(ctx, launchArgv(c.Workdir, pidfile, outPath, errPath, traceSpec(c.Tracer, tracePath), argv), guestEnv(c.Env), []byte(key+"\n"))
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
	spool := newSpool(r, c, tracePath)
	defer spool.close()
	wait := 5 * time.Millisecond
	lastStream := time.Now()
	// The record is read for a cancel request at once (one may have come
	// since the cycle's last write), then when the bell rings and every
	// cancelRecheck.
	var lastCancelRead time.Time
	var rung <-chan struct{}
	if r.Cancels != nil {
		rung = r.Cancels.Rung()
	}
	cancelled := false
	var unanswered time.Time // since when the agent has not answered
	var killedAt time.Time   // the first kill at the timeout
	// launcherEnded: the launcher exited (an untraced sample is its
	// launcher; a traced one's waits for the tracer, which waits for every
	// process it traces), its status is the execution's exit code, and
	// what the sample started may still run without it: a daemon
	// reparented to init, in the sample's cgroup, watched until it ends or
	// the timeout kills it.
	launcherEnded := false
	for {
		if !launcherEnded {
			p, err := g.Status(ctx, c.GuestPID)
			if err != nil {
				alive, aerr := r.alive(ctx, g, c.GuestPID)
				if aerr != nil {
					// A slow guest (TCG, a busy sample) can leave its agent
					// unanswered for a while: give it the agent's grace
					// before the cycle fails.
					if unanswered.IsZero() {
						unanswered = time.Now()
						r.Log.Warn("the guest agent does not answer; waiting", "cycle", c.ID, "err", aerr, "grace", guestagent.Grace)
					}
					if time.Since(unanswered) < guestagent.Grace && ctx.Err() == nil {
						if err := guestagent.Pause(ctx, time.Second); err != nil {
							return c, err
						}
						continue
					}
					return c, fmt.Errorf("watching the sample: %v (%v; no answer for %s)", err, aerr, time.Since(unanswered).Round(time.Second))
				}
				if !alive {
					p = guestagent.Proc{Exited: true, ExitCode: -1}
				}
			}
			unanswered = time.Time{}
			if p.Exited {
				code := p.Code()
				if code >= 0 {
					ex.ExitCode = &code
				}
				launcherEnded = true
			}
		}
		if launcherEnded {
			left, err := lingering(ctx, g, c)
			if err != nil {
				return c, err
			}
			if !left {
				break
			}
			if wait < r.stream() && killedAt.IsZero() {
				// Its exit code is in; what remains is watched for its end
				// at the pace output is copied out.
				r.Log.Info("the sample's launcher ended; processes it started still run, watched until they end or the timeout", "cycle", c.ID)
				wait = r.stream()
			}
		}
		now := time.Now()
		if !now.Before(deadline) {
			if c.Detach {
				ex.Running = true
				break
			}
			if !killedAt.IsZero() && now.Sub(killedAt) >= r.killWait() {
				// Whatever keeps it going (a child forked past each kill's
				// walk of the tree, an agent that is the sample's), the
				// cycle does not wait for it any longer: it is recorded
				// as still running, and its analysis says so.
				ex.Running = true
				r.Log.Warn("the sample did not end after its kill; the cycle goes on without it", "cycle", c.ID, "guest_pid", c.GuestPID, "waited", now.Sub(killedAt).Round(time.Second))
				break
			}
			if err := r.kill(ctx, g, c); err != nil {
				if killedAt.IsZero() {
					return c, err
				}
				// A kill again, for what the first may have missed: the
				// agent's hiccup fails no cycle whose sample was killed.
				r.Log.Warn("killing the sample again", "cycle", c.ID, "err", err)
			}
			if killedAt.IsZero() {
				killedAt = now
			}
			ex.TimedOut, ex.Killed = true, true
			wait = 5 * time.Millisecond
			deadline = now.Add(min(killRetry, r.killWait()/4)) // only the exit is awaited now, and the kill tried again
			continue
		}
		if now.Sub(lastStream) >= r.stream() {
			lastStream = now
			if err := spool.pull(ctx, g, false); err != nil {
				return c, err
			}
		}
		readCancel := now.Sub(lastCancelRead) >= r.cancelRecheck()
		select {
		case <-rung:
			rung, readCancel = r.Cancels.Rung(), true
		default:
		}
		if readCancel {
			lastCancelRead = now
			cur, err := r.Get(c.ID)
			if err != nil {
				return c, err
			}
			if cur.Cancel {
				cancelled = true
				if err := r.kill(ctx, g, c); err != nil {
					return c, err
				}
				ex.Killed = true
				code := 137
				ex.ExitCode = &code
				break
			}
		}
		if err := guestagent.Pause(ctx, min(wait, time.Until(deadline)+time.Millisecond)); err != nil {
			return c, err
		}
		if !launcherEnded || !killedAt.IsZero() {
			wait = min(2*wait, r.poll())
		}
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
	if c.Tracer != "" {
		if err := r.checkTrace(ctx, c, g, ex, spool.stream(ArtifactTrace)); err != nil {
			return c, fmt.Errorf("checking the trace: %w", err)
		}
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
	if spool.low != nil {
		return c, fmt.Errorf("the sample's %s not stored, its run is recorded in %s: %w", strings.Join(ex.NotStored, ", "), ex.ID, spool.low)
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
		if err := guestagent.Pause(ctx, 200*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// lingering tells whether anything the sample started still runs in its
// cgroup (sampleCgroup) once the launcher ended. A guest without the
// cgroup (no cgroup v2 in its kernel) tells nothing: false, the launcher's
// end is the sample's. The events file is the kernel's, but root in the
// guest may mount something over it: a cgroup that claims to be populated
// holds the cycle until its timeout and the kills' KillWait after it, then
// the cycle goes on, survived-kill, as for a sample its kills missed
// (TestASampleThatOutlivesItsKill); one that claims to be empty ends it as
// a sample that moved itself out of the cgroup would.
func lingering(ctx context.Context, g Guest, c *records.Cycle) (bool, error) {
	b, err := g.ReadFileAt(ctx, sampleCgroup(c)+"/cgroup.events", 0, 256)
	if err != nil {
		if strings.Contains(err.Error(), "No such file or directory") {
			return false, nil
		}
		return false, fmt.Errorf("reading the sample's cgroup: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, _ := strings.Cut(line, " "); k == "populated" {
			return v == "1", nil
		}
	}
	return false, nil
}

// killRetry is how often a sample that has not ended since its kill is
// killed again (a quarter of Runner.KillWait if that is less): a child it
// forked after a kill's walk of its tree escaped that kill.
const killRetry = 5 * time.Second

func (r *Runner) killWait() time.Duration { return orDur(r.KillWait, guestagent.Grace) }

func execSummary(ex *records.ExecutionSnapshot) string {
	switch {
	case ex.TimedOut && ex.Running:
		return "timed out after " + ex.Duration.D().Round(time.Millisecond).String() + "; killed, and still running"
	case ex.TimedOut:
		return "timed out after " + ex.Duration.D().Round(time.Millisecond).String() + "; killed"
	case ex.Running:
		return "window ended; the sample keeps running"
	case ex.ExitCode != nil:
		return "exited " + strconv.Itoa(*ex.ExitCode)
	}
	return "exited"
}

func (r *Runner) kill(ctx context.Context, g Guest, c *records.Cycle) error {
	pid := c.GuestPID
	res, err := g.Run(ctx, killArgv(pid, spared(c.Tracer), sampleCgroup(c))...)
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
