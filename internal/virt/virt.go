// Package virt is Talkbox's hypervisor boundary: start and destroy guests
// booted directly from a kernel, talk to their QEMU guest agent, and choose
// between KVM and TCG by a real probe. Hypervisor is the small interface the
// tools use; Libvirt implements it over libvirtd.
package virt

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// Hypervisor starts and controls guests.
type Hypervisor interface {
	// Start creates and boots a transient guest; it is gone once destroyed.
	Start(ctx context.Context, cfg DomainConfig) error
	// Destroy stops a guest at once. A guest that is not there is not an error.
	Destroy(ctx context.Context, name string) error
	// AgentCommand sends one QMP-style JSON command to the guest agent and
	// returns the raw JSON reply. ErrAgentNotReady means nobody answered yet.
	AgentCommand(ctx context.Context, name, cmd string) (string, error)
	// EnsureNetwork makes sure an isolated network exists: a bridge with no
	// uplink, on which guests reach only each other (and the host, if the
	// network has a host address).
	EnsureNetwork(ctx context.Context, n NetworkConfig) error
	Close() error
}

// ErrAgentNotReady is returned by AgentCommand while the guest agent is not
// connected or does not answer.
var ErrAgentNotReady = errors.New("guest agent not ready")

// ErrGuestGone is returned when the guest is not running any more (it
// powered off, panicked or was destroyed).
var ErrGuestGone = errors.New("guest is not running")

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

// Guest is a started domain and what its guest agent can do.
type Guest struct {
	H    Hypervisor
	Name string
	// ConsoleLog is read for the tail shown when the guest fails.
	ConsoleLog string
}

// Ping asks the agent once whether it is there.
func (g *Guest) Ping(ctx context.Context) error {
	_, err := g.H.AgentCommand(ctx, g.Name, `{"execute":"guest-ping"}`)
	return err
}

// WaitAgent pings until the agent answers or ctx ends; the error then
// carries the end of the serial console.
func (g *Guest) WaitAgent(ctx context.Context) error {
	// The agent gives no event when it comes up; asking every 200 ms is
	// the protocol's way to find out.
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		err := g.Ping(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrGuestGone) {
			return &BootError{Err: fmt.Errorf("%s stopped before its guest agent answered: %w", g.Name, err), Console: g.ConsoleTail(20)}
		}
		if !errors.Is(err, ErrAgentNotReady) {
			last = err
		}
		select {
		case <-ctx.Done():
			why := ctx.Err()
			if last != nil {
				why = fmt.Errorf("%w (last agent error: %v)", why, last)
			}
			return &BootError{Err: fmt.Errorf("guest agent of %s did not answer: %w", g.Name, why), Console: g.ConsoleTail(20)}
		case <-tick.C:
		}
	}
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

