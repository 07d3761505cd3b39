// Command tb-build turns declarative image specs into bootable, smoke-tested,
// signed sandbox images.
package main

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/image"
)

type specsFlag struct {
	SpecsDir string `name:"specs-dir" env:"TB_SPECS" type:"path" placeholder:"DIR" help:"Directory of user specs (*.json); default /etc/talkbox/specs as root, $$XDG_CONFIG_HOME/talkbox/specs otherwise."`
}

func (f specsFlag) dir() string {
	if f.SpecsDir != "" {
		return f.SpecsDir
	}
	if os.Geteuid() == 0 {
		return "/etc/talkbox/specs"
	}
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "talkbox", "specs")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".config", "talkbox", "specs")
}

type specsCmd struct {
	specsFlag
	Format string `name:"format" enum:"text,json" default:"text" help:"text (a table for a person) or json (one spec-summary line per spec)."`
}

func (c *specsCmd) Run(env *cli.Env) error { return image.ListSpecs(env, c.dir(), c.Format) }

type specShowCmd struct {
	ID string `arg:"" help:"Spec id."`
	specsFlag
}

func (c *specShowCmd) Run(env *cli.Env) error {
	ss, err := image.LoadSpecs(c.dir())
	if err != nil {
		return err
	}
	s, err := ss.Get(c.ID)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(env.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

type buildCmd struct {
	Spec  string `arg:"" help:"Spec id (see 'tb-build specs')."`
	URI   string `name:"connect" default:"qemu:///system" help:"libvirt URI for the smoke test."`
	Accel string `name:"accel" enum:"auto,kvm,tcg" default:"auto" help:"Smoke-test acceleration: auto (probe KVM, fall back to TCG), kvm or tcg."`
	Cache string `name:"cache-dir" env:"TB_APT_CACHE" type:"path" placeholder:"DIR" help:"Package download cache (default <state>/cache/apt)."`
	specsFlag
}

func (c *buildCmd) Run(env *cli.Env) error {
	return image.Build(env, image.BuildRequest{Spec: c.Spec, SpecsDir: c.dir(), URI: c.URI, Accel: c.Accel, CacheDir: c.Cache})
}

type refCmd struct {
	Image string `arg:"" help:"Image ID, spec id (its active image) or SPEC@VERSION."`
}

type verifyCmd struct{ refCmd }

func (c *verifyCmd) Run(env *cli.Env) error {
	l, err := lifecycle(env)
	if err != nil {
		return err
	}
	return l.Verify(c.Image)
}

type pinCmd struct {
	refCmd
	Remove bool `name:"remove" help:"Unpin instead."`
}

func (c *pinCmd) Run(env *cli.Env) error {
	l, err := lifecycle(env)
	if err != nil {
		return err
	}
	return l.Pin(env.Ctx, c.Image, !c.Remove)
}

type supersedeCmd struct{ refCmd }

func (c *supersedeCmd) Run(env *cli.Env) error {
	l, err := lifecycle(env)
	if err != nil {
		return err
	}
	return l.Supersede(env.Ctx, c.Image)
}

type rollbackCmd struct {
	Spec string `arg:"" help:"Spec id."`
}

func (c *rollbackCmd) Run(env *cli.Env) error {
	l, err := lifecycle(env)
	if err != nil {
		return err
	}
	return l.Rollback(env.Ctx, c.Spec)
}

type rmCmd struct {
	refCmd
	Force bool `name:"force" help:"Also remove an active or pinned image."`
}

func (c *rmCmd) Run(env *cli.Env) error {
	l, err := lifecycle(env)
	if err != nil {
		return err
	}
	return l.Rm(env.Ctx, c.Image, c.Force)
}

type smokeCmd struct {
	refCmd
	URI   string `name:"connect" default:"qemu:///system" help:"libvirt URI."`
	Accel string `name:"accel" enum:"auto,kvm,tcg" default:"auto" help:"Acceleration: auto, kvm or tcg."`
	specsFlag
}

func (c *smokeCmd) Run(env *cli.Env) error {
	l, err := lifecycle(env)
	if err != nil {
		return err
	}
	return l.SmokeAgain(env.Ctx, c.Image, c.URI, c.Accel, c.dir())
}

type gcCmd struct{}

func (c *gcCmd) Run(env *cli.Env) error {
	l, err := lifecycle(env)
	if err != nil {
		return err
	}
	return l.GC(env.Ctx)
}

func lifecycle(env *cli.Env) (*image.Lifecycle, error) {
	st, err := env.OpenState()
	if err != nil {
		return nil, err
	}
	return &image.Lifecycle{Env: env, St: st}, nil
}

type tbBuild struct {
	cli.Globals
	Specs specsCmd `cmd:"" help:"List image specs (embedded and user): a table for a person; --format json for JSON lines."`
	Spec  struct {
		Show specShowCmd `cmd:"" help:"Print one spec, resolved, as JSON."`
	} `cmd:"" help:"Inspect image specs."`
	Build     buildCmd     `cmd:"" help:"Build, smoke-test and publish an image from a spec."`
	List      cli.ListCmd  `cmd:"" help:"List images and builds."`
	Get       cli.GetCmd   `cmd:"" help:"Print stored records by ID."`
	Verify    verifyCmd    `cmd:"" help:"Check an image's checksums and signature."`
	Pin       pinCmd       `cmd:"" help:"Pin an image: gc and rm keep it, and new builds do not replace it while it is active."`
	Supersede supersedeCmd `cmd:"" help:"Retire an image; if it was active, the newest stable image becomes active."`
	Rollback  rollbackCmd  `cmd:"" help:"Make the previous stable image of a spec active again."`
	Rm        rmCmd        `cmd:"" help:"Remove an image's files and record."`
	Gc        gcCmd        `cmd:"" help:"Remove build leftovers, superseded images and unreferenced image files."`
	Smoke     smokeCmd     `cmd:"" help:"Boot a published image again and run its smoke test (changes nothing; measures boot time)."`
}

func main() {
	os.Exit(cli.Run(tool(), &tbBuild{}, os.Args[1:]))
}

// tool is a function, not a variable, so that main_test.go can check the
// examples without package state.
func tool() cli.Tool {
	return cli.Tool{
		Name:        "tb-build",
		Description: "Reproducible, smoke-tested, signed sandbox images for many architectures.",
		Kinds:       "image,build",
		Examples: map[string][]string{
			"": {
				"tb-build specs",
				"tb-build build debian-bookworm-amd64",
			},
			"specs":     {"tb-build specs"},
			"spec":      {"tb-build spec show debian-bookworm-mipsel"},
			"spec show": {"tb-build spec show debian-bookworm-mipsel"},
			"build": {
				"tb-build build debian-bookworm-amd64",
				"tb-build build debian-bookworm-mipsel --accel tcg",
			},
			"list":      {"tb-build list --kind image"},
			"get":       {`tb-build get "$(tb-build list --kind image --limit 1 | jq -r .id)"`},
			"verify":    {"tb-build verify debian-bookworm-amd64"},
			"pin":       {"tb-build pin debian-bookworm-amd64", "tb-build pin --remove debian-bookworm-amd64"},
			"supersede": {"tb-build supersede IMAGE"},
			"rollback":  {"tb-build rollback debian-bookworm-amd64"},
			"rm":        {"tb-build rm IMAGE"},
			"gc":        {"tb-build gc"},
			"smoke":     {"tb-build smoke debian-bookworm-amd64", "tb-build smoke debian-bookworm-amd64 --accel tcg"},
		},
	}
}
