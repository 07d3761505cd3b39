package main

import (
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
)

type policyFlag struct {
	Policy string `name:"policy" env:"TB_ALLOW_POLICY" type:"existingfile" placeholder:"FILE" help:"Policy file (JSON) over the defaults ('tb-allow policy' prints them)."`
}

// policy is the effective policy; a policy file that does not load is a
// usage error.
func (f policyFlag) policy() (allowlist.Policy, error) {
	pol, err := allowlist.LoadPolicy(f.Policy)
	if err != nil {
		return pol, fault.Usage(err)
	}
	return pol, nil
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

// input reads observables from stdin when asked to (force), or when
// neither a lease nor a cycle names them in the state and stdin is piped.
func input(env *cli.Env, force bool, lease, cycle string) allowlist.Input {
	in := allowlist.Input{Lease: lease, Cycle: cycle}
	if force || lease == "" && cycle == "" && env.StdinPiped() {
		in.Stdin = env.Stdin
	}
	return in
}

// book opens the state's allow-list revisions.
func book(env *cli.Env) (*allowlist.Book, error) {
	st, err := env.OpenState()
	if err != nil {
		return nil, err
	}
	return &allowlist.Book{St: st}, nil
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
	pol, err := c.policy()
	if err != nil {
		return err
	}
	b, err := book(env)
	if err != nil {
		return err
	}
	return allowlist.Promote(env.Ctx, b, allowlist.PromoteRequest{
		Input: input(env, c.Stdin, c.Lease, c.Cycle),
		Scope: c.Scope, Sample: c.Sample, Policy: pol, Lab: c.Lab, NoApply: c.NoApply, DryRun: c.DryRun,
	}, env.Sink())
}

type applyCmd struct {
	labFlag
	Leases []string `name:"lease" help:"Lease to apply (repeatable; default: every lease with rules)."`
}

func (c *applyCmd) Run(env *cli.Env) error {
	b, err := book(env)
	if err != nil {
		return err
	}
	meter := env.Progress()
	defer meter.Wait()
	return allowlist.Apply(env.Ctx, b, allowlist.ApplyRequest{Leases: c.Leases, Lab: c.Lab, Progress: meter}, env.Sink())
}

type rollbackCmd struct {
	labFlag
	Revision string `arg:"" name:"revision" help:"Revision whose content is restored (as a new revision)."`
	NoApply  bool   `name:"no-apply" help:"Write the revision only."`
}

func (c *rollbackCmd) Run(env *cli.Env) error {
	b, err := book(env)
	if err != nil {
		return err
	}
	return allowlist.Rollback(env.Ctx, b, c.Revision, c.Lab, c.NoApply, env.Sink())
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
	pol, err := c.policy()
	if err != nil {
		return err
	}
	b, err := book(env)
	if err != nil {
		return err
	}
	return allowlist.ChangeEntries(env.Ctx, b, op, allowlist.ChangeRequest{Selector: c.sel(), Targets: c.Targets, Note: c.Note,
		Policy: pol, Lab: c.Lab, NoApply: c.NoApply}, env.Sink())
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
	b, err := book(env)
	if err != nil {
		return err
	}
	return allowlist.Expire(env.Ctx, b, c.sel(), c.At, c.Lab, c.NoApply, env.Sink())
}
