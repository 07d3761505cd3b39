package leasereport

import (
	"cmp"
	"io"
	"slices"

	"github.com/talkbox-sandbox/talkbox/internal/dnsname"
	"github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"github.com/talkbox-sandbox/talkbox/internal/mitre"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/stix"
)

// WriteSTIX writes the report as one STIX 2.1 bundle: the sample as a
// malware object with its file (hashes) as sample_refs, and what it
// dropped as files it drops; each C2 the allow-list let through (active,
// or on probation) as command-and-control infrastructure the malware
// beacons to, with an indicator of the traffic to it and one per valid
// domain name of it; the ATT&CK techniques its cycles showed as attack
// patterns the malware uses. Candidates, revoked and refused endpoints
// are left out. Identifiers derive from the report's ID and each value.
func WriteSTIX(w io.Writer, r *Report) error {
	b := stix.NewBundle(r.ID)
	at := r.Generated
	f := false
	mal := stix.Object{Type: "malware", ID: stix.ID("malware", r.ID), Name: "Talkbox " + r.Target + " " + r.ID,
		Description: "The sample Talkbox observed", MalwareTypes: []string{"bot"}, IsFamily: &f}
	if r.Sample != "" {
		mal.Name, mal.Description = "sample "+r.Sample, "The sample Talkbox observed in "+r.Target+" "+r.ID
	}
	var dropped []string
	for _, file := range r.Files {
		hashes := map[string]string{"SHA-256": file.SHA256}
		if file.SHA1 != "" {
			hashes["SHA-1"] = file.SHA1
		}
		if file.MD5 != "" {
			hashes["MD5"] = file.MD5
		}
		id := b.Add(stix.Object{Type: "file", ID: stix.ID("file", file.SHA256), Hashes: hashes, Size: file.Size}, at)
		if file.Role == "sample" {
			mal.SampleRefs = append(mal.SampleRefs, id)
		} else {
			dropped = append(dropped, id)
		}
	}
	malware := b.Add(mal, at)
	for _, id := range dropped {
		b.Relate(malware, "drops", id, at)
	}
	for _, c := range r.C2s {
		if c.Status != records.StatusActive && c.Status != records.StatusProbation {
			continue
		}
		ep, err := endpoint.Parse(c.Value)
		if err != nil {
			continue
		}
		first, last := c.First, c.Last
		if first.IsZero() {
			first = at
		}
		infra := stix.Object{Type: "infrastructure", ID: stix.ID("infrastructure", r.ID, c.Value), Name: "C2 " + c.Value,
			Description: "tb-allow: " + c.Status + ": " + c.Reason, InfrastructureTypes: []string{"command-and-control"},
			FirstSeen: stix.Time(first)}
		if !last.IsZero() && !last.Before(first) {
			infra.LastSeen = stix.Time(last)
		}
		in := b.Add(infra, at)
		b.Relate(malware, "beacons-to", in, at)
		ind := b.Add(stix.Object{Type: "indicator", ID: stix.ID("indicator", r.ID, c.Value), Name: "traffic to C2 " + c.Value,
			IndicatorTypes: []string{"malicious-activity"}, Pattern: stix.EndpointPattern(ep.Addr, ep.Port, ep.Proto),
			PatternType: "stix", ValidFrom: stix.Time(first)}, at)
		b.Relate(ind, "indicates", in, at)
		for _, n := range c.Names {
			name, err := dnsname.Forwardable(n)
			if err != nil {
				continue
			}
			ind := b.Add(stix.Object{Type: "indicator", ID: stix.ID("indicator", r.ID, "domain", name), Name: "a name of C2 " + c.Value,
				IndicatorTypes: []string{"malicious-activity"}, Pattern: stix.DomainPattern(name), PatternType: "stix",
				ValidFrom: stix.Time(first)}, at)
			b.Relate(ind, "indicates", in, at)
		}
	}
	var techniques []string
	for _, c := range r.Cycles {
		for _, t := range c.Techniques {
			if !slices.Contains(techniques, t.ID) {
				techniques = append(techniques, t.ID)
			}
		}
	}
	for _, t := range mitre.Named(techniques) {
		ap := b.Add(stix.Object{Type: "attack-pattern", ID: stix.ID("attack-pattern", t.ID), Name: cmp.Or(t.Name, t.ID),
			ExternalReferences: []stix.ExternalReference{{SourceName: "mitre-attack", ExternalID: t.ID, URL: t.URL()}}}, at)
		b.Relate(malware, "uses", ap, at)
	}
	return b.Write(w)
}
