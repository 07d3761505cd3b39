package netlab

import (
	"encoding/binary"
	"fmt"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// What the sinkhole may send to the upstream resolver, per lab: packets to
// its port 53 a second, and the burst allowed above that rate. A query is
// at least one packet (over TCP at least four), so these bound the queries
// forwarded. The cache answers repeats, so a sample resolving its promoted
// names stays far below; a flood of questions is held to it whatever the
// guests' own limits add up to.
const (
	UpstreamQueriesPerSecond = 10
	UpstreamQueryBurst       = 20
)

// dnsLimitTable is the sinkhole namespace's own table. It lives and dies
// with that namespace, apart from the lab's containment tables on the host.
const dnsLimitTable = "talkbox_dns"

// limitUpstream (re)programs the sinkhole namespace's output limit on
// queries to the upstream resolver.
func limitUpstream(cfg *Config) error {
	ns, err := os.Open(netns.Path(cfg.SinkNS))
	if err != nil {
		return fmt.Errorf("sinkhole namespace: %w", err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: dnsLimitTable, Family: nftables.TableFamilyINet}
	// Adding then deleting the table clears what an earlier "up" left in
	// one transaction, without failing when there was none.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	out := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	up := cfg.Upstream.As4()
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: up[:]},
		// UDP and TCP alike: port 53 at the transport header's offset 2.
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, 53)},
		&expr.Limit{Type: expr.LimitTypePkts, Rate: UpstreamQueriesPerSecond, Unit: expr.LimitTimeSecond,
			Burst: UpstreamQueryBurst, Over: true},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sinkhole upstream limit: %w", err)
	}
	return nil
}
