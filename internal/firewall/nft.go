package firewall

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netns"
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
	// DHCP accepts guests' DHCP requests to the gateway.
	DHCP bool `json:"dhcp"`
	// Documentation lets documentation ranges stand in for the internet.
	Documentation bool `json:"documentation,omitempty"`
	// MaxElements caps each of a lease's verdict sets (default 65536); the
	// kernel refuses a batch that would overflow one, and nothing changes.
	MaxElements uint32 `json:"max_elements,omitempty"`
}

// LeaseRules is what one lease gets.
type LeaseRules struct {
	Lease string     `json:"lease"`
	IP    netip.Addr `json:"ip"`
	// Port is the guest's tap on the bridge; reflect needs it.
	Port      string    `json:"port,omitempty"`
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

// ---- expression helpers ----

func comment(s string) []byte { return userdata.AppendString(nil, userdata.TypeComment, s) }

func ifname(s string) []byte {
	b := make([]byte, 16)
	copy(b, s)
	return b
}

func ifIs(key expr.MetaKey, name string, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: ifname(name)},
	}
}

func iif(name string) []expr.Any  { return ifIs(expr.MetaKeyIIFNAME, name, expr.CmpOpEq) }
func oif(name string) []expr.Any  { return ifIs(expr.MetaKeyOIFNAME, name, expr.CmpOpEq) }
func noif(name string) []expr.Any { return ifIs(expr.MetaKeyOIFNAME, name, expr.CmpOpNeq) }

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func ipv4() []expr.Any { return nfproto(unix.NFPROTO_IPV4) }

func ipField(off uint32, reg uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}
}

func ipAddrIs(off uint32, a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{ipField(off, 1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]}}
}

func saddrIs(a netip.Addr) []expr.Any { return ipAddrIs(12, a) }
func daddrIs(a netip.Addr) []expr.Any { return ipAddrIs(16, a) }

func ipIn(off uint32, p netip.Prefix) []expr.Any {
	p = p.Masked()
	a := p.Addr().As4()
	mask := net.CIDRMask(p.Bits(), 32)
	return []expr.Any{
		ipField(off, 1),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
	}
}

func l4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, bits), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

func established() []expr.Any {
	return ctState(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
}

// elemLookup matches "ip daddr . meta l4proto . th dport @set".
func elemLookup(set string) []expr.Any {
	return []expr.Any{
		ipField(16, 8), // NFT_REG32_00
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
		&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 8, SetName: set},
	}
}

func dnatTo(a netip.Addr, port uint16) []expr.Any {
	b := a.As4()
	out := []expr.Any{&expr.Immediate{Register: 1, Data: b[:]}}
	nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1}
	if port != 0 {
		out = append(out, &expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, port)})
		nat.RegProtoMin, nat.Specified = 2, true
	}
	return append(out, nat)
}

func counter() *expr.Counter { return &expr.Counter{} }

func accept() *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictAccept} }
func drop() *expr.Verdict   { return &expr.Verdict{Kind: expr.VerdictDrop} }
func ret() *expr.Verdict    { return &expr.Verdict{Kind: expr.VerdictReturn} }

// rule joins match expressions, a counter and the final statements.
func rule(t *nftables.Table, c *nftables.Chain, label string, parts ...[]expr.Any) *nftables.Rule {
	var ex []expr.Any
	for i, p := range parts {
		if i == len(parts)-1 {
			ex = append(ex, counter())
		}
		ex = append(ex, p...)
	}
	return &nftables.Rule{Table: t, Chain: c, Exprs: ex, UserData: comment(label)}
}

func then(e ...expr.Any) []expr.Any { return e }

// ---- lab tables ----

