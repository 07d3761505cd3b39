package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/talkbox-sandbox/talkbox/internal/blobshare"
	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/files"
	"github.com/talkbox-sandbox/talkbox/internal/leasereport"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/cycle"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// drive are the flags of the commands that drive cycles.
type drive struct {
	Metrics  string `name:"metrics" type:"path" placeholder:"FILE" help:"Write Prometheus textfile metrics to FILE when done (for node_exporter's textfile collector)."`
	ToolsDir string `name:"tools-dir" type:"path" placeholder:"DIR" help:"Where tb-lease, tb-capture, tb-parse and tb-allow are (default: tb-run's directory, then $$PATH)."`
	Lab      string `name:"lab" default:"default" help:"Lab instance of tb-capture and tb-allow."`
}

// runner opens the state and makes the runner of the tools; done writes
// the metrics file, if asked for, once the command is over.
func (d drive) runner(env *cli.Env) (r *cycle.Runner, done func(), err error) {
	return d.hostRunner(env, "")
}

// hostRunner is runner pinned to a fleet host (none: "").
func (d drive) hostRunner(env *cli.Env, host string) (r *cycle.Runner, done func(), err error) {
	// A cycle makes ~30 writes; synced one by one they cost ~0.3 s of a
	// warm cycle here. A killed process loses none of them (the page cache
	// survives it); Drive syncs where a power cut would matter.
	st, err := env.OpenState(state.WithDurability(state.SyncOnFlush))
	if err != nil {
		return nil, nil, err
	}
	dir := d.ToolsDir
	if dir == "" {
		if exe, err := os.Executable(); err == nil {
			dir = filepath.Dir(exe)
		}
	}
	done = func() {
		if d.Metrics == "" {
			return
		}
		if err := cycle.WriteMetrics(st, d.Metrics); err != nil {
			env.Log.Warn("writing metrics", "file", d.Metrics, "err", err)
		}
	}
	return cycle.NewRunner(st, env.Log, dir, d.Lab, host), done, nil
}

