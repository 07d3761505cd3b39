// Command tb-parse extracts observables from pcaps, Zeek logs and Suricata EVE.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/observe/parse"
)

type parseCmd struct {
	Inputs   []string `arg:"" optional:"" name:"file" help:"Captures (pcap, pcapng, gzip) or logs (Zeek TSV/JSON, Suricata EVE). '-' or none: read artifact records or paths from stdin, one per line."`
	Lease    string   `name:"lease" help:"Lease the file inputs belong to (artifact records carry their own)."`
	Cycle    string   `name:"cycle" help:"Cycle the file inputs belong to (artifact records carry their own)."`
	Merge    bool     `name:"merge" help:"Fold observables into those the state already holds for the lease (count, first/last seen, sets)."`
	NoStore  bool     `name:"no-store" help:"Only print the observables; do not write them to the state."`
	MaxFlows int      `name:"max-flows" default:"131072" help:"Connections tracked at once (about 450 bytes each); beyond it the least recently active one is ended early."`
	MaxHeld  int      `name:"max-held" default:"16384" help:"Distinct observables held for deduplication; beyond it half are written out early (flows first, then the least recently updated)."`
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
	})
}

type tbParse struct {
	cli.Globals
	Parse parseCmd    `cmd:"" default:"withargs" help:"Extract observables from artifacts or files (default command)."`
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
		},
	}
}
