package leasetest

import (
	"context"
	"os"
	"os/exec"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// ownerKind is the kind of the labs upLab records (labtest.Own): a test
// process killed runs no cleanup, and its lab, its leases' guests and its
// capture daemons would stay until taken down by hand; the next upLab
// takes down those whose process is gone.
const ownerKind = "leasetest"

// takeDown takes down a lab upLab made, and what ran on it: the processes
// started for its state directory (capture daemons), its leases' guests
// (Cleanup), the lab (netlab.Down), then each name left of it (a lab cut
// short, or its state directory removed).
func takeDown(ctx context.Context, o labtest.Owner) {
	if o.State != "" {
		labtest.KillUsersOf(o.State)
		if _, err := os.Stat(o.State); err == nil {
			Cleanup(o.State)
		}
	}
	if o.Dir != "" {
		netlab.Down(ctx, o.Dir)
	}
	for _, fam := range []string{"inet", "netdev", "bridge"} {
		exec.CommandContext(ctx, "nft", "delete", "table", fam, "talkboxlt"+o.Tag).Run()
	}
	for _, link := range []string{"tbltk" + o.Tag, "tbltu" + o.Tag, "tblt" + o.Tag} {
		exec.CommandContext(ctx, "ip", "link", "del", link).Run()
	}
	for _, ns := range []string{"tblts" + o.Tag, "tbltn" + o.Tag} {
		netns.Delete(ns)
	}
}
