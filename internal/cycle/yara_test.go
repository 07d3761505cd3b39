package cycle

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/yarascan"
)

// TestYaraMatchOnADroppedFileEscalates: the analyst's rules matching a
// file the sample dropped escalate the analysis; a match in memory is
// listed and classified, and escalates nothing by itself.
func TestYaraMatchOnADroppedFileEscalates(t *testing.T) {
	for _, target := range []string{yarascan.TargetDropped, yarascan.TargetMemory} {
		t.Run(target, func(t *testing.T) {
			e := setup(t, "out hello")
			c := e.run(t, Request{})
			ctx := context.Background()
			_, err := yarascan.Record(ctx, e.st, yarascan.File{Target: target, SHA256: "ab", Lease: c.Lease, Cycle: c.ID, Input: "x"},
				[]records.YaraMatch{{Rule: "TalkboxBeaconDrop", Namespace: "talkbox-beacon"}})
			if err != nil {
				t.Fatal(err)
			}
			a, err := Analyse(t.Context(), e.st, c)
			if err != nil {
				t.Fatal(err)
			}
			want := "talkbox-beacon:TalkboxBeaconDrop in " + target
			if !slices.Equal(a.Yara, []string{want}) || !slices.Contains(a.Classification, "yara-match") {
				t.Fatalf("analysis %+v", a)
			}
			if escalated := a.Recommendation == records.RecommendEscalate; escalated != (target == yarascan.TargetDropped) {
				t.Fatalf("%s: recommendation %s %q", target, a.Recommendation, a.Reasons)
			}
		})
	}
}

// TestOrdersEscalate: a cycle whose C2 sent attack orders escalates, and
// its floods classify it as attacking.
func TestOrdersEscalate(t *testing.T) {
	e := setup(t, "out hello")
	c := e.run(t, Request{})
	e.observe(t, c,
		&records.Observable{Type: records.ObsC2Command, Value: "mirai udpplain 203.0.113.9/32", C2Command: &records.C2CommandInfo{Family: "mirai", Vector: "udpplain"}},
		&records.Observable{Type: records.ObsAttack, Value: "udpplain 203.0.113.9", Attack: &records.AttackInfo{Vector: "udpplain", Target: "203.0.113.9"}},
	)
	a, err := Analyse(t.Context(), e.st, c)
	if err != nil {
		t.Fatal(err)
	}
	if a.Recommendation != records.RecommendEscalate || !slices.Contains(a.Classification, "ordered") || !slices.Contains(a.Classification, "attacking") ||
		!slices.ContainsFunc(a.Reasons, func(r string) bool { return strings.HasPrefix(r, "the C2 sent 1 attack orders") }) {
		t.Fatalf("analysis %+v", a)
	}
}
