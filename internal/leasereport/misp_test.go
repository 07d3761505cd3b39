package leasereport_test

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/leasereport"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// mispEvent is what MISP's import reads of an event (its core format).
type mispEvent struct {
	Event struct {
		UUID, Info, Date, Timestamp, Analysis, Distribution string
		ThreatLevelID                                       string `json:"threat_level_id"`
		Attribute                                           []mispAttr
		Object                                              []struct {
			UUID, Name string
			Attribute  []mispAttr
		}
		Tag []struct{ Name string }
	}
}

type mispAttr struct {
	UUID, Type, Category, Value, Comment string
	Relation                             string `json:"object_relation"`
	ToIDS                                bool   `json:"to_ids"`
	FirstSeen                            string `json:"first_seen"`
	LastSeen                             string `json:"last_seen"`
}

var (
	uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	// MISP's own checks of these types' values.
	mispValue = map[string]*regexp.Regexp{
		"ip-dst|port":   regexp.MustCompile(`^[0-9.]+\|[0-9]{1,5}$`),
		"domain":        regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$`),
		"sha256":        regexp.MustCompile(`^[0-9a-f]{64}$`),
		"sha1":          regexp.MustCompile(`^[0-9a-f]{40}$`),
		"md5":           regexp.MustCompile(`^[0-9a-f]{32}$`),
		"size-in-bytes": regexp.MustCompile(`^[0-9]+$`),
	}
	mispTimeRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`)
)

// TestWriteMISP: a lease's report as one MISP event, each attribute of a
// type, category and value MISP accepts, the C2 let through for IDS with
// its reason, the sample as a file object, ATT&CK as galaxy tags, the
// hostile name left out, and the same UUIDs when exported again.
func TestWriteMISP(t *testing.T) {
	st, b := twoCycles(t)
	r := collect(t, st, leasereport.Target{Lease: b.Lease})
	var buf bytes.Buffer
	if err := leasereport.WriteMISP(&buf, r); err != nil {
		t.Fatal(err)
	}
	var ev mispEvent
	if err := json.Unmarshal(buf.Bytes(), &ev); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	e := ev.Event
	if !uuidRE.MatchString(e.UUID) || !strings.Contains(e.Info, b.Lease) || e.Distribution != "0" || e.ThreatLevelID == "" {
		t.Errorf("event %+v", e)
	}
	check := func(a mispAttr) {
		if re := mispValue[a.Type]; re != nil && !re.MatchString(a.Value) {
			t.Errorf("%s %q is not a value MISP takes", a.Type, a.Value)
		}
		if !uuidRE.MatchString(a.UUID) {
			t.Errorf("%s %q: uuid %q", a.Type, a.Value, a.UUID)
		}
		for _, ts := range []string{a.FirstSeen, a.LastSeen} {
			if ts != "" && !mispTimeRE.MatchString(ts) {
				t.Errorf("%s %q: time %q", a.Type, a.Value, ts)
			}
		}
	}
	endpoints := map[string]mispAttr{}
	for _, a := range e.Attribute {
		check(a)
		if a.Type == "ip-dst|port" {
			endpoints[a.Value] = a
		}
		if strings.ContainsAny(a.Value, "<>") {
			t.Errorf("hostile value exported: %+v", a)
		}
	}
	// Each C2 tb-allow let through is there for IDS, with its reason; a
	// candidate is there, not for IDS; a revoked or refused one is not.
	if len(r.C2s) == 0 {
		t.Fatal("the fixture has no C2")
	}
	for _, c := range r.C2s {
		addr, _, _ := strings.Cut(c.Value, "/")
		i := strings.LastIndexByte(addr, ':')
		a, ok := endpoints[addr[:i]+"|"+addr[i+1:]]
		switch c.Status {
		case records.StatusActive, records.StatusProbation, records.StatusCandidate, records.StatusPending:
			let := c.Status == records.StatusActive || c.Status == records.StatusProbation
			if !ok || a.ToIDS != let || !strings.Contains(a.Comment, c.Reason) || a.FirstSeen == "" {
				t.Errorf("C2 %s (%s): %+v", c.Value, c.Status, a)
			}
		default:
			if ok {
				t.Errorf("C2 %s (%s) exported: %+v", c.Value, c.Status, a)
			}
		}
	}
	var files []string
	for _, o := range e.Object {
		for _, a := range o.Attribute {
			check(a)
			if a.Relation == "sha256" {
				files = append(files, a.Value)
			}
		}
	}
	if !slices.Contains(files, r.Sample) {
		t.Errorf("the sample %s is no file object: %v", r.Sample, files)
	}
	var tags []string
	for _, tg := range e.Tag {
		tags = append(tags, tg.Name)
	}
	if !slices.ContainsFunc(tags, func(s string) bool { return strings.HasPrefix(s, `misp-galaxy:mitre-attack-pattern="`) }) {
		t.Errorf("no ATT&CK tag: %q", tags)
	}
	var again bytes.Buffer
	if err := leasereport.WriteMISP(&again, collect(t, st, leasereport.Target{Lease: b.Lease})); err != nil {
		t.Fatal(err)
	}
	var ev2 mispEvent
	if err := json.Unmarshal(again.Bytes(), &ev2); err != nil || ev2.Event.UUID != e.UUID || len(ev2.Event.Attribute) != len(e.Attribute) ||
		(len(e.Attribute) > 0 && ev2.Event.Attribute[0].UUID != e.Attribute[0].UUID) {
		t.Errorf("exported again: other UUIDs")
	}
}
