// Command tb-capture owns the lab network, per-lease containment rules and
// packet capture.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

type tbCapture struct {
	cli.Globals
	Net struct {
		Up     cli.Pending `cmd:"" help:"Bring the lab network up (idempotent)."`
		Down   cli.Pending `cmd:"" help:"Remove exactly what 'net up' made."`
		Status cli.Pending `cmd:"" help:"Show the lab network."`
	} `cmd:"" help:"The lab network: bridge, sinkhole, nftables."`
	Start     cli.Pending `cmd:"" help:"Apply a lease's rules and start capture on its tap."`
	Rotate    cli.Pending `cmd:"" help:"Close the current capture file and register it as an artifact."`
	Stop      cli.Pending `cmd:"" help:"Stop capture and remove the lease's rules."`
	Reconcile cli.Pending `cmd:"" help:"Remove rules, sensors and namespaces whose lease is gone."`
	Status    cli.Pending `cmd:"" help:"What is applied per lease, with counters."`
	List      cli.ListCmd `cmd:"" help:"List captures and artifacts."`
	Get       cli.GetCmd  `cmd:"" help:"Print stored records by ID."`
}

func main() {
	os.Exit(cli.Run(cli.Tool{
		Name:        "tb-capture",
		Description: "Lab network, per-lease containment rules in nftables, and packet capture.",
		Kinds:       "capture,artifact",
	}, &tbCapture{}, os.Args[1:]))
}
