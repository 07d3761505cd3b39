package packet

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/decode/botproto"
	"github.com/talkbox-sandbox/talkbox/internal/decode/dns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Bounds on attributing attacks to orders within one capture: the orders
// kept (the latest), the names they aimed at whose DNS answers are
// followed, the addresses kept per name, the orders an HTTP poll's answers
// may hold until the poll is known to be one, and how long after its
// order an attack may start.
const (
	maxOrders      = 256
	maxOrderNames  = 64
	maxNameAddrs   = 8
	maxPollOrders  = 8
	maxHTTPPending = 256
	orderWindow    = 30e9 // ns
)

// order is an order a C2 sent in this capture, as attacks are matched
// against it.
type order struct {
	ts, n    int64  // its packet's time and number
	value    string // the c2-command observable's value
	vector   string
	prefixes []netip.Prefix // the targets that are addresses or prefixes
	names    []string       // and those that are names (a URL's host)
}

// orderBook is the orders of one capture and what the names they aimed
// at resolved to after them.
type orderBook struct {
	list     []order
	resolved map[string][]netip.Addr // names ordered → their answers' addresses
	pending  int                     // HTTP orders held by polls
}

// add keeps an order; beyond maxOrders it replaces the oldest.
func (b *orderBook) add(ts, n int64, value string, c *botproto.Command) {
	o := order{ts: ts, n: n, value: value, vector: c.Vector}
	for _, t := range c.Targets {
		if p, err := netip.ParsePrefix(t); err == nil {
			o.prefixes = append(o.prefixes, p.Masked())
			continue
		}
		host := botproto.TargetHost(t)
		if a, err := netip.ParseAddr(host); err == nil {
			o.prefixes = append(o.prefixes, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		o.names = append(o.names, b.watch(host))
	}
	if len(b.list) < maxOrders {
		b.list = append(b.list, o)
		return
	}
	oldest := 0
	for i := range b.list {
		if b.list[i].ts < b.list[oldest].ts {
			oldest = i
		}
	}
	b.list[oldest] = o
}

// watch starts following the DNS answers for a host an order names; it
// returns the name as answers are matched.
func (b *orderBook) watch(host string) string {
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if b.resolved == nil {
		b.resolved = make(map[string][]netip.Addr)
	}
	if _, ok := b.resolved[name]; !ok && len(b.resolved) < maxOrderNames {
		b.resolved[name] = nil
	}
	return name
}

// answered notes the addresses an answered query for name carried, if an
// order aimed at the name: an attack on one of them carries the order out.
func (b *orderBook) answered(name string, rrs []dns.RR) {
	addrs, ok := b.resolved[name]
	if !ok {
		return
	}
	for _, rr := range rrs {
		if rr.Type != dns.TypeA && rr.Type != dns.TypeAAAA || len(addrs) >= maxNameAddrs {
			continue
		}
		if a, err := netip.ParseAddr(rr.Data); err == nil && !slices.Contains(addrs, a.Unmap()) {
			addrs = append(addrs, a.Unmap())
		}
	}
	b.resolved[name] = addrs
}

// aims reports whether the order aimed at the target: an address within
// one of its prefixes or that one of its names resolved to, or the name
// itself (a dns flood's domain).
func (o *order) aims(b *orderBook, target netip.Addr, name string) bool {
	if target.IsValid() {
		for _, p := range o.prefixes {
			if p.Contains(target) {
				return true
			}
		}
	}
	for _, n := range o.names {
		if name != "" && n == name || target.IsValid() && slices.Contains(b.resolved[n], target) {
			return true
		}
	}
	return false
}

// attribute finds the order an attack of vector on target (an address,
// or for a dns flood the domain name) starting at start carried out: one
// aimed at the target, of a vector the attack's carries out
// (botproto.Carries), sent at most orderWindow before the start; the
// latest such, the later packet on a tie.
func (b *orderBook) attribute(vector string, target netip.Addr, name string, start int64) *order {
	var best *order
	for i := range b.list {
		o := &b.list[i]
		if o.ts > start || start-o.ts > orderWindow || !botproto.Carries(o.vector, vector) || !o.aims(b, target, name) {
			continue
		}
		if best == nil || o.ts > best.ts || o.ts == best.ts && o.n > best.n {
			best = o
		}
	}
	return best
}

// attribute records on an attack the order it carried out, if one came
// before it in this capture.
func (d *Decoder) attribute(a *records.AttackInfo, target netip.Addr, name string, start int64) {
	if o := d.orders.attribute(a.Vector, target, name, start); o != nil {
		a.Order, a.OrderDelay = o.value, round3(float64(start-o.ts)/1e9)
	}
}

// pollOrder is an order an answer to a poll carried, held until the end
// of the capture tells whether the requests were a poll.
type pollOrder struct {
	cmd   botproto.Command
	ts, n int64
	uid   string // the answer's connection
}

// pollAnswer reads the body of an answer to a request counted towards p
// as an order (botproto.HTTPOrder); uid is the answer's connection.
func (d *Decoder) pollAnswer(p *poll, body []byte, k *pkt, uid string) {
	if len(p.orders) >= maxPollOrders || d.orders.pending >= maxHTTPPending {
		return
	}
	if c, ok := botproto.HTTPOrder(body); ok {
		p.orders = append(p.orders, pollOrder{cmd: c, ts: k.ts, n: k.n, uid: uid})
		d.orders.pending++
		// The bot may resolve the target before the end of the
		// capture tells that this was a poll.
		if host := botproto.TargetHost(c.Targets[0]); !isAddrOrPrefix(host) {
			d.orders.watch(host)
		}
	}
}

func isAddrOrPrefix(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	_, err := netip.ParsePrefix(s)
	return err == nil
}
