// Package lease owns Talkbox's long-lived VMs: it acquires them for plans
// (reusing idle ones), keeps their state, health and TTL, releases, expires,
// reaps and heals them, snapshots and restores them, and places them over
// several libvirt hosts within pool quotas.
package lease

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"net/url"
	"os"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// Config is tb-lease's configuration file (JSON).
type Config struct {
	// Hosts are the libvirt hosts leases may be placed on; none means the
	// local system libvirtd.
	Hosts []HostConfig `json:"hosts,omitempty"`
	// Placement is the default strategy: least-loaded, native-arch-first
	// or explicit.
	Placement string `json:"placement,omitempty"`
	// Pools bound concurrent leases and VM-hours per pool.
	Pools map[string]PoolConfig `json:"pools,omitempty"`
	// Bridge is the lab bridge guests are attached to; LabNet its network,
	// whose first address is the guests' gateway.
	Bridge string `json:"bridge,omitempty"`
	LabNet string `json:"lab_net,omitempty"`
}

// HostConfig is one libvirt host.
type HostConfig struct {
	Name string `json:"name"`
	URI  string `json:"uri"`
	// Accel is auto (probe, for the local host; TCG for remote ones), kvm
	// or tcg: what this host really runs guests of its own architecture
	// with.
	Accel string `json:"accel,omitempty"`
	// Arch is the host's Debian architecture (default: this machine's).
	Arch string `json:"arch,omitempty"`
	// MaxLeases caps the leases placed on the host (0: no cap).
	MaxLeases int `json:"max_leases,omitempty"`
	// NetNS is the network namespace in which the host's libvirtd
	// attaches its guests' taps ("" for tb-lease's own). A guest is
	// started only on the bridge of a lab of this machine in that
	// namespace whose containment check passed (Labs).
	NetNS string `json:"netns,omitempty"`
}

// Remote reports whether the host is another machine's libvirtd (a URI
// with a host part: qemu+tcp://, qemu+ssh://), not this machine's. No
// lab of this machine contains its guests, so no lease goes there.
func (h HostConfig) Remote() bool {
	u, err := url.Parse(h.URI)
	return err != nil || u.Host != ""
}

// PoolConfig is a pool's quota.
type PoolConfig struct {
	MaxLeases int     `json:"max_leases,omitempty"`
	VMHours   float64 `json:"vm_hours,omitempty"`
}

// Placement strategies.
const (
	LeastLoaded     = "least-loaded"
	NativeArchFirst = "native-arch-first"
	Explicit        = "explicit"
)

// LoadConfig reads a configuration file; a missing file gives the defaults
// unless required.
func LoadConfig(path string, required bool) (*Config, error) {
	c := &Config{}
	if path != "" {
		b, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist) && !required:
		case err != nil:
			return nil, fault.Usage(fmt.Errorf("config: %w", err))
		default:
			dec := json.NewDecoder(strings.NewReader(string(b)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(c); err != nil {
				if strings.Contains(err.Error(), `unknown field "uncontained"`) {
					// An option earlier versions had: say what took its place.
					err = errors.New(`"uncontained" is no longer accepted: tb-lease places no lease on another machine's libvirtd; run tb-capture net up and tb-run worker on that machine instead (a fleet)`)
				}
				return nil, fault.DataErr(fmt.Errorf("%s: %w", path, err))
			}
		}
	}
	return c, c.check(path)
}

// defaultHostName names the local libvirtd of a configuration without hosts.
const defaultHostName = "local"

func (c *Config) check(path string) error {
	if len(c.Hosts) == 0 {
		c.Hosts = []HostConfig{{Name: defaultHostName, URI: virt.DefaultURI}}
	}
	seen := map[string]bool{}
	for i, h := range c.Hosts {
		if h.Name == "" || h.URI == "" {
			return fault.DataErr(fmt.Errorf("%s: host %d needs a name and a uri", path, i+1))
		}
		if seen[h.Name] {
			return fault.DataErr(fmt.Errorf("%s: host %q twice", path, h.Name))
		}
		seen[h.Name] = true
		switch h.Accel {
		case "", "auto", "kvm", "tcg":
		default:
			return fault.DataErr(fmt.Errorf("%s: host %s: accel %q is not auto, kvm or tcg", path, h.Name, h.Accel))
		}
	}
	switch c.Placement {
	case "":
		c.Placement = LeastLoaded
	case LeastLoaded, NativeArchFirst, Explicit:
	default:
		return fault.DataErr(fmt.Errorf("%s: placement %q is not least-loaded, native-arch-first or explicit", path, c.Placement))
	}
	// The bridge and network are the lab's (netlab owns them): without
	// a configuration or flag, the default lab's, as tb-capture net up
	// makes it with no flag.
	var lab netlab.Config
	lab.Defaults()
	c.Bridge = cmp.Or(c.Bridge, lab.Bridge)
	c.LabNet = cmp.Or(c.LabNet, lab.LabNet.String())
	if _, err := netip.ParsePrefix(c.LabNet); err != nil {
		return fault.DataErr(fmt.Errorf("%s: lab_net: %w", path, err))
	}
	return nil
}

// Host finds a configured host by name.
func (c *Config) Host(name string) (HostConfig, bool) {
	for _, h := range c.Hosts {
		if h.Name == name {
			return h, true
		}
	}
	return HostConfig{}, false
}
