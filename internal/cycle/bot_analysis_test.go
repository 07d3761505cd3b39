package cycle

import (
	"slices"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// TestAnalysisNamesOrderedAttacks: the analysis says which floods carried
// out which order (tb-parse's attack.order), and nothing of a flood that
// carried out none.
func TestAnalysisNamesOrderedAttacks(t *testing.T) {
	e := setup(t, "out hello")
	c := e.run(t, Request{})
	order := "mirai udpplain 203.0.113.77/32 4s dport=9 len=64"
	e.observe(t, c,
		&records.Observable{Type: records.ObsC2Command, Value: order, C2Command: &records.C2CommandInfo{Family: "mirai", Vector: "udpplain"}},
		&records.Observable{Type: records.ObsAttack, Value: "udp 203.0.113.77", Attack: &records.AttackInfo{Vector: "udp", Target: "203.0.113.77",
			Order: order, OrderDelay: 0.25}},
		&records.Observable{Type: records.ObsAttack, Value: "syn 198.51.100.9", Attack: &records.AttackInfo{Vector: "syn", Target: "198.51.100.9"}},
	)
	a, err := Analyse(t.Context(), e.st, c)
	if err != nil {
		t.Fatal(err)
	}
	want := `floods carrying out an order: udp 203.0.113.77 after "` + order + `" (0.25 s)`
	if !slices.Contains(a.Reasons, want) || a.Recommendation != records.RecommendEscalate ||
		!slices.Contains(a.Classification, "ordered") || !slices.Contains(a.Classification, "attacking") {
		t.Fatalf("analysis %+v", a)
	}
}
