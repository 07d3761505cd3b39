package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Port is a guest's port on the lab's bridge: its interface, MAC and IPv4.
type Port struct {
	Name string
	MAC  net.HardwareAddr
	IP   netip.Addr
}

func (p Port) check(cfg *Config) error {
	if p.Name == "" || len(p.Name) > 15 {
		return fmt.Errorf("port %q: not an interface name", p.Name)
	}
	if len(p.MAC) != 6 || p.MAC[0]&1 != 0 || bytes.Equal(p.MAC, make([]byte, 6)) {
		return fmt.Errorf("port %s: MAC %q is not a unicast Ethernet address", p.Name, p.MAC)
	}
	// Neither the gateway, nor the network or broadcast address.
	if !p.IP.Is4() || !cfg.LabNet.Contains(p.IP) || p.IP == cfg.Gateway() ||
		p.IP == cfg.LabNet.Masked().Addr() || !cfg.LabNet.Contains(p.IP.Next()) {
		return fmt.Errorf("port %s: %s is not a guest address in %s", p.Name, p.IP, cfg.LabNet)
	}
	return nil
}

// AttachPort puts a guest's interface (a tap, or a veth in tests) on the
// bridge, isolated from the other ports, and binds it to the guest's MAC
// and IPv4: the bridge drops every frame from it with another source MAC,
// IPv4 source or ARP sender, and the lease's rules match only packets that
// came in by it. The bridge learns nothing from it (a static forwarding
// entry sends the guest's MAC there and nowhere else) and the host's
// neighbour entry for its address is static, so no ARP can move either.
// It is idempotent: attaching again replaces the binding.
func AttachPort(ctx context.Context, cfg Config, p Port) error {
	cfg.Defaults()
	if err := p.check(&cfg); err != nil {
		return err
	}
	h, err := handleAt(cfg.HostNSPath())
	if err != nil {
		return err
	}
	defer h.Close()
	br, err := h.LinkByName(cfg.Bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w (tb-capture net up)", cfg.Bridge, err)
	}
	l, err := h.LinkByName(p.Name)
	if err != nil {
		return fmt.Errorf("interface %s: %w", p.Name, err)
	}
	// Bound before the port joins the bridge, so that no frame of the
	// guest's passes unbound.
	fw, err := cfg.Firewall()
	if err != nil {
		return err
	}
	if err := fw.BindPort(ctx, p.Name, l.Attrs().Index, p.MAC, p.IP); err != nil {
		return err
	}
	if l.Attrs().MasterIndex != br.Attrs().Index {
		if err := h.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("attaching %s to %s: %w", p.Name, cfg.Bridge, err)
		}
	}
	if err := h.LinkSetIsolated(l, true); err != nil {
		return fmt.Errorf("isolating %s: %w", p.Name, err)
	}
	if err := h.LinkSetLearning(l, false); err != nil {
		return fmt.Errorf("turning off learning on %s: %w", p.Name, err)
	}
	// Unknown unicast is not flooded to guests: the host's frames for
	// one guest never reach another.
	if err := h.LinkSetFlood(l, false); err != nil {
		return fmt.Errorf("turning off flooding to %s: %w", p.Name, err)
	}
	// The guest's MAC is at this port only: static, so it never ages out,
	// and sticky, so a frame with that source MAC on another port (one
	// that learns) does not move it there.
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_MASTER | netlink.NTF_STICKY,
		State: netlink.NUD_NOARP, HardwareAddr: p.MAC}); err != nil {
		return fmt.Errorf("forwarding entry for %s on %s: %w", p.MAC, p.Name, err)
	}
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: p.IP.AsSlice(), HardwareAddr: p.MAC}); err != nil {
		return fmt.Errorf("neighbour entry for %s on %s: %w", p.IP, cfg.Bridge, err)
	}
	return h.LinkSetUp(l)
}

// DetachPort undoes AttachPort: the port's binding, its static entries and
// its place on the bridge go. What is already gone is skipped.
func DetachPort(ctx context.Context, cfg Config, name string) error {
	cfg.Defaults()
	fw, err := cfg.Firewall()
	if err != nil {
		return err
	}
	bound, err := fw.UnbindPort(ctx, name)
	if err != nil {
		return err
	}
	h, err := handleAt(cfg.HostNSPath())
	if err != nil {
		return err
	}
	defer h.Close()
	br, err := h.LinkByName(cfg.Bridge)
	if err != nil {
		return nil // no bridge: nothing of the port is left on it
	}
	if bound.IP.IsValid() {
		n := &netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, IP: bound.IP.AsSlice()}
		if err := h.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("neighbour entry for %s on %s: %w", bound.IP, cfg.Bridge, err)
		}
	}
	l, err := h.LinkByName(name)
	if err != nil {
		return nil // the port is gone, and its forwarding entry with it
	}
	if l.Attrs().MasterIndex == br.Attrs().Index {
		if err := h.LinkSetNoMaster(l); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("detaching %s from %s: %w", name, cfg.Bridge, err)
		}
	}
	return nil
}
