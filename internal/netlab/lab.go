// Package netlab is the lab network of one host: the guests' bridge, the
// sinkhole namespace with its fake services (INetSim, dnsmasq), the
// containment tables, and the bookkeeping that lets "down" remove exactly
// what "up" made and "reconcile" find what a crash left.
package netlab

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"

	"github.com/talkbox-sandbox/talkbox/internal/files"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// Config is one lab instance. The zero value of each field takes the
// default lab (README, tb-capture); tests change names and subnets to run a private lab.
type Config struct {
	Name string `json:"name"`
	// HostNS is the network namespace playing the host ("" = this one).
	HostNS   string       `json:"host_ns,omitempty"`
	Bridge   string       `json:"bridge"`
	LabNet   netip.Prefix `json:"lab_net"`
	SinkNS   string       `json:"sink_ns"`
	SinkVeth string       `json:"sink_veth"`
	SinkNet  netip.Prefix `json:"sink_net"`
	Table    string       `json:"table"`
	// Uplink is where forwarded traffic leaves; Upstream the resolver
	// allow-listed names are forwarded to.
	Uplink   string     `json:"uplink,omitempty"`
	Upstream netip.Addr `json:"upstream,omitempty"`
	// Documentation lets documentation ranges stand in for the internet.
	Documentation bool     `json:"documentation,omitempty"`
	SMTPPorts     []uint16 `json:"smtp_ports,omitempty"`
	// Services to run: INetSim and the DNS sinkhole in the sinkhole
	// namespace, DHCP for guests on the bridge.
	INetSim bool `json:"inetsim"`
	DNS     bool `json:"dns"`
	DHCP    bool `json:"dhcp"`
	// INetSimServices overrides the INetSim services started.
	INetSimServices []string `json:"inetsim_services,omitempty"`
	// Dir holds the lab's generated configs, pid files and logs.
	Dir string `json:"dir"`
	// Limits bound each guest's load (firewall.DefaultLimits where zero).
	Limits firewall.Limits `json:"limits,omitzero"`
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.Name, DefaultName)
	def(&c.Bridge, "tb-lab0")
	def(&c.SinkNS, "tb-sink")
	def(&c.SinkVeth, "tb-sink0")
	def(&c.Table, "talkbox")
	if !c.LabNet.IsValid() {
		c.LabNet = netip.MustParsePrefix("10.13.37.0/24")
	}
	if !c.SinkNet.IsValid() {
		c.SinkNet = netip.MustParsePrefix("10.13.38.0/24")
	}
	if c.SMTPPorts == nil {
		c.SMTPPorts = firewall.DefaultSMTPPorts
	}
}

