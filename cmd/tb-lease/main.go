// Command tb-lease owns long-lived sandbox VMs under libvirt: acquire, renew,
// release, snapshot and restore them, and place them over several hosts.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

type tbLease struct {
	cli.Globals
	Acquire acquireCmd `cmd:"" help:"Acquire a lease for a plan (reuses an idle matching lease)."`
	List    listCmd    `cmd:"" help:"List leases."`
	Get     cli.GetCmd `cmd:"" help:"Print stored records by ID."`
	Renew   renewCmd   `cmd:"" aliases:"extend-ttl" help:"Extend a lease's TTL."`
	Release releaseCmd `cmd:"" help:"Destroy a lease's domain and overlay (or --keep it idle for reuse)."`
	Expire  expireCmd  `cmd:"" help:"Release leases past their TTL (dry run unless --apply)."`
	Reap    reapCmd    `cmd:"" help:"Reconcile libvirt with the state."`
	Heal    healCmd    `cmd:"" help:"Restart or replace unhealthy leases."`
	Exec    execCmd    `cmd:"" help:"Run a program in a lease's guest through its agent."`
	Inspect struct {
		Host inspectHostCmd `cmd:"" help:"Acceleration, capacity and running leases of a host."`
	} `cmd:"" help:"Inspect hosts."`
	Snapshot   snapshotCmd   `cmd:"" help:"Save a lease's disk and memory."`
	Snapshots  snapshotsCmd  `cmd:"" help:"List snapshots with size and checksum."`
	Dump       dumpCmd       `cmd:"" help:"Write a lease's guest memory to the blob store as an artifact (ELF core, zstd)."`
	SnapshotRm snapshotRmCmd `cmd:"" name:"snapshot-rm" help:"Delete snapshots."`
	Restore    restoreCmd    `cmd:"" help:"Start a new lease from a snapshot, without a boot."`
}

func main() {
	os.Exit(cli.Run(tool(), &tbLease{}, os.Args[1:]))
}

// tool is a function, not a variable, so that main_test.go can check the
// examples without package state.
func tool() cli.Tool {
	return cli.Tool{
		Name:        "tb-lease",
		Description: "Long-lived libvirt sandbox leases: acquire, health, TTL, snapshots, placement.",
		Kinds:       "lease",
		Examples: map[string][]string{
			"": {
				"tb-lease acquire --plan PLAN --ttl 6h",
				"tb-lease list --live",
			},
			"acquire": {
				"tb-lease acquire --plan PLAN --ttl 6h",
				"tb-lease acquire --plan PLAN --dry-run",
			},
			"list": {
				"tb-lease list --live",
				"tb-lease list --lease-state idle --lease-state busy",
			},
			"get":   {"tb-lease get LEASE"},
			"renew": {"tb-lease renew LEASE --ttl 2h"},
			"release": {
				"tb-lease release --keep LEASE    # back to the idle pool",
				"tb-lease release LEASE",
			},
			"expire": {
				"tb-lease expire",
				"tb-lease expire --apply && tb-lease reap",
			},
			"reap": {
				"tb-lease reap --dry-run",
				"tb-lease reap",
			},
			"heal": {
				"tb-lease heal",
				"tb-lease heal LEASE",
			},
			"exec":         {"tb-lease exec LEASE /bin/busybox uname -a"},
			"inspect":      {"tb-lease inspect host"},
			"inspect host": {"tb-lease inspect host"},
			"snapshot":     {"tb-lease snapshot LEASE && tb-lease restore SNAPSHOT"},
			"dump":         {"tb-lease dump LEASE --cycle CYCLE"},
			"snapshots":    {"tb-lease snapshots --verify"},
			"snapshot-rm":  {"tb-lease snapshot-rm SNAPSHOT"},
			"restore":      {"tb-lease restore SNAPSHOT --ttl 2h"},
		},
	}
}
