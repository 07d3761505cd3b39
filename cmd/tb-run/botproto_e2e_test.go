package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// The bot protocols' demos (TB_DEMO_PROTO, internal/demo's botwire): the
// existing amd64 and arm64 demos speak http and mirai, and three more
// amd64 demos the other protocols, in TestDemoEndToEnd's slots.
var (
	demoProto   = map[string]string{"amd64": "http", "arm64": "mirai"}
	extraProtos = []string{"mirai", "gafgyt", "irc"}
)

// demoPorts are the C2's ports scripts/demo.sh serves each protocol on.
var demoPorts = map[string]string{"": "80", "http": "80", "mirai": "23", "gafgyt": "666", "irc": "6667"}

// demoTarget is the address of the attack the demo's C2 orders.
const demoTarget = "203.0.113.77"

// demoCase is one run of the demo in TestDemoEndToEnd: arch's guest, its
// beacon speaking proto ("" for HTTP check-ins with no order).
type demoCase struct{ arch, proto string }

// demoCases are the architectures with their protocols, then the extra
// amd64 runs, named ARCH-PROTO.
func demoCases() []demoCase {
	var out []demoCase
	for _, a := range demoArches {
		out = append(out, demoCase{a, demoProto[a]})
	}
	for _, p := range extraProtos {
		out = append(out, demoCase{"amd64", p})
	}
	return out
}

func (c demoCase) name() string {
	if c.proto == "" || demoProto[c.arch] == c.proto {
		return c.arch
	}
	return c.arch + "-" + c.proto
}

// What the demo prints: its count of the attack's packets on the uplink,
// and in a cycle's text report the order and the attack.
var (
	uplinkLine      = regexp.MustCompile(`(?m)^uplink: (\d+) packets to the attack's target ` + regexp.QuoteMeta(demoTarget) + ` reached the uplink$`)
	reportOrdered   = regexp.MustCompile(`(?m)^  classification: .*\bordered\b`)
	reportAttacking = regexp.MustCompile(`(?m)^  classification: .*\battacking\b`)
	reportSeen      = regexp.MustCompile(`(?m)^  seen: .*\b[1-9]\d* attack\b.*\b[1-9]\d* c2-command\b`)
)

