// Command tb-run runs observation cycles of a sample on a live lease.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

type tbRun struct {
	cli.Globals
	Cycle   cycleCmd    `cmd:"" default:"withargs" help:"Run one cycle of a plan on a lease (default command)."`
	Resume  resumeCmd   `cmd:"" help:"Continue every unfinished cycle from its last state."`
	Submit  submitCmd   `cmd:"" help:"Store a pending cycle for each plan on stdin, for a fleet's workers."`
	Worker  workerCmd   `cmd:"" help:"Drive the fleet's cycles that fit this host, until stopped."`
	List    cli.ListCmd `cmd:"" help:"List cycles, executions and analyses."`
	Get     cli.GetCmd  `cmd:"" help:"Print stored records by ID."`
	Watch   watchCmd    `cmd:"" help:"Follow cycle events as JSON lines."`
	Cancel  cancelCmd   `cmd:"" help:"Cancel cycles."`
	Report  reportCmd   `cmd:"" help:"Report on cycles, a lease or a sample: text for a person, JSON lines, or one self-contained HTML page."`
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
			"submit": {
				"tb-run submit < plans.jsonl",
				`tb-run --state "$TB_FLEET" submit --fresh-lease < plans.jsonl`,
			},
			"worker": {
				"tb-run worker --host sandbox-01 --slots 2",
				"tb-run worker --host sandbox-02 --until-idle",
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
			"report": {
				`tb-run report "$C"`,
				`tb-run report --format html --lease "$L" -o lease.html`,
			},
			"metrics": {
				"tb-run metrics",
				"tb-run metrics /var/lib/node_exporter/tb-run.prom",
			},
		},
	}
}
