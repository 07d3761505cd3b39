// Command tb-allow classifies observables, keeps versioned allow-list
// revisions and enforces them live.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

type tbAllow struct {
	cli.Globals
	Promote   cli.Pending `cmd:"" help:"Classify observables and write a new revision."`
	Apply     cli.Pending `cmd:"" help:"Push the active revision to the firewall and DNS sinkhole."`
	List      cli.ListCmd `cmd:"" help:"List allow-list entries and revisions."`
	Get       cli.GetCmd  `cmd:"" help:"Print stored records by ID."`
	Show      cli.Pending `cmd:"" help:"Show one revision."`
	Revisions cli.Pending `cmd:"" help:"List revisions of a scope."`
	Diff      cli.Pending `cmd:"" help:"Difference between two revisions."`
	Rollback  cli.Pending `cmd:"" help:"Write a new revision restoring an earlier one."`
	Approve   cli.Pending `cmd:"" help:"Approve pending entries."`
	Reject    cli.Pending `cmd:"" help:"Reject pending entries."`
	Revoke    cli.Pending `cmd:"" help:"Revoke active entries."`
	Expire    cli.Pending `cmd:"" help:"Expire entries past their time."`
	Export    cli.Pending `cmd:"" help:"Export as JSON, plain list, nftables, Zeek Intel, Suricata or STIX."`
}

func main() {
	os.Exit(cli.Run(cli.Tool{
		Name:        "tb-allow",
		Description: "C2 classification, versioned allow-list revisions, live enforcement.",
		Kinds:       "allow,revision",
	}, &tbAllow{}, os.Args[1:]))
}
