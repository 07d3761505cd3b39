// Command tb-lease owns long-lived sandbox VMs under libvirt: acquire, renew,
// release, snapshot and restore them, and place them over several hosts.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

type tbLease struct {
	cli.Globals
	Acquire cli.Pending `cmd:"" help:"Acquire a lease for a plan (reuses an idle matching lease)."`
	List    cli.ListCmd `cmd:"" help:"List leases."`
	Get     cli.GetCmd  `cmd:"" help:"Print stored records by ID."`
	Renew   cli.Pending `cmd:"" aliases:"extend-ttl" help:"Extend a lease's TTL."`
	Release cli.Pending `cmd:"" help:"Destroy a lease's domain and overlay."`
	Expire  cli.Pending `cmd:"" help:"Release leases past their TTL (dry run unless --apply)."`
	Reap    cli.Pending `cmd:"" help:"Reconcile libvirt with the state."`
	Heal    cli.Pending `cmd:"" help:"Restart or replace unhealthy leases."`
	Inspect struct {
		Host cli.Pending `cmd:"" help:"Acceleration, capacity and running leases of a host."`
	} `cmd:"" help:"Inspect hosts."`
	Snapshot  cli.Pending `cmd:"" help:"Save a lease's disk and memory."`
	Snapshots cli.Pending `cmd:"" help:"List snapshots with size and checksum."`
	Restore   cli.Pending `cmd:"" help:"Start a new lease from a snapshot, without a boot."`
}

func main() {
	os.Exit(cli.Run(cli.Tool{
		Name:        "tb-lease",
		Description: "Long-lived libvirt sandbox leases: acquire, health, TTL, snapshots, placement.",
		Kinds:       "lease",
	}, &tbLease{}, os.Args[1:]))
}
