package leasereport_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/leasereport"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// TestOrdersAndAttacksOnTheTimeline: the C2's attack orders and the
// floods the bot sent (c2-command and attack observables, as tb-parse
// stores them) are the timeline's bot row and a table under it, each
// linked to its record, with the order's sample-controlled text escaped.
func TestOrdersAndAttacksOnTheTimeline(t *testing.T) {
	st, b := twoCycles(t)
	ctx := context.Background()
	var c records.Cycle
	if err := st.Get(b.Cycles[1], &c); err != nil {
		t.Fatal(err)
	}
	at := c.StartedAt.Add(30e9)
	order := &records.Observable{Type: records.ObsC2Command, Value: "mirai udpplain 203.0.113.9/32", Lease: b.Lease, Cycle: c.ID,
		FirstSeen: at, LastSeen: at, Count: 1, C2Command: &records.C2CommandInfo{Family: "mirai", Protocol: "mirai", Vector: "udpplain",
			Targets: []string{"203.0.113.9/32"}, Ports: []string{"<b>80</b>"}, Duration: 5, Raw: "00", Servers: []string{"198.51.100.18:23"}}}
	attack := &records.Observable{Type: records.ObsAttack, Value: "udpplain 203.0.113.9", Lease: b.Lease, Cycle: c.ID,
		FirstSeen: at.Add(1e9), LastSeen: at.Add(6e9), Count: 1, Attack: &records.AttackInfo{Vector: "udpplain", Target: "203.0.113.9",
			Packets: 500, PPS: 100, PortCount: 1, Order: order.Value, OrderDelay: 1}}
	// A flood that carried out an order the report does not hold (sent in
	// another cycle) names it without a record.
	unheld := &records.Observable{Type: records.ObsAttack, Value: "syn 203.0.113.10", Lease: b.Lease, Cycle: c.ID,
		FirstSeen: at.Add(10e9), LastSeen: at.Add(16e9), Count: 1, Attack: &records.AttackInfo{Vector: "syn", Target: "203.0.113.10",
			Packets: 600, PPS: 100, PortCount: 1, Order: "irc-bot !syn 203.0.113.10", OrderDelay: 2.5}}
	for _, o := range []*records.Observable{order, attack, unheld} {
		records.Init(o, records.KindObservable, st.Now())
		if err := st.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	r := collect(t, st, leasereport.Target{Lease: b.Lease})
	if len(r.Orders) != 1 || r.Orders[0].Observable != order.ID || len(r.Attacks) != 2 || r.Attacks[0].Packets != 500 ||
		r.Attacks[0].OrderObservable != order.ID || r.Attacks[1].Order != "irc-bot !syn 203.0.113.10" || r.Attacks[1].OrderObservable != "" {
		t.Fatalf("orders %+v, attacks %+v", r.Orders, r.Attacks)
	}
	var buf bytes.Buffer
	if err := leasereport.WriteHTML(&buf, r); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, p := range pageProblems(page) {
		t.Error(p)
	}
	for _, want := range []string{">bot</text>", "order (mirai): udpplain on 203.0.113.9/32", "attack: udpplain flood on 203.0.113.9, 500 packets",
		`href="#rec-` + order.ID + `"`, `href="#rec-` + attack.ID + `"`, "&lt;b&gt;80&lt;/b&gt;",
		"; carrying out the order mirai udpplain 203.0.113.9/32 (1 s after it: ",
		"; carrying out the order irc-bot !syn 203.0.113.10 (2.5 s after it)",
		"carrying out the order mirai udpplain 203.0.113.9/32 (1 s after it)</title>",
		`stroke="#283593"`} {
		if !strings.Contains(page, want) {
			t.Errorf("no %s", want)
		}
	}
}
