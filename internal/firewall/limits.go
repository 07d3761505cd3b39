package firewall

import (
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Limits bound the load one lease's guest can put on the host and, through
// its allow-list, on the internet. Zero fields take the defaults below.
type Limits struct {
	// NewConns is the rate of new connections a guest may open on any
	// path (sinkhole or allow-list); Conns the connection-tracking
	// entries it may hold at once. Together they keep one guest from
	// filling the host's conntrack table.
	NewConns Rate   `json:"new_conns,omitzero"`
	Conns    uint32 `json:"conns,omitempty"`
	// DNS is the rate of DNS queries a guest may send the sinkhole, which
	// bounds what the sinkhole forwards upstream for it.
	DNS Rate `json:"dns,omitzero"`
	// Budget and BudgetConns bound what a lease sends to all its allowed
	// endpoints together (bytes, new connections); each endpoint also has
	// the lease's own rate (LeaseRules.Rate, DefaultRate when none).
	Budget      Rate `json:"budget,omitzero"`
	BudgetConns Rate `json:"budget_conns,omitzero"`
}

// The defaults: room for a sample's normal traffic, far below what would
// strain the host or aim the lab at a third party.
var (
	DefaultRate   = Rate{Value: 64 << 10, Bytes: true, Per: 1}
	DefaultLimits = Limits{
		NewConns:    Rate{Value: 50, Per: 1},
		Conns:       1024,
		DNS:         Rate{Value: 20, Per: 1},
		Budget:      Rate{Value: 256 << 10, Bytes: true, Per: 1},
		BudgetConns: Rate{Value: 10, Per: 1},
	}
)

func (l *Limits) defaults() {
	def := func(r *Rate, d Rate) {
		if r.Value == 0 {
			*r = d
		}
	}
	def(&l.NewConns, DefaultLimits.NewConns)
	def(&l.DNS, DefaultLimits.DNS)
	def(&l.Budget, DefaultLimits.Budget)
	def(&l.BudgetConns, DefaultLimits.BudgetConns)
	if l.Conns == 0 {
		l.Conns = DefaultLimits.Conns
	}
}

// connlimitOver is NFT_CONNLIMIT_F_INV: "ct count over".
const connlimitOver = 1

// Meters of the inet table, keyed by guest address (which the bridge
// binds to the guest's port, so one key is one lease).
const (
	meterNewConns = "guest_new_conns"
	meterConns    = "guest_conns"
	meterDNS      = "guest_dns"
	// meterSize bounds each meter; it holds every address of a lab net
	// as large as a /16, so no guest's packets go unmetered for want of room.
	meterSize = 65536
)

func meter(t *nftables.Table, name string, timeout bool) *nftables.Set {
	s := &nftables.Set{Table: t, Name: name, KeyType: nftables.TypeIPAddr, Dynamic: true, Size: meterSize}
	if timeout {
		s.HasTimeout, s.Timeout = true, time.Minute
	}
	return s
}

// bucketOver is "limit rate over" r whose bucket holds one period's worth
// beyond the rate, packets or bytes: a guest's normal bursts (a sample's
// first lookups and connections) pass, a flood does not.
func bucketOver(r Rate) *expr.Limit {
	l := limitOver(r)
	l.Burst = uint32(min(r.Value, 1<<30))
	return l
}

// guestLimitRules queues the forward chain's per-guest limits, ahead of
// every accept of a guest's packet.
func (f *NFT) guestLimitRules(c *nftables.Conn, t *nftables.Table, fwd *nftables.Chain) error {
	lim := f.cfg.Limits
	for _, m := range []*nftables.Set{meter(t, meterNewConns, true), meter(t, meterConns, false), meter(t, meterDNS, true)} {
		if err := c.AddSet(m, nil); err != nil {
			return err
		}
	}
	br := f.cfg.Bridge
	saddr := ipField(12, 8)
	isNew := ctState(expr.CtStateBitNEW)
	over := func(set string, op uint32, timeout time.Duration, e expr.Any) []expr.Any {
		return []expr.Any{saddr, &expr.Dynset{SrcRegKey: 8, SetName: set, Operation: op, Timeout: timeout, Exprs: []expr.Any{e}}}
	}
	c.AddRule(rule(t, fwd, "guest: over its new-connection rate", iif(br), ipv4(), isNew,
		over(meterNewConns, unix.NFT_DYNSET_OP_UPDATE, time.Minute, bucketOver(lim.NewConns)), then(drop())))
	c.AddRule(rule(t, fwd, "guest: over its connection count", iif(br), ipv4(), isNew,
		over(meterConns, unix.NFT_DYNSET_OP_ADD, 0, &expr.Connlimit{Count: lim.Conns, Flags: connlimitOver}), then(drop())))
	c.AddRule(rule(t, fwd, "guest dns: over its query rate", iif(br), ipv4(), daddrIs(f.cfg.Sinkhole), l4(unix.IPPROTO_UDP), dport(53),
		over(meterDNS, unix.NFT_DYNSET_OP_UPDATE, time.Minute, bucketOver(lim.DNS)), then(drop())))
	return nil
}

// budgetRules queues a lease's aggregate budget in its forward chain,
// ahead of its forward and rate-limit verdicts: the rule's own token
// bucket is the lease's, whichever endpoint a packet is for.
func (f *NFT) budgetRules(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain) {
	lim := f.cfg.Limits
	c.AddRule(rule(t, ch, "lease budget: new connections over", ctState(expr.CtStateBitNEW), then(bucketOver(lim.BudgetConns)), then(drop())))
	c.AddRule(rule(t, ch, "lease budget: bytes over", then(bucketOver(lim.Budget)), then(drop())))
}
