// Package virt is Talkbox's hypervisor boundary: start and destroy guests
// booted directly from a kernel, carry commands to their QEMU guest agent
// (the transport of internal/guestagent), and choose between KVM and TCG by
// a real probe. Hypervisor is the small interface the tools use; Libvirt
// implements it over libvirtd.
package virt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
)

// Hypervisor starts and controls guests.
type Hypervisor interface {
	// Start creates and boots a transient guest; it is gone once destroyed.
	Start(ctx context.Context, cfg DomainConfig) error
	// Destroy stops a guest at once. A guest that is not there is not an error.
	Destroy(ctx context.Context, name string) error
	// The guest agent of a running guest.
	guestagent.Transport
	// EnsureNetwork makes sure an isolated network exists: a bridge with no
	// uplink, on which guests reach only each other (and the host, if the
	// network has a host address).
	EnsureNetwork(ctx context.Context, n NetworkConfig) error
	Close() error
}

// Accel is how guests are run.
type Accel string

const (
	KVM Accel = "kvm"
	TCG Accel = "tcg"
)

// DomainConfig describes a guest booted directly from a kernel.
type DomainConfig struct {
	Name     string
	Accel    Accel
	Emulator string // QEMU system binary, a name or a path
	Arch     string // QEMU architecture: x86_64, i686, aarch64, armv7l, mipsel, …
	Machine  string
	// CPU is a CPU model for TCG ("" for QEMU's default); KVM always uses
	// host-passthrough.
	CPU       string
	MemoryMiB int
	VCPUs     int
	Kernel    string
	Initrd    string
	Cmdline   string
	Disks     []Disk
	// ConsoleLog receives the guest's first serial console.
	ConsoleLog string
	NICs       []NIC
}

// Disk is one block device.
type Disk struct {
	Path     string
	Format   string // qcow2 or raw
	Bus      string // virtio (default), scsi, ide
	ReadOnly bool
}

// NIC is one network interface, attached to a libvirt network or a bridge.
type NIC struct {
	Network string
	Bridge  string
	MAC     string
	Model   string // virtio (default)
}

// NetworkConfig is an isolated network: a bridge with no uplink, DHCP or
// DNS.
type NetworkConfig struct {
	Name   string
	Bridge string
	// HostCIDR is the host's address on the bridge, e.g. 10.13.37.1/24;
	// empty leaves the host off the network.
	HostCIDR string
}

// Guest is a started domain: its guest agent, and the console that says
// why the agent did not come.
type Guest struct {
	*guestagent.Client
	Name string
	// ConsoleLog is read for the tail shown when the guest fails.
	ConsoleLog string
}

// NewGuest is domain name of h, whose serial console goes to consoleLog.
func NewGuest(h Hypervisor, name, consoleLog string) *Guest {
	return &Guest{Client: guestagent.New(h, name), Name: name, ConsoleLog: consoleLog}
}

// WaitAgent waits until the agent answers or ctx ends; a guest that did
// not come up is a BootError with the end of the serial console.
func (g *Guest) WaitAgent(ctx context.Context) error {
	err := g.Wait(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, guestagent.ErrGone):
		return &BootError{Err: fmt.Errorf("%s stopped before its guest agent answered: %w", g.Name, err), Console: g.ConsoleTail(20)}
	}
	return &BootError{Err: fmt.Errorf("guest agent of %s did not answer: %w", g.Name, err), Console: g.ConsoleTail(20)}
}

// BootError is a guest that did not come up, with what its console said.
type BootError struct {
	Err     error
	Console string
}

func (e *BootError) Error() string {
	if e.Console == "" {
		return e.Err.Error() + " (console empty)"
	}
	return e.Err.Error() + "; console ends: " + strings.ReplaceAll(strings.TrimSpace(e.Console), "\n", " | ")
}
func (e *BootError) Unwrap() error { return e.Err }

// ConsoleTail returns the last n lines of the serial console log.
func (g *Guest) ConsoleTail(n int) string {
	b, err := os.ReadFile(g.ConsoleLog)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(strings.ReplaceAll(string(b), "\r", ""), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