// ended turns a cycle's end into the command's exit status.
func ended(c *records.Cycle) error {
	switch c.State {
	case records.CycleFailed:
		return fault.Failure(fmt.Errorf("cycle %s failed: %s", c.ID, c.Error))
	case records.CycleCancelled:
		return fault.Failure(fmt.Errorf("cycle %s was cancelled", c.ID))
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

// printCycle prints a cycle, then its execution and analysis if it has
// them.
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

type cycleCmd struct {
	drive
	Plan       string            `name:"plan" placeholder:"ID" help:"Plan to run (default: the lease's, or a plan record on stdin)."`
	Lease      string            `name:"lease" placeholder:"ID" help:"Lease to run on (default: a lease or capture record on stdin; none: acquire one with tb-lease)."`
	Args       []string          `name:"arg" sep:"none" help:"Argument for the sample (repeatable; default: the plan's)."`
	Env        map[string]string `name:"env" placeholder:"KEY=VALUE" help:"Environment variable for the sample (repeatable; default: the plan's)."`
	Workdir    string            `name:"workdir" placeholder:"DIR" help:"Working directory in the guest (default: the plan's, else the cycle's directory)."`
	Timeout    *time.Duration    `name:"timeout" help:"Kill the sample after this long (default: the plan's execution timeout)."`
	Detach     *bool             `name:"detach" negatable:"" help:"Leave the sample running across cycles; each cycle observes it for --window."`
	Window     *time.Duration    `name:"window" help:"Observation window of a detached cycle (default: the plan's)."`
	Post       []string          `name:"post" placeholder:"STEP" help:"Post-processing steps: dump, rotate, parse, promote (default: rotate,parse, plus promote if the plan promotes, plus dump first if its instrumentation has memory)."`
	NoPost     bool              `name:"no-post" help:"No post-processing (no capture needed)."`
	FreshLease bool              `name:"fresh-lease" help:"Without --lease: boot a new lease instead of reusing an idle one."`
	CreateOnly bool              `name:"create-only" help:"Only store the cycle as pending and print it; 'tb-run resume' runs it."`
}

// Run creates a cycle and drives it to its end, printing the cycle, its
// execution and its analysis.
func (c *cycleCmd) Run(env *cli.Env) error {
	req := cycle.Request{Plan: c.Plan, Lease: c.Lease, Args: c.Args, Env: c.Env, Workdir: c.Workdir,
		Timeout: c.Timeout, Detach: c.Detach, Window: c.Window, Post: c.Post, FreshLease: c.FreshLease}
	if c.NoPost {
		req.Post = []string{}
	}
	r, done, err := c.runner(env)
	if err != nil {
		return err
	}
	defer done()
	if c.Lease == "" && c.Plan == "" && env.StdinPiped() {
		if err := fromStdin(env.Stdin, &req, env.Log); err != nil {
			return err
		}
	}
	cy, err := r.Create(env.Ctx, req)
	if err != nil {
		return err
	}
	if c.CreateOnly {
		return printRecords(env.Stdout, cy)
	}
	cy, err = r.Drive(env.Ctx, cy.ID)
	if cy != nil {
		if perr := printCycle(r.St, env.Stdout, cy); perr != nil && err == nil {
			err = perr
		}
	}
	if err != nil {
		return err
	}
	return ended(cy)
}

// fromStdin takes the lease and plan of a pipeline's records (the first
// of each: a lease, a capture or a plan); the records it does not use it
// counts, by kind, in log.
func fromStdin(in io.Reader, req *cycle.Request, log *slog.Logger) error {
	rd := records.NewReader(in, "stdin")
	passed := records.PassedOver{}
	defer passed.Log(log)
	for {
		rec, err := rd.Record()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		h := rec.Header()
		switch v := rec.(type) {
		case *records.Plan:
			if req.Plan == "" {
				req.Plan = v.ID
				continue
			}
		case *records.Capture:
			if req.Lease == "" && v.Lease != "" {
				req.Lease = v.Lease
				continue
			}
		default:
			if h.Kind == records.KindLease && req.Lease == "" {
				req.Lease = h.ID
				continue
			}
		}
		passed.Add(h.Kind)
	}
}

type resumeCmd struct {
	drive
	IDs []string `arg:"" optional:"" name:"cycle" help:"Cycles to resume (default: every one that has not ended)."`
}

// Run drives every cycle that has not ended (or the ones named) from its
// last state. Cycles another tb-run drives are skipped.
func (c *resumeCmd) Run(env *cli.Env) error {
	r, done, err := c.runner(env)
	if err != nil {
		return err
	}
	defer done()
	ids := c.IDs
	if len(ids) == 0 {
		if ids, err = r.St.List(records.KindCycle); err != nil {
			return err
		}
	}
	var batch fault.Batch
	for _, id := range ids {
		cy, err := r.Get(id)
		if err != nil {
			env.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		if records.CycleTerminal(cy.State) {
			if len(c.IDs) > 0 {
				env.Log.Info("cycle already ended", "cycle", id, "state", cy.State)
			}
			continue
		}
		env.Log.Info("resuming", "cycle", id, "state", cy.State)
		cy, err = r.Drive(env.Ctx, id)
		if errors.Is(err, cycle.ErrBusy) {
			env.Log.Info("skipped: in use by another tb-run", "cycle", id, "why", err)
			continue
		}
		if cy != nil {
			if perr := printCycle(r.St, env.Stdout, cy); perr != nil {
				return perr
			}
		}
		if err == nil {
			err = ended(cy)
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

type submitCmd struct {
	FreshLease bool   `name:"fresh-lease" help:"Boot a new lease for each cycle instead of reusing an idle one."`
	Host       string `name:"host" placeholder:"NAME" help:"Pin each cycle to this fleet host: only the worker of --host NAME takes it (explicit placement)."`
}

// Run stores a pending cycle, with no lease, for each runnable plan read
// from stdin (plan records, as tb-plan prints them); a plan that is not
// runnable is reported and skipped.
func (c *submitCmd) Run(env *cli.Env) (err error) {
	if !env.StdinPiped() {
		return fault.Usage(errors.New("submit reads plan records on stdin (tb-plan samples/ | tb-run submit)"))
	}
	st, err := env.OpenState(state.WithDurability(state.SyncOnFlush))
	if err != nil {
		return err
	}
	defer func() {
		// The cycles are stored once they are flushed: a failed flush is
		// a failed submit.
		if ferr := st.Flush(); err == nil {
			err = ferr
		}
	}()
	if c.Host != "" {
		// A host whose worker has not started yet is a fine pin; a
		// misspelt one leaves the cycles waiting, so say so.
		ws, err := state.FindBy[records.Worker](st, records.KindWorker, records.KeyHost, c.Host, nil)
		if err != nil {
			return err
		}
		if len(ws) == 0 {
			env.Warnf("--host %s: no worker has ever run on a host of that name; the cycles wait for one", c.Host)
		}
	}
	r := cycle.NewRunner(st, env.Log, "", "", "")
	rd := records.NewReader(env.Stdin, "stdin")
	var batch fault.Batch
	passed := records.PassedOver{}
	defer passed.Log(env.Log)
	for {
		l, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// The input itself failed (a line too long to read on).
			env.Warnf("%v", err)
			batch.Add(err)
			break
		}
		rec, err := records.Decode(l.Data)
		if err != nil {
			err = l.Err(err)
			env.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		p, ok := rec.(*records.Plan)
		if !ok {
			// Samples and the pipeline's other records.
			passed.Add(rec.Header().Kind)
			continue
		}
		cy, err := r.Create(env.Ctx, cycle.Request{Plan: p.ID, FreshLease: c.FreshLease, PinnedTo: c.Host})
		if err != nil {
			err = fmt.Errorf("stdin:%d: %w", l.No, err)
			env.Warnf("%v", err)
			batch.Add(err)
			continue
		}
		if err := printRecords(env.Stdout, cy); err != nil {
			return err
		}
	}
	return batch.Err()
}

type workerCmd struct {
	drive
	Host      string        `name:"host" required:"" env:"TB_HOST" help:"This host's name in the fleet: the tb-lease host its leases are placed on (unique in the fleet)."`
	Slots     int           `name:"slots" default:"1" help:"Cycles driven at once: this host's capacity."`
	Heartbeat time.Duration `name:"heartbeat" default:"5s" help:"How often the worker says it is alive."`
	DeadAfter time.Duration `name:"dead-after" default:"30s" help:"How long a host's workers may be silent before its cycles are replaced on other hosts."`
	UntilIdle bool          `name:"until-idle" help:"Exit once nothing is left to drive (default: run until SIGTERM)."`
	Serve     string        `name:"serve-blobs" placeholder:"ADDR" help:"Serve this host's blobs to the fleet's other hosts on ADDR (host:port on the fleet's private network; each request needs the fleet's token, kept in its database), and fetch from theirs what this host lacks."`
	Advertise string        `name:"advertise" placeholder:"URL" help:"The URL other hosts reach --serve-blobs at (default http://ADDR)."`
	ServeAny  bool          `name:"serve-blobs-any" help:"Let --serve-blobs listen on every address of the host (:PORT, 0.0.0.0, ::): refused otherwise."`
}

// Run drives the fleet's cycles that fit this host and prints each as it
// ends.
func (c *workerCmd) Run(env *cli.Env) error {
	if c.Slots < 1 {
		return fault.Usage(fmt.Errorf("--slots %d: at least 1", c.Slots))
	}
	if c.DeadAfter < 2*c.Heartbeat {
		return fault.Usage(fmt.Errorf("--dead-after %s must be at least twice --heartbeat %s", c.DeadAfter, c.Heartbeat))
	}
	if c.Serve != "" {
		if err := blobshare.CheckAddr(c.Serve, c.ServeAny); err != nil {
			return err
		}
	}
	r, done, err := c.hostRunner(env, c.Host)
	if err != nil {
		return err
	}
	defer done()
	var blobURL string
	if c.Serve != "" {
		ln, err := net.Listen("tcp", c.Serve)
		if err != nil {
			return fault.Unavailable(fmt.Errorf("--serve-blobs %s: %w", c.Serve, err))
		}
		srv := &http.Server{Handler: blobshare.Handler(r.St), ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		blobURL = cmp.Or(c.Advertise, "http://"+ln.Addr().String())
	}
	var batch fault.Batch
	w := &cycle.Worker{BlobURL: blobURL, R: r, Host: c.Host, Lab: c.Lab, Slots: c.Slots, Heartbeat: c.Heartbeat, DeadAfter: c.DeadAfter,
		UntilIdle: c.UntilIdle,
		Ready:     func(ctx context.Context) error { return capture.LabContained(ctx, r.St, c.Lab) },
		Ended: func(cy *records.Cycle, err error) {
			if cy != nil {
				if perr := printCycle(r.St, env.Stdout, cy); perr != nil {
					env.Warnf("%v", perr)
				}
				if err == nil {
					err = ended(cy)
				}
			}
			switch {
			case err == nil || env.Ctx.Err() != nil:
			case fault.Code(err) == fault.ExitTempFail:
				// The cycle stays in its state; the worker takes it
				// up again (the store or the hypervisor was away).
				env.Log.Warn("cycle left for a retry", "err", err)
			default:
				env.Warnf("%v", err)
				batch.Add(err)
			}
		}}
	if err := w.Run(env.Ctx); err != nil {
		return err
	}
	return batch.Err()
}

type watchCmd struct {
	IDs []string `arg:"" optional:"" name:"cycle" help:"Cycles to follow from their start until they end (default: every cycle's new events, until interrupted)."`
	All bool     `name:"all" help:"Without cycles: print every event from the start of the journal first."`
}

func (c *watchCmd) Run(env *cli.Env) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	for _, id := range c.IDs {
		if records.KindOf(id) != records.KindCycle || !st.Exists(id) {
			return fault.Usage(fmt.Errorf("cycle %s: not found", id))
		}
	}
	err = cycle.Watch(env.Ctx, st, env.Stdout, c.IDs, c.All)
	if env.Ctx.Err() != nil {
		return nil
	}
	return err
}

type cancelCmd struct {
	drive
	IDs    []string `arg:"" name:"cycle" help:"Cycles to cancel."`
	NoWait bool     `name:"no-wait" help:"Return once the running tb-run was told, without waiting for the cycle to end."`
}

// Run cancels the cycles and, unless --no-wait, waits until they ended;
// then it prints them.
func (c *cancelCmd) Run(env *cli.Env) error {
	r, done, err := c.runner(env)
	if err != nil {
		return err
	}
	defer done()
	waitFor, err := r.Cancel(env.Ctx, c.IDs, env.Warnf)
	if len(waitFor) > 0 && !c.NoWait {
		if werr := cycle.Watch(env.Ctx, r.St, io.Discard, waitFor, false); werr != nil {
			return werr
		}
	}
	for _, id := range c.IDs {
		if cy, gerr := r.Get(id); gerr == nil {
			if perr := printRecords(env.Stdout, cy); perr != nil {
				return perr
			}
		}
	}
	return err
}

type reportCmd struct {
	IDs    []string `arg:"" optional:"" name:"cycle" help:"Cycles to report on (html: one)."`
	Lease  string   `name:"lease" xor:"target" placeholder:"ID" help:"Report on a lease: all its cycles."`
	Sample string   `name:"sample" xor:"target" placeholder:"ID|SHA256" help:"Report on a sample: all its cycles, on every lease."`
	Format string   `name:"format" enum:"text,json,html,misp,stix" default:"text" help:"text (for a person), json (JSON lines), html (one self-contained page), misp (one MISP event, in MISP's JSON) or stix (one STIX 2.1 bundle)."`
	Output string   `name:"output" short:"o" type:"path" placeholder:"FILE" help:"Write the report to FILE (atomically) instead of stdout."`
}

// Run reports on cycles, a lease or a sample. Text is a short summary of
// each cycle for a person (what ran, was seen, promoted and why, refused,
// what next); json is the same facts as cycle-report lines for cycles, or
// the report-* lines of a lease's or sample's report; html is one
// self-contained page (internal/leasereport).
func (c *reportCmd) Run(env *cli.Env) error {
	target := leasereport.Target{Lease: c.Lease, Sample: c.Sample}
	switch {
	case target.Lease == "" && target.Sample == "" && len(c.IDs) == 0:
		return fault.Usage(errors.New("report on what? give cycles, --lease or --sample"))
	case (target.Lease != "" || target.Sample != "") && len(c.IDs) > 0:
		return fault.Usage(errors.New("give cycles, or --lease, or --sample"))
	case c.Format != "text" && c.Format != "json" && len(c.IDs) > 1:
		return fault.Usage(fmt.Errorf("--format %s is one report of one cycle, lease or sample", c.Format))
	case len(c.IDs) == 1:
		target.Cycle = c.IDs[0]
	}
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	write := func(fn func(w io.Writer) error) error {
		if c.Output == "" {
			return fn(env.Stdout)
		}
		if err := files.WriteAtomicFunc(c.Output, 0o644, fn); err != nil {
			return fmt.Errorf("-o %s: %w", c.Output, err)
		}
		return nil
	}
	if c.Format != "text" && (c.Format != "json" || len(c.IDs) == 0) {
		r, err := leasereport.Collect(env.Ctx, st, target)
		if err != nil {
			return err
		}
		for _, n := range r.Notes {
			env.Log.Warn("report: " + n)
		}
		switch c.Format {
		case "html":
			return write(func(w io.Writer) error { return leasereport.WriteHTML(w, r) })
		case "misp":
			return write(func(w io.Writer) error { return leasereport.WriteMISP(w, r) })
		case "stix":
			return write(func(w io.Writer) error { return leasereport.WriteSTIX(w, r) })
		}
		return write(func(w io.Writer) error { return leasereport.WriteJSON(w, r) })
	}
	ids := c.IDs
	if len(ids) == 0 {
		if ids, err = leasereport.CycleIDs(st, target); err != nil {
			return err
		}
	}
	return write(func(out io.Writer) error {
		w := records.NewWriter(out)
		var batch fault.Batch
		for _, id := range ids {
			r, err := cycle.Summarise(env.Ctx, st, id)
			if err == nil && c.Format == "json" {
				err = w.Line(records.LineCycleReport, r)
			} else if err == nil {
				// A write error is no cycle's: the rest cannot be written either.
				if err := r.Text(out); err != nil {
					return err
				}
			}
			if err != nil {
				env.Warnf("%v", err)
				batch.Add(err)
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		return batch.Err()
	})
}

type metricsCmd struct {
	File string `arg:"" optional:"" default:"-" name:"file" help:"Textfile to write ('-': stdout)."`
}

// Run writes the metrics file (or stdout for "-").
func (c *metricsCmd) Run(env *cli.Env) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	if c.File != "-" {
		return cycle.WriteMetrics(st, c.File)
	}
	tmp, err := os.MkdirTemp("", "tb-run-metrics")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	p := filepath.Join(tmp, "m.prom")
	if err := cycle.WriteMetrics(st, p); err != nil {
		return err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	_, err = env.Stdout.Write(b)
	return err
}
