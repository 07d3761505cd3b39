package firewall

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A guest's port is bound to its MAC and IPv4 in the bridge table: the
// bind chain drops every frame from a lab port whose source MAC, IPv4
// source or ARP sender is not the port's, and every ethertype but IPv4 and
// ARP. A frame that passes gets the port's mark, and the inet table
// dispatches a lease's rules on mark and source address together, so a
// lease's allow-list is reached only through its own port.
const (
	setPorts   = "lab_ports"
	setPortMAC = "port_mac"
	setPortIP  = "port_ip"
	chBind     = "bind"
)

// Marks: markBase with the port's interface index in the low 24 bits.
// markUnbound (index 0, which no interface has) keys the rules of a lease
// whose port is not bound: no packet carries it, so they wait for the
// port rather than apply to anyone's traffic.
const (
	markBase    = 0x7b000000
	markMask    = 0x00ffffff
	markUnbound = markBase
)

func portMark(index int) uint32 { return markBase | uint32(index)&markMask }

var (
	portMACType = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeEtherAddr)
	portIPType  = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)
	dispatchKey = nftables.MustConcatSetType(nftables.TypeMark, nftables.TypeIPAddr)
)

func (f *NFT) portSet(bt *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: bt, Name: setPorts, KeyType: nftables.TypeIFName}
}

func portMACSet(bt *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: bt, Name: setPortMAC, KeyType: portMACType, Concatenation: true}
}

func portIPSet(bt *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: bt, Name: setPortIP, KeyType: portIPType, Concatenation: true}
}

func portMACKey(name string, mac net.HardwareAddr) []byte {
	k := make([]byte, 24)
	copy(k, name)
	copy(k[16:], mac)
	return k
}

func portIPKey(name string, ip netip.Addr) []byte {
	a := ip.As4()
	return append(ifname(name), a[:]...)
}

func dispatchKeyOf(mark uint32, ip netip.Addr) []byte {
	a := ip.As4()
	return append(binary.NativeEndian.AppendUint32(nil, mark), a[:]...)
}

// The bridge family's expressions: the Ethernet type, and keys built in
// the 32-bit registers from NFT_REG32_00 (8) on, the interface name first.
func etherType(t uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, t)},
	}
}

// portKeyIn looks "iifname . <field>" up in set; field is a payload of
// len bytes at off from base.
func portKeyIn(set string, base expr.PayloadBase, off, n uint32, invert bool) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 8},
		&expr.Payload{DestRegister: 12, Base: base, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 8, SetName: set, Invert: invert},
	}
}

func payloadIs(base expr.PayloadBase, off uint32, val []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: base, Offset: off, Len: uint32(len(val))},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: val},
	}
}

// arpIPv4 is an Ethernet/IPv4 ARP header: hardware type 1, protocol
// 0x0800, address lengths 6 and 4. The kernel would refuse other shapes
// anyway; checking here keeps the sender fields at the offsets read below.
func arpIPv4() []expr.Any {
	return append(etherType(unix.ETH_P_ARP), payloadIs(expr.PayloadBaseNetworkHeader, 0, []byte{0, 1, 8, 0, 6, 4})...)
}

// Passes reports whether the bind chain lets frame, sent by the guest on
// the port b binds, onto the bridge; dhcp is the lab's Config.DHCP. It
// says in Go what bindRules says to the kernel, so that a capture on the
// port (the lease's tap, which sees a frame before the bridge drops it)
// can keep out what never reached the lab: a sample's forged frames must
// not count as what it sent or, forging answers to itself, as what its C2
// said. TestHostileGuest (internal/netlab) checks the two agree on every
// attack frame it sends.
func (b PortBinding) Passes(frame []byte, dhcp bool) bool {
	c, ok := claimOf(frame)
	if !ok || !bytes.Equal(c.mac, b.MAC) {
		return false
	}
	switch c.typ {
	case unix.ETH_P_IP:
		if !c.sender.IsValid() {
			return false
		}
		// Its own address, or a DHCP request from 0.0.0.0 where the lab
		// serves DHCP.
		return c.sender == b.IP || dhcp && c.dhcpRequest()
	case unix.ETH_P_ARP:
		if !c.sender.IsValid() || !bytes.Equal(c.arpMAC, b.MAC) {
			return false
		}
		// Its own address, or a probe (a request from 0.0.0.0).
		return c.sender == b.IP || c.sender.IsUnspecified() && c.nh[6] == 0 && c.nh[7] == 1
	}
	return false
}

