package firewall

import (
	"context"
	"net/netip"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
)

// RuleCounter is one rule and what its counter saw.
type RuleCounter struct {
	Chain   string `json:"chain"`
	Rule    string `json:"rule"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// LeaseStatus is what is applied for one lease.
type LeaseStatus struct {
	Lease    string         `json:"lease"` // the tag; callers map it back to an ID
	IP       netip.Addr     `json:"ip"`
	Elements map[string]int `json:"elements"` // per verdict
	Rules    []RuleCounter  `json:"rules"`
}

// Status is the whole of talkbox's tables in one namespace.
type Status struct {
	Table  string        `json:"table"`
	Up     bool          `json:"up"`
	Lab    []RuleCounter `json:"lab,omitempty"`
	Leases []LeaseStatus `json:"leases,omitempty"`
}

func label(ud []byte) string {
	s, _ := userdata.GetString(ud, userdata.TypeComment)
	return s
}

func counted(t *nftables.Table, ch string, rules []*nftables.Rule) []RuleCounter {
	var out []RuleCounter
	for _, r := range rules {
		rc := RuleCounter{Chain: ch, Rule: label(r.UserData)}
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				rc.Packets, rc.Bytes = c.Packets, c.Bytes
			}
		}
		out = append(out, rc)
	}
	return out
}

// Status implements Firewall.
func (f *NFT) Status(ctx context.Context) (*Status, error) {
	st := &Status{Table: f.cfg.Table}
	up, err := f.Present()
	if err != nil || !up {
		return st, err
	}
	st.Up = true
	c, done, err := f.conn()
	if err != nil {
		return nil, err
	}
	defer done()
	t := f.inet()
	for _, ch := range []string{chPre, chSink, chFwd, chIn, chPost} {
		rules, err := c.GetRules(t, &nftables.Chain{Name: ch, Table: t})
		if err != nil {
			return nil, err
		}
		st.Lab = append(st.Lab, counted(t, ch, rules)...)
	}
	bt := f.bridge()
	if rules, err := c.GetRules(bt, &nftables.Chain{Name: "forward", Table: bt}); err == nil {
		st.Lab = append(st.Lab, counted(bt, "bridge forward", rules)...)
	}
	if rules, err := c.GetRules(bt, &nftables.Chain{Name: chBind, Table: bt}); err == nil {
		st.Lab = append(st.Lab, counted(bt, "bridge bind", rules)...)
	}
	ips, err := f.leaseIPs(c, t)
	if err != nil {
		return nil, err
	}
	tags := map[string]netip.Addr{}
	for ip, d := range ips {
		tags[d.tag] = ip
	}
	// Chains without a dispatch entry (a crash between batches cannot
	// leave them, but a hand edit can) are reported too, so reconcile sees them.
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, err
	}
	for _, ch := range chains {
		if ch.Table.Name == t.Name && strings.HasPrefix(ch.Name, "pre_") {
			if _, ok := tags[ch.Name[4:]]; !ok {
				tags[ch.Name[4:]] = netip.Addr{}
			}
		}
	}
	for tag, ip := range tags {
		ls := LeaseStatus{Lease: tag, IP: ip, Elements: map[string]int{}}
		o := f.leaseObjs(t, tag)
		for _, v := range Verdicts {
			if els, err := c.GetSetElements(o.sets[v]); err == nil {
				ls.Elements[string(v)] = len(els)
			}
		}
		for _, ch := range []*nftables.Chain{o.pre, o.fwd, o.rfl} {
			if rules, err := c.GetRules(ch.Table, ch); err == nil {
				ls.Rules = append(ls.Rules, counted(ch.Table, ch.Name, rules)...)
			}
		}
		st.Leases = append(st.Leases, ls)
	}
	sort.Slice(st.Leases, func(i, j int) bool { return st.Leases[i].Lease < st.Leases[j].Lease })
	return st, nil
}

func sortElements(els []Element) {
	sort.Slice(els, func(i, j int) bool {
		a, b := els[i], els[j]
		if c := a.Dst.Compare(b.Dst); c != 0 {
			return c < 0
		}
		if a.Proto != b.Proto {
			return a.Proto < b.Proto
		}
		return a.Port < b.Port
	})
}
