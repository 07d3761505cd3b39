// Command tb-run runs observation cycles of a sample on a live lease.
package main

import (
	"os"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/cycle"
)

// drive are the flags of the commands that drive cycles.
type drive struct {
	Metrics  string `name:"metrics" type:"path" placeholder:"FILE" help:"Write Prometheus textfile metrics to FILE when done (for node_exporter's textfile collector)."`
	ToolsDir string `name:"tools-dir" type:"path" placeholder:"DIR" help:"Where tb-lease, tb-capture, tb-parse and tb-allow are (default: tb-run's directory, then $$PATH)."`
	Lab      string `name:"lab" default:"default" help:"Lab instance of tb-capture and tb-allow."`
}

func (d drive) opts() cycle.Options {
	return cycle.Options{Metrics: d.Metrics, ToolsDir: d.ToolsDir, Lab: d.Lab}
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

func (c *cycleCmd) Run(env *cli.Env) error {
	fromStdin := false
	if c.Lease == "" && c.Plan == "" {
		if st, err := os.Stdin.Stat(); err == nil && st.Mode()&os.ModeCharDevice == 0 {
			fromStdin = true
		}
	}
	req := cycle.Request{Plan: c.Plan, Lease: c.Lease, Args: c.Args, Env: c.Env, Workdir: c.Workdir,
		Timeout: c.Timeout, Detach: c.Detach, Window: c.Window, Post: c.Post, FreshLease: c.FreshLease}
	if c.NoPost {
		req.Post = []string{}
	}
	return cycle.RunCmd(env, c.opts(), cycle.RunRequest{Request: req, FromStdin: fromStdin, CreateOnly: c.CreateOnly})
}

type resumeCmd struct {
	drive
	IDs []string `arg:"" optional:"" name:"cycle" help:"Cycles to resume (default: every one that has not ended)."`
}

func (c *resumeCmd) Run(env *cli.Env) error { return cycle.ResumeCmd(env, c.opts(), c.IDs) }

type watchCmd struct {
	IDs []string `arg:"" optional:"" name:"cycle" help:"Cycles to follow from their start until they end (default: every cycle's new events, until interrupted)."`
	All bool     `name:"all" help:"Without cycles: print every event from the start of the journal first."`
}

func (c *watchCmd) Run(env *cli.Env) error { return cycle.WatchCmd(env, c.IDs, c.All) }

type cancelCmd struct {
	drive
	IDs    []string `arg:"" name:"cycle" help:"Cycles to cancel."`
	NoWait bool     `name:"no-wait" help:"Return once the running tb-run was told, without waiting for the cycle to end."`
}

func (c *cancelCmd) Run(env *cli.Env) error { return cycle.CancelCmd(env, c.opts(), c.IDs, c.NoWait) }

type reportCmd struct {
	IDs    []string `arg:"" name:"cycle" help:"Cycles to summarise."`
	Format string   `name:"format" enum:"text,json" default:"text" help:"text (for a person) or json (one cycle-report line per cycle)."`
}

func (c *reportCmd) Run(env *cli.Env) error { return cycle.ReportCmd(env, c.IDs, c.Format) }

type metricsCmd struct {
	File string `arg:"" optional:"" default:"-" name:"file" help:"Textfile to write ('-': stdout)."`
}

func (c *metricsCmd) Run(env *cli.Env) error { return cycle.MetricsCmd(env, c.File) }

type tbRun struct {
	cli.Globals
	Cycle   cycleCmd    `cmd:"" default:"withargs" help:"Run one cycle of a plan on a lease (default command)."`
	Resume  resumeCmd   `cmd:"" help:"Continue every unfinished cycle from its last state."`
	List    cli.ListCmd `cmd:"" help:"List cycles, executions and analyses."`
	Get     cli.GetCmd  `cmd:"" help:"Print stored records by ID."`
	Watch   watchCmd    `cmd:"" help:"Follow cycle events as JSON lines."`
	Cancel  cancelCmd   `cmd:"" help:"Cancel cycles."`
	Report  reportCmd   `cmd:"" help:"Summarise cycles as text for a person: what ran, was seen, promoted, refused; what next (--format json for JSON lines)."`
	Metrics metricsCmd  `cmd:"" help:"Write Prometheus textfile metrics."`
}

func main() {
	os.Exit(cli.Run(tool(), &tbRun{}, os.Args[1:]))
}

// tool is a function, not a variable, so that main_test.go can check the
// examples without package state.
func tool() cli.Tool {
	return cli.Tool{
		Name:        "tb-run",
		Description: "Run observation cycles of a sample on a live lease.",
		Kinds:       "cycle,execution,analysis",
		Examples: map[string][]string{
			"": {
				`tb-run --lease "$L" --plan "$P"`,
				`tb-run report "$C"`,
			},
			"cycle": {
				`tb-run --lease "$L" --plan "$P"`,
				`tb-run --lease "$L" --detach --window 1h --metrics /var/lib/node_exporter/tb-run.prom`,
			},
			"resume": {
				"tb-run resume",
				`tb-run resume "$C"`,
			},
			"list": {"tb-run list --kind cycle --limit 10"},
			"get":  {`tb-run get "$C"`},
			"watch": {
				`tb-run watch "$C" | jq -r '[.at, .to, .detail] | @tsv'`,
				"tb-run watch --all",
			},
			"cancel": {
				`tb-run cancel "$C"`,
				`tb-run cancel --no-wait "$C"`,
			},
			"report": {`tb-run report "$C"`},
			"metrics": {
				"tb-run metrics",
				"tb-run metrics /var/lib/node_exporter/tb-run.prom",
			},
		},
	}
}
