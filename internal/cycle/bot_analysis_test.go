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

// TestAnalysisNamesForgedFrames: frames of the guest's the bridge dropped,
// which the capture kept out and counted (tb-capture's forged), make the
// cycle "spoofing", with a reason that counts them over the cycle's
// captures.
func TestAnalysisNamesForgedFrames(t *testing.T) {
	e := setup(t, "out hello")
	c := e.run(t, Request{})
	for _, n := range []uint64{0, 300, 12} {
		a := &records.Artifact{Cycle: c.ID, Lease: c.Lease, Type: "pcap", Packets: 40, Forged: n}
		records.Init(a, records.KindArtifact, e.st.Now())
		if err := e.st.Create(t.Context(), a); err != nil {
			t.Fatal(err)
		}
	}
	a, err := Analyse(t.Context(), e.st, c)
	if err != nil {
		t.Fatal(err)
	}
	want := "the guest sent 312 frames the lab's bridge dropped (not from its own MAC and address, or neither IPv4 nor ARP: forged, or IPv6): kept out of the capture, they are evidence of nothing"
	if !slices.Contains(a.Reasons, want) || !slices.Contains(a.Classification, "spoofing") {
		t.Fatalf("analysis: classification %v, reasons %q", a.Classification, a.Reasons)
	}
}