func (f *NFT) baseChains(t *nftables.Table) (pre, fwd, in, post *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	pre = &nftables.Chain{Name: chPre, Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest}
	fwd = &nftables.Chain{Name: chFwd, Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	in = &nftables.Chain{Name: chIn, Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	post = &nftables.Chain{Name: chPost, Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource}
	return
}

func leaseMap(t *nftables.Table, name string) *nftables.Set {
	return &nftables.Set{Table: t, Name: name, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
}

// Up implements Firewall. It runs as one batch: the tables and base chains
// are created when missing and the base chains' rules replaced, so it is
// idempotent and never leaves a half-programmed lab.
func (f *NFT) Up(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, done, err := f.conn()
	if err != nil {
		return err
	}
	defer done()
	cfg := f.cfg
	t := c.AddTable(f.inet())
	pre, fwd, in, post := f.baseChains(t)
	for _, ch := range []*nftables.Chain{pre, fwd, in, post} {
		c.AddChain(ch)
		c.FlushChain(ch)
	}
	smtp := &nftables.Set{Table: t, Name: setSMTP, KeyType: nftables.TypeInetService}
	var ports []nftables.SetElement
	for _, p := range cfg.SMTPPorts {
		ports = append(ports, nftables.SetElement{Key: binary.BigEndian.AppendUint16(nil, p)})
	}
	if err := c.AddSet(smtp, nil); err != nil {
		return err
	}
	c.FlushSet(smtp)
	if len(ports) > 0 {
		if err := c.SetAddElements(smtp, ports); err != nil {
			return err
		}
	}
	for _, name := range []string{mapLeasePr, mapLeaseFw} {
		if err := c.AddSet(leaseMap(t, name), nil); err != nil {
			return err
		}
	}
	br := cfg.Bridge
	lp := &nftables.Set{Table: t, Name: mapLeasePr}
	lf := &nftables.Set{Table: t, Name: mapLeaseFw}
	saddrVmap := func(m *nftables.Set) []expr.Any {
		return []expr.Any{ipField(12, 1), &expr.Lookup{SourceRegister: 1, SetName: m.Name, DestRegister: 0, IsDestRegSet: true}}
	}

	add := func(r *nftables.Rule) { c.AddRule(r) }

	// prerouting (nat): every guest packet bound outside goes to the sinkhole.
	add(rule(t, pre, "guest dns to sinkhole (udp)", iif(br), ipv4(), l4(unix.IPPROTO_UDP), dport(53), dnatTo(cfg.Sinkhole, 53)))
	add(rule(t, pre, "guest dns to sinkhole (tcp)", iif(br), ipv4(), l4(unix.IPPROTO_TCP), dport(53), dnatTo(cfg.Sinkhole, 53)))
	add(rule(t, pre, "guest broadcast and multicast: not translated", iif(br),
		then(&expr.Meta{Key: expr.MetaKeyPKTTYPE, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.PACKET_HOST}}), then(accept())))
	add(rule(t, pre, "lease rules", iif(br), ipv4(), saddrVmap(lp)))
	add(rule(t, pre, "guest to host: not translated", iif(br), ipv4(),
		then(&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)}),
		then(accept())))
	add(rule(t, pre, "guest to sinkhole", iif(br), ipv4(), daddrIs(cfg.Sinkhole), then(accept())))
	add(rule(t, pre, "guest to anywhere: sinkhole", iif(br), ipv4(), dnatTo(cfg.Sinkhole, 0)))

	// forward (filter): replies, sinkholed traffic, lease rules; the rest of
	// the lab's traffic is dropped. Other interfaces are left alone.
	add(rule(t, fwd, "replies to guests", oif(br), established(), then(accept())))
	add(rule(t, fwd, "lease rules", iif(br), ipv4(), saddrVmap(lf)))
	add(rule(t, fwd, "guest to sinkhole", iif(br), oif(cfg.SinkIface), ipv4(), daddrIs(cfg.Sinkhole), then(accept())))
	add(rule(t, fwd, "guest ipv6", iif(br), nfproto(unix.NFPROTO_IPV6), then(drop())))
	add(rule(t, fwd, "guest anything else", iif(br), then(drop())))
	if cfg.Uplink != "" && cfg.Upstream.Is4() {
		for _, p := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			add(rule(t, fwd, "sinkhole dns forwarding to upstream", iif(cfg.SinkIface), oif(cfg.Uplink), ipv4(),
				daddrIs(cfg.Upstream), l4(p), dport(53), then(accept())))
		}
	}
	add(rule(t, fwd, "replies to sinkhole", oif(cfg.SinkIface), established(), then(accept())))
	add(rule(t, fwd, "sinkhole anything else", iif(cfg.SinkIface), then(drop())))
	add(rule(t, fwd, "unsolicited to sinkhole", oif(cfg.SinkIface), then(drop())))
	add(rule(t, fwd, "unsolicited to guests", oif(br), then(drop())))

	// input (filter): guests and the sinkhole do not reach the host.
	if cfg.DHCP {
		add(rule(t, in, "guest dhcp", iif(br), ipv4(), l4(unix.IPPROTO_UDP), dport(67), then(accept())))
	}
	add(rule(t, in, "replies to host from guests", iif(br), established(), then(accept())))
	add(rule(t, in, "guest to host", iif(br), then(drop())))
	add(rule(t, in, "replies to host from sinkhole", iif(cfg.SinkIface), established(), then(accept())))
	add(rule(t, in, "sinkhole to host", iif(cfg.SinkIface), then(drop())))

	// postrouting (nat): forwarded traffic leaves with the uplink's address.
	if cfg.Uplink != "" {
		add(rule(t, post, "lab to uplink: masquerade", oif(cfg.Uplink), ipv4(), ipIn(12, cfg.LabNet), then(&expr.Masq{})))
		if cfg.SinkNet.IsValid() {
			add(rule(t, post, "sinkhole to uplink: masquerade", oif(cfg.Uplink), ipv4(), ipIn(12, cfg.SinkNet), then(&expr.Masq{})))
		}
	}

	c.AddTable(f.netdev())

	// bridge family: guest to guest is dropped at layer 2. The kernel may
	// lack bridge-name matching (nft_meta_bridge), so the lab's ports are
	// listed in a set that AddPorts maintains.
	bt := c.AddTable(f.bridge())
	bfwd := &nftables.Chain{Name: "forward", Table: bt, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept0}
	c.AddChain(bfwd)
	c.FlushChain(bfwd)
	if err := c.AddSet(f.portSet(bt), nil); err != nil {
		return err
	}
	add(rule(bt, bfwd, "guest to guest (in)", ifSet(expr.MetaKeyIIFNAME, setPorts), then(drop())))
	add(rule(bt, bfwd, "guest to guest (out)", ifSet(expr.MetaKeyOIFNAME, setPorts), then(drop())))
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: programming table %s: %w", cfg.Table, err)
	}
	return nil
}

