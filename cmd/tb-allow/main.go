// Command tb-allow classifies observables, keeps versioned allow-list
// revisions and enforces them live.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

type tbAllow struct {
	cli.Globals
	Promote   promoteCmd   `cmd:"" help:"Classify observables and write a new revision, then apply it."`
	Classify  classifyCmd  `cmd:"" help:"Print the classification of every destination; write nothing."`
	Apply     applyCmd     `cmd:"" help:"Push the active revisions to the firewall and DNS sinkhole."`
	List      listCmd      `cmd:"" help:"List the entries of the current revisions."`
	Get       getCmd       `cmd:"" help:"Print records by ID (entries from the current revisions)."`
	Show      showCmd      `cmd:"" help:"Show a revision and its entries."`
	Revisions revisionsCmd `cmd:"" help:"List the revisions of each chain, oldest first."`
	Verify    verifyCmd    `cmd:"" help:"Verify the revision chains (exit 65 on tampering)."`
	Diff      diffCmd      `cmd:"" help:"Difference between two revisions."`
	Rollback  rollbackCmd  `cmd:"" help:"Write a new revision restoring an earlier one."`
	Approve   approveCmd   `cmd:"" help:"Approve pending entries."`
	Reject    rejectCmd    `cmd:"" help:"Reject pending entries."`
	Revoke    revokeCmd    `cmd:"" help:"Revoke active entries."`
	Expire    expireCmd    `cmd:"" help:"Expire entries past their time."`
	Export    exportCmd    `cmd:"" help:"Export as JSON, plain list, nftables, Zeek Intel, Suricata or STIX."`
	Policy    policyCmd    `cmd:"" help:"Print the effective policy."`
}

func main() {
	os.Exit(cli.Run(tool(), &tbAllow{}, os.Args[1:]))
}

// tool is a function, not a variable, so that main_test.go can check the
// examples without package state.
func tool() cli.Tool {
	return cli.Tool{
		Name:        "tb-allow",
		Description: "C2 classification, versioned allow-list revisions, live enforcement.",
		Kinds:       "allow,revision",
		Examples: map[string][]string{
			"": {
				"tb-allow promote --lease L --cycle C",
				"tb-allow list --lease L --status pending-approval",
			},
			"promote": {
				"tb-allow promote --lease L --cycle C --no-apply && tb-allow apply --lease L",
				"tb-allow promote --lease L --dry-run",
			},
			"classify": {"tb-allow classify --lease L"},
			"apply":    {"tb-allow apply --lease L"},
			"list":     {"tb-allow list --lease L --status pending-approval"},
			"get":      {"tb-allow get REV"},
			"show": {
				"tb-allow show --lease L",
				"tb-allow show REV",
			},
			"revisions": {"tb-allow revisions --lease L"},
			"verify":    {"tb-allow verify || echo 'allow-list history was edited'"},
			"diff": {
				"tb-allow diff REV",
				"tb-allow diff REV REV2",
			},
			"rollback": {"tb-allow rollback REV"},
			"approve":  {"tb-allow approve --lease L raw.githubusercontent.com --note 'dead drop'"},
			"reject":   {"tb-allow reject --lease L cdn.example.net --note 'CDN, not C2'"},
			"revoke":   {"tb-allow revoke --scope global 203.0.113.5:443/tcp"},
			"expire": {
				"tb-allow expire",
				"tb-allow expire --at 2026-12-01T00:00:00Z --no-apply",
			},
			"export": {
				"tb-allow export --format suricata > talkbox.rules",
				"tb-allow export --format stix",
			},
			"policy": {"tb-allow policy"},
		},
	}
}