// Check refuses configs that cannot work.
func (c *Config) Check() error {
	var errs []string
	for what, n := range map[string]string{"bridge": c.Bridge, "sink veth": c.SinkVeth, "uplink": c.Uplink} {
		if len(n) > 15 {
			errs = append(errs, fmt.Sprintf("%s name %q longer than 15 characters", what, n))
		}
		// As the kernel refuses them: a slash or colon would also be taken
		// for a dot of the name in its sysctl's key (ifSysctl), naming
		// another interface's setting.
		if n == "." || n == ".." || strings.ContainsAny(n, "/: \t\n") {
			errs = append(errs, fmt.Sprintf("%s name %q is not an interface's name (no /, :, space, . or ..)", what, n))
		}
	}
	if !c.LabNet.Addr().Is4() || c.LabNet.Bits() > 29 || !c.SinkNet.Addr().Is4() || c.SinkNet.Bits() > 30 {
		errs = append(errs, "lab_net and sink_net must be IPv4 prefixes of at least /29 and /30")
	}
	if c.LabNet.Overlaps(c.SinkNet) {
		errs = append(errs, "lab_net and sink_net overlap")
	}
	if !strings.HasPrefix(c.Table, "talkbox") {
		errs = append(errs, fmt.Sprintf("table %q must start with talkbox", c.Table))
	}
	if c.Dir == "" {
		errs = append(errs, "no lab directory")
	}
	listen := inetsimListen()
	for _, s := range c.INetSimServices {
		if _, ok := listen[s]; !ok {
			errs = append(errs, fmt.Sprintf("INetSim service %q unknown", s))
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// ConfigChangedError refuses "up" with another config for a lab that is up.
type ConfigChangedError struct{ Lab string }

func (e *ConfigChangedError) Error() string {
	return fmt.Sprintf("lab %q is up with a different configuration: take it down first (tb-capture net down --lab %s)", e.Lab, e.Lab)
}

func sameConfig(a, b Config) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// Gateway is the host's address on the bridge (first host address).
func (c *Config) Gateway() netip.Addr { return c.LabNet.Masked().Addr().Next() }

// SinkHost is the host's end of the sinkhole link.
func (c *Config) SinkHost() netip.Addr { return c.SinkNet.Masked().Addr().Next() }

// Sinkhole is the sinkhole namespace's address.
func (c *Config) Sinkhole() netip.Addr { return c.SinkHost().Next() }

// HostNSPath is the host namespace's path ("" for this process's).
func (c *Config) HostNSPath() string { return netns.Path(c.HostNS) }

// Firewall is the lab's containment driver.
func (c *Config) Firewall() (*firewall.NFT, error) {
	tcp, udp := c.catchAll()
	return firewall.New(firewall.Config{
		Table: c.Table, NetNS: c.HostNSPath(), Bridge: c.Bridge, LabNet: c.LabNet, Gateway: c.Gateway(),
		SinkIface: c.SinkVeth, SinkNet: c.SinkNet, Sinkhole: c.Sinkhole(), Uplink: c.Uplink, Upstream: c.Upstream,
		SMTPPorts: c.SMTPPorts, DHCP: c.DHCP, Documentation: c.Documentation, Limits: c.Limits,
		CatchAllTCP: tcp, CatchAllUDP: udp,
	})
}

// Made records what Up created, so that Down removes exactly that.
type Made struct {
	Config   Config `json:"config"`
	Bridge   bool   `json:"bridge"`
	SinkNS   bool   `json:"sink_ns"`
	SinkVeth bool   `json:"sink_veth"`
	Table    bool   `json:"table"`
}

func statePath(dir string) string { return filepath.Join(dir, "lab.json") }

// Load reads the state of a lab that is up (os.ErrNotExist otherwise).
func Load(dir string) (*Made, error) {
	b, err := os.ReadFile(statePath(dir))
	if err != nil {
		return nil, err
	}
	var m Made
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", statePath(dir), err)
	}
	return &m, nil
}

func save(m *Made) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(statePath(m.Config.Dir), b, 0o644)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return files.WriteAtomic(path, data, mode)
}

func handleAt(path string) (*netlink.Handle, error) {
	if path == "" {
		return netlink.NewHandle()
	}
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns)
}

func addrOn(h *netlink.Handle, l netlink.Link, p netip.Prefix) error {
	a, _ := netlink.ParseAddr(p.String())
	if err := h.AddrAdd(l, a); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("address %s on %s: %w", p, l.Attrs().Name, err)
	}
	return nil
}

func sysctl(ns, key, val string) (old string, err error) {
	p := "/proc/sys/" + strings.Map(func(r rune) rune {
		switch r {
		case '.':
			return '/'
		case '/': // a dot of an interface's name (ifSysctl)
			return '.'
		}
		return r
	}, key)
	err = netns.Do(ns, func() error {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		old = strings.TrimSpace(string(b))
		if val == "" || old == val {
			return nil
		}
		return os.WriteFile(p, []byte(val), 0o644)
	})
	return old, err
}