var accept0 = nftables.ChainPolicyAccept

const setPorts = "lab_ports"

func (f *NFT) portSet(bt *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: bt, Name: setPorts, KeyType: nftables.TypeIFName}
}

func ifSet(key expr.MetaKey, set string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Lookup{SourceRegister: 1, SetName: set}}
}

// SetPorts adds and removes bridge ports (guest taps) from the set of
// ports that may not talk to each other.
func (f *NFT) SetPorts(ctx context.Context, add, del []string) error {
	c, done, err := f.conn()
	if err != nil {
		return err
	}
	defer done()
	s := f.portSet(f.bridge())
	cur, err := c.GetSetElements(s)
	if err != nil {
		return fmt.Errorf("nftables: reading %s: %w", setPorts, err)
	}
	have := map[string]bool{}
	for _, e := range cur {
		have[strings.TrimRight(string(e.Key), "\x00")] = true
	}
	var a, d []nftables.SetElement
	for _, p := range add {
		if !have[p] {
			a = append(a, nftables.SetElement{Key: ifname(p)})
			have[p] = true
		}
	}
	for _, p := range del {
		if have[p] {
			d = append(d, nftables.SetElement{Key: ifname(p)})
		}
	}
	if len(a) > 0 {
		if err := c.SetAddElements(s, a); err != nil {
			return err
		}
	}
	if len(d) > 0 {
		if err := c.SetDeleteElements(s, d); err != nil {
			return err
		}
	}
	return c.Flush()
}

// Ports lists the registered bridge ports.
func (f *NFT) Ports(ctx context.Context) ([]string, error) {
	c, done, err := f.conn()
	if err != nil {
		return nil, err
	}
	defer done()
	cur, err := c.GetSetElements(f.portSet(f.bridge()))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range cur {
		out = append(out, strings.TrimRight(string(e.Key), "\x00"))
	}
	return out, nil
}

