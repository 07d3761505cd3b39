// Package stixtest checks STIX 2.1 bundles in tests: what STIX 2.1
// (OASIS Standard, 2021) requires of the objects internal/stix writes,
// checked as its validators do. The OASIS stix2 library and stix2-patterns
// cannot be installed here (PyPI is not reachable from this workplace), so
// Validate is the spec's rules for these types, written from its text.
package stixtest

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
)

var (
	idRE   = regexp.MustCompile(`^([a-z0-9-]+)--[0-9a-f]{8}-[0-9a-f]{4}-[1-5][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	timeRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$`)
	// The patterns this package writes: comparison expressions of
	// object paths against quoted strings or integers, ANDed, bracketed.
	patternRE = regexp.MustCompile(`^\[[a-z0-9-]+:[a-z_.\[\]*]+ = ('([^'\\]|\\.)*'|\d+)( AND [a-z0-9-]+:[a-z_.\[\]*]+ = ('([^'\\]|\\.)*'|\d+))*\]$`)
	// Relationships the spec's tables allow between the types written.
	allowed = map[string][]string{
		"malware beacons-to infrastructure":  nil,
		"malware uses attack-pattern":        nil,
		"malware drops file":                 nil,
		"indicator indicates infrastructure": nil,
		"indicator indicates malware":        nil,
		"infrastructure controls malware":    nil,
	}
)

// Validate checks a bundle as STIX 2.1 and returns what is wrong.
func Validate(bundle []byte) []string {
	var b struct {
		Type    string            `json:"type"`
		ID      string            `json:"id"`
		Objects []json.RawMessage `json:"objects"`
	}
	if err := json.Unmarshal(bundle, &b); err != nil {
		return []string{err.Error()}
	}
	var out []string
	bad := func(f string, a ...any) { out = append(out, fmt.Sprintf(f, a...)) }
	if b.Type != "bundle" || !idRE.MatchString(b.ID) || idRE.FindStringSubmatch(b.ID)[1] != "bundle" {
		bad("bundle %q %q", b.Type, b.ID)
	}
	types := map[string]string{}
	var objs []map[string]any
	for _, raw := range b.Objects {
		var o map[string]any
		if err := json.Unmarshal(raw, &o); err != nil {
			bad("object: %v", err)
			continue
		}
		objs = append(objs, o)
		id, _ := o["id"].(string)
		typ, _ := o["type"].(string)
		m := idRE.FindStringSubmatch(id)
		if m == nil || m[1] != typ {
			bad("%s: id %q", typ, id)
		}
		if types[id] != "" {
			bad("%s: twice", id)
		}
		types[id] = typ
		if o["spec_version"] != "2.1" {
			bad("%s: spec_version %v", id, o["spec_version"])
		}
		str := func(k string) string { s, _ := o[k].(string); return s }
		need := func(keys ...string) {
			for _, k := range keys {
				if _, ok := o[k]; !ok {
					bad("%s: no %s", id, k)
				}
			}
		}
		if typ != "file" {
			need("created", "modified")
			for _, k := range []string{"created", "modified", "valid_from", "valid_until", "first_seen", "last_seen"} {
				if v := str(k); v != "" && !timeRE.MatchString(v) {
					bad("%s: %s %q", id, k, v)
				}
			}
			if str("modified") < str("created") {
				bad("%s: modified before created", id)
			}
		}
		switch typ {
		case "indicator":
			need("pattern", "pattern_type", "valid_from")
			if str("pattern_type") == "stix" && !patternRE.MatchString(str("pattern")) {
				bad("%s: pattern %q", id, str("pattern"))
			}
			if v := str("valid_until"); v != "" && v <= str("valid_from") {
				bad("%s: valid_until not after valid_from", id)
			}
		case "malware":
			need("is_family")
			if f, _ := o["is_family"].(bool); f && str("name") == "" {
				bad("%s: a family needs a name", id)
			}
		case "infrastructure", "attack-pattern":
			need("name")
		case "relationship":
			need("relationship_type", "source_ref", "target_ref")
		case "file":
			if _, ok := o["hashes"]; !ok && str("name") == "" {
				bad("%s: a file needs hashes or a name", id)
			}
		default:
			bad("%s: a type internal/stix does not write", id)
		}
	}
	for _, o := range objs {
		if o["type"] != "relationship" {
			continue
		}
		src, _ := o["source_ref"].(string)
		dst, _ := o["target_ref"].(string)
		if types[src] == "" || types[dst] == "" {
			bad("%v: a ref to no object of the bundle", o["id"])
			continue
		}
		k := types[src] + " " + o["relationship_type"].(string) + " " + types[dst]
		if _, ok := allowed[k]; !ok {
			bad("%v: %s is no relationship of STIX 2.1", o["id"], k)
		}
	}
	slices.Sort(out)
	return out
}