// ExecResult is a finished guest process.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// Exec runs a program in the guest and waits for it to finish.
func (g *Guest) Exec(ctx context.Context, path string, args ...string) (*ExecResult, error) {
	req, _ := json.Marshal(map[string]any{"execute": "guest-exec", "arguments": map[string]any{
		"path": path, "arg": args, "capture-output": true}})
	raw, err := g.H.AgentCommand(ctx, g.Name, string(req))
	if err != nil {
		return nil, fmt.Errorf("guest-exec %s: %w", path, err)
	}
	var started struct {
		Return struct {
			PID int `json:"pid"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(raw), &started); err != nil {
		return nil, fmt.Errorf("guest-exec %s: bad reply %q", path, raw)
	}
	status := fmt.Sprintf(`{"execute":"guest-exec-status","arguments":{"pid":%d}}`, started.Return.PID)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		raw, err := g.H.AgentCommand(ctx, g.Name, status)
		if err != nil {
			return nil, fmt.Errorf("guest-exec-status %s: %w", path, err)
		}
		var st struct {
			Return struct {
				Exited   bool   `json:"exited"`
				ExitCode int    `json:"exitcode"`
				Signal   int    `json:"signal"`
				Out      string `json:"out-data"`
				Err      string `json:"err-data"`
			} `json:"return"`
		}
		if err := json.Unmarshal([]byte(raw), &st); err != nil {
			return nil, fmt.Errorf("guest-exec-status %s: bad reply %q", path, raw)
		}
		if st.Return.Exited {
			r := &ExecResult{ExitCode: st.Return.ExitCode}
			if st.Return.Signal != 0 {
				r.ExitCode = 128 + st.Return.Signal
			}
			r.Stdout, _ = base64.StdEncoding.DecodeString(st.Return.Out)
			r.Stderr, _ = base64.StdEncoding.DecodeString(st.Return.Err)
			return r, nil
		}
		// guest-exec-status has no blocking form; poll it.
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("guest-exec %s: %w", path, ctx.Err())
		case <-tick.C:
		}
	}
}

// ReadFile reads a whole file from the guest (at most max bytes).
func (g *Guest) ReadFile(ctx context.Context, path string, max int) ([]byte, error) {
	req, _ := json.Marshal(map[string]any{"execute": "guest-file-open", "arguments": map[string]any{"path": path, "mode": "r"}})
	raw, err := g.H.AgentCommand(ctx, g.Name, string(req))
	if err != nil {
		return nil, fmt.Errorf("guest-file-open %s: %w", path, err)
	}
	var open struct {
		Return int `json:"return"`
	}
	if err := json.Unmarshal([]byte(raw), &open); err != nil {
		return nil, fmt.Errorf("guest-file-open %s: bad reply %q", path, raw)
	}
	defer g.H.AgentCommand(context.WithoutCancel(ctx), g.Name, fmt.Sprintf(`{"execute":"guest-file-close","arguments":{"handle":%d}}`, open.Return))
	var out []byte
	for len(out) < max {
		raw, err := g.H.AgentCommand(ctx, g.Name, fmt.Sprintf(`{"execute":"guest-file-read","arguments":{"handle":%d,"count":%d}}`, open.Return, min(max-len(out), 48<<10)))
		if err != nil {
			return nil, fmt.Errorf("guest-file-read %s: %w", path, err)
		}
		var rd struct {
			Return struct {
				Count int    `json:"count"`
				Buf   string `json:"buf-b64"`
				EOF   bool   `json:"eof"`
			} `json:"return"`
		}
		if err := json.Unmarshal([]byte(raw), &rd); err != nil {
			return nil, fmt.Errorf("guest-file-read %s: bad reply %q", path, raw)
		}
		b, err := base64.StdEncoding.DecodeString(rd.Return.Buf)
		if err != nil {
			return nil, fmt.Errorf("guest-file-read %s: %w", path, err)
		}
		out = append(out, b...)
		if rd.Return.EOF || rd.Return.Count == 0 {
			break
		}
	}
	return out, nil
}

// Interface is one guest network interface as the agent reports it.
type Interface struct {
	Name      string   `json:"name"`
	MAC       string   `json:"hardware-address"`
	Addresses []string `json:"addresses"` // CIDR
}

// Interfaces lists the guest's network interfaces and their addresses.
func (g *Guest) Interfaces(ctx context.Context) ([]Interface, error) {
	raw, err := g.H.AgentCommand(ctx, g.Name, `{"execute":"guest-network-get-interfaces"}`)
	if err != nil {
		return nil, fmt.Errorf("guest-network-get-interfaces: %w", err)
	}
	var rep struct {
		Return []struct {
			Name string `json:"name"`
			MAC  string `json:"hardware-address"`
			IPs  []struct {
				Addr   string `json:"ip-address"`
				Prefix int    `json:"prefix"`
			} `json:"ip-addresses"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(raw), &rep); err != nil {
		return nil, fmt.Errorf("guest-network-get-interfaces: bad reply %q", raw)
	}
	var out []Interface
	for _, r := range rep.Return {
		i := Interface{Name: r.Name, MAC: r.MAC}
		for _, a := range r.IPs {
			i.Addresses = append(i.Addresses, fmt.Sprintf("%s/%d", a.Addr, a.Prefix))
		}
		out = append(out, i)
	}
	return out, nil
}
