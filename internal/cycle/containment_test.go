package cycle

import (
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// TestAttackContainment: the analysis says where each flood of a cycle
// went under the allow lists in force when it started: the sinkhole when
// no entry lets its target (or, for a reflection, its reflectors) and
// ports out, dropped or let out as the entries say, and partly when only
// some of its ports are let out.
func TestAttackContainment(t *testing.T) {
	e := setup(t, "out hello")
	c := e.run(t, Request{})
	ctx := t.Context()
	book := &allowlist.Book{St: e.st}
	entry := func(value, status string, v firewall.Verdict) *records.AllowEntry {
		return &records.AllowEntry{Type: records.AllowEndpoint, Value: value, Scope: records.ScopeLease, Lease: c.Lease,
			Status: status, Class: "c2", Score: 1, Reason: "test", Verdict: string(v)}
	}
	rev, _, err := book.Write(ctx, allowlist.Commit{Chain: allowlist.Chain{Scope: records.ScopeLease, Lease: c.Lease}, Cause: "test"}, nil, nil,
		[]*records.AllowEntry{
			entry("203.0.113.77:9/udp", records.StatusActive, firewall.Forward),
			entry("203.0.113.77:10/udp", records.StatusProbation, firewall.Forward),
			entry("198.51.100.9:80/tcp", records.StatusActive, firewall.Drop),
			entry("203.0.113.80:9/udp", records.StatusRevoked, firewall.Forward),
		})
	if err != nil {
		t.Fatal(err)
	}
	c.Revision = rev.ID
	floods := map[string]*records.AttackInfo{
		"udpplain 203.0.113.77": {Vector: "udpplain", Target: "203.0.113.77", Ports: []string{"9"}, PortCount: 1, Packets: 800},
		"udp 203.0.113.77":      {Vector: "udp", Target: "203.0.113.77", Ports: []string{"10"}, PortCount: 1, Packets: 600},
		"ack 203.0.113.77":      {Vector: "ack", Target: "203.0.113.77", Ports: []string{"9"}, PortCount: 1, Packets: 500},
		"syn 198.51.100.9":      {Vector: "syn", Target: "198.51.100.9", Ports: []string{"80"}, PortCount: 1, Packets: 900},
		"udp 203.0.113.78":      {Vector: "udp", Target: "203.0.113.78", Ports: []string{"9"}, PortCount: 1, Packets: 700},
		"udp 203.0.113.80":      {Vector: "udp", Target: "203.0.113.80", Ports: []string{"9"}, PortCount: 1, Packets: 700},
		"udpplain 203.0.113.79": {Vector: "udpplain", Target: "203.0.113.77", Ports: []string{"9", "11"}, PortCount: 2, Packets: 1000},
		"amp-ntp 198.51.100.50": {Vector: "amp-ntp", Target: "198.51.100.50", Reflectors: []string{"203.0.113.77"}, Ports: []string{"123"}, PortCount: 1, Packets: 500},
		"icmp 203.0.113.77":     {Vector: "icmp", Target: "203.0.113.77", Packets: 500},
	}
	want := map[string]string{
		"udpplain 203.0.113.77": ContainedForwarded,
		"udp 203.0.113.77":      ContainedLimited, // on probation: rate-limited whatever it says
		"ack 203.0.113.77":      ContainedSinkholed,
		"syn 198.51.100.9":      ContainedDropped,
		"udp 203.0.113.78":      ContainedSinkholed,
		"udp 203.0.113.80":      ContainedSinkholed, // a revoked entry lets nothing out
		"udpplain 203.0.113.79": ContainedPartly,
		"amp-ntp 198.51.100.50": ContainedSinkholed, // its reflector's port is not let out
		"icmp 203.0.113.77":     ContainedSinkholed,
	}
	for v, a := range floods {
		e.observe(t, c, &records.Observable{Type: records.ObsAttack, Value: v, Attack: a})
	}
	a, err := Analyse(ctx, e.st, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Attacks) != len(want) {
		t.Fatalf("attacks %+v", a.Attacks)
	}
	for _, o := range a.Attacks {
		if o.Contained != want[o.Value] || o.Packets != floods[o.Value].Packets || o.Attack == "" {
			t.Errorf("%s: %+v, want %s", o.Value, o, want[o.Value])
		}
	}
	if !slices.ContainsFunc(a.Reasons, func(r string) bool { return strings.HasPrefix(r, "floods under the rules in force: ") }) {
		t.Errorf("reasons %v", a.Reasons)
	}
}

// TestAttackContainmentReadsTheGlobalChain: a cycle records the sample's
// and the global chains' heads when it starts, and the analysis reads what
// they let out as it reads the lease's.
func TestAttackContainmentReadsTheGlobalChain(t *testing.T) {
	e := setup(t, "out hello")
	book := &allowlist.Book{St: e.st}
	rev, _, err := book.Write(t.Context(), allowlist.Commit{Chain: allowlist.Chain{Scope: records.ScopeGlobal}, Cause: "test"}, nil, nil,
		[]*records.AllowEntry{{Type: records.AllowEndpoint, Value: "203.0.113.90:9/udp", Scope: records.ScopeGlobal,
			Status: records.StatusActive, Class: "c2", Score: 1, Reason: "test", Verdict: string(firewall.Forward)}})
	if err != nil {
		t.Fatal(err)
	}
	c := e.run(t, Request{})
	if !slices.Contains(c.Enforced, rev.ID) {
		t.Fatalf("the cycle's enforced revisions %v lack the global head %s", c.Enforced, rev.ID)
	}
	e.observe(t, c, &records.Observable{Type: records.ObsAttack, Value: "udp 203.0.113.90",
		Attack: &records.AttackInfo{Vector: "udp", Target: "203.0.113.90", Ports: []string{"9"}, PortCount: 1, Packets: 700}})
	a, err := Analyse(t.Context(), e.st, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Attacks) != 1 || a.Attacks[0].Contained != ContainedForwarded {
		t.Fatalf("attacks %+v", a.Attacks)
	}
}
