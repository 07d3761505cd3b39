package firewall

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

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
	o.preMap = leaseMap(t, mapLeasePr)
	o.fwdMap = leaseMap(t, mapLeaseFw)
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
		return &TableAbsentError{Table: f.cfg.Table}
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
		if ip == lr.IP && other.tag != tag {
			return &InvalidError{Reasons: []string{fmt.Sprintf("lease IP %s is already used by lease %s", ip, other.tag)}}
		}
	}
	mark, err := f.leaseMark(c, lr, portIndex)
	if err != nil {
		return err
	}
	// Replace: drop whatever this lease had, then build it afresh, all in
	// the same batch.
	f.delLease(c, t, o, existing)
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
	c.AddRule(rule(t, o.pre, "redirect: sinkhole", elemLookup(set(Redirect)), then(gotoChain(chSink))))
	c.AddRule(rule(t, o.pre, "drop", elemLookup(set(Drop)), then(drop())))
	// fwd_<lease>: what may leave by the uplink.
	if f.cfg.Uplink != "" {
		c.AddRule(rule(t, o.fwd, "not to the uplink", noif(f.cfg.Uplink), then(ret())))
		if !lr.AllowSMTP {
			c.AddRule(rule(t, o.fwd, "smtp never forwarded", l4(unix.IPPROTO_TCP),
				then(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
					&expr.Lookup{SourceRegister: 1, SetName: setSMTP}), then(drop())))
		}
		f.budgetRules(c, t, o.fwd)
		c.AddRule(rule(t, o.fwd, "forward", elemLookup(set(Forward)), then(accept())))
		rate := lr.Rate
		if rate.Value == 0 {
			rate = DefaultRate
		}
		// One token bucket per destination: a meter keyed like the set.
		meter := &nftables.Set{Table: t, Name: "rlm_" + tag, KeyType: elemType, Concatenation: true,
			Dynamic: true, HasTimeout: true, Timeout: time.Minute, Size: f.cfg.MaxElements}
		if err := c.AddSet(meter, nil); err != nil {
			return err
		}
		c.AddRule(rule(t, o.fwd, "rate-limit: over the limit", elemLookup(set(RateLimit)),
			then(&expr.Dynset{SrcRegKey: 8, SetName: meter.Name, Operation: unix.NFT_DYNSET_OP_UPDATE,
				Timeout: time.Minute, Exprs: []expr.Any{limitOver(rate)}}), then(drop())))
		c.AddRule(rule(t, o.fwd, "rate-limit: within the limit", elemLookup(set(RateLimit)), then(accept())))
	}
	// Dispatch the lease's port and source address to its chains.
	for m, ch := range map[*nftables.Set]*nftables.Chain{o.preMap: o.pre, o.fwdMap: o.fwd} {
		if err := c.SetAddElements(m, []nftables.SetElement{{Key: dispatchKeyOf(mark, lr.IP), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}}); err != nil {
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

// dispatch is a lease's entry in the dispatch maps.
type dispatch struct {
	tag string
	key []byte // mark . address
}

// leaseIPs maps lease source addresses to their dispatch entries.
func (f *NFT) leaseIPs(c *nftables.Conn, t *nftables.Table) (map[netip.Addr]dispatch, error) {
	els, err := c.GetSetElements(leaseMap(t, mapLeasePr))
	if err != nil {
		return nil, fmt.Errorf("nftables: reading %s: %w", mapLeasePr, err)
	}
	out := map[netip.Addr]dispatch{}
	for _, e := range els {
		chain := verdictChain(e)
		if len(e.Key) < 8 || chain == "" {
			continue
		}
		out[netip.AddrFrom4([4]byte(e.Key[4:8]))] = dispatch{tag: strings.TrimPrefix(chain, "pre_"), key: e.Key[:8]}
	}
	return out, nil
}

// leaseMark is the mark a lease's rules are dispatched on: its port's.
// A port given must be bound to the lease's address; without one, the
// port bound to the address is the lease's, and with none bound the rules
// wait for BindPort (markUnbound).
func (f *NFT) leaseMark(c *nftables.Conn, lr LeaseRules, portIndex int) (uint32, error) {
	bound, err := f.bindings(c)
	if err != nil {
		return 0, err
	}
	if lr.Port != "" {
		b := bound[lr.Port]
		if b == nil || b.IP != lr.IP {
			return 0, &InvalidError{Reasons: []string{fmt.Sprintf("lease port %s is not bound to %s (netlab.AttachPort)", lr.Port, lr.IP)}}
		}
		return portMark(portIndex), nil
	}
	for _, b := range bound {
		if b.IP != lr.IP {
			continue
		}
		mark := uint32(markUnbound)
		err := netns.Do(f.cfg.NetNS, func() error {
			ifc, err := net.InterfaceByName(b.Name)
			if err == nil {
				mark = portMark(ifc.Index)
			}
			return nil
		})
		return mark, err
	}
	return markUnbound, nil
}

// delLease queues the removal of a lease's objects that exist.
func (f *NFT) delLease(c *nftables.Conn, t *nftables.Table, o *leaseObjs, ips map[netip.Addr]dispatch) bool {
	found := false
	for _, d := range ips {
		if d.tag != o.tag {
			continue
		}
		found = true
		for _, m := range []*nftables.Set{o.preMap, o.fwdMap} {
			_ = c.SetDeleteElements(m, []nftables.SetElement{{Key: d.key}})
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

// ErrTableAbsent matches (errors.Is) a TableAbsentError.
var ErrTableAbsent = errors.New("the lab's nftables table is absent")

// TableAbsentError is a lease's rules asked of a lab whose table is not in
// the kernel (the lab was taken down, the host rebooted): the lab is not
// up. netlab owns the one wording of that and cannot be imported from
// here (it imports this package): its Lab.LiveFirewall checks the table
// first and gives the lab's NotUpError; this is what a table lost between
// that check and the rules says, exit 69 too.
type TableAbsentError struct{ Table string }

func (e *TableAbsentError) Error() string {
	return fmt.Sprintf("the lab's nftables table %s is absent: the lab is not up", e.Table)
}

// FaultCode implements fault.Coder: a service missing, as a lab not up.
func (e *TableAbsentError) FaultCode() int { return fault.ExitUnavailable }

// Is makes errors.Is(err, ErrTableAbsent) true.
func (e *TableAbsentError) Is(target error) bool { return target == ErrTableAbsent }

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
	return slices.ContainsFunc(els, func(e Element) bool { return e.Verdict == v })
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
