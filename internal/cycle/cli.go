package cycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Options are the flags shared by the commands that drive cycles.
type Options struct {
	Metrics  string // Prometheus textfile written after the command
	ToolsDir string // where tb-lease, tb-capture, tb-parse, tb-allow are
	Lab      string
}

func newRunner(env *cli.Env, o Options) (*Runner, *state.Store, error) {
	// A cycle makes ~30 writes; synced one by one they cost ~0.3 s of a
	// warm cycle here. A killed process loses none of them (the page cache
	// survives it); Drive syncs where a power cut would matter.
	st, err := env.OpenState(state.WithDurability(state.SyncOnFlush))
	if err != nil {
		return nil, nil, err
	}
	dir := o.ToolsDir
	if dir == "" {
		if exe, err := os.Executable(); err == nil {
			dir = filepath.Dir(exe)
		}
	}
	tools := &Tools{Dir: dir, St: st, Log: env.Log, Lab: o.Lab}
	host, _ := os.Hostname()
	return &Runner{St: st, Log: env.Log, Connect: LibvirtGuest, Leaser: tools, Post: tools, Host: host, PID: os.Getpid()}, st, nil
}

func writeMetrics(env *cli.Env, st *state.Store, o Options) {
	if o.Metrics == "" {
		return
	}
	if err := WriteMetrics(st, o.Metrics); err != nil {
		env.Log.Warn("writing metrics", "file", o.Metrics, "err", err)
	}
}

// RunRequest is "tb-run [cycle]".
type RunRequest struct {
	Request
	FromStdin  bool
	CreateOnly bool
}

// RunCmd creates a cycle and drives it to its end, printing the cycle, its
// execution and its analysis.
func RunCmd(env *cli.Env, o Options, req RunRequest) error {
	r, st, err := newRunner(env, o)
	if err != nil {
		return err
	}
	defer writeMetrics(env, st, o)
	if req.FromStdin {
		if err := fromStdin(env.Stdin, &req.Request); err != nil {
			return err
		}
	}
	c, err := r.Create(env.Ctx, req.Request)
	if err != nil {
		return err
	}
	if req.CreateOnly {
		return printRecords(env.Stdout, c)
	}
	c, err = r.Drive(env.Ctx, c.ID)
	if c != nil {
		if perr := printCycle(st, env.Stdout, c); perr != nil && err == nil {
			err = perr
		}
	}
	if err != nil {
		return err
	}
	return ended(c)
}

// ended turns a cycle's end into the command's exit status.
func ended(c *records.Cycle) error {
	switch c.State {
	case records.CycleFailed:
		return cli.Failure(fmt.Errorf("cycle %s failed: %s", c.ID, c.Error))
	case records.CycleCancelled:
		return cli.Failure(fmt.Errorf("cycle %s was cancelled", c.ID))
	}
	return nil
}

// fromStdin takes the lease and plan of a pipeline's records (the first
// of each: a lease, a capture or a plan).
func fromStdin(in io.Reader, req *Request) error {
	rd := records.NewReader(in, "stdin")
	for {
		rec, err := rd.Record()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		switch v := rec.(type) {
		case *records.Plan:
			if req.Plan == "" {
				req.Plan = v.ID
			}
		case *records.Capture:
			if req.Lease == "" {
				req.Lease = v.Lease
			}
		default:
			if rec.Header().Kind == records.KindLease && req.Lease == "" {
				req.Lease = rec.Header().ID
			}
		}
	}
	return nil
}

func printRecords(w io.Writer, recs ...records.Record) error {
	rw := records.NewWriter(w)
	for _, r := range recs {
		if err := rw.Write(r); err != nil {
			return err
		}
	}
	return rw.Flush()
}

func printCycle(st *state.Store, w io.Writer, c *records.Cycle) error {
	recs := []records.Record{c}
	if c.Execution != "" {
		var ex records.ExecutionSnapshot
		if st.Get(c.Execution, &ex) == nil {
			recs = append(recs, &ex)
		}
	}
	if c.Analysis != "" {
		var a records.RunAnalysis
		if st.Get(c.Analysis, &a) == nil {
			recs = append(recs, &a)
		}
	}
	return printRecords(w, recs...)
}

