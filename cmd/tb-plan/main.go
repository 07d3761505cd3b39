// Command tb-plan triages samples and writes a plan for each: what image can
// run it, what lease to ask for, and the network policy it starts under.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

type tbPlan struct {
	cli.Globals
	Plan     planCmd     `cmd:"" default:"withargs" help:"Triage samples and write a sample and a plan record for each (default command)."`
	Profiles profilesCmd `cmd:"" help:"List the profiles (embedded and user)."`
	Profile  struct {
		Show profileShowCmd `cmd:"" help:"Print one profile as JSON."`
	} `cmd:"" help:"Inspect profiles."`
	List cli.ListCmd `cmd:"" help:"List stored samples and plans."`
	Get  cli.GetCmd  `cmd:"" help:"Print stored records by ID."`
}

func main() {
	os.Exit(cli.Run(tool(), &tbPlan{}, os.Args[1:]))
}

// tool is a function, not a variable, so that main_test.go can check the
// examples without package state.
func tool() cli.Tool {
	return cli.Tool{
		Name:        "tb-plan",
		Description: "Triage samples (format, architecture, ABI, hashes) and plan how to run them.",
		Kinds:       "sample,plan",
		Examples: map[string][]string{
			"": {
				"tb-plan samples/",
				"tb-plan list --kind plan | jq -r 'select(.runnable|not) | .reason'",
			},
			"plan": {
				"tb-plan samples/",
				"tb-plan --profile long-running --memory 1024 bot.mips",
			},
			"profiles":     {"tb-plan profiles"},
			"profile":      {"tb-plan profile show default"},
			"profile show": {"tb-plan profile show long-running"},
			"list": {
				"tb-plan list --kind plan",
				"tb-plan list --kind plan | jq -r 'select(.runnable|not) | .reason'",
			},
			"get": {`tb-plan get "$(tb-plan list --kind plan --limit 1 | jq -r .id)"`},
		},
	}
}