// Forged reports whether frame, one from the port that the bind chain
// drops (Passes false), says it came from someone the guest is not: another
// source MAC; an IPv4 source or ARP sender (MAC or address) not the port's,
// or 0.0.0.0 outside a DHCP request or an ARP probe; an IPv6 source that
// is neither :: nor link-local (the lab gives guests no other IPv6
// address, so any other is made up). The rest of what the chain drops says
// nothing false of its sender: the guest's own IPv6 (the lab carries no
// IPv6), other ethertypes, frames cut short, and a DHCP request where the
// lab serves no DHCP. A guest whose own IPv6 is dropped is not spoofing.
func (b PortBinding) Forged(frame []byte) bool {
	c, ok := claimOf(frame)
	switch {
	case !ok:
		return false
	case !bytes.Equal(c.mac, b.MAC):
		return true
	case !c.sender.IsValid():
		return false
	case c.typ == unix.ETH_P_IPV6:
		return !c.sender.IsUnspecified() && !c.sender.IsLinkLocalUnicast()
	case c.typ == unix.ETH_P_ARP && !bytes.Equal(c.arpMAC, b.MAC):
		return true
	case c.sender.IsUnspecified():
		// Only a DHCP client or an ARP probe speaks from 0.0.0.0.
		probe := c.typ == unix.ETH_P_ARP && c.nh[6] == 0 && c.nh[7] == 1
		return !probe && !(c.typ == unix.ETH_P_IP && c.dhcpRequest())
	}
	return c.sender != b.IP
}

// frameClaim is who an Ethernet frame says sent it.
type frameClaim struct {
	mac []byte // the source MAC
	typ uint16 // the ethertype
	nh  []byte // what follows the Ethernet header
	// sender is an IPv4 or IPv6 packet's source or an IPv4-over-Ethernet
	// ARP's sender address, arpMAC the ARP's sender MAC; invalid for any
	// other frame, or one cut short.
	sender netip.Addr
	arpMAC []byte
}

// dhcpRequest reports whether c, an IPv4 packet, is a DHCP request from
// 0.0.0.0: UDP from port 68 to port 67.
func (c frameClaim) dhcpRequest() bool {
	th := int(c.nh[0]&0x0f) * 4 // where the kernel finds the transport header
	return c.sender.IsUnspecified() && c.nh[9] == unix.IPPROTO_UDP && th >= 20 && len(c.nh) >= th+4 &&
		bytes.Equal(c.nh[th:th+4], []byte{0, 68, 0, 67})
}

// claimOf reads frame's claim; false for a frame too short to be Ethernet.
func claimOf(frame []byte) (frameClaim, bool) {
	if len(frame) < 14 {
		return frameClaim{}, false
	}
	c := frameClaim{mac: frame[6:12], typ: binary.BigEndian.Uint16(frame[12:14]), nh: frame[14:]}
	switch {
	case c.typ == unix.ETH_P_IP && len(c.nh) >= 20:
		c.sender = netip.AddrFrom4([4]byte(c.nh[12:16]))
	case c.typ == unix.ETH_P_ARP && len(c.nh) >= 28 && bytes.Equal(c.nh[:6], []byte{0, 1, 8, 0, 6, 4}):
		c.sender, c.arpMAC = netip.AddrFrom4([4]byte(c.nh[14:18])), c.nh[8:14]
	case c.typ == unix.ETH_P_IPV6 && len(c.nh) >= 40:
		c.sender = netip.AddrFrom16([16]byte(c.nh[8:24]))
	}
	return c, true
}

