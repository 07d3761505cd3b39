// Command tb-build turns declarative image specs into bootable, smoke-tested,
// signed sandbox images.
package main

import (
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
)

type tbBuild struct {
	cli.Globals
	Specs cli.Pending `cmd:"" help:"List image specs (embedded and user)."`
	Spec  struct {
		Show cli.Pending `cmd:"" help:"Print one spec, resolved."`
	} `cmd:"" help:"Inspect image specs."`
	Build     cli.Pending `cmd:"" help:"Build, smoke-test and publish an image from a spec."`
	List      cli.ListCmd `cmd:"" help:"List images and builds."`
	Get       cli.GetCmd  `cmd:"" help:"Print stored records by ID."`
	Verify    cli.Pending `cmd:"" help:"Check an image's checksums and signature."`
	Pin       cli.Pending `cmd:"" help:"Pin an image version."`
	Supersede cli.Pending `cmd:"" help:"Mark an image superseded."`
	Rollback  cli.Pending `cmd:"" help:"Make the previous stable image active again."`
	Rm        cli.Pending `cmd:"" help:"Remove an image."`
	Gc        cli.Pending `cmd:"" help:"Remove unreferenced image files and build leftovers."`
}

func main() {
	os.Exit(cli.Run(cli.Tool{
		Name:        "tb-build",
		Description: "Reproducible, smoke-tested, signed sandbox images for many architectures.",
		Kinds:       "image,build",
	}, &tbBuild{}, os.Args[1:]))
}