// Down implements Firewall.
func (f *NFT) Down(ctx context.Context) error {
	c, done, err := f.conn()
	if err != nil {
		return err
	}
	defer done()
	for _, t := range []*nftables.Table{f.inet(), f.bridge(), f.netdev()} {
		if _, err := c.ListTableOfFamily(t.Name, t.Family); err != nil {
			continue // absent
		}
		c.DelTable(t)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: removing table %s: %w", f.cfg.Table, err)
	}
	return nil
}

// Present reports whether the lab's inet table exists.
func (f *NFT) Present() (bool, error) {
	c, done, err := f.conn()
	if err != nil {
		return false, err
	}
	defer done()
	tabs, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	for _, t := range tabs {
		if t.Name == f.cfg.Table {
			return true, nil
		}
	}
	return false, nil
}

// OthersPresent reports whether another lab's talkbox table is in the
// namespace: that lab still needs what the namespace-wide settings give it.
func (f *NFT) OthersPresent() (bool, error) {
	c, done, err := f.conn()
	if err != nil {
		return false, err
	}
	defer done()
	tabs, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	for _, t := range tabs {
		if t.Name != f.cfg.Table && strings.HasPrefix(t.Name, "talkbox") {
			return true, nil
		}
	}
	return false, nil
}

// uplinkUp reports whether the uplink exists and is up in the namespace
// ns ("" when already there).
func (f *NFT) uplinkUp(ns string) error {
	if f.cfg.Uplink == "" {
		return errors.New("no uplink configured: nothing can be forwarded")
	}
	return netns.Do(ns, func() error {
		ifc, err := net.InterfaceByName(f.cfg.Uplink)
		if err != nil {
			return fmt.Errorf("uplink %s: %w", f.cfg.Uplink, err)
		}
		if ifc.Flags&net.FlagUp == 0 {
			return fmt.Errorf("uplink %s is down", f.cfg.Uplink)
		}
		return nil
	})
}

func needsUplink(els []Element) bool {
	for _, e := range els {
		if e.Verdict == Forward || e.Verdict == RateLimit {
			return true
		}
	}
	return false
}

// ---- per-lease rules ----

type leaseObjs struct {
	tag            string
	pre, fwd       *nftables.Chain
	rfl            *nftables.Chain // netdev ingress of the lease's tap
	sets           map[Verdict]*nftables.Set
	preMap, fwdMap *nftables.Set
}