// PcapFilter is Passes as a pcap-filter(7) expression, for the programs
// that capture on the port without Talkbox's own check (tb-capture's
// sensors): true for the frames the guest sends that the bind chain lets
// onto the bridge. Matching Passes on frames it is given is what
// TestPortBindingPasses checks, compiled by tcpdump.
func (b PortBinding) PcapFilter(dhcp bool) string {
	mac, ip := []byte(b.MAC), b.IP.As4()
	hex := func(p []byte) string { return fmt.Sprintf("0x%x", p) }
	// len: Passes takes no IPv4 header shorter than 20 bytes, no ARP
	// body shorter than 28.
	ipv4 := fmt.Sprintf("(ip and len >= 34 and ether[26:4] = %s)", hex(ip[:]))
	if dhcp {
		// udp[0:4]: libpcap, as the kernel, finds the UDP header after
		// the IPv4 header's own length.
		ipv4 = fmt.Sprintf("(ip and len >= 34 and (ether[26:4] = %s or (ether[26:4] = 0 and ether[23] = 17 and ether[14] & 0xf >= 5 and udp[0:4] = 0x00440043)))", hex(ip[:]))
	}
	arp := fmt.Sprintf("(arp and len >= 42 and ether[14:4] = 0x00010800 and ether[18:2] = 0x0604 and ether[22:4] = %s and ether[26:2] = %s"+
		" and (ether[28:4] = %s or (ether[28:4] = 0 and ether[20:2] = 1)))", hex(mac[:4]), hex(mac[4:6]), hex(ip[:]))
	return fmt.Sprintf("ether src %s and (%s or %s)", b.MAC, ipv4, arp)
}

// bindRules queues the bind chain's rules (the chain is flushed first).
func (f *NFT) bindRules(c *nftables.Conn, bt *nftables.Table, bind *nftables.Chain) {
	add := func(r *nftables.Rule) { c.AddRule(r) }
	labPort := ifSet(expr.MetaKeyIIFNAME, setPorts)
	nh := expr.PayloadBaseNetworkHeader
	add(rule(bt, bind, "guest frame: not its MAC", labPort,
		portKeyIn(setPortMAC, expr.PayloadBaseLLHeader, 6, 6, true), then(drop())))
	add(rule(bt, bind, "guest ipv4: its address", labPort, etherType(unix.ETH_P_IP),
		portKeyIn(setPortIP, nh, 12, 4, false),
		then(&expr.Meta{Key: expr.MetaKeyIIF, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binary.NativeEndian.AppendUint32(nil, markMask), Xor: binary.NativeEndian.AppendUint32(nil, markBase)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}, accept())))
	if f.cfg.DHCP {
		add(rule(bt, bind, "guest dhcp from 0.0.0.0", labPort, etherType(unix.ETH_P_IP),
			payloadIs(nh, 12, []byte{0, 0, 0, 0}), payloadIs(nh, 9, []byte{unix.IPPROTO_UDP}),
			payloadIs(expr.PayloadBaseTransportHeader, 0, []byte{0, 68, 0, 67}), then(accept())))
	}
	add(rule(bt, bind, "guest arp: its address", labPort, arpIPv4(),
		portKeyIn(setPortMAC, nh, 8, 6, false), portKeyIn(setPortIP, nh, 14, 4, false), then(accept())))
	// Address conflict detection (RFC 5227) asks with sender 0.0.0.0.
	add(rule(bt, bind, "guest arp probe", labPort, arpIPv4(),
		payloadIs(nh, 6, []byte{0, 1}), payloadIs(nh, 14, []byte{0, 0, 0, 0}),
		portKeyIn(setPortMAC, nh, 8, 6, false), then(accept())))
	add(rule(bt, bind, "guest frame: not bound", labPort, then(drop())))
}

