package lease

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// HostLabs are the labs of this host (capture.Labs): the check, and the
// binding of a lease's tap at the bridge of the lab that passed it.
type HostLabs struct{ capture.Labs }

// Attach binds port p to its MAC and IPv4 at bridge, once the lab it
// belongs to passes Contained.
func (h HostLabs) Attach(ctx context.Context, hostNS, bridge string, labNet netip.Prefix, p netlab.Port) error {
	if err := h.Contained(ctx, hostNS, bridge, labNet); err != nil {
		return err
	}
	cfg, err := h.ByBridge(hostNS, bridge)
	if err != nil {
		return err
	}
	return netlab.AttachPort(ctx, cfg, p)
}

// Detach forgets port's binding at bridge (a lab that is gone has none).
func (h HostLabs) Detach(ctx context.Context, hostNS, bridge, port string) error {
	cfg, err := h.ByBridge(hostNS, bridge)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return netlab.DetachPort(ctx, cfg, port)
}

// port is a lease's tap as the lab binds it.
func port(l *records.SandboxLease) (netlab.Port, error) {
	mac, err := net.ParseMAC(l.MAC)
	if err != nil {
		return netlab.Port{}, fmt.Errorf("lease %s: MAC %q: %w", l.ID, l.MAC, err)
	}
	ip, err := netip.ParseAddr(l.IP)
	if err != nil {
		return netlab.Port{}, fmt.Errorf("lease %s: address %q: %w", l.ID, l.IP, err)
	}
	return netlab.Port{Name: l.Tap, MAC: mac, IP: ip}, nil
}

// run starts a lease's guest: start creates its domain paused, with its
// tap; the tap is bound to the lease's MAC and address at the lab's bridge
// and only then does the guest run, so that no frame of it passes unbound.
// A domain whose tap cannot be bound is destroyed.
func (m *Manager) run(ctx context.Context, c Host, l *records.SandboxLease, start func() error) error {
	h, ok := m.Cfg.Host(l.Host)
	if !ok {
		return fmt.Errorf("lease %s is on host %s, which is not configured", l.ID, l.Host)
	}
	if m.Labs == nil {
		return errors.New("no lab configured: tb-lease starts no guest without one")
	}
	labNet, err := netip.ParsePrefix(m.Cfg.LabNet)
	if err != nil {
		return fmt.Errorf("lab network: %w", err)
	}
	p, err := port(l)
	if err != nil {
		return err
	}
	if err := start(); err != nil {
		return err
	}
	err = m.Labs.Attach(ctx, h.NetNS, l.Bridge, labNet, p)
	if err == nil {
		err = c.Resume(ctx, l.VMName)
	}
	if err != nil {
		c.Destroy(context.WithoutCancel(ctx), l.VMName)
		return fmt.Errorf("binding tap %s of lease %s: %w", l.Tap, l.ID, err)
	}
	return nil
}

// detach forgets the binding of a lease's tap.
func (m *Manager) detach(ctx context.Context, l *records.SandboxLease) error {
	h, ok := m.Cfg.Host(l.Host)
	if !ok || m.Labs == nil || l.Tap == "" {
		return nil
	}
	return m.Labs.Detach(ctx, h.NetNS, l.Bridge, l.Tap)
}
