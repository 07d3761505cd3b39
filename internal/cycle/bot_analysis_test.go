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
// which the capture kept out and counted (tb-capture's kept_out), are told
// over the cycle's captures; those that claimed another identity (forged)
// make the cycle "spoofing", the rest (the guest's own IPv6, say) do not.
func TestAnalysisNamesForgedFrames(t *testing.T) {
	e := setup(t, "out hello")
	analyse := func(arts ...*records.Artifact) *records.RunAnalysis {
		t.Helper()
		c := e.run(t, Request{})
		for _, a := range arts {
			a.Cycle, a.Lease, a.Type, a.Packets = c.ID, c.Lease, "pcap", 40
			records.Init(a, records.KindArtifact, e.st.Now())
			if err := e.st.Create(t.Context(), a); err != nil {
				t.Fatal(err)
			}
		}
		a, err := Analyse(t.Context(), e.st, c)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	forged := "the guest sent 312 frames claiming a sender it is not (another MAC, IPv4 address or ARP sender, 0.0.0.0 outside DHCP and ARP probes, or a routable IPv6 source), which the lab's bridge dropped: kept out of the capture, they are evidence of nothing"
	other := "the guest sent 25 frames the lab does not carry (its own IPv6, another protocol than IPv4 and ARP, or cut short), which its bridge dropped: kept out of the capture"
	// An artifact from before kept_out counted every frame kept out as forged.
	a := analyse(&records.Artifact{}, &records.Artifact{Forged: 300}, &records.Artifact{KeptOut: 37, Forged: 12})
	if !slices.Contains(a.Reasons, forged) || !slices.Contains(a.Reasons, other) || !slices.Contains(a.Classification, "spoofing") {
		t.Fatalf("forged and other frames: classification %v, reasons %q", a.Classification, a.Reasons)
	}
	a = analyse(&records.Artifact{KeptOut: 25})
	if !slices.Contains(a.Reasons, other) || slices.Contains(a.Classification, "spoofing") {
		t.Fatalf("the guest's own IPv6 alone: classification %v, reasons %q", a.Classification, a.Reasons)
	}
}
