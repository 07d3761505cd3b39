package allowlist

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// miraiFlood writes a Mirai bot's session with its C2 at c2, kept alive,
// whose order the bot carries out: a UDP flood of victim.
func miraiFlood(g *pcapgen.Gen, c2 netip.AddrPort, victim netip.Addr) {
	g.T = pcapgen.Start
	g.MiraiSession(netip.AddrPortFrom(guest, 40001), c2, "telnet.x86", 4, pcapgen.MiraiOrder(5, 2,
		[]netip.Prefix{netip.PrefixFrom(victim, 32)}, nil), 1460)
	for i := 0; i < 2000; i++ {
		g.UDP(netip.AddrPortFrom(guest, 40002), netip.AddrPortFrom(victim, uint16(1000+i%50)), make([]byte, 512))
	}
}

// provUIDs are the uids an observable's provenance names.
func provUIDs(o *records.Observable) []string {
	var out []string
	for _, p := range o.Provenance {
		out = append(out, p.UID)
	}
	return out
}

// A promotion names the connections its evidence rests on, and a refusal
// those of what it refused: the C2's entry the uid of the connection that
// carried the bot's channel, the flood target's refusal the flood's, each
// the uid tb-parse gave that connection in the flow log.
func TestEvidenceNamesItsConnections(t *testing.T) {
	c2 := netip.MustParseAddrPort("198.51.100.7:48101")
	victim := netip.MustParseAddr("203.0.113.9")
	obs := parsed(t, func(g *pcapgen.Gen) { miraiFlood(g, c2, victim) })
	var channelUIDs, attackUIDs []string
	for _, o := range obs {
		switch o.Type {
		case records.ObsC2Channel:
			channelUIDs = provUIDs(o)
		case records.ObsAttack:
			attackUIDs = provUIDs(o)
		}
	}
	if len(channelUIDs) != 1 || len(attackUIDs) != 1 || channelUIDs[0] == "" || attackUIDs[0] == "" {
		t.Fatalf("channel %q, attack %q: one connection each", channelUIDs, attackUIDs)
	}
	pol, err := LoadPolicy("")
	if err != nil {
		t.Fatal(err)
	}
	pol.Documentation = true
	dests := Classify(obs, &pol)
	byValue := map[string]Dest{}
	for _, d := range dests {
		byValue[d.Value] = d
	}
	if d := byValue[c2.String()+"/tcp"]; d.Class != ClassC2 || !slices.Equal(d.UIDs, channelUIDs) {
		t.Fatalf("the C2: %s, uids %q, want the channel's %q", d.Class, d.UIDs, channelUIDs)
	}
	attacked := netip.AddrPortFrom(victim, 1000).String() + "/udp"
	if d := byValue[attacked]; d.Class != ClassAbuse || len(d.UIDs) == 0 || d.UIDs[0] != attackUIDs[0] {
		t.Fatalf("the flood's target: %s, uids %q, want the flood's %q first", d.Class, d.UIDs, attackUIDs)
	}

	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	v := pubValidator()
	v.Documentation = true
	p := Promotion{Chain: Chain{Scope: records.ScopeLease, Lease: testLease}, Cycle: "cycle_01JD0000000000000000000000",
		Dests: dests, Policy: &pol, Validator: v, Now: now}
	rev, _, err := b.Promote(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	_, entries, err := b.Revision(context.Background(), rev.ID)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(entries, func(e *records.AllowEntry) bool { return e.Value == c2.String()+"/tcp" })
	if i < 0 || !slices.Equal(entries[i].UIDs, channelUIDs) {
		t.Fatalf("entries %+v (refusals %+v): the C2's names no connection %q", entries, rev.Refusals, channelUIDs)
	}
	j := slices.IndexFunc(rev.Refusals, func(r records.Refusal) bool { return r.Class == ClassAbuse })
	if j < 0 || !slices.Contains(rev.Refusals[j].UIDs, attackUIDs[0]) {
		t.Fatalf("refusals %+v: the flood's target's names not the flood's connection %q", rev.Refusals, attackUIDs)
	}
}

// Observables on stdin are any JSON: a provenance uid that could not be a
// flow log's (too long, quotes, control characters) is not evidence, and
// however many connections an endpoint names, its destination names at
// most MaxUIDs.
func TestEvidenceUIDsAreCheckedAndBounded(t *testing.T) {
	pol := DefaultPolicy()
	pol.compile()
	t0 := pcapgen.Start
	o := obsEndpoint("45.155.205.17", 443, 6, t0, t0.Add(25*time.Minute))
	for _, bad := range []string{strings.Repeat("C", 10000), `C1","x":"`, "C1\x00", "C1\n", "C ", ""} {
		o.Provenance = append(o.Provenance, records.Provenance{Input: "x", UID: bad})
	}
	for i := range 3 * MaxUIDs {
		o.Provenance = append(o.Provenance, records.Provenance{Input: "x", UID: "Cgood" + strconv.Itoa(i)})
	}
	for _, d := range Classify([]*records.Observable{o}, &pol) {
		if len(d.UIDs) != MaxUIDs {
			t.Fatalf("%s: %d uids, want %d", d.Value, len(d.UIDs), MaxUIDs)
		}
		for _, u := range d.UIDs {
			if !strings.HasPrefix(u, "Cgood") {
				t.Fatalf("%s: uid %q taken as evidence", d.Value, u)
			}
		}
	}
}
