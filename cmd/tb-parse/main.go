// Command tb-parse extracts observables from pcaps, Zeek logs and Suricata EVE.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

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
				`tb-parse flows --lease L --uid "$(tb-parse list | jq -rn 'first(inputs | select(.type=="endpoint") | .provenance[0].uid)')"`,
			},
		},
	}
}
