package leasereport

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/dnsname"
	"github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"github.com/talkbox-sandbox/talkbox/internal/mitre"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// The MISP core format (MISP's event JSON, as its API and pymisp read
// and write it): one event per report, its attributes and objects.
type mispDoc struct {
	Event mispEvent `json:"Event"`
}

type mispEvent struct {
	UUID          string       `json:"uuid"`
	Info          string       `json:"info"`
	Date          string       `json:"date"`
	Timestamp     string       `json:"timestamp"`
	ThreatLevelID string       `json:"threat_level_id"`
	Analysis      string       `json:"analysis"`
	Distribution  string       `json:"distribution"`
	Published     bool         `json:"published"`
	Attribute     []mispAttr   `json:"Attribute"`
	Object        []mispObject `json:"Object"`
	Tag           []mispTag    `json:"Tag"`
}

type mispAttr struct {
	UUID           string `json:"uuid"`
	Type           string `json:"type"`
	Category       string `json:"category"`
	ObjectRelation string `json:"object_relation,omitempty"`
	Value          string `json:"value"`
	ToIDS          bool   `json:"to_ids"`
	Comment        string `json:"comment,omitempty"`
	FirstSeen      string `json:"first_seen,omitempty"`
	LastSeen       string `json:"last_seen,omitempty"`
	Distribution   string `json:"distribution"`
}

type mispObject struct {
	UUID         string     `json:"uuid"`
	Name         string     `json:"name"`
	MetaCategory string     `json:"meta-category"`
	Comment      string     `json:"comment,omitempty"`
	Distribution string     `json:"distribution"`
	Attribute    []mispAttr `json:"Attribute"`
}

type mispTag struct {
	Name string `json:"name"`
}

// MISP's enumerations as the format spells them.
const (
	mispThreatMedium      = "2"
	mispAnalysisOngoing   = "1"
	mispAnalysisCompleted = "2"
	mispYourOrgOnly       = "0" // the event's distribution: the analyst widens it in MISP
	mispInheritEvent      = "5" // an attribute's: as its event
)

