package firewall

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestPassesAgreesWithCheck: Plan's quick check never accepts an element
// that Check refuses, and accepts the ordinary ones, for addresses on
// both sides of every prefix the policy refuses.
func TestPassesAgreesWithCheck(t *testing.T) {
	var addrs []netip.Addr
	edges := func(p netip.Prefix) {
		first := p.Masked().Addr()
		f4 := first.As4()
		n := binary.BigEndian.Uint32(f4[:]) | (1<<(32-p.Bits()) - 1)
		last := netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, n)))
		for _, a := range []netip.Addr{first, first.Prev(), first.Next(), last, last.Next()} {
			if a.IsValid() {
				addrs = append(addrs, a)
			}
		}
	}
	for _, r := range reserved {
		edges(r.p)
	}
	lab := []netip.Prefix{netip.MustParsePrefix("10.13.37.0/24"), netip.MustParsePrefix("45.9.0.0/16")}
	host := []netip.Addr{netip.MustParseAddr("45.10.1.1"), netip.MustParseAddr("::ffff:45.10.1.2"), netip.MustParseAddr("2001:db8::1")}
	for _, l := range lab {
		edges(l)
	}
	for _, h := range host {
		addrs = append(addrs, h.Unmap(), h.Unmap().Next())
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		addrs = append(addrs, netip.AddrFrom4([4]byte{byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32())}))
	}
	addrs = append(addrs, netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("2001:db8::7"), netip.Addr{})
	ports := []uint16{0, 25, 443, 2525, 8080}
	protos := []string{"tcp", "udp", "sctp"}
	for _, doc := range []bool{false, true} {
		for _, smtp := range []bool{false, true} {
			p := Policy{Documentation: doc, AllowSMTP: smtp, SMTPPorts: DefaultSMTPPorts, Lab: lab, Host: host}
			pass := p.passes()
			accepted, quick := 0, 0
			for _, a := range addrs {
				for _, port := range ports {
					for _, proto := range protos {
						for _, v := range append(Verdicts, "bogus") {
							e := Element{Dst: a, Proto: proto, Port: port, Verdict: v}
							err := p.Check(e)
							if pass(e) {
								quick++
								if err != nil {
									t.Fatalf("documentation %v, smtp %v: %s passes the quick check, Check says %v", doc, smtp, e, err)
								}
							}
							if err == nil {
								accepted++
							}
						}
					}
				}
			}
			// Only the edge cases (documentation ranges) are left to Check.
			if quick < accepted*9/10 {
				t.Fatalf("documentation %v, smtp %v: the quick check passed %d of %d accepted elements", doc, smtp, quick, accepted)
			}
		}
	}
}
