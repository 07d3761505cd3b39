// Command tb-parse extracts observables from pcaps, Zeek logs and Suricata EVE.
package main

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/observe/parse"
)

type parseCmd struct {
	Inputs         []string       `arg:"" optional:"" name:"file" help:"Captures (pcap, pcapng, gzip) or logs (Zeek TSV/JSON, Suricata EVE). '-' or none: read artifact records or paths from stdin, one per line."`
	Lease          string         `name:"lease" help:"Lease the file inputs belong to (artifact records carry their own)."`
	Cycle          string         `name:"cycle" help:"Cycle the file inputs belong to (artifact records carry their own)."`
	Merge          bool           `name:"merge" help:"Fold observables into those the state already holds for the lease (count, first/last seen, sets)."`
	NoStore        bool           `name:"no-store" help:"Only print the observables; do not write them to the state."`
	MaxFlows       int            `name:"max-flows" default:"131072" help:"Connections tracked at once (about 450 bytes each); beyond it the least recently active one is ended early."`
	MaxHeld        int            `name:"max-held" default:"16384" help:"Distinct observables held for deduplication; beyond it the least recently updated half is written out early."`
	MinFree        diskspace.Size `name:"min-free" default:"1G" placeholder:"SIZE" help:"Stop (exit 75) before less than SIZE (default ${default}) is free on the state's file system; 0 and --min-free-percent 0: never."`
	MinFreePercent float64        `name:"min-free-percent" default:"2" placeholder:"P" help:"... or less than P percent of it (default ${default}; the larger bound wins)."`
}

func (c *parseCmd) Run(env *cli.Env) error {
	fromStdin := len(c.Inputs) == 0
	for _, in := range c.Inputs {
		fromStdin = fromStdin || in == "-"
	}
	if len(c.Inputs) == 0 {
		if st, err := os.Stdin.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			fromStdin = false // an interactive terminal: say what is expected instead of waiting
		}
	}
	return parse.Run(env, parse.Request{
		Inputs: c.Inputs, FromStdin: fromStdin, Lease: c.Lease, Cycle: c.Cycle,
		Merge: c.Merge, NoStore: c.NoStore, MaxFlows: c.MaxFlows, MaxHeld: c.MaxHeld,
		MinFree: diskspace.Threshold{Bytes: int64(c.MinFree), Percent: c.MinFreePercent},
	})
}

type flowsCmd struct {
	Lease     string   `name:"lease" help:"Only the flow logs of this lease."`
	Cycle     string   `name:"cycle" help:"Only the flow logs of this cycle."`
	Artifacts []string `name:"artifact" sep:"none" help:"Only these flow logs, or those parsed from these capture artifacts (repeatable)."`
	Addrs     []string `name:"addr" sep:"none" help:"Only connections with this address on either side (repeatable)."`
	Ports     []uint16 `name:"port" sep:"none" help:"Only connections with this port on either side (repeatable)."`
	ZeekTSV   string   `name:"zeek" placeholder:"FILE" help:"Write Zeek's TSV conn.log to FILE instead of records on stdout."`
}

func (c *flowsCmd) Run(env *cli.Env) error {
	q := flowlog.Query{Lease: c.Lease, Cycle: c.Cycle, Artifacts: c.Artifacts, Ports: c.Ports}
	for _, s := range c.Addrs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return cli.Usage(fmt.Errorf("--addr %q: not an IP address", s))
		}
		q.Addrs = append(q.Addrs, a.Unmap())
	}
	return parse.Flows(env, parse.FlowsRequest{Query: q, ZeekTSV: c.ZeekTSV})
}

type tbParse struct {
	cli.Globals
	Parse parseCmd    `cmd:"" default:"withargs" help:"Extract observables from artifacts or files (default command)."`
	Flows flowsCmd    `cmd:"" help:"Stream connections back from the flow logs, as conn records or Zeek's TSV."`
	List  cli.ListCmd `cmd:"" help:"List observables."`
	Get   cli.GetCmd  `cmd:"" help:"Print stored records by ID."`
}

func main() {
	os.Exit(cli.Run(tool(), &tbParse{}, os.Args[1:]))
}

// tool is a function, not a variable, so that main_test.go can check the
// examples without package state.
func tool() cli.Tool {
	return cli.Tool{
		Name:        "tb-parse",
		Description: "Streaming extraction of observables from pcaps, Zeek logs and Suricata EVE.",
		Kinds:       "observable",
		Examples: map[string][]string{
			"": {
				"tb-parse --no-store --lease L --cycle C window.pcap.gz conn.log dns.log eve.json",
				"tb-parse list | jq -c 'select(.type==\"ip\") | [.value, .ip.conns, .ip.domains]'",
			},
			"parse": {
				"tb-parse --no-store big.pcapng",
				"tb-parse --no-store --lease L --cycle C window.pcap.gz conn.log dns.log eve.json",
			},
			"list": {
				"tb-parse list --limit 20",
				"tb-parse list | jq -c 'select(.type==\"ip\") | [.value, .ip.conns, .ip.domains]'",
			},
			"get": {`tb-parse get "$(tb-parse list --limit 1 | jq -r .id)"`},
			"flows": {
				"tb-parse flows --lease L --cycle C --port 443 | jq -c '[.\"id.resp_h\", .conn_state, .history]'",
				"tb-parse flows --lease L --addr 203.0.113.7 --zeek conn.log",
			},
		},
	}
}
