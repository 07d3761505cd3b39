// Command tb-allow classifies observables, keeps versioned allow-list
// revisions and enforces them live.
package main

import (
	"os"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

type policyFlag struct {
	Policy string `name:"policy" env:"TB_ALLOW_POLICY" type:"existingfile" placeholder:"FILE" help:"Policy file (JSON) over the defaults ('tb-allow policy' prints them)."`
}

type labFlag struct {
	Lab string `name:"lab" default:"default" help:"Lab instance whose firewall and DNS sinkhole are updated."`
}

type selector struct {
	Lease  string `name:"lease" help:"Lease ID."`
	Scope  string `name:"scope" enum:",lease,sample,global" default:"" help:"Chain scope: lease, sample or global (default: every chain that applies)."`
	Sample string `name:"sample" help:"Sample (sha256) of a sample-scoped chain."`
}

func (s selector) sel() allowlist.Selector {
	return allowlist.Selector{Lease: s.Lease, Scope: s.Scope, Sample: s.Sample}
}

func stdinWanted(lease, cycle string) bool {
	if lease != "" || cycle != "" {
		return false
	}
	st, err := os.Stdin.Stat()
	return err != nil || st.Mode()&os.ModeCharDevice == 0
}

type promoteCmd struct {
	policyFlag
	labFlag
	Lease   string `name:"lease" help:"Read this lease's observables from the state (and scope the revision to it)."`
	Cycle   string `name:"cycle" help:"Only observables of this cycle; recorded on the revision."`
	Scope   string `name:"scope" enum:"lease,sample,global" default:"lease" help:"Chain the entries go to: lease, sample or global."`
	Sample  string `name:"sample" help:"Sample of a sample-scoped chain (default: the lease's)."`
	Stdin   bool   `name:"stdin" help:"Read observables from stdin even with --lease or --cycle (they then filter)."`
	NoApply bool   `name:"no-apply" help:"Write the revision only; do not push it to the firewall."`
	DryRun  bool   `name:"dry-run" short:"n" help:"Print the entries the next revision would hold; write nothing."`
}

func (c *promoteCmd) Run(env *cli.Env) error {
	return allowlist.Promote(env, allowlist.PromoteRequest{
		Input: allowlist.Input{FromStdin: c.Stdin || stdinWanted(c.Lease, c.Cycle), Lease: c.Lease, Cycle: c.Cycle},
		Scope: c.Scope, Sample: c.Sample, PolicyFile: c.Policy, Lab: c.Lab, NoApply: c.NoApply, DryRun: c.DryRun,
	})
}

type classifyCmd struct {
	policyFlag
	Lease string `name:"lease" help:"Read this lease's observables from the state."`
	Cycle string `name:"cycle" help:"Only observables of this cycle."`
	All   bool   `name:"all" help:"Also print destinations without any evidence (class other)."`
}

func (c *classifyCmd) Run(env *cli.Env) error {
	return allowlist.ClassifyCmd(env, allowlist.ClassifyRequest{
		Input:      allowlist.Input{FromStdin: stdinWanted(c.Lease, c.Cycle), Lease: c.Lease, Cycle: c.Cycle},
		PolicyFile: c.Policy, All: c.All,
	})
}

type applyCmd struct {
	labFlag
	Leases []string `name:"lease" help:"Lease to apply (repeatable; default: every lease with rules)."`
}

func (c *applyCmd) Run(env *cli.Env) error {
	return allowlist.Apply(env, allowlist.ApplyRequest{Leases: c.Leases, Lab: c.Lab})
}

type listCmd struct {
	selector
	Status []string `name:"status" help:"Only entries with this status (repeatable)."`
}

func (c *listCmd) Run(env *cli.Env) error {
	return allowlist.List(env, allowlist.ListRequest{Selector: c.sel(), Status: c.Status})
}

type getCmd struct {
	IDs []string `arg:"" name:"id" help:"Record IDs (allow_…, revision_…)."`
}

func (c *getCmd) Run(env *cli.Env) error { return allowlist.Get(env, c.IDs) }

type showCmd struct {
	selector
	Revision string `arg:"" optional:"" name:"revision" help:"Revision ID (default: the current revisions of the chosen chains)."`
}

func (c *showCmd) Run(env *cli.Env) error { return allowlist.Show(env, c.Revision, c.sel()) }

type revisionsCmd struct {
	selector
	Verify bool `name:"verify" help:"Check each chain's hashes, contents and changesets; exit 65 naming a tampered revision."`
}

func (c *revisionsCmd) Run(env *cli.Env) error {
	return allowlist.Revisions(env, c.sel(), c.Verify, false)
}

type verifyCmd struct{ selector }

func (c *verifyCmd) Run(env *cli.Env) error { return allowlist.Revisions(env, c.sel(), true, true) }

type diffCmd struct {
	From string `arg:"" name:"rev" help:"Revision (alone: what it changed from its predecessor)."`
	To   string `arg:"" optional:"" name:"rev2" help:"Second revision: what changed from the first to it."`
}

func (c *diffCmd) Run(env *cli.Env) error { return allowlist.DiffCmd(env, c.From, c.To) }

type rollbackCmd struct {
	labFlag
	Revision string `arg:"" name:"revision" help:"Revision whose content is restored (as a new revision)."`
	NoApply  bool   `name:"no-apply" help:"Write the revision only."`
}

func (c *rollbackCmd) Run(env *cli.Env) error {
	return allowlist.RollbackCmd(env, c.Revision, c.Lab, c.NoApply)
}

type changeCmd struct {
	selector
	policyFlag
	labFlag
	Targets []string `arg:"" name:"entry" help:"Entry IDs (allow_…) or values (IP:PORT/PROTO, names) in the chosen chains."`
	Note    string   `name:"note" help:"Comment recorded on the entries."`
	NoApply bool     `name:"no-apply" help:"Write the revision only."`
}

func (c *changeCmd) run(env *cli.Env, op string) error {
	return allowlist.ChangeEntries(env, op, allowlist.ChangeRequest{Selector: c.sel(), Targets: c.Targets, Note: c.Note,
		PolicyFile: c.Policy, Lab: c.Lab, NoApply: c.NoApply})
}

type approveCmd struct{ changeCmd }

func (c *approveCmd) Run(env *cli.Env) error { return c.run(env, "approve") }

type rejectCmd struct{ changeCmd }

func (c *rejectCmd) Run(env *cli.Env) error { return c.run(env, "reject") }

type revokeCmd struct{ changeCmd }

func (c *revokeCmd) Run(env *cli.Env) error { return c.run(env, "revoke") }

type expireCmd struct {
	selector
	labFlag
	At      time.Time `name:"at" placeholder:"RFC3339" help:"Expire as of this time instead of now."`
	NoApply bool      `name:"no-apply" help:"Write the revisions only."`
}

func (c *expireCmd) Run(env *cli.Env) error {
	return allowlist.Expire(env, c.sel(), c.At, c.Lab, c.NoApply)
}

type exportCmd struct {
	selector
	Format  string   `name:"format" short:"f" enum:"json,plain,nft,zeek,suricata,stix" default:"json" help:"json, plain, nft, zeek, suricata or stix."`
	Status  []string `name:"status" help:"Entries with this status (repeatable; default: those enforced now)."`
	Table   string   `name:"nft-table" default:"talkbox" help:"nft format: the inet table."`
	Set     string   `name:"nft-set" default:"allow" help:"nft format: the set."`
	SIDBase int      `name:"sid-base" default:"9700001" help:"suricata format: the first signature ID."`
}

func (c *exportCmd) Run(env *cli.Env) error {
	return allowlist.ExportCmd(env, allowlist.ExportRequest{Selector: c.sel(), Status: c.Status,
		ExportOptions: allowlist.ExportOptions{Format: c.Format, Table: c.Table, Set: c.Set, SIDBase: c.SIDBase}})
}

type policyCmd struct{ policyFlag }

func (c *policyCmd) Run(env *cli.Env) error { return allowlist.PolicyCmd(env, c.Policy) }

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
