// Command tb-run runs observation cycles of a sample on a live lease.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

type tbRun struct {
	cli.Globals
	Cycle  cli.Pending `cmd:"" default:"withargs" help:"Run one cycle of a plan on a lease (default command)."`
	Resume cli.Pending `cmd:"" help:"Continue every unfinished cycle from its last state."`
	List   cli.ListCmd `cmd:"" help:"List cycles."`
	Get    cli.GetCmd  `cmd:"" help:"Print stored records by ID."`
	Watch  cli.Pending `cmd:"" help:"Follow cycle events as JSON lines."`
	Cancel cli.Pending `cmd:"" help:"Cancel a cycle."`
}

func main() {
	os.Exit(cli.Run(cli.Tool{
		Name:        "tb-run",
		Description: "Run observation cycles of a sample on a live lease.",
		Kinds:       "cycle,execution,analysis",
	}, &tbRun{}, os.Args[1:]))
}
