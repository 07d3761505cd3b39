package allowlist

import (
	"fmt"
	endpt "github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/stix"
)

// Formats of export.
var Formats = []string{"json", "plain", "nft", "zeek", "suricata", "stix"}

// ExportOptions tune the formats that need names or numbers.
type ExportOptions struct {
	Format string
	// Table and Set name the nftables set the elements are added to.
	Table, Set string
	// SIDBase is the first Suricata signature ID.
	SIDBase int
	Now     time.Time
}

// Export writes entries (already chosen and filtered) in one format.
func Export(w io.Writer, es []*records.AllowEntry, o ExportOptions) error {
	es = append([]*records.AllowEntry(nil), es...)
	sortEntries(es)
	switch o.Format {
	case "json":
		rw := records.NewWriter(w)
		for _, e := range es {
			if err := rw.Write(e); err != nil {
				return err
			}
		}
		return rw.Flush()
	case "plain":
		for _, e := range es {
			if invalidValue(e) != "" {
				continue
			}
			if _, err := fmt.Fprintln(w, e.Value); err != nil {
				return err
			}
		}
		return nil
	case "nft":
		return exportNFT(w, es, o)
	case "zeek":
		return exportZeek(w, es)
	case "suricata":
		return exportSuricata(w, es, o)
	case "stix":
		return exportSTIX(w, es, o)
	}
	return fmt.Errorf("unknown format %q (%s)", o.Format, strings.Join(Formats, ", "))
}

// exportNFT writes an nft -f script adding the endpoints to a set of type
// ipv4_addr . inet_proto . inet_service, the type of a lease's allow set.
func exportNFT(w io.Writer, es []*records.AllowEntry, o ExportOptions) error {
	var els []string
	for _, e := range es {
		if e.Type != records.AllowEndpoint {
			continue
		}
		ep, err := endpt.Parse(e.Value)
		a, proto, port := ep.Addr, ep.Proto, ep.Port
		if err != nil || !a.Is4() {
			continue
		}
		els = append(els, fmt.Sprintf("%s . %s . %d", a, proto, port))
	}
	if _, err := fmt.Fprintf(w, "# tb-allow export: %d elements (ipv4_addr . inet_proto . inet_service)\n", len(els)); err != nil || len(els) == 0 {
		return err
	}
	_, err := fmt.Fprintf(w, "add element inet %s %s { %s }\n", o.Table, o.Set, strings.Join(els, ", "))
	return err
}

// exportZeek writes a Zeek Intel framework file.
func exportZeek(w io.Writer, es []*records.AllowEntry) error {
	if _, err := fmt.Fprintln(w, "#fields\tindicator\tindicator_type\tmeta.source\tmeta.desc\tmeta.url"); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, e := range es {
		if invalidValue(e) != "" {
			continue
		}
		ind, typ := e.Value, "Intel::DOMAIN"
		if e.Type == records.AllowEndpoint {
			ep, err := endpt.Parse(e.Value)
			a := ep.Addr
			if err != nil {
				continue
			}
			ind, typ = a.String(), "Intel::ADDR"
		}
		if seen[ind] {
			continue
		}
		seen[ind] = true
		if _, err := fmt.Fprintf(w, "%s\t%s\ttalkbox\t%s\t%s\n", ind, typ, zeekField(e.Class+": "+e.Reason), zeekField(entryID(e))); err != nil {
			return err
		}
	}
	return nil
}

func zeekField(s string) string {
	s = oneField(s, "", "")
	if s == "" {
		return "-"
	}
	return s
}

// entryID is an entry's ID when it is one ("" otherwise: a content blob
// is any JSON).
func entryID(e *records.AllowEntry) string {
	if records.CheckID(e.ID) != nil {
		return ""
	}
	return e.ID
}

// exportSuricata writes one alert rule per endpoint and per name.
func exportSuricata(w io.Writer, es []*records.AllowEntry, o ExportOptions) error {
	sid := o.SIDBase
	for _, e := range es {
		if invalidValue(e) != "" || entryID(e) == "" {
			continue
		}
		msg := oneField(strings.NewReplacer(`"`, "'", ";", ",", `\`, "/").Replace(fmt.Sprintf("Talkbox %s %s", e.Class, e.Value)), "", "")
		var rule string
		switch e.Type {
		case records.AllowEndpoint:
			ep, err := endpt.Parse(e.Value)
			a, proto, port := ep.Addr, ep.Proto, ep.Port
			if err != nil {
				continue
			}
			rule = fmt.Sprintf(`alert %s $HOME_NET any -> %s %d (msg:"%s"; flow:to_server; metadata:talkbox_entry %s; sid:%d; rev:1;)`,
				proto, a, port, msg, e.ID, sid)
		case records.AllowDomain:
			rule = fmt.Sprintf(`alert dns $HOME_NET any -> any any (msg:"%s"; dns.query; content:"%s"; nocase; endswith; metadata:talkbox_entry %s; sid:%d; rev:1;)`,
				msg, e.Value, e.ID, sid)
		default:
			continue
		}
		sid++
		if _, err := fmt.Fprintln(w, rule); err != nil {
			return err
		}
	}
	return nil
}

// exportSTIX writes a STIX 2.1 bundle with one indicator per entry
// (tb-run report --format stix writes an analysis's, with its malware,
// infrastructure and relationships).
func exportSTIX(w io.Writer, es []*records.AllowEntry, o ExportOptions) error {
	var ids []string
	for _, e := range es {
		ids = append(ids, e.ID+e.Value)
	}
	sort.Strings(ids)
	b := stix.NewBundle(strings.Join(ids, ","))
	for _, e := range es {
		if invalidValue(e) != "" {
			continue
		}
		var pattern string
		switch e.Type {
		case records.AllowEndpoint:
			ep, err := endpt.Parse(e.Value)
			a, proto, port := ep.Addr, ep.Proto, ep.Port
			if err != nil {
				continue
			}
			pattern = stix.EndpointPattern(a, port, proto)
		case records.AllowDomain:
			pattern = stix.DomainPattern(e.Value)
		default:
			continue
		}
		created := e.CreatedAt
		if created.IsZero() {
			created = o.Now
		}
		modified := e.UpdatedAt
		if modified.Before(created) {
			modified = created
		}
		ind := stix.Object{Type: "indicator", ID: stix.ID("indicator", e.ID+e.Value), Created: stix.Time(created),
			Modified: stix.Time(modified), Name: fmt.Sprintf("%s %s", e.Class, e.Value), Description: e.Reason,
			IndicatorTypes: []string{"malicious-activity"}, Pattern: pattern, PatternType: "stix", ValidFrom: stix.Time(created),
			Labels: []string{"talkbox", e.Status}}
		if e.ExpiresAt != nil && e.ExpiresAt.After(created) {
			ind.ValidUntil = stix.Time(*e.ExpiresAt)
		}
		b.Add(ind, created)
	}
	return b.Write(w)
}
