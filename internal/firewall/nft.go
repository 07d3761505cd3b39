package firewall

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Config is the lab the rules contain. Every name and address is
// configurable so that tests run a private lab next to the real one.
type Config struct {
	// Table is the name of talkbox's tables (inet, bridge and netdev);
	// it must start with "talkbox".
	Table string `json:"table"`
	// NetNS is the network namespace (a path such as /run/netns/NAME) the
	// rules live in; "" is the caller's.
	NetNS string `json:"netns,omitempty"`
	// Bridge is the guests' bridge; Gateway its address in LabNet.
	Bridge  string       `json:"bridge"`
	LabNet  netip.Prefix `json:"lab_net"`
	Gateway netip.Addr   `json:"gateway"`
	// SinkIface is the host end of the link to the sinkhole namespace,
	// Sinkhole the address every redirected packet goes to.
	SinkIface string       `json:"sink_iface"`
	SinkNet   netip.Prefix `json:"sink_net"`
	Sinkhole  netip.Addr   `json:"sinkhole"`
	// Uplink is the interface forwarded traffic leaves by ("" = none:
	// nothing can be forwarded). Upstream is the resolver the sinkhole's
	// DNS may forward allow-listed names to.
	Uplink   string     `json:"uplink,omitempty"`
	Upstream netip.Addr `json:"upstream,omitempty"`
	// SMTPPorts are never forwarded unless a lease forces them.
	SMTPPorts []uint16 `json:"smtp_ports"`
	// CatchAllTCP and CatchAllUDP, when set, send a guest's TCP or UDP
	// bound for the sinkhole to a port the sinkhole serves nothing on to
	// its catch-all listener instead; unset, the port is kept.
	CatchAllTCP *CatchAll `json:"catch_all_tcp,omitempty"`
	CatchAllUDP *CatchAll `json:"catch_all_udp,omitempty"`
	// DHCP accepts guests' DHCP requests to the gateway.
	DHCP bool `json:"dhcp"`
	// Documentation lets documentation ranges stand in for the internet.
	Documentation bool `json:"documentation,omitempty"`
	// MaxElements caps each of a lease's verdict sets (default 65536); the
	// kernel refuses a batch that would overflow one, and nothing changes.
	MaxElements uint32 `json:"max_elements,omitempty"`
	// Limits bound each guest's load (DefaultLimits where zero).
	Limits Limits `json:"limits,omitzero"`
}

// CatchAll is the sinkhole's listener for the ports it serves nothing on:
// a bot whose C2 listens on any port gets its connection accepted and sends
// its first bytes (which the capture on its tap sees with the port it
// asked for) where it would otherwise get a reset and send nothing.
type CatchAll struct {
	// Port is where the catch-all listens.
	Port uint16 `json:"port"`
	// Served are the ports the sinkhole's services listen on: a packet to
	// one of them keeps its port.
	Served []uint16 `json:"served"`
}

// LeaseRules is what one lease gets.
type LeaseRules struct {
	Lease string     `json:"lease"`
	IP    netip.Addr `json:"ip"`
	// Port is the guest's tap on the bridge; reflect needs it.
	Port string `json:"port,omitempty"`
	// Rate limits each rate-limit endpoint (DefaultRate when zero: a
	// rate-limit verdict is never unlimited).
	Rate      Rate      `json:"rate"`
	AllowSMTP bool      `json:"allow_smtp"`
	Elements  []Element `json:"elements,omitempty"`
}

// Firewall is the driver boundary of the containment rules.
type Firewall interface {
	// Up creates or refreshes the lab tables; per-lease rules survive.
	Up(ctx context.Context) error
	// Down removes the lab tables and every lease's rules with them.
	Down(ctx context.Context) error
	// ApplyLease validates and installs a lease's rules in one batch,
	// replacing any it had.
	ApplyLease(ctx context.Context, lr LeaseRules) error
	// RemoveLease removes a lease's rules; absent rules are not an error.
	RemoveLease(ctx context.Context, lease string) error
	// ApplyAllowSet adds and deletes elements of a lease's live allow set
	// in one atomic batch. An added element that is present with another
	// verdict moves; deleting an absent element is a no-op.
	ApplyAllowSet(ctx context.Context, lease string, add, del []Element) error
	// AllowSet lists a lease's current elements.
	AllowSet(ctx context.Context, lease string) ([]Element, error)
	// Status reports the tables, every rule's counters and the leases.
	Status(ctx context.Context) (*Status, error)
}

// NFT is the Firewall over nftables netlink.
type NFT struct {
	cfg Config
}

var _ Firewall = (*NFT)(nil)

