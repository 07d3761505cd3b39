// Command tb-build turns declarative image specs into bootable, smoke-tested,
// signed sandbox images.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

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