// WriteMISP writes the report as one MISP event: the sample and its
// dropped files as file objects (sha256, sha1, md5, names, size); each C2
// the allow-list let through (active, or on probation) as an ip-dst|port
// attribute for IDS, and each candidate waiting as one not for IDS, with
// its first and last check-in and tb-allow's reason as the comment; the
// C2s' names and the other names the sample resolved as domain attributes;
// the YARA rules that matched as text attributes; the ATT&CK techniques as
// MITRE galaxy tags. Endpoints tb-allow revoked or refused (forged
// evidence, probation failed, attack targets) are left out. UUIDs are
// derived from the report's ID and each value, so exporting again gives
// the same event.
func WriteMISP(w io.Writer, r *Report) error {
	ev := mispEvent{UUID: mispUUID(r.ID), Info: mispInfo(r), Date: r.From.UTC().Format(time.DateOnly),
		Timestamp: strconv.FormatInt(r.Generated.Unix(), 10), ThreatLevelID: mispThreatMedium,
		Analysis: mispAnalysisCompleted, Distribution: mispYourOrgOnly, Attribute: []mispAttr{}, Object: []mispObject{}, Tag: []mispTag{}}
	for _, c := range r.Cycles {
		if c.CompletedAt == nil {
			ev.Analysis = mispAnalysisOngoing
		}
	}
	attr := func(typ, cat, value string, ids bool, comment string, first, last time.Time) mispAttr {
		return mispAttr{UUID: mispUUID(r.ID, typ, value), Type: typ, Category: cat, Value: value, ToIDS: ids, Comment: comment,
			FirstSeen: mispTime(first), LastSeen: mispTime(last), Distribution: mispInheritEvent}
	}
	for _, f := range r.Files {
		o := mispObject{UUID: mispUUID(r.ID, "file", f.SHA256), Name: "file", MetaCategory: "file", Distribution: mispInheritEvent,
			Comment: "Talkbox: the " + map[string]string{"sample": "sample analysed", "dropped": "file a cycle's sample dropped"}[f.Role]}
		add := func(rel, typ, cat, v string) {
			if v != "" {
				a := attr(typ, cat, v, rel != "filename" && rel != "size-in-bytes", "", time.Time{}, time.Time{})
				a.UUID, a.ObjectRelation = mispUUID(r.ID, "file", f.SHA256, rel, v), rel
				o.Attribute = append(o.Attribute, a)
			}
		}
		add("sha256", "sha256", "Payload delivery", f.SHA256)
		add("sha1", "sha1", "Payload delivery", f.SHA1)
		add("md5", "md5", "Payload delivery", f.MD5)
		for _, n := range f.Names {
			add("filename", "filename", "Payload delivery", n)
		}
		add("size-in-bytes", "size-in-bytes", "Other", strconv.FormatInt(f.Size, 10))
		ev.Object = append(ev.Object, o)
	}
	c2Names := map[string]bool{}
	for _, c := range r.C2s {
		let := c.Status == records.StatusActive || c.Status == records.StatusProbation
		if !let && c.Status != records.StatusCandidate && c.Status != records.StatusPending {
			continue
		}
		v, ok := mispEndpoint(c.Value)
		if !ok {
			continue
		}
		ev.Attribute = append(ev.Attribute, attr("ip-dst|port", "Network activity", v, let,
			"Talkbox: "+c.Status+": "+c.Reason, c.First, c.Last))
		for _, n := range c.Names {
			n, err := dnsname.Forwardable(n)
			if err == nil && !c2Names[n] {
				c2Names[n] = true
				ev.Attribute = append(ev.Attribute, attr("domain", "Network activity", n, let, "Talkbox: a name of C2 "+c.Value+" ("+c.Status+")", c.First, c.Last))
			}
		}
	}
	for _, n := range r.Names {
		// A name the sample made up (no domain, a bare TLD, odd bytes) is
		// in the report, never a MISP domain.
		name, err := dnsname.Forwardable(n.Name)
		if err == nil && !c2Names[name] {
			c2Names[name] = true
			ev.Attribute = append(ev.Attribute, attr("domain", "Network activity", name, false,
				fmt.Sprintf("Talkbox: resolved by the sample (%d queries); not a C2", n.Queries), n.FirstSeen, time.Time{}))
		}
	}
	var yara []string
	var techniques []mitre.Technique
	for _, c := range r.Cycles {
		for _, y := range c.Yara {
			if !slices.Contains(yara, y) {
				yara = append(yara, y)
			}
		}
		for _, t := range c.Techniques {
			if !slices.Contains(techniques, t) {
				techniques = append(techniques, t)
			}
		}
	}
	for _, y := range yara {
		ev.Attribute = append(ev.Attribute, attr("text", "Other", "YARA rule "+y, false, "Talkbox: the analyst's rules", time.Time{}, time.Time{}))
	}
	for _, t := range techniques {
		ev.Tag = append(ev.Tag, mispTag{Name: `misp-galaxy:mitre-attack-pattern="` + galaxyName(t) + " - " + t.ID + `"`})
	}
	b, err := json.MarshalIndent(mispDoc{Event: ev}, "", " ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// galaxyName is a technique's own name as MITRE's galaxy spells its
// clusters: a sub-technique by its last part ("Cron", not "Scheduled
// Task/Job: Cron").
func galaxyName(t mitre.Technique) string {
	if i := strings.LastIndex(t.Name, ": "); i >= 0 {
		return t.Name[i+2:]
	}
	return cmp.Or(t.Name, t.ID)
}

// mispInfo is the event's title.
func mispInfo(r *Report) string {
	s := "Talkbox " + r.Target + " " + r.ID
	if r.Sample != "" && r.Target != TargetSample {
		s += ": sample " + r.Sample
	}
	return s
}

// mispEndpoint is ADDR:PORT/PROTO as MISP's ip-dst|port, "ADDR|PORT".
func mispEndpoint(v string) (string, bool) {
	ep, err := endpoint.Parse(v)
	if err != nil {
		return "", false
	}
	return ep.Addr.String() + "|" + strconv.Itoa(int(ep.Port)), true
}

// mispTime is MISP's first_seen/last_seen form; "" for none.
func mispTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
}

// mispUUID derives a UUID (version 5's layout, over SHA-256) from parts.
func mispUUID(parts ...string) string {
	sum := sha256.Sum256([]byte("talkbox-misp\x00" + strings.Join(parts, "\x00")))
	u := sum[:16]
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
