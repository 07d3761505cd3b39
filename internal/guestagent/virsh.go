package guestagent

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Virsh is the Transport through virsh qemu-agent-command, for builds
// without cgo (no libvirt C library). Each command is a virsh process,
// tens of milliseconds more than virt.Libvirt's call into the library.
type Virsh struct {
	uri, path string
}

// NewVirsh is the transport to the domains of libvirt URI uri ("" is
// virsh's default), through the virsh on PATH.
func NewVirsh(uri string) (*Virsh, error) {
	p, err := exec.LookPath("virsh")
	if err != nil {
		return nil, fmt.Errorf("virsh (package libvirt-clients): %w", err)
	}
	return &Virsh{uri: uri, path: p}, nil
}

// AgentCommand runs virsh qemu-agent-command and sorts its errors as
// libvirt's codes are sorted in virt.Libvirt: by libvirt's messages, which
// virsh prints.
func (v *Virsh) AgentCommand(ctx context.Context, domain, cmd string) (string, error) {
	args := []string{"-q"}
	if v.uri != "" {
		args = append(args, "-c", v.uri)
	}
	args = append(args, "qemu-agent-command", "--timeout", strconv.Itoa(CommandTimeout), domain, cmd)
	x := exec.CommandContext(ctx, v.path, args...)
	var out, errb bytes.Buffer
	x.Stdout, x.Stderr = &out, &errb
	if err := x.Run(); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		msg := strings.TrimSpace(errb.String())
		msg = strings.ReplaceAll(strings.TrimPrefix(msg, "error: "), "\nerror: ", ": ")
		switch {
		case msg == "":
			return "", fmt.Errorf("virsh qemu-agent-command %s: %w", domain, err)
		case strings.Contains(msg, "failed to get domain"), strings.Contains(msg, "Domain not found"), strings.Contains(msg, "domain is not running"):
			return "", fmt.Errorf("%s: %w (%s)", domain, ErrGone, msg)
		case strings.Contains(msg, "Guest agent is not responding"):
			return "", fmt.Errorf("%w: %s", ErrNotReady, msg)
		}
		return "", fmt.Errorf("guest %s: %s", domain, msg)
	}
	return out.String(), nil
}