// Up builds the lab (idempotent): each part is made only when missing, and
// what was made is recorded before the next part is attempted.
func Up(ctx context.Context, cfg Config) (*Made, error) {
	cfg.Defaults()
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	m, err := Load(cfg.Dir)
	if err != nil {
		m = &Made{}
	} else if !sameConfig(m.Config, cfg) {
		// Down must remove what was made: it cannot once the config changed.
		return nil, &ConfigChangedError{Lab: cfg.Name}
	}
	m.Config = cfg
	if err := save(m); err != nil {
		return nil, err
	}
	h, err := handleAt(cfg.HostNSPath())
	if err != nil {
		return nil, err
	}
	defer h.Close()

	// Bridge with the gateway address; no IPv6 on it, so guests have no
	// IPv6 path to the host at all.
	br, err := h.LinkByName(cfg.Bridge)
	if err != nil {
		la := netlink.NewLinkAttrs()
		la.Name = cfg.Bridge
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
			return m, fmt.Errorf("creating bridge %s: %w", cfg.Bridge, err)
		}
		m.Bridge = true
		if err := save(m); err != nil {
			return m, err
		}
		if br, err = h.LinkByName(cfg.Bridge); err != nil {
			return m, err
		}
	}
	if _, err := sysctl(cfg.HostNSPath(), ifSysctl("ipv6", cfg.Bridge, "disable_ipv6"), "1"); err != nil {
		return m, err
	}
	// A bridge whose MAC was never set takes the lowest of its ports'
	// MACs, and a change flushes every neighbour entry on it, the static
	// ones AttachPort makes included: set, it stays.
	if err := h.LinkSetHardwareAddr(br, br.Attrs().HardwareAddr); err != nil {
		return m, fmt.Errorf("bridge %s: fixing its MAC: %w", cfg.Bridge, err)
	}
	if err := limitFDB(cfg.HostNSPath(), br.Attrs().Index); err != nil {
		return m, fmt.Errorf("bridge %s: bounding its forwarding database: %w", cfg.Bridge, err)
	}
	if err := addrOn(h, br, netip.PrefixFrom(cfg.Gateway(), cfg.LabNet.Bits())); err != nil {
		return m, err
	}
	if err := h.LinkSetUp(br); err != nil {
		return m, err
	}

	// Sinkhole namespace and its link.
	if !netns.Exists(cfg.SinkNS) {
		if err := netns.Create(cfg.SinkNS); err != nil {
			return m, err
		}
		m.SinkNS = true
		if err := save(m); err != nil {
			return m, err
		}
	}
	if err := sinkLink(h, &cfg, m); err != nil {
		return m, err
	}

	if err := forwardOn(&cfg); err != nil {
		return m, err
	}

	fw, err := cfg.Firewall()
	if err != nil {
		return m, err
	}
	if err := fw.Up(ctx); err != nil {
		return m, err
	}
	m.Table = true
	if err := save(m); err != nil {
		return m, err
	}
	// Ports already on the bridge are guests too: registered, they are
	// kept apart and send nothing until AttachPort binds them.
	if ports, err := bridgePorts(h, br); err == nil && len(ports) > 0 {
		if err := fw.RegisterPorts(ctx, ports); err != nil {
			return m, err
		}
	}
	if err := startServices(ctx, &cfg); err != nil {
		return m, err
	}
	return m, save(m)
}

func sinkLink(h *netlink.Handle, cfg *Config, m *Made) error {
	host, err := h.LinkByName(cfg.SinkVeth)
	if err != nil {
		la := netlink.NewLinkAttrs()
		la.Name = cfg.SinkVeth
		peer := cfg.SinkVeth + "p"
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: peer}); err != nil {
			return fmt.Errorf("creating %s: %w", cfg.SinkVeth, err)
		}
		m.SinkVeth = true
		if err := save(m); err != nil {
			return err
		}
		pl, err := h.LinkByName(peer)
		if err != nil {
			return err
		}
		ns, err := os.Open(netns.Path(cfg.SinkNS))
		if err != nil {
			return err
		}
		err = h.LinkSetNsFd(pl, int(ns.Fd()))
		ns.Close()
		if err != nil {
			return fmt.Errorf("moving %s into %s: %w", peer, cfg.SinkNS, err)
		}
		if host, err = h.LinkByName(cfg.SinkVeth); err != nil {
			return err
		}
	}
	if err := addrOn(h, host, netip.PrefixFrom(cfg.SinkHost(), cfg.SinkNet.Bits())); err != nil {
		return err
	}
	if err := h.LinkSetUp(host); err != nil {
		return err
	}
	sh, err := handleAt(netns.Path(cfg.SinkNS))
	if err != nil {
		return err
	}
	defer sh.Close()
	if lo, err := sh.LinkByName("lo"); err == nil {
		_ = sh.LinkSetUp(lo)
	}
	in, err := sh.LinkByName(cfg.SinkVeth + "p")
	if err != nil {
		return fmt.Errorf("sinkhole end of %s: %w", cfg.SinkVeth, err)
	}
	if err := addrOn(sh, in, netip.PrefixFrom(cfg.Sinkhole(), cfg.SinkNet.Bits())); err != nil {
		return err
	}
	if err := sh.LinkSetUp(in); err != nil {
		return err
	}
	gw := net.IP(cfg.SinkHost().AsSlice())
	if err := sh.RouteReplace(&netlink.Route{LinkIndex: in.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("sinkhole default route: %w", err)
	}
	return nil
}

