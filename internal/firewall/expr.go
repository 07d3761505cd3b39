package firewall

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

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

func gotoChain(name string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: name} }

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
