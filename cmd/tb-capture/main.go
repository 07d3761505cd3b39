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
		Up       netUpCmd       `cmd:"" help:"Bring the lab network up (idempotent) and check that it contains."`
		Check    netCheckCmd    `cmd:"" help:"Re-run the containment probes on the lab and record the result."`
		Down     netDownCmd     `cmd:"" help:"Remove exactly what 'net up' made."`
		Status   netStatusCmd   `cmd:"" help:"Show the lab network, its services and rule counters."`
		DNSAllow netDNSAllowCmd `cmd:"" name:"dns-allow" help:"Set the names the DNS sinkhole forwards upstream."`
	} `cmd:"" help:"The lab network: bridge, sinkhole, nftables."`
	Start     startCmd     `cmd:"" help:"Apply a lease's rules and start capture on its tap."`
	Rotate    rotateCmd    `cmd:"" help:"Close the current capture file and register it as an artifact."`
	Stop      stopCmd      `cmd:"" help:"Stop capture (registering the last file) and remove the lease's rules."`
	Prune     pruneCmd     `cmd:"" help:"Delete a lease's oldest pcaps and flow logs beyond a retention (records stay, marked pruned_at)."`
	Allow     allowCmd     `cmd:"" help:"Add or delete elements of a lease's live allow set, in one batch."`
	Reconcile reconcileCmd `cmd:"" help:"Remove rules, sensors and captures whose lease is gone."`
	Status    statusCmd    `cmd:"" help:"What is applied per lease, with counters."`
	Daemon    daemonCmd    `cmd:"" hidden:"" help:"Run one capture (started by 'start')."`
	List      cli.ListCmd  `cmd:"" help:"List captures and artifacts."`
	Get       cli.GetCmd   `cmd:"" help:"Print stored records by ID."`
}

func main() {
	os.Exit(cli.Run(tool(), &tbCapture{}, os.Args[1:]))
}

// tool is a function, not a variable, so that main_test.go can check the
// examples without package state.
func tool() cli.Tool {
	return cli.Tool{
		Name:        "tb-capture",
		Description: "Lab network, per-lease containment rules in nftables, and packet capture.",
		Kinds:       "capture,artifact",
		Examples: map[string][]string{
			"": {
				"tb-capture net up --uplink eth0 --upstream 9.9.9.9",
				"tb-capture start --lease lease_01JD... --rotate-every 1h",
			},
			"net": {
				"tb-capture net up --uplink eth0 --upstream 9.9.9.9",
				"tb-capture net status",
			},
			"net up": {
				"tb-capture net up --uplink eth0 --upstream 9.9.9.9",
				"tb-capture net up --no-inetsim --dhcp",
			},
			"net check": {
				"tb-capture net check",
				"tb-capture net check --lab default",
			},
			"net down":   {"tb-capture net down"},
			"net status": {"tb-capture net status"},
			"net dns-allow": {
				"tb-capture net dns-allow raw.githubusercontent.com",
				"tb-capture net dns-allow    # none: clears the list",
			},
			"start": {
				"tb-capture start --lease lease_01JD... --rotate-every 1h",
				"tb-capture start --lease lease_01JD... --rotate-every 1h --keep-days 3 --keep-bytes 20G --min-free 5G",
			},
			"prune": {
				"tb-capture prune --lease lease_01JD... --keep-bytes 20G --dry-run",
				"tb-capture prune --lease lease_01JD...    # the capture's own retention",
			},
			"rotate": {"tb-capture rotate --lease lease_01JD... --cycle cycle_01JD..."},
			"stop":   {"tb-capture stop --lease lease_01JD..."},
			"allow": {
				"tb-capture allow --lease lease_01JD... --add 203.0.113.5:443/tcp=rate-limit",
				"tb-capture allow --lease lease_01JD... --del 203.0.113.5:443/tcp",
			},
			"reconcile": {
				"tb-capture reconcile --dry-run",
				"tb-capture reconcile",
			},
			"status": {"tb-capture status"},
			"list":   {"tb-capture list --kind artifact --limit 10"},
			"get":    {"tb-capture get capture_01JD..."},
		},
	}
}
