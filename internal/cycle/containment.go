package cycle

import (
	"cmp"
	"context"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Where a flood went, as the lab's rules in force when the cycle started
// decided it (records.AttackOutcome.Contained).
const (
	ContainedSinkholed = "sinkholed"    // no entry let it out: the lab's default DNAT to the sinkhole
	ContainedDropped   = "dropped"      // entries with the drop verdict
	ContainedReflected = "reflected"    // entries that send it back to the guest
	ContainedLimited   = "rate-limited" // let out within the lease's rate limit
	ContainedForwarded = "forwarded"    // let out
	ContainedPartly    = "partly let out"
	ContainedUnknown   = "unknown" // the allow lists in force could not be read
)

// enforcedAt is what the allow lists in force when c started let out, by
// endpoint: the lease chain's revision (c.Revision) and the sample's and
// global chains' (c.Enforced); entries on probation are rate-limited
// whatever they say.
func enforcedAt(ctx context.Context, st *state.Store, c *records.Cycle) (map[endpoint.Endpoint]firewall.Verdict, error) {
	out := map[endpoint.Endpoint]firewall.Verdict{}
	b := &allowlist.Book{St: st}
	for _, rev := range append([]string{c.Revision}, c.Enforced...) {
		if rev == "" {
			continue
		}
		_, entries, err := b.Revision(ctx, rev)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.Type != records.AllowEndpoint || e.Status != records.StatusActive && e.Status != records.StatusProbation {
				continue
			}
			ep, err := endpoint.Parse(e.Value)
			if err != nil {
				continue
			}
			v := firewall.Verdict(e.Verdict)
			if e.Status == records.StatusProbation || v == "" {
				v = firewall.RateLimit
			}
			out[ep] = v
		}
	}
	return out, nil
}

// floodProto is the transport a flood vector's packets use ("" for those
// with no port, ICMP and GRE, which no endpoint entry matches).
func floodProto(vector string) string {
	switch {
	case vector == "syn" || vector == "ack" || vector == "http":
		return "tcp"
	case vector == "udp" || vector == "udpplain" || vector == "vse" || vector == "dns" || strings.HasPrefix(vector, "amp-"):
		return "udp"
	}
	return ""
}

// contained says where a flood went under the verdicts in force: its
// packets go to the target (to the reflectors, for a reflection or a dns
// flood) on the ports tb-parse listed; a DNS query always goes to the
// lab's resolver, and a packet no entry matches to the sinkhole.
func contained(a *records.AttackInfo, in map[endpoint.Endpoint]firewall.Verdict) string {
	proto := floodProto(a.Vector)
	dsts := []string{a.Target}
	if strings.HasPrefix(a.Vector, "amp-") || a.Vector == "dns" {
		dsts = a.Reflectors
	}
	seen := map[string]bool{}
	for _, d := range dsts {
		addr, err := netip.ParseAddr(d)
		for _, p := range a.Ports {
			port, perr := strconv.ParseUint(p, 10, 16)
			v := ContainedSinkholed
			if err == nil && perr == nil && proto != "" && port != 53 {
				switch in[endpoint.New(addr, uint16(port), proto)] {
				case firewall.Drop:
					v = ContainedDropped
				case firewall.Reflect:
					v = ContainedReflected
				case firewall.RateLimit:
					v = ContainedLimited
				case firewall.Forward:
					v = ContainedForwarded
				}
			}
			seen[v] = true
		}
	}
	out := slices.Sorted(maps.Keys(seen))
	letOut := seen[ContainedLimited] || seen[ContainedForwarded]
	switch {
	case len(out) == 0:
		return ContainedSinkholed
	case len(out) == 1 && (!letOut || a.PortCount <= int64(len(a.Ports))):
		return out[0]
	case letOut:
		// Some ports let out, others not, or ports beyond those listed.
		return ContainedPartly
	}
	return strings.Join(out, " or ")
}

// attackOutcomes are the cycle's floods with where each went.
func attackOutcomes(ctx context.Context, st *state.Store, c *records.Cycle, attacks []*records.Observable) ([]records.AttackOutcome, error) {
	if len(attacks) == 0 {
		return nil, nil
	}
	// A revision that cannot be read (its content gone, its fleet host
	// down) leaves the floods' fate unknown rather than failing the cycle.
	in, err := enforcedAt(ctx, st, c)
	if err != nil && ctx.Err() != nil {
		return nil, err
	}
	out := make([]records.AttackOutcome, 0, len(attacks))
	for _, o := range attacks {
		where := ContainedUnknown
		if err == nil {
			where = contained(o.Attack, in)
		}
		out = append(out, records.AttackOutcome{Attack: o.ID, Value: o.Value, Packets: o.Attack.Packets,
			Order: o.Attack.Order, Contained: where})
	}
	slices.SortFunc(out, func(x, y records.AttackOutcome) int {
		return cmp.Or(cmp.Compare(x.Value, y.Value), cmp.Compare(x.Attack, y.Attack))
	})
	return out, nil
}
