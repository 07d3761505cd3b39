//go:build !cgo

package cycle

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// pushChunk keeps one guest-file-write's base64 under the kernel's limit
// on a single argument (128 KiB), since virsh takes the command as one.
const pushChunk = 64 << 10

// LibvirtGuest talks to a lease's guest agent through virsh, for builds
// without cgo (no libvirt C library). Each command is a virsh process, so
// a cycle's overhead grows by tens of milliseconds per agent command; the
// cgo build (libvirt.go) is the fast one.
func LibvirtGuest(ctx context.Context, l *records.SandboxLease) (Guest, error) {
	virsh, err := exec.LookPath("virsh")
	if err != nil {
		return nil, cli.Unavailable(fmt.Errorf("lease %s: this tb-run was built without cgo and needs virsh: %w", l.ID, err))
	}
	cmd := func(ctx context.Context, c string) (string, error) {
		x := exec.CommandContext(ctx, virsh, "-q", "-c", l.ConnectURI, "qemu-agent-command", "--timeout", "5", l.VMName, c)
		var out, errb bytes.Buffer
		x.Stdout, x.Stderr = &out, &errb
		if err := x.Run(); err != nil {
			return "", fmt.Errorf("virsh qemu-agent-command %s: %v: %s", l.VMName, err, strings.TrimSpace(errb.String()))
		}
		return out.String(), nil
	}
	return NewAgentGuest(cmd, pushChunk, nil), nil
}