// bridgeUp queues the bridge table: its sets, the bind chain on
// prerouting and the forward chain that keeps guests apart. The kernel
// may lack bridge-name matching (nft_meta_bridge), so the lab's ports are
// listed in a set that SetPorts and BindPort maintain.
func (f *NFT) bridgeUp(c *nftables.Conn) error {
	bt := c.AddTable(f.bridge())
	for _, s := range []*nftables.Set{f.portSet(bt), portMACSet(bt), portIPSet(bt)} {
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
	}
	accept := nftables.ChainPolicyAccept
	prio := nftables.ChainPriority(-200)
	bind := &nftables.Chain{Name: chBind, Table: bt, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: &prio, Policy: &accept}
	c.AddChain(bind)
	c.FlushChain(bind)
	f.bindRules(c, bt, bind)
	bfwd := &nftables.Chain{Name: "forward", Table: bt, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	c.AddChain(bfwd)
	c.FlushChain(bfwd)
	c.AddRule(rule(bt, bfwd, "guest to guest (in)", ifSet(expr.MetaKeyIIFNAME, setPorts), then(drop())))
	c.AddRule(rule(bt, bfwd, "guest to guest (out)", ifSet(expr.MetaKeyOIFNAME, setPorts), then(drop())))
	return nil
}

// PortBinding is a lab port's bound MAC and IPv4.
type PortBinding struct {
	Name string           `json:"name"`
	MAC  net.HardwareAddr `json:"mac"`
	IP   netip.Addr       `json:"ip"`
}

func ifnameOf(b []byte) string { return strings.TrimRight(string(b[:min(16, len(b))]), "\x00") }

// bindings reads the bound ports by name.
func (f *NFT) bindings(c *nftables.Conn) (map[string]*PortBinding, error) {
	bt := f.bridge()
	out := map[string]*PortBinding{}
	get := func(name string) *PortBinding {
		if out[name] == nil {
			out[name] = &PortBinding{Name: name}
		}
		return out[name]
	}
	macs, err := c.GetSetElements(portMACSet(bt))
	if err != nil {
		return nil, fmt.Errorf("nftables: reading %s: %w", setPortMAC, err)
	}
	for _, e := range macs {
		if len(e.Key) >= 22 {
			get(ifnameOf(e.Key)).MAC = net.HardwareAddr(bytes.Clone(e.Key[16:22]))
		}
	}
	ips, err := c.GetSetElements(portIPSet(bt))
	if err != nil {
		return nil, fmt.Errorf("nftables: reading %s: %w", setPortIP, err)
	}
	for _, e := range ips {
		if len(e.Key) >= 20 {
			get(ifnameOf(e.Key)).IP = netip.AddrFrom4([4]byte(e.Key[16:20]))
		}
	}
	return out, nil
}

// Bindings lists the bound ports.
func (f *NFT) Bindings(ctx context.Context) ([]PortBinding, error) {
	c, done, err := f.conn()
	if err != nil {
		return nil, err
	}
	defer done()
	b, err := f.bindings(c)
	if err != nil {
		return nil, err
	}
	var out []PortBinding
	for _, p := range b {
		out = append(out, *p)
	}
	return out, nil
}

// BindPort binds the lab port name (interface index) to a guest's MAC and
// IPv4 and registers it as a lab port, replacing any binding it had. An
// address or MAC bound to another port is refused: two ports may not
// claim one guest. The rules of a lease with that address follow the
// port's mark, in the same batch.
func (f *NFT) BindPort(ctx context.Context, name string, index int, mac net.HardwareAddr, ip netip.Addr) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(name) == 0 || len(name) > 15 || index <= 0 || index > markMask || len(mac) != 6 || !ip.Is4() {
		return &InvalidError{Reasons: []string{fmt.Sprintf("port %q (index %d, %s, %s) cannot be bound", name, index, mac, ip)}}
	}
	c, done, err := f.conn()
	if err != nil {
		return err
	}
	defer done()
	have, err := f.bindings(c)
	if err != nil {
		return err
	}
	for _, b := range have {
		if b.Name == name {
			continue
		}
		if b.IP == ip {
			return &InvalidError{Reasons: []string{fmt.Sprintf("port %s: %s is bound to port %s", name, ip, b.Name)}}
		}
		if bytes.Equal(b.MAC, mac) {
			return &InvalidError{Reasons: []string{fmt.Sprintf("port %s: %s is bound to port %s", name, mac, b.Name)}}
		}
	}
	bt := f.bridge()
	if old := have[name]; old != nil {
		if len(old.MAC) == 6 {
			_ = c.SetDeleteElements(portMACSet(bt), []nftables.SetElement{{Key: portMACKey(name, old.MAC)}})
		}
		if old.IP.IsValid() {
			_ = c.SetDeleteElements(portIPSet(bt), []nftables.SetElement{{Key: portIPKey(name, old.IP)}})
			if old.IP != ip {
				if err := f.rekey(c, old.IP, markUnbound); err != nil {
					return err
				}
			}
		}
	}
	for s, k := range map[*nftables.Set][]byte{f.portSet(bt): ifname(name), portMACSet(bt): portMACKey(name, mac), portIPSet(bt): portIPKey(name, ip)} {
		if err := c.SetAddElements(s, []nftables.SetElement{{Key: k}}); err != nil {
			return err
		}
	}
	if err := f.rekey(c, ip, portMark(index)); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: binding port %s to %s and %s: %w", name, mac, ip, err)
	}
	return nil
}