// FDBMaxLearned bounds the forwarding entries the bridge learns. Guests'
// ports learn nothing (AttachPort gives each a static entry); this bounds
// what a port attached any other way could make the bridge hold.
const FDBMaxLearned = 256

func limitFDB(nsPath string, index int) error {
	return netns.Do(nsPath, func() error {
		req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
		msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
		msg.Index = int32(index)
		req.AddData(msg)
		info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
		info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("bridge"))
		data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
		data.AddRtAttr(unix.IFLA_BR_FDB_MAX_LEARNED, nl.Uint32Attr(FDBMaxLearned))
		req.AddData(info)
		_, err := req.Execute(unix.NETLINK_ROUTE, 0)
		return err
	})
}

func bridgePorts(h *netlink.Handle, br netlink.Link) ([]string, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// Down removes what Up made, in reverse order, and forgets the lab. Parts
// already gone are skipped; the first failure stops it with the state
// kept, so that it can be run again.
func Down(ctx context.Context, dir string) error {
	m, err := Load(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	cfg := m.Config
	stopServices(&cfg)
	if m.Table {
		fw, err := cfg.Firewall()
		if err != nil {
			return err
		}
		if err := fw.Down(ctx); err != nil {
			return err
		}
	}
	h, err := handleAt(cfg.HostNSPath())
	if err != nil {
		return err
	}
	defer h.Close()
	if m.SinkVeth {
		if l, err := h.LinkByName(cfg.SinkVeth); err == nil {
			if err := h.LinkDel(l); err != nil {
				return fmt.Errorf("deleting %s: %w", cfg.SinkVeth, err)
			}
		}
	}
	if m.SinkNS {
		if err := netns.Delete(cfg.SinkNS); err != nil {
			return err
		}
	}
	if m.Bridge {
		if l, err := h.LinkByName(cfg.Bridge); err == nil {
			if err := h.LinkDel(l); err != nil {
				return fmt.Errorf("deleting %s: %w", cfg.Bridge, err)
			}
		}
	}
	// The lab's own interfaces are gone, and what they were set to with
	// them: only their records are left to forget, whatever other labs
	// are up (each lab's interfaces are its own).
	for _, name := range []string{cfg.Bridge, cfg.SinkVeth} {
		if err := forgetSysctl(cfg.HostNSPath(), ifForwarding(name)); err != nil {
			return err
		}
	}
	if !otherLabUp(&cfg) {
		if err := restoreForwarding(&cfg); err != nil {
			return err
		}
	}
	os.RemoveAll(RunDir(&cfg))
	return os.RemoveAll(dir)
}

// forwardingKeys are the sysctls that let the lab route: IPv4 forwarding
// on the lab's own interfaces only (a packet is forwarded if the interface
// it came in by forwards), never host-wide, so the host routes nothing
// else because a lab is up.
func forwardingKeys(cfg *Config) []string {
	keys := []string{ifForwarding(cfg.Bridge), ifForwarding(cfg.SinkVeth)}
	if cfg.Uplink != "" {
		keys = append(keys, ifForwarding(cfg.Uplink))
	}
	return keys
}

func ifForwarding(name string) string { return ifSysctl("ipv4", name, "forwarding") }

// ifSysctl is the key of an interface's setting, written as sysctl(8)
// writes it: a dot of the name (a VLAN's "eth0.100") is a slash, as a
// dot there would be taken for a separator.
func ifSysctl(family, name, setting string) string {
	return "net." + family + ".conf." + strings.ReplaceAll(name, ".", "/") + "." + setting
}

func forwardOn(cfg *Config) error {
	for _, key := range forwardingKeys(cfg) {
		old, err := sysctl(cfg.HostNSPath(), key, "1")
		if errors.Is(err, os.ErrNotExist) && cfg.Uplink != "" && key == ifForwarding(cfg.Uplink) {
			// An uplink that is not there yet forwards nothing; nothing
			// can be allowed out by it either (the firewall checks it).
			continue
		}
		if err != nil {
			return err
		}
		if err := rememberSysctl(cfg.HostNSPath(), key, old); err != nil {
			return err
		}
	}
	return nil
}

// sysctlFile keeps, per network namespace and setting, what the first lab
// found there, so that the last lab to go down restores it whichever lab
// that is. /run is cleared at boot, as the settings are.
func sysctlFile(ns, key string) (string, error) {
	ns = cmp.Or(ns, "/proc/self/ns/net")
	var st unix.Stat_t
	if err := unix.Stat(ns, &st); err != nil {
		return "", fmt.Errorf("network namespace %s: %w", ns, err)
	}
	// A key's slashes (ifSysctl) are colons here, which no interface's
	// name holds.
	name := strings.ReplaceAll(strings.TrimPrefix(key, "net.ipv4."), "/", ":")
	return filepath.Join("/run/talkbox", fmt.Sprintf("%s.%d-%d", name, st.Dev, st.Ino)), nil
}

func rememberSysctl(ns, key, old string) error {
	p, err := sysctlFile(ns, key)
	if err != nil {
		return err
	}
	if _, err := os.Stat(p); err == nil {
		return nil // an earlier lab recorded what it found
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(old+"\n"), 0o644)
}

// keptSysctls are the settings rememberSysctl kept for ns; among them
// net.ipv4.ip_forward, if a lab of a version before per-interface
// forwarding turned it on.
func keptSysctls(ns string) ([]string, error) {
	any, err := sysctlFile(ns, "")
	if err != nil {
		return nil, err
	}
	suffix := filepath.Base(any) // "." and the namespace's device and inode
	ents, err := os.ReadDir(filepath.Dir(any))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), suffix); ok && name != "" {
			keys = append(keys, "net.ipv4."+strings.ReplaceAll(name, ":", "/"))
		}
	}
	return keys, nil
}