// ResumeCmd drives every cycle that has not ended (or the ones named) from
// its last state. Cycles another tb-run drives are skipped.
func ResumeCmd(env *cli.Env, o Options, only []string) error {
	r, st, err := newRunner(env, o)
	if err != nil {
		return err
	}
	defer writeMetrics(env, st, o)
	ids := only
	if len(ids) == 0 {
		if ids, err = st.List(records.KindCycle); err != nil {
			return err
		}
	}
	var batch cli.Batch
	for _, id := range ids {
		c, err := r.get(id)
		if err != nil {
			env.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		if records.CycleTerminal(c.State) {
			if len(only) > 0 {
				env.Log.Info("cycle already ended", "cycle", id, "state", c.State)
			}
			continue
		}
		env.Log.Info("resuming", "cycle", id, "state", c.State)
		c, err = r.Drive(env.Ctx, id)
		if errors.Is(err, ErrBusy) {
			env.Log.Info("skipped: in use by another tb-run", "cycle", id, "why", err)
			continue
		}
		if c != nil {
			if perr := printCycle(st, env.Stdout, c); perr != nil {
				return perr
			}
		}
		if err == nil {
			err = ended(c)
		}
		if err != nil {
			if env.Ctx.Err() != nil {
				return err
			}
			env.Warnf("%v", err)
			batch.Add(err)
		}
	}
	return batch.Err()
}

// CancelCmd cancels cycles: one no process drives ends at once (its sample
// killed if it runs); one a tb-run drives is flagged, and that tb-run
// kills the sample and ends it. Unless noWait, it returns once they ended.
func CancelCmd(env *cli.Env, o Options, ids []string, noWait bool) error {
	r, st, err := newRunner(env, o)
	if err != nil {
		return err
	}
	defer writeMetrics(env, st, o)
	var batch cli.Batch
	var waitFor []string
	for _, id := range ids {
		if err := r.cancel(env.Ctx, id, &waitFor); err != nil {
			env.Warnf("%v", err)
			batch.Add(err)
		}
	}
	if len(waitFor) > 0 && !noWait {
		if err := Watch(env.Ctx, st, io.Discard, waitFor, false); err != nil {
			return err
		}
	}
	for _, id := range ids {
		if c, err := r.get(id); err == nil {
			if err := printRecords(env.Stdout, c); err != nil {
				return err
			}
		}
	}
	return batch.Err()
}

func (r *Runner) cancel(ctx context.Context, id string, waitFor *[]string) error {
	c, err := r.get(id)
	if err != nil {
		return err
	}
	if records.CycleTerminal(c.State) {
		return cli.Failure(fmt.Errorf("cycle %s already ended (%s)", id, c.State))
	}
	if c, err = r.update(ctx, id, func(n *records.Cycle) error { n.Cancel = true; return nil }); err != nil {
		return err
	}
	unlock, ok, err := r.St.TryLock(ctx, cycleLock(id))
	if err != nil {
		return err
	}
	if !ok {
		*waitFor = append(*waitFor, id)
		return nil
	}
	defer unlock()
	detail := "cancelled"
	if c.State == records.CycleExecuting && c.GuestPID != 0 && !c.Detach {
		g, err := r.connect(ctx, c)
		if err == nil {
			err = r.kill(ctx, g, c.GuestPID)
			g.Close()
		}
		if err != nil {
			return fmt.Errorf("cycle %s: %w (not cancelled)", id, err)
		}
		detail = "cancelled; the sample was killed"
	}
	_, err = r.transition(ctx, c, records.CycleCancelled, detail, nil)
	return err
}

// WatchCmd is "tb-run watch".
func WatchCmd(env *cli.Env, ids []string, all bool) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	for _, id := range ids {
		if records.KindOf(id) != records.KindCycle || !st.Exists(id) {
			return cli.Usage(fmt.Errorf("cycle %s: not found", id))
		}
	}
	err = Watch(env.Ctx, st, env.Stdout, ids, all)
	if env.Ctx.Err() != nil {
		return nil
	}
	return err
}

// MetricsCmd writes the metrics file (or stdout for "-").
func MetricsCmd(env *cli.Env, path string) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	if path != "-" {
		return WriteMetrics(st, path)
	}
	tmp, err := os.MkdirTemp("", "tb-run-metrics")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	p := filepath.Join(tmp, "m.prom")
	if err := WriteMetrics(st, p); err != nil {
		return err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	_, err = env.Stdout.Write(b)
	return err
}