// UnbindPort forgets a lab port and its binding; the rules of its lease
// wait, unmatched, for a port bound to the address again. It returns
// what the port was bound to (zero when it was not).
func (f *NFT) UnbindPort(ctx context.Context, name string) (PortBinding, error) {
	c, done, err := f.conn()
	if err != nil {
		return PortBinding{}, err
	}
	defer done()
	if _, err := c.ListTableOfFamily(f.cfg.Table, nftables.TableFamilyBridge); err != nil {
		return PortBinding{}, nil // no lab table: nothing is bound
	}
	have, err := f.bindings(c)
	if err != nil {
		return PortBinding{}, err
	}
	bt := f.bridge()
	var out PortBinding
	if b := have[name]; b != nil {
		out = *b
		if len(b.MAC) == 6 {
			_ = c.SetDeleteElements(portMACSet(bt), []nftables.SetElement{{Key: portMACKey(name, b.MAC)}})
		}
		if b.IP.IsValid() {
			_ = c.SetDeleteElements(portIPSet(bt), []nftables.SetElement{{Key: portIPKey(name, b.IP)}})
			if err := f.rekey(c, b.IP, markUnbound); err != nil {
				return out, err
			}
		}
	}
	ports, err := c.GetSetElements(f.portSet(bt))
	if err != nil {
		return out, fmt.Errorf("nftables: reading %s: %w", setPorts, err)
	}
	for _, e := range ports {
		if ifnameOf(e.Key) == name {
			_ = c.SetDeleteElements(f.portSet(bt), []nftables.SetElement{{Key: ifname(name)}})
		}
	}
	if err := c.Flush(); err != nil {
		return out, fmt.Errorf("nftables: unbinding port %s: %w", name, err)
	}
	return out, nil
}

// rekey queues moving the dispatch entries of the lease with address ip
// (if any) to mark.
func (f *NFT) rekey(c *nftables.Conn, ip netip.Addr, mark uint32) error {
	t := f.inet()
	for _, name := range []string{mapLeasePr, mapLeaseFw} {
		m := leaseMap(t, name)
		els, err := c.GetSetElements(m)
		if err != nil {
			return fmt.Errorf("nftables: reading %s: %w", name, err)
		}
		for _, e := range els {
			chain := verdictChain(e)
			if len(e.Key) < 8 || chain == "" || netip.AddrFrom4([4]byte(e.Key[4:8])) != ip {
				continue
			}
			if binary.NativeEndian.Uint32(e.Key[:4]) == mark {
				continue
			}
			if err := c.SetDeleteElements(m, []nftables.SetElement{{Key: e.Key}}); err != nil {
				return err
			}
			if err := c.SetAddElements(m, []nftables.SetElement{{Key: dispatchKeyOf(mark, ip),
				VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}}); err != nil {
				return err
			}
		}
	}
	return nil
}