// botProtoEndToEnd checks a protocol demo's two cycles cs: its channel
// recognised as proto's, the C2 on probation after the first (its bot
// side alone, the C2 sinkholed), the order sent only in the second once
// the C2 was let through,
// the flood seen and attributed to that order, not one of its packets on
// the uplink, and the reports showing the order and the attack.
func botProtoEndToEnd(t *testing.T, st *state.Store, r *demoRun, proto, c2addr string, cs [2]records.Cycle, as [2]records.RunAnalysis) {
	t.Helper()
	server := c2addr + ":" + demoPorts[proto]
	obs, err := state.FindBy(st, records.KindObservable, records.KeyLease, cs[0].Lease, func(o *records.Observable) bool {
		return o.Type == records.ObsC2Channel || o.Type == records.ObsC2Command || o.Type == records.ObsAttack
	})
	if err != nil {
		t.Fatal(err)
	}
	var channel bool
	var orders, attacks []*records.Observable
	for _, o := range obs {
		switch {
		case o.C2Channel != nil:
			channel = channel || o.C2Channel.Protocol == proto && o.C2Channel.Server == server
		case o.C2Command != nil:
			orders = append(orders, o)
		case o.Attack != nil:
			attacks = append(attacks, o)
		}
	}
	// The C2 server's log: nothing before the C2 was let through (the
	// sinkhole answered before), and the order sent.
	b, err := os.ReadFile(filepath.Join(r.outDir, "c2.log"))
	if err != nil {
		t.Fatal(err)
	}
	sent := 0
	for i, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var line struct {
			Time  time.Time `json:"time"`
			Order string    `json:"order"`
		}
		if err := json.Unmarshal(l, &line); err != nil {
			t.Fatalf("c2.log:%d: %v", i+1, err)
		}
		if line.Time.Before(*cs[1].StartedAt) {
			t.Errorf("c2.log:%d: the C2 was reached before it was let through (%s): %s", i+1, cs[1].ID, l)
		}
		if line.Order != "" {
			sent++
		}
	}
	if sent == 0 {
		t.Errorf("the C2 sent no order: %s", b)
	}
	if !channel {
		t.Errorf("no %s c2-channel to %s among %s", proto, server, obsValues(obs))
	}
	// The order: in the C2's cycle only (the sinkhole never speaks the C2's
	// side), against the demo's target.
	var order *records.Observable
	for _, o := range orders {
		if slices.Contains(o.Cycles, cs[0].ID) {
			t.Errorf("an order in %s, with the C2 sinkholed: %s", cs[0].ID, o.Value)
		}
		if slices.ContainsFunc(o.C2Command.Targets, isTarget) && slices.Contains(o.Cycles, cs[1].ID) {
			order = o
		}
	}
	if order == nil {
		t.Fatalf("no order against %s in %s among %s", demoTarget, cs[1].ID, obsValues(obs))
	}
	var attack *records.Observable
	for _, o := range attacks {
		if o.Attack.Target == demoTarget && slices.Contains(o.Cycles, cs[1].ID) {
			attack = o
		}
	}
	if attack == nil {
		t.Fatalf("no attack on %s in %s among %s", demoTarget, cs[1].ID, obsValues(obs))
	}
	if attack.Attack.Packets < 500 || !strings.HasPrefix(attack.Attack.Vector, "udp") || !slices.Contains(attack.Attack.Ports, "9") {
		t.Errorf("the attack = %+v, want a UDP flood of port 9, at least 500 packets", attack.Attack)
	}
	if attack.Attack.Order != order.Value {
		t.Errorf("the attack is attributed to %q, want the order %q", attack.Attack.Order, order.Value)
	}
	// Cycle 2's analysis counts both; the allow-list never takes the target.
	if !slices.Contains(as[1].Classification, "ordered") || !slices.Contains(as[1].Classification, "attacking") ||
		as[1].Recommendation != records.RecommendEscalate {
		t.Errorf("%s: classification %v, recommendation %s", cs[1].ID, as[1].Classification, as[1].Recommendation)
	}
	// ... and says the rules in force sent the flood to the sinkhole,
	// which the uplink's count below measures.
	if i := slices.IndexFunc(as[1].Attacks, func(o records.AttackOutcome) bool { return o.Attack == attack.ID }); i < 0 ||
		as[1].Attacks[i].Contained != "sinkholed" {
		t.Errorf("%s: the attack's outcome in the analysis: %+v", cs[1].ID, as[1].Attacks)
	}
	for _, a := range as {
		for _, p := range a.Promoted {
			if strings.Contains(p, demoTarget) {
				t.Errorf("the attack's target promoted: %s", p)
			}
		}
	}
	// Containment: the lab sinkholed or dropped every packet of the
	// attack, in both cycles.
	m := uplinkLine.FindSubmatch(r.out)
	if m == nil {
		t.Fatal("the demo printed no uplink count")
	}
	if n, _ := strconv.Atoi(string(m[1])); n != 0 {
		t.Errorf("%d of the attack's packets reached the uplink", n)
	}
	// The reports: the C2's cycle's text report, and the lease's HTML page with
	// the order and the attack on its timeline's table.
	if i := bytes.Index(r.out, []byte("cycle "+cs[1].ID+":")); i < 0 || !reportOrdered.Match(r.out[i:]) || !reportAttacking.Match(r.out[i:]) ||
		!reportSeen.Match(r.out[i:]) {
		t.Errorf("%s's report does not show the order and the attack", cs[1].ID)
	}
	page, err := os.ReadFile(filepath.Join(r.stateDir, "reports", cs[0].Lease+".html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`aria-label="the bot's orders and attacks"`, order.ID, attack.ID, "flood on " + demoTarget} {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("the lease's report has no %s", want)
		}
	}
}

// isTarget says whether an order's target (an address, or Mirai's prefix)
// is the demo's.
func isTarget(s string) bool { return s == demoTarget || s == demoTarget+"/32" }

func obsValues(obs []*records.Observable) string {
	var vs []string
	for _, o := range obs {
		vs = append(vs, o.Type+" "+o.Value)
	}
	return "[" + strings.Join(vs, "; ") + "]"
}
