package virt

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
)

// ensureBridge creates n.Bridge if it is missing, brings it up and, when
// n.HostCIDR is set, gives the host that address on it. Nothing is
// enslaved to it, so it has no uplink.
func ensureBridge(ctx context.Context, n NetworkConfig) error {
	if n.Bridge == "" || len(n.Bridge) > 15 {
		return fmt.Errorf("network %s: bridge name %q must be 1 to 15 characters", n.Name, n.Bridge)
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		return fault.Unavailable(fmt.Errorf("ip not found (creates the isolated bridge): install the Debian package iproute2"))
	}
	if _, err := net.InterfaceByName(n.Bridge); err != nil {
		out, err := exec.CommandContext(ctx, ip, "link", "add", "name", n.Bridge, "type", "bridge").CombinedOutput()
		if err != nil && !strings.Contains(string(out), "File exists") {
			return fmt.Errorf("creating bridge %s: %s", n.Bridge, strings.TrimSpace(string(out)))
		}
	}
	if n.HostCIDR != "" {
		out, err := exec.CommandContext(ctx, ip, "addr", "replace", n.HostCIDR, "dev", n.Bridge).CombinedOutput()
		if err != nil {
			return fmt.Errorf("address %s on bridge %s: %s", n.HostCIDR, n.Bridge, strings.TrimSpace(string(out)))
		}
	}
	out, err := exec.CommandContext(ctx, ip, "link", "set", n.Bridge, "up").CombinedOutput()
	if err != nil {
		return fmt.Errorf("bringing bridge %s up: %s", n.Bridge, strings.TrimSpace(string(out)))
	}
	return nil
}
