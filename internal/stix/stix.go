// Package stix writes STIX 2.1 bundles: the objects Talkbox exports (the
// sample as malware with its file, its C2s as infrastructure and
// indicators, its names, ATT&CK attack patterns) and the relationships
// between them, with deterministic identifiers so that exporting the same
// thing again gives the same bundle.
package stix

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Object is one STIX object: the common properties, and those of the
// types Talkbox writes (empty ones are left out).
type Object struct {
	Type        string   `json:"type"`
	SpecVersion string   `json:"spec_version"`
	ID          string   `json:"id"`
	Created     string   `json:"created,omitempty"`
	Modified    string   `json:"modified,omitempty"`
	Name        string   `json:"name,omitempty"`
	Description string   `json:"description,omitempty"`
	Labels      []string `json:"labels,omitempty"`

	// indicator
	IndicatorTypes []string `json:"indicator_types,omitempty"`
	Pattern        string   `json:"pattern,omitempty"`
	PatternType    string   `json:"pattern_type,omitempty"`
	ValidFrom      string   `json:"valid_from,omitempty"`
	ValidUntil     string   `json:"valid_until,omitempty"`

	// malware (IsFamily is required there, so a pointer)
	MalwareTypes []string `json:"malware_types,omitempty"`
	IsFamily     *bool    `json:"is_family,omitempty"`
	SampleRefs   []string `json:"sample_refs,omitempty"`

	// infrastructure
	InfrastructureTypes []string `json:"infrastructure_types,omitempty"`
	FirstSeen           string   `json:"first_seen,omitempty"`
	LastSeen            string   `json:"last_seen,omitempty"`

	// attack-pattern
	ExternalReferences []ExternalReference `json:"external_references,omitempty"`

	// relationship
	RelationshipType string `json:"relationship_type,omitempty"`
	SourceRef        string `json:"source_ref,omitempty"`
	TargetRef        string `json:"target_ref,omitempty"`

	// file (a cyber-observable: no created/modified)
	Hashes map[string]string `json:"hashes,omitempty"`
	Size   int64             `json:"size,omitempty"`
}

// ExternalReference points outside the bundle (an ATT&CK technique).
type ExternalReference struct {
	SourceName string `json:"source_name"`
	ExternalID string `json:"external_id,omitempty"`
	URL        string `json:"url,omitempty"`
}

// Bundle collects objects; each ID once.
type Bundle struct {
	seed    string
	objects []Object
	ids     map[string]bool
}

// NewBundle starts a bundle whose identifiers derive from seed (the
// report's or revision's ID).
func NewBundle(seed string) *Bundle { return &Bundle{seed: seed, ids: map[string]bool{}} }

// ID is a deterministic identifier "TYPE--UUID" (version 5's layout over
// SHA-256) for the object of that type named by parts.
func ID(typ string, parts ...string) string {
	h := sha256.Sum256([]byte("talkbox:" + strings.Join(parts, "\x00")))
	h[6] = h[6]&0x0f | 0x50
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%s--%x-%x-%x-%x-%x", typ, h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// Time is STIX's timestamp form (UTC, milliseconds).
func Time(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// Add adds an object (a domain object gets the spec version and, if it has
// none, created and modified at); an ID already in the bundle is kept
// as first added. It returns the object's ID.
func (b *Bundle) Add(o Object, at time.Time) string {
	o.SpecVersion = "2.1"
	if o.Type != "file" && o.Created == "" {
		o.Created, o.Modified = Time(at), Time(at)
	}
	if !b.ids[o.ID] {
		b.ids[o.ID] = true
		b.objects = append(b.objects, o)
	}
	return o.ID
}

// Relate adds the relationship source –typ→ target.
func (b *Bundle) Relate(source, typ, target string, at time.Time) {
	b.Add(Object{Type: "relationship", ID: ID("relationship", b.seed, source, typ, target), RelationshipType: typ,
		SourceRef: source, TargetRef: target}, at)
}

// Write writes the bundle as one JSON line.
func (b *Bundle) Write(w io.Writer) error {
	objs := slices.Clone(b.objects)
	if objs == nil {
		objs = []Object{}
	}
	var ids []string
	for _, o := range objs {
		ids = append(ids, o.ID)
	}
	slices.Sort(ids)
	out, err := json.Marshal(struct {
		Type    string   `json:"type"`
		ID      string   `json:"id"`
		Objects []Object `json:"objects"`
	}{"bundle", ID("bundle", b.seed, strings.Join(ids, ",")), objs})
	if err != nil {
		return err
	}
	_, err = w.Write(append(out, '\n'))
	return err
}

// EndpointPattern is the STIX pattern of traffic to addr:port over proto.
func EndpointPattern(addr netip.Addr, port uint16, proto string) string {
	typ := "ipv4-addr"
	if addr.Is6() && !addr.Is4In6() {
		typ = "ipv6-addr"
	}
	return fmt.Sprintf("[network-traffic:dst_ref.type = '%s' AND network-traffic:dst_ref.value = '%s' AND network-traffic:dst_port = %d AND network-traffic:protocols[*] = '%s']",
		typ, addr.Unmap(), port, quote(proto))
}

// DomainPattern is the STIX pattern of a domain name.
func DomainPattern(name string) string {
	return fmt.Sprintf("[domain-name:value = '%s']", quote(name))
}

// quote escapes a string literal of a pattern (backslash and quote).
func quote(s string) string {
	return strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s)
}
