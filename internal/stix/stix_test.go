package stix_test

import (
	"bytes"
	"github.com/talkbox-sandbox/talkbox/internal/stix"
	"github.com/talkbox-sandbox/talkbox/internal/stix/stixtest"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestBundleValidates: a bundle of each kind of object the package writes
// passes Validate, and Validate catches what the spec forbids.
func TestBundleValidates(t *testing.T) {
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	b := stix.NewBundle("r1")
	f := false
	file := b.Add(stix.Object{Type: "file", ID: stix.ID("file", "ab"), Hashes: map[string]string{"SHA-256": strings.Repeat("ab", 32)}}, at)
	mal := b.Add(stix.Object{Type: "malware", ID: stix.ID("malware", "r1"), Name: "sample", IsFamily: &f, SampleRefs: []string{file}}, at)
	infra := b.Add(stix.Object{Type: "infrastructure", ID: stix.ID("infrastructure", "c2"), Name: "C2", InfrastructureTypes: []string{"command-and-control"}}, at)
	b.Relate(mal, "beacons-to", infra, at)
	ind := b.Add(stix.Object{Type: "indicator", ID: stix.ID("indicator", "c2"), Pattern: stix.EndpointPattern(netip.MustParseAddr("198.51.100.7"), 80, "tcp"),
		PatternType: "stix", ValidFrom: stix.Time(at)}, at)
	b.Relate(ind, "indicates", infra, at)
	dom := b.Add(stix.Object{Type: "indicator", ID: stix.ID("indicator", "d"), Pattern: stix.DomainPattern(`it's\a.example`), PatternType: "stix", ValidFrom: stix.Time(at)}, at)
	b.Relate(dom, "indicates", infra, at)
	var buf bytes.Buffer
	if err := b.Write(&buf); err != nil {
		t.Fatal(err)
	}
	if problems := stixtest.Validate(buf.Bytes()); len(problems) > 0 {
		t.Fatalf("%q\n%s", problems, buf.String())
	}
	// What the checks catch.
	b.Relate(infra, "beacons-to", mal, at)
	b.Add(stix.Object{Type: "indicator", ID: stix.ID("indicator", "x"), Pattern: "[domain-name:value = 'a' OR 1=1", PatternType: "stix", ValidFrom: stix.Time(at)}, at)
	b.Add(stix.Object{Type: "malware", ID: stix.ID("malware", "y")}, at)
	buf.Reset()
	if err := b.Write(&buf); err != nil {
		t.Fatal(err)
	}
	problems := strings.Join(stixtest.Validate(buf.Bytes()), "\n")
	for _, want := range []string{"infrastructure beacons-to malware is no relationship", "pattern", "no is_family"} {
		if !strings.Contains(problems, want) {
			t.Errorf("not caught: %s\n%s", want, problems)
		}
	}
}