func (f *NFT) leaseObjs(t *nftables.Table, tag string) *leaseObjs {
	o := &leaseObjs{tag: tag, sets: map[Verdict]*nftables.Set{}}
	o.pre = &nftables.Chain{Name: "pre_" + tag, Table: t}
	o.fwd = &nftables.Chain{Name: "fwd_" + tag, Table: t}
	for _, v := range Verdicts {
		o.sets[v] = &nftables.Set{Table: t, Name: verdictSet(tag, v), KeyType: elemType, Concatenation: true, Size: f.cfg.MaxElements}
	}
	nd := f.netdev()
	o.sets[Reflect].Table = nd
	o.rfl = &nftables.Chain{Name: "rfl_" + tag, Table: nd}
	o.preMap = &nftables.Set{Table: t, Name: mapLeasePr, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	o.fwdMap = &nftables.Set{Table: t, Name: mapLeaseFw, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	return o
}

// ApplyLease implements Firewall.
func (f *NFT) ApplyLease(ctx context.Context, lr LeaseRules) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tag, err := leaseTag(lr.Lease)
	if err != nil {
		return &InvalidError{Reasons: []string{err.Error()}}
	}
	if !lr.IP.Is4() || !f.cfg.LabNet.Contains(lr.IP) || lr.IP == f.cfg.Gateway {
		return &InvalidError{Reasons: []string{fmt.Sprintf("lease IP %s is not a guest address in %s", lr.IP, f.cfg.LabNet)}}
	}
	if err := f.Policy(lr.AllowSMTP).Plan(lr.Elements, nil); err != nil {
		return err
	}
	if needsUplink(lr.Elements) {
		if err := f.uplinkUp(f.cfg.NetNS); err != nil {
			return &InvalidError{Reasons: []string{err.Error()}}
		}
	}
	portIndex := 0
	if lr.Port != "" {
		if err := netns.Do(f.cfg.NetNS, func() error {
			ifc, err := net.InterfaceByName(lr.Port)
			if err == nil {
				portIndex = ifc.Index
			}
			return err
		}); err != nil {
			return &InvalidError{Reasons: []string{fmt.Sprintf("lease port %s: %v", lr.Port, err)}}
		}
	} else if hasVerdict(lr.Elements, Reflect) {
		return &InvalidError{Reasons: []string{"reflect needs the lease's tap (port)"}}
	}
	if ok, err := f.Present(); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("lab table %s is not up (tb-capture net up)", f.cfg.Table)
	}
	c, done, err := f.conn()
	if err != nil {
		return err
	}
	defer done()
	t := f.inet()
	o := f.leaseObjs(t, tag)
	existing, err := f.leaseIPs(c, t)
	if err != nil {
		return err
	}
	for ip, other := range existing {
		if ip == lr.IP && other != tag {
			return &InvalidError{Reasons: []string{fmt.Sprintf("lease IP %s is already used by lease %s", ip, other)}}
		}
	}
	// Replace: drop whatever this lease had, then build it afresh, all in
	// the same batch.
	f.delLease(c, t, o, existing)
	ip := lr.IP.As4()
	for _, ch := range []*nftables.Chain{o.pre, o.fwd} {
		c.AddChain(ch)
	}
	for _, v := range Verdicts {
		if v == Reflect && portIndex == 0 {
			continue
		}
		if err := c.AddSet(o.sets[v], nil); err != nil {
			return err
		}
	}
	if portIndex != 0 {
		f.reflectChain(c, o, lr.Port, portIndex)
	}
	byV := map[Verdict][]nftables.SetElement{}
	for _, e := range lr.Elements {
		byV[e.Verdict] = append(byV[e.Verdict], nftables.SetElement{Key: elemKey(e)})
	}
	for v, els := range byV {
		if err := addElems(c, o.sets[v], els); err != nil {
			return err
		}
	}
	set := func(v Verdict) string { return o.sets[v].Name }
	// pre_<lease>: which destinations escape the default DNAT.
	c.AddRule(rule(t, o.pre, "forward: not translated", elemLookup(set(Forward)), then(accept())))
	c.AddRule(rule(t, o.pre, "rate-limit: not translated", elemLookup(set(RateLimit)), then(accept())))
	c.AddRule(rule(t, o.pre, "redirect: sinkhole", elemLookup(set(Redirect)), dnatTo(f.cfg.Sinkhole, 0)))
	c.AddRule(rule(t, o.pre, "drop", elemLookup(set(Drop)), then(drop())))
	// fwd_<lease>: what may leave by the uplink.
	if f.cfg.Uplink != "" {
		c.AddRule(rule(t, o.fwd, "not to the uplink", noif(f.cfg.Uplink), then(ret())))
		if !lr.AllowSMTP {
			c.AddRule(rule(t, o.fwd, "smtp never forwarded", l4(unix.IPPROTO_TCP),
				then(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
					&expr.Lookup{SourceRegister: 1, SetName: setSMTP}), then(drop())))
		}
		c.AddRule(rule(t, o.fwd, "forward", elemLookup(set(Forward)), then(accept())))
		if lr.Rate.Value > 0 {
			// One token bucket per destination: a meter keyed like the set.
			meter := &nftables.Set{Table: t, Name: "rlm_" + tag, KeyType: elemType, Concatenation: true,
				Dynamic: true, HasTimeout: true, Timeout: time.Minute, Size: f.cfg.MaxElements}
			if err := c.AddSet(meter, nil); err != nil {
				return err
			}
			c.AddRule(rule(t, o.fwd, "rate-limit: over the limit", elemLookup(set(RateLimit)),
				then(&expr.Dynset{SrcRegKey: 8, SetName: meter.Name, Operation: unix.NFT_DYNSET_OP_UPDATE,
					Timeout: time.Minute, Exprs: []expr.Any{limitOver(lr.Rate)}}), then(drop())))
		}
		c.AddRule(rule(t, o.fwd, "rate-limit: within the limit", elemLookup(set(RateLimit)), then(accept())))
	}
	// Dispatch the lease's source address to its chains.
	for m, ch := range map[*nftables.Set]*nftables.Chain{o.preMap: o.pre, o.fwdMap: o.fwd} {
		if err := c.SetAddElements(m, []nftables.SetElement{{Key: ip[:], VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}}); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: applying rules of %s (nothing changed): %w", lr.Lease, err)
	}
	return nil
}