// forgetSysctl removes what rememberSysctl kept for key in ns.
func forgetSysctl(ns, key string) error {
	p, err := sysctlFile(ns, key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// restoreForwarding puts back what the forwarding settings the labs of
// the namespace kept were before the first of them: this lab's, and the
// uplinks of labs that went down while another was up (an uplink may be
// shared, so its setting stays until the last lab is down). An interface
// already gone has nothing to restore.
func restoreForwarding(cfg *Config) error {
	kept, err := keptSysctls(cfg.HostNSPath())
	if err != nil {
		return err
	}
	for _, key := range append(forwardingKeys(cfg), kept...) {
		p, err := sysctlFile(cfg.HostNSPath(), key)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if v := strings.TrimSpace(string(b)); v == "0" || v == "1" {
			if _, err := sysctl(cfg.HostNSPath(), key, v); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	return nil
}

// otherLabUp reports whether another lab shares this namespace; forwarding
// stays on for it. When that cannot be told, it is assumed, because turning
// forwarding off under a running lab breaks it while leaving it on does not
// weaken containment (the lab's nftables rules decide what is forwarded).
func otherLabUp(cfg *Config) bool {
	fw, err := cfg.Firewall()
	if err != nil {
		return true
	}
	others, err := fw.OthersPresent()
	return err != nil || others
}

// Status is what the lab looks like now.
type Status struct {
	Name     string           `json:"name"`
	Up       bool             `json:"up"`
	Bridge   bool             `json:"bridge"`
	SinkNS   bool             `json:"sink_ns"`
	Uplink   string           `json:"uplink,omitempty"`
	UplinkUp bool             `json:"uplink_up"`
	Ports    []string         `json:"ports,omitempty"`
	Services []ServiceStatus  `json:"services,omitempty"`
	Firewall *firewall.Status `json:"firewall,omitempty"`
	Config   Config           `json:"config"`
}

func inspect(ctx context.Context, cfg Config) (*Status, error) {
	st := &Status{Name: cfg.Name, Config: cfg, Uplink: cfg.Uplink}
	h, err := handleAt(cfg.HostNSPath())
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if br, err := h.LinkByName(cfg.Bridge); err == nil {
		st.Bridge = br.Attrs().Flags&net.FlagUp != 0
		st.Ports, _ = bridgePorts(h, br)
	}
	if cfg.Uplink != "" {
		if l, err := h.LinkByName(cfg.Uplink); err == nil {
			st.UplinkUp = l.Attrs().Flags&net.FlagUp != 0
		}
	}
	st.SinkNS = netns.Exists(cfg.SinkNS)
	st.Services = serviceStatus(&cfg)
	fw, err := cfg.Firewall()
	if err != nil {
		return nil, err
	}
	if st.Firewall, err = fw.Status(ctx); err != nil {
		return nil, err
	}
	st.Up = st.Bridge && st.SinkNS && st.Firewall.Up
	for _, s := range st.Services {
		st.Up = st.Up && s.Running
	}
	return st, nil
}
