// Command tb-plan triages samples and writes a plan for each: what image can
// run it, what lease to ask for, and the network policy it starts under.
package main

import (
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/plan"
	"github.com/talkbox-sandbox/talkbox/internal/records"
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
}

func (c *planCmd) Run(env *cli.Env) error {
	if os.Getenv("GOGC") == "" {
		// The live heap is small (the batch in flight), so at the default
		// the collector runs every few MB of records encoded: 6% of the CPU
		// time on small samples (bench/plan.sh corpus, state on tmpfs).
		debug.SetGCPercent(400)
	}
	fromStdin := len(c.Inputs) == 0
	for _, in := range c.Inputs {
		fromStdin = fromStdin || in == "-"
	}
	if len(c.Inputs) == 0 {
		if st, err := os.Stdin.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			fromStdin = false // an interactive terminal: say what is expected instead of waiting
		}
	}
	var drop *records.Drop
	if c.DroppedBy != "" {
		drop = &records.Drop{Cycle: c.DroppedBy, Path: c.DroppedPath}
	} else if c.DroppedPath != "" {
		return cli.Usage(errors.New("--dropped-path needs --dropped-by"))
	}
	return plan.Run(env, plan.Request{
		Inputs: c.Inputs, FromStdin: fromStdin, Profile: c.Profile, ProfilesDir: profilesDir(c.ProfilesDir),
		Priority: c.Priority, Strict: c.Strict, Jobs: c.Jobs, DroppedBy: drop,
		Overrides: plan.Overrides{
			File: c.Overrides, VCPUs: c.VCPUs, MemoryMiB: c.Memory, DiskGiB: c.Disk, TTL: c.TTL,
			BootTimeout: c.BootTimeout, Timeout: c.Timeout, Window: c.Window, Network: c.Network,
			RateLimit: c.RateLimit, AllowSMTP: c.AllowSMTP, Promote: c.Promote, Instrumentation: c.Instrument,
			Detach: c.Detach, Cycles: c.Cycles, Args: c.Args, Env: c.Env, Workdir: c.Workdir,
			Images: c.Images, Platform: c.Platform,
		},
	})
}

type profilesCmd struct {
	ProfilesDir string `name:"profiles-dir" env:"TB_PROFILES" type:"path" placeholder:"DIR" help:"Directory of user profiles."`
}

func (c *profilesCmd) Run(env *cli.Env) error {
	return plan.ListProfiles(env, profilesDir(c.ProfilesDir))
}

type profileShowCmd struct {
	Name        string `arg:"" help:"Profile name."`
	ProfilesDir string `name:"profiles-dir" env:"TB_PROFILES" type:"path" placeholder:"DIR" help:"Directory of user profiles."`
}

func (c *profileShowCmd) Run(env *cli.Env) error {
	return plan.ShowProfile(env, profilesDir(c.ProfilesDir), c.Name)
}

func profilesDir(flag string) string {
	if flag != "" {
		return flag
	}
	if os.Geteuid() == 0 {
		return "/etc/talkbox/profiles"
	}
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "talkbox", "profiles")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".config", "talkbox", "profiles")
}

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