func limitOver(r Rate) *expr.Limit {
	l := &expr.Limit{Type: expr.LimitTypePkts, Rate: r.Value, Over: true, Unit: expr.LimitTime(r.Per)}
	if r.Bytes {
		l.Type = expr.LimitTypePktBytes
		// A burst of one second's worth lets a full-size packet through at
		// low rates; without it a 1500-byte packet never fits a small bucket.
		l.Burst = uint32(min(r.Value, 1<<30))
	} else {
		l.Burst = 5
	}
	return l
}

// addElems adds elements 1024 at a time: one netlink message per chunk
// keeps each under the kernel's message size limit; the chunks are still
// one batch (one transaction).
func addElems(c *nftables.Conn, s *nftables.Set, els []nftables.SetElement) error {
	const chunk = 1024
	for len(els) > 0 {
		n := min(chunk, len(els))
		if err := c.SetAddElements(s, els[:n]); err != nil {
			return err
		}
		els = els[n:]
	}
	return nil
}

// leaseIPs maps lease source addresses to lease tags from the dispatch map.
func (f *NFT) leaseIPs(c *nftables.Conn, t *nftables.Table) (map[netip.Addr]string, error) {
	els, err := c.GetSetElements(leaseMap(t, mapLeasePr))
	if err != nil {
		return nil, fmt.Errorf("nftables: reading %s: %w", mapLeasePr, err)
	}
	out := map[netip.Addr]string{}
	for _, e := range els {
		chain := verdictChain(e)
		if len(e.Key) < 4 || chain == "" {
			continue
		}
		out[netip.AddrFrom4([4]byte(e.Key[:4]))] = strings.TrimPrefix(chain, "pre_")
	}
	return out, nil
}

// delLease queues the removal of a lease's objects that exist.
func (f *NFT) delLease(c *nftables.Conn, t *nftables.Table, o *leaseObjs, ips map[netip.Addr]string) bool {
	found := false
	for ip, tag := range ips {
		if tag != o.tag {
			continue
		}
		found = true
		a := ip.As4()
		for _, m := range []*nftables.Set{o.preMap, o.fwdMap} {
			_ = c.SetDeleteElements(m, []nftables.SetElement{{Key: a[:]}})
		}
	}
	chains, _ := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	for _, ch := range chains {
		if ch.Table.Name != t.Name {
			continue
		}
		if ch.Name == o.pre.Name || ch.Name == o.fwd.Name {
			found = true
			c.FlushChain(&nftables.Chain{Name: ch.Name, Table: t})
			c.DelChain(&nftables.Chain{Name: ch.Name, Table: t})
		}
	}
	nd := f.netdev()
	if ndChains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev); err == nil {
		for _, ch := range ndChains {
			if ch.Table.Name == nd.Name && ch.Name == o.rfl.Name {
				found = true
				c.FlushChain(&nftables.Chain{Name: ch.Name, Table: nd})
				c.DelChain(&nftables.Chain{Name: ch.Name, Table: nd})
			}
		}
	}
	if ndSets, err := c.GetSets(nd); err == nil {
		for _, s := range ndSets {
			if s.Name == o.sets[Reflect].Name {
				found = true
				c.DelSet(&nftables.Set{Table: nd, Name: s.Name})
			}
		}
	}
	sets, _ := c.GetSets(t)
	for _, s := range sets {
		if s.Name == "rlm_"+o.tag {
			c.DelSet(&nftables.Set{Table: t, Name: s.Name})
		}
		for _, v := range Verdicts {
			if s.Name == verdictSet(o.tag, v) {
				found = true
				c.DelSet(&nftables.Set{Table: t, Name: s.Name})
			}
		}
	}
	return found
}

