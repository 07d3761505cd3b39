// Command tb-parse extracts observables from pcaps, Zeek logs and Suricata EVE.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

type tbParse struct {
	cli.Globals
	Parse cli.Pending `cmd:"" default:"withargs" help:"Extract observables from artifacts or files (default command)."`
	List  cli.ListCmd `cmd:"" help:"List observables."`
	Get   cli.GetCmd  `cmd:"" help:"Print stored records by ID."`
}

func main() {
	os.Exit(cli.Run(cli.Tool{
		Name:        "tb-parse",
		Description: "Streaming extraction of observables from pcaps, Zeek logs and Suricata EVE.",
		Kinds:       "observable",
	}, &tbParse{}, os.Args[1:]))
}
