package firewall

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

func (f *NFT) baseChains(t *nftables.Table) (pre, fwd, in, post *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	pre = &nftables.Chain{Name: chPre, Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest}
	fwd = &nftables.Chain{Name: chFwd, Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	in = &nftables.Chain{Name: chIn, Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	post = &nftables.Chain{Name: chPost, Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource}
	return
}

// leaseMap dispatches "meta mark . ip saddr" (the guest's port, see
// BindPort, and its address) to a lease's chain.
func leaseMap(t *nftables.Table, name string) *nftables.Set {
	return &nftables.Set{Table: t, Name: name, IsMap: true, KeyType: dispatchKey, DataType: nftables.TypeVerdict, Concatenation: true}
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
	sink := &nftables.Chain{Name: chSink, Table: t}
	for _, ch := range []*nftables.Chain{pre, fwd, in, post, sink} {
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
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: 8}, ipField(12, 9),
			&expr.Lookup{SourceRegister: 8, SetName: m.Name, DestRegister: 0, IsDestRegSet: true}}
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
	// A guest that resolved a name gets the sinkhole's address: it goes
	// through the catch-all as one sent anywhere else does.
	add(rule(t, pre, "guest to sinkhole", iif(br), ipv4(), daddrIs(cfg.Sinkhole), then(gotoChain(chSink))))
	add(rule(t, pre, "guest to anywhere: sinkhole", iif(br), ipv4(), then(gotoChain(chSink))))
	if err := f.sinkRules(c, t, sink); err != nil {
		return err
	}

	// forward (filter): replies, sinkholed traffic, lease rules; the rest of
	// the lab's traffic is dropped. Other interfaces are left alone.
	add(rule(t, fwd, "replies to guests", oif(br), established(), then(accept())))
	// Only what came in by a bound port (see BindPort) is a guest's: a
	// port on the bridge that was never attached has no lease, no limits
	// keyed to it and no business beyond the bridge.
	add(rule(t, fwd, "guest not from a bound port", iif(br),
		then(&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binary.NativeEndian.AppendUint32(nil, ^uint32(markMask)), Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, markBase)}),
		then(drop())))
	if err := f.guestLimitRules(c, t, fwd); err != nil {
		return err
	}
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
	if err := f.bridgeUp(c); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: programming table %s: %w", cfg.Table, err)
	}
	return nil
}

// sinkRules queues the sets of the ports the sinkhole serves and the rules
// of the chain that translates to it: TCP and UDP to a port it does not
// serve go to its catch-all (one set lookup each, whatever the number of
// ports), the rest keeps its port.
func (f *NFT) sinkRules(c *nftables.Conn, t *nftables.Table, sink *nftables.Chain) error {
	for _, ca := range []struct {
		set   string
		proto byte
		cfg   *CatchAll
	}{{setSinkTCP, unix.IPPROTO_TCP, f.cfg.CatchAllTCP}, {setSinkUDP, unix.IPPROTO_UDP, f.cfg.CatchAllUDP}} {
		s := &nftables.Set{Table: t, Name: ca.set, KeyType: nftables.TypeInetService}
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
		c.FlushSet(s)
		if ca.cfg == nil {
			continue
		}
		var served []nftables.SetElement
		for _, p := range ca.cfg.Served {
			served = append(served, nftables.SetElement{Key: binary.BigEndian.AppendUint16(nil, p)})
		}
		if len(served) > 0 {
			if err := c.SetAddElements(s, served); err != nil {
				return err
			}
		}
		name := "unserved tcp port: catch-all"
		if ca.proto == unix.IPPROTO_UDP {
			name = "unserved udp port: catch-all"
		}
		c.AddRule(rule(t, sink, name, l4(ca.proto),
			then(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Lookup{SourceRegister: 1, SetName: ca.set, Invert: true}),
			dnatTo(f.cfg.Sinkhole, ca.cfg.Port)))
	}
	c.AddRule(rule(t, sink, "sinkhole, port kept", dnatTo(f.cfg.Sinkhole, 0)))
	return nil
}

func ifSet(key expr.MetaKey, set string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Lookup{SourceRegister: 1, SetName: set}}
}

// RegisterPorts adds bridge ports to the lab's ports: they may not talk
// to each other, and the bind chain drops what they send until BindPort
// binds them.
func (f *NFT) RegisterPorts(ctx context.Context, ports []string) error {
	c, done, err := f.conn()
	if err != nil {
		return err
	}
	defer done()
	var add []nftables.SetElement
	for _, p := range ports {
		add = append(add, nftables.SetElement{Key: ifname(p)})
	}
	if err := c.SetAddElements(f.portSet(f.bridge()), add); err != nil {
		return err
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
	return slices.ContainsFunc(els, func(e Element) bool { return e.Verdict == Forward || e.Verdict == RateLimit })
}