// RemoveLease implements Firewall.
func (f *NFT) RemoveLease(ctx context.Context, lease string) error {
	tag, err := leaseTag(lease)
	if err != nil {
		return err
	}
	if ok, err := f.Present(); err != nil || !ok {
		return err
	}
	c, done, err := f.conn()
	if err != nil {
		return err
	}
	defer done()
	t := f.inet()
	ips, err := f.leaseIPs(c, t)
	if err != nil {
		return err
	}
	if !f.delLease(c, t, f.leaseObjs(t, tag), ips) {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: removing rules of %s: %w", lease, err)
	}
	return nil
}

// ErrNoLease is returned (wrapped) for a lease without applied rules.
var ErrNoLease = errors.New("no rules applied")

// hostAddrs lists the addresses of every interface in the namespace.
func hostAddrs(ns string) []netip.Addr {
	var out []netip.Addr
	_ = netns.Do(ns, func() error {
		// One dump of the addresses (net.InterfaceAddrs dumps the links
		// too); a point-to-point interface's local and peer addresses
		// both count.
		tab, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_UNSPEC)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(tab)
		if err != nil {
			return err
		}
		for i := range msgs {
			if msgs[i].Header.Type != syscall.RTM_NEWADDR {
				continue
			}
			attrs, err := syscall.ParseNetlinkRouteAttr(&msgs[i])
			if err != nil {
				continue
			}
			for _, a := range attrs {
				if a.Attr.Type == syscall.IFA_ADDRESS || a.Attr.Type == syscall.IFA_LOCAL {
					if ip, ok := netip.AddrFromSlice(a.Value); ok {
						out = append(out, ip.Unmap())
					}
				}
			}
		}
		return nil
	})
	return out
}

// verdictChain is the chain a vmap element jumps to. google/nftables
// leaves the verdict undecoded in Val (NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN).
func verdictChain(e nftables.SetElement) string {
	if e.VerdictData != nil {
		return e.VerdictData.Chain
	}
	ad, err := netlink.NewAttributeDecoder(e.Val)
	if err != nil {
		return ""
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_VERDICT_CHAIN {
			return ad.String()
		}
	}
	return ""
}

func hasVerdict(els []Element, v Verdict) bool {
	for _, e := range els {
		if e.Verdict == v {
			return true
		}
	}
	return false
}

// reflectChain queues the netdev ingress chain of a lease's tap: a packet
// to a reflected destination (or the guest's answer from that port) gets
// its Ethernet and IPv4 source and destination swapped and is sent straight
// back out of the tap, as if the destination had answered from the guest.
// A swap leaves every checksum valid. Reflected packets never reach the
// host's IP stack, so nothing is translated or tracked.
func (f *NFT) reflectChain(c *nftables.Conn, o *leaseObjs, port string, index int) {
	nd := f.netdev()
	prio := nftables.ChainPriority(-500)
	accept := nftables.ChainPolicyAccept
	o.rfl.Hooknum, o.rfl.Priority, o.rfl.Type, o.rfl.Device, o.rfl.Policy = nftables.ChainHookIngress, &prio, nftables.ChainTypeFilter, port, &accept
	c.AddChain(o.rfl)
	set := o.sets[Reflect].Name
	isIPv4 := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x08, 0x00}},
	}
	sport := []expr.Any{
		ipField(16, 8),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
		&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
		&expr.Lookup{SourceRegister: 8, SetName: set},
	}
	back := []expr.Any{
		// Ethernet addresses.
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 0, Len: 6},
		&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 2, Base: expr.PayloadBaseLLHeader, Offset: 0, Len: 6},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
		// IPv4 addresses.
		ipField(12, 1),
		ipField(16, 2),
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Immediate{Register: 3, Data: binary.NativeEndian.AppendUint32(nil, uint32(index))},
		&expr.Dup{RegDev: 3, IsRegDevSet: true},
		drop(),
	}
	c.AddRule(rule(nd, o.rfl, "reflect: to the guest", isIPv4, elemLookup(set), back))
	c.AddRule(rule(nd, o.rfl, "reflect: the guest's answers", isIPv4, sport, back))
}