// New checks cfg and returns the nftables driver.
func New(cfg Config) (*NFT, error) {
	if !strings.HasPrefix(cfg.Table, "talkbox") {
		return nil, fmt.Errorf("table %q: talkbox only owns tables named talkbox*", cfg.Table)
	}
	if cfg.Bridge == "" || cfg.SinkIface == "" || !cfg.LabNet.IsValid() || !cfg.Sinkhole.Is4() || !cfg.Gateway.Is4() {
		return nil, errors.New("firewall config needs bridge, lab_net, gateway, sink_iface and sinkhole")
	}
	if cfg.SMTPPorts == nil {
		cfg.SMTPPorts = DefaultSMTPPorts
	}
	if cfg.MaxElements == 0 {
		cfg.MaxElements = 65536
	}
	cfg.Limits.defaults()
	return &NFT{cfg: cfg}, nil
}

// Config returns the driver's configuration.
func (f *NFT) Config() Config { return f.cfg }

// Policy is the validator of this lab, for a lease whose plan does or does
// not force SMTP.
func (f *NFT) Policy(allowSMTP bool) Policy { return f.policy(allowSMTP, hostAddrs(f.cfg.NetNS)) }

// policy is Policy with the namespace's addresses given.
func (f *NFT) policy(allowSMTP bool, host []netip.Addr) Policy {
	p := Policy{Documentation: f.cfg.Documentation, AllowSMTP: allowSMTP, SMTPPorts: f.cfg.SMTPPorts,
		Lab: []netip.Prefix{f.cfg.LabNet}, Host: []netip.Addr{f.cfg.Gateway}}
	if f.cfg.SinkNet.IsValid() {
		p.Lab = append(p.Lab, f.cfg.SinkNet)
	}
	p.Host = append(p.Host, host...)
	return p
}

// bigBuffers lets one batch of tens of thousands of elements go in a
// single sendmsg (a batch must be one message to be one transaction).
func bigBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 64<<20)
		if serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
		}
	})
	return errors.Join(err, serr)
}

func (f *NFT) conn() (*nftables.Conn, func(), error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(bigBuffers)}
	if f.cfg.NetNS == "" {
		c, err := nftables.New(opts...)
		return c, func() {}, err
	}
	ns, err := os.Open(f.cfg.NetNS)
	if err != nil {
		return nil, nil, fmt.Errorf("network namespace: %w", err)
	}
	c, err := nftables.New(append(opts, nftables.WithNetNSFd(int(ns.Fd())))...)
	if err != nil {
		ns.Close()
		return nil, nil, err
	}
	return c, func() { ns.Close() }, nil
}

func (f *NFT) inet() *nftables.Table {
	return &nftables.Table{Name: f.cfg.Table, Family: nftables.TableFamilyINet}
}

// netdev holds the per-tap ingress chains of the reflect verdict.
func (f *NFT) netdev() *nftables.Table {
	return &nftables.Table{Name: f.cfg.Table, Family: nftables.TableFamilyNetdev}
}

func (f *NFT) bridge() *nftables.Table {
	return &nftables.Table{Name: f.cfg.Table, Family: nftables.TableFamilyBridge}
}

// Names of the objects in the inet table.
const (
	chPre      = "prerouting"
	chFwd      = "forward"
	chIn       = "input"
	chPost     = "postrouting"
	setSMTP    = "smtp_ports"
	mapLeasePr = "lease_pre"
	mapLeaseFw = "lease_fwd"
	// chSink sends a packet to the sinkhole: the lab's default and a
	// lease's redirect verdict both go there, so they cannot differ.
	chSink     = "to_sinkhole"
	setSinkTCP = "sink_tcp"
	setSinkUDP = "sink_udp"
)

// leaseTag is the short name of a lease in chain and set names: the
// lower-cased ULID of its ID ("lease_01JD…" → "01jd…").
func leaseTag(lease string) (string, error) {
	i := strings.LastIndexByte(lease, '_')
	tag := strings.ToLower(lease[i+1:])
	if len(tag) == 0 || len(tag) > 26 {
		return "", fmt.Errorf("lease %q: not a lease ID", lease)
	}
	for _, c := range tag {
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return "", fmt.Errorf("lease %q: not a lease ID", lease)
		}
	}
	return tag, nil
}

func verdictSet(tag string, v Verdict) string {
	short := map[Verdict]string{Forward: "fwd", RateLimit: "rl", Redirect: "rdr", Reflect: "rfl", Drop: "drop"}[v]
	return "a" + short + "_" + tag
}

var elemType = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)

func elemKey(e Element) []byte {
	k := keyOf(e)
	return k[:]
}

func keyElem(k []byte, v Verdict) (Element, bool) {
	if len(k) < 10 {
		return Element{}, false
	}
	proto := "tcp"
	if k[4] == 17 {
		proto = "udp"
	}
	return Element{Dst: netip.AddrFrom4([4]byte(k[0:4])), Proto: proto, Port: binary.BigEndian.Uint16(k[8:10]), Verdict: v}, true
}
