package main

import (
	"encoding/json"
	"errors"
	"os"
	"runtime/debug"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/plan"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

type planCmd struct {
	Inputs      []string          `arg:"" optional:"" name:"path" help:"Sample files or directories (walked recursively, links followed). '-' or none: read records, sha256s or paths from stdin, one per line."`
	Profile     string            `name:"profile" short:"p" default:"default" help:"Profile to start from (see 'tb-plan profiles')."`
	ProfilesDir string            `name:"profiles-dir" env:"TB_PROFILES" type:"path" placeholder:"DIR" help:"Directory of user profiles (*.json); default /etc/talkbox/profiles as root, $$XDG_CONFIG_HOME/talkbox/profiles otherwise."`
	Overrides   string            `name:"overrides" type:"existingfile" placeholder:"FILE" help:"Partial profile in JSON, merged over the profile (RFC 7396) before flags."`
	VCPUs       int               `name:"vcpus" help:"vCPUs for the lease."`
	Memory      int               `name:"memory" placeholder:"MIB" help:"Guest memory in MiB."`
	Disk        int               `name:"disk" placeholder:"GIB" help:"Guest disk in GiB."`
	TTL         time.Duration     `name:"ttl" help:"Lease time to live."`
	BootTimeout time.Duration     `name:"boot-timeout" help:"Longest wait for the guest agent."`
	Timeout     time.Duration     `name:"timeout" help:"Execution timeout (0 with --detach: none)."`
	Window      time.Duration     `name:"window" help:"Observation window per cycle."`
	Cycles      int               `name:"cycles" help:"Observation cycles."`
	Network     string            `name:"network" enum:",sinkhole,allowlist" default:"" help:"Network mode: sinkhole or allowlist."`
	RateLimit   string            `name:"rate-limit" help:"Rate limit for forwarded traffic, e.g. '64 kbytes/second'."`
	AllowSMTP   *bool             `name:"allow-smtp" negatable:"" help:"Allow promoted SMTP destinations (off unless forced)."`
	Promote     *bool             `name:"promote" negatable:"" help:"Let tb-allow promote C2 candidates between cycles."`
	Detach      *bool             `name:"detach" negatable:"" help:"Leave the sample running across cycles."`
	Instrument  string            `name:"instrumentation" help:"What is recorded: pcap, trace (system calls), memory (a dump per cycle), joined with +."`
	Args        []string          `name:"arg" sep:"none" help:"Argument for the sample (repeatable; commas are kept)."`
	Env         map[string]string `name:"env" placeholder:"KEY=VALUE" help:"Environment variable for the sample (repeatable)."`
	Workdir     string            `name:"workdir" help:"Working directory in the guest."`
	Images      []string          `name:"image" help:"Preferred image ID or name (repeatable)."`
	Platform    string            `name:"platform" help:"Force the guest platform (Debian architecture), overriding triage."`
	Priority    int               `name:"priority" help:"Priority recorded on new samples."`
	Strict      bool              `name:"strict" help:"Exit 1 when any plan is not runnable."`
	Jobs        int               `name:"jobs" short:"j" help:"Files read, hashed, triaged and copied into the blob store at once (default: one per CPU); output stays in input order."`
	DroppedBy   string            `name:"dropped-by" placeholder:"CYCLE" help:"The inputs are files a sample wrote in this cycle's guest (tb-run copies them out): recorded as the samples' lineage."`
	DroppedPath string            `name:"dropped-path" placeholder:"PATH" help:"With --dropped-by: the file's path in the guest."`
	Yara        []string          `name:"yara" type:"path" placeholder:"DIR" help:"Directory (or file) of YARA rules, *.yar and *.yara, added to the profile's and /etc/talkbox/yara (repeatable): run over each sample now, and over its dropped files and memory dumps at each cycle."`
}

func (c *planCmd) Run(env *cli.Env) error {
	if os.Getenv("GOGC") == "" {
		// The live heap is small (the batch in flight), so at the default
		// the collector runs every few MB of records encoded: 6% of the CPU
		// time on small samples (bench/tb-plan/run.sh corpus, state on tmpfs).
		debug.SetGCPercent(400)
	}
	var drop *records.Drop
	if c.DroppedBy != "" {
		drop = &records.Drop{Cycle: c.DroppedBy, Path: c.DroppedPath}
	} else if c.DroppedPath != "" {
		return fault.Usage(errors.New("--dropped-path needs --dropped-by"))
	}
	job, err := plan.Prepare(plan.Request{
		Inputs:    c.Inputs,
		FromStdin: slices.Contains(c.Inputs, "-") || len(c.Inputs) == 0 && env.StdinPiped(),
		Profile:   c.Profile, ProfilesDir: profilesDir(c.ProfilesDir),
		Priority: c.Priority, Strict: c.Strict, Jobs: c.Jobs, DroppedBy: drop,
		Overrides: plan.Overrides{
			File: c.Overrides, VCPUs: c.VCPUs, MemoryMiB: c.Memory, DiskGiB: c.Disk, TTL: c.TTL,
			BootTimeout: c.BootTimeout, Timeout: c.Timeout, Window: c.Window, Network: c.Network,
			RateLimit: c.RateLimit, AllowSMTP: c.AllowSMTP, Promote: c.Promote, Instrumentation: c.Instrument,
			Detach: c.Detach, Cycles: c.Cycles, Args: c.Args, Env: c.Env, Workdir: c.Workdir,
			Images: c.Images, Platform: c.Platform, Yara: c.Yara,
		},
	}, env.Stdin, env.Sink())
	if err != nil {
		return err
	}
	st, err := env.OpenState(state.WithDurability(state.SyncOnFlush))
	if err != nil {
		return err
	}
	return job.Run(env.Ctx, st, env.Sink())
}

type profilesCmd struct {
	ProfilesDir string `name:"profiles-dir" env:"TB_PROFILES" type:"path" placeholder:"DIR" help:"Directory of user profiles."`
}

// Run prints one JSON line per profile.
func (c *profilesCmd) Run(env *cli.Env) error {
	ps, err := plan.LoadProfiles(profilesDir(c.ProfilesDir))
	if err != nil {
		return fault.DataErr(err)
	}
	w := records.NewWriter(env.Stdout)
	for _, n := range ps.Names() {
		p, _ := ps.Get(n)
		if err := w.Line(records.LineProfileSummary, struct {
			Name        string `json:"name"`
			Version     string `json:"version"`
			Source      string `json:"source"`
			Description string `json:"description,omitempty"`
		}{p.Name, p.Version, p.Source, p.Description}); err != nil {
			return err
		}
	}
	return w.Flush()
}

type profileShowCmd struct {
	Name        string `arg:"" help:"Profile name."`
	ProfilesDir string `name:"profiles-dir" env:"TB_PROFILES" type:"path" placeholder:"DIR" help:"Directory of user profiles."`
}

// Run prints one profile, resolved, as indented JSON.
func (c *profileShowCmd) Run(env *cli.Env) error {
	ps, err := plan.LoadProfiles(profilesDir(c.ProfilesDir))
	if err != nil {
		return fault.DataErr(err)
	}
	p, err := ps.Get(c.Name)
	if err != nil {
		return fault.Usage(err)
	}
	enc := json.NewEncoder(env.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(p)
}

func profilesDir(flag string) string {
	if flag != "" {
		return flag
	}
	return cli.ConfigDir("profiles")
}
