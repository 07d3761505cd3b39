package main

import (
	"encoding/json"
	"fmt"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/image"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

type specsFlag struct {
	SpecsDir string `name:"specs-dir" env:"TB_SPECS" type:"path" placeholder:"DIR" help:"Directory of user specs (*.json); default /etc/talkbox/specs as root, $$XDG_CONFIG_HOME/talkbox/specs otherwise."`
}

func (f specsFlag) dir() string {
	if f.SpecsDir != "" {
		return f.SpecsDir
	}
	return cli.ConfigDir("specs")
}

type specsCmd struct {
	specsFlag
	Format string `name:"format" enum:"text,json" default:"text" help:"text (a table for a person) or json (one spec-summary line per spec)."`
}

// Run prints one line per spec: id, version, arch, boot mode, source; a
// table for a person, or (--format json) one spec-summary line each.
func (c *specsCmd) Run(env *cli.Env) error {
	ss, err := image.LoadSpecs(c.dir())
	if err != nil {
		return err
	}
	w := records.NewWriter(env.Stdout)
	for _, id := range ss.IDs() {
		s, err := ss.Get(id)
		if err != nil {
			env.Warnf("%v", err)
			continue
		}
		if c.Format != "json" {
			if _, err := fmt.Fprintf(env.Stdout, "%-30s %-7s %-9s %-12s %s\n", s.ID, s.Version, s.Arch, s.Boot.Mode, s.Source); err != nil {
				return err
			}
			continue
		}
		if err := w.Line(records.LineSpecSummary, struct {
			ID       string `json:"id"`
			Version  string `json:"version"`
			Arch     string `json:"arch"`
			BootMode string `json:"boot_mode"`
			Source   string `json:"source"`
		}{s.ID, s.Version, s.Arch, s.Boot.Mode, s.Source}); err != nil {
			return err
		}
	}
	return w.Flush()
}

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
	job, err := image.PrepareBuild(env.Ctx, image.BuildRequest{Spec: c.Spec, SpecsDir: c.dir(), URI: c.URI, Accel: c.Accel, CacheDir: c.Cache})
	if err != nil {
		return err
	}
	defer job.Close()
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	meter := env.Progress()
	defer meter.Wait()
	status := meter.Status("build " + c.Spec)
	defer status.Done()
	return job.Run(env.Ctx, st, env.Sink())
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
	return &image.Lifecycle{St: st, Out: env.Sink()}, nil
}
