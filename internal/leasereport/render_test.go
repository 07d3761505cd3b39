package leasereport_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/html"

	"github.com/talkbox-sandbox/talkbox/internal/leasereport"
	"github.com/talkbox-sandbox/talkbox/internal/leasereport/reporttest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// hostile are the strings of the story that a sample controls and that
// would be markup if a page did not escape them: a DNS name, an argument,
// a process's command line, a dropped file's path, and the operator's note.
var hostile = []string{reporttest.Hostile, `--tag=<img src=x onerror=alert(2)>`, `echo '<svg onload=alert(3)>' > /tmp/.x/run`,
	"/tmp/.x/<b>bot</b>", `ticket 4711: the paste is the bot's "config" <b>drop</b>`}

// sections are the page's landmarks, by id.
var sections = []string{"summary", "timeline", "hours", "checkins", "connections", "scans", "dns", "beacons", "allowlist-history",
	"behaviour", "cycles", "records"}

// pageProblems says what is wrong with a report page: anything that could
// run or load something (a script, an element that loads, an event
// handler, a link off the page, a style that imports), no
// Content-Security-Policy, a missing section, a link to no record, or a
// hostile string that is not text.
func pageProblems(page string) []string {
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	ids := map[string]bool{}
	var hrefs, texts []string
	csp := ""
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		switch n.Type {
		case html.TextNode:
			texts = append(texts, n.Data)
		case html.ElementNode:
			switch n.Data {
			case "script", "iframe", "object", "embed", "link", "img", "image", "base", "form", "video", "audio", "source", "use", "foreignObject":
				out = append(out, fmt.Sprintf("a <%s> element", n.Data))
			case "style":
				if n.FirstChild != nil && (strings.Contains(n.FirstChild.Data, "url(") || strings.Contains(n.FirstChild.Data, "@import")) {
					out = append(out, "a style that loads something")
				}
			}
			for _, a := range n.Attr {
				k := strings.ToLower(a.Key)
				switch {
				case k == "id":
					ids[a.Val] = true
				case strings.HasPrefix(k, "on"):
					out = append(out, fmt.Sprintf("an event handler %s=%q on <%s>", a.Key, a.Val, n.Data))
				case k == "src" || k == "srcset" || k == "xlink:href" || k == "action" || k == "style" && strings.Contains(a.Val, "url("):
					out = append(out, fmt.Sprintf("%s=%q on <%s>", a.Key, a.Val, n.Data))
				case k == "href":
					hrefs = append(hrefs, a.Val)
				case k == "http-equiv" && strings.EqualFold(a.Val, "content-security-policy"):
					for _, b := range n.Attr {
						if b.Key == "content" {
							csp = b.Val
						}
					}
				case k == "http-equiv" && strings.EqualFold(a.Val, "refresh"):
					out = append(out, "a meta refresh")
				}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	if !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "script-src") {
		out = append(out, fmt.Sprintf("Content-Security-Policy %q", csp))
	}
	for _, s := range sections {
		if !ids[s] {
			out = append(out, "no section "+s)
		}
	}
	for _, h := range hrefs {
		if !strings.HasPrefix(h, "#") || !ids[h[1:]] {
			out = append(out, fmt.Sprintf("href %q leads nowhere on the page", h))
		}
	}
	for _, h := range hostile {
		if !slices.ContainsFunc(texts, func(t string) bool { return strings.Contains(t, h) }) {
			out = append(out, fmt.Sprintf("%q is not text on the page", h))
		}
	}
	return out
}

func TestWriteHTML(t *testing.T) {
	st, b := twoCycles(t)
	for _, target := range []leasereport.Target{{Lease: b.Lease}, {Sample: b.Sample}} {
		r := collect(t, st, target)
		var buf bytes.Buffer
		if err := leasereport.WriteHTML(&buf, r); err != nil {
			t.Fatal(err)
		}
		page := buf.String()
		for _, p := range pageProblems(page) {
			t.Errorf("%s: %s", r.Target, p)
		}
		// The escaping as bytes: the DNS name is text, nothing is a script.
		if strings.Contains(strings.ToLower(page), "<script") || !strings.Contains(page, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Errorf("%s: the hostile DNS name is not escaped", r.Target)
		}
		for _, want := range []string{`<svg class="chart" id="timeline-chart" role="img" aria-label="timeline: cycles coloured by outcome`,
			`aria-label="check-ins per hour to 198.51.100.18:80/tcp"`, `aria-label="inter-arrival histogram of the check-ins to 198.51.100.18:80/tcp"`,
			`aria-label="scan rate per hour on tcp/2323"`, `aria-label="allow-list history"`, `id="rec-` + b.Cycles[1] + `"`} {
			if !strings.Contains(page, want) {
				t.Errorf("%s: no %s", r.Target, want)
			}
		}
	}
}

func TestWriteJSON(t *testing.T) {
	st, b := twoCycles(t)
	r := collect(t, st, leasereport.Target{Lease: b.Lease})
	var buf bytes.Buffer
	if err := leasereport.WriteJSON(&buf, r); err != nil {
		t.Fatal(err)
	}
	if err := records.CheckLines(bytes.NewReader(buf.Bytes()), "report"); err != nil {
		t.Fatal(err)
	}
	// Each line's id is the record it is about, of the kind the line's
	// kind says (an hour's, the report's target).
	idKind := map[string]string{
		leasereport.LineTarget: records.KindLease, leasereport.LineLease: records.KindLease, leasereport.LineCycle: records.KindCycle,
		leasereport.LineRevision: records.KindRevision, leasereport.LineAllowEvent: records.KindRevision, leasereport.LineC2: records.KindAllow,
		leasereport.LineHour: records.KindLease, leasereport.LineName: records.KindObservable, leasereport.LineBehaviour: records.KindAnalysis,
	}
	counts := map[string]int{}
	var c2s []leasereport.C2
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var probe struct {
			Kind, ID string
		}
		if err := json.Unmarshal(l, &probe); err != nil {
			t.Fatal(err)
		}
		counts[probe.Kind]++
		if want, ok := idKind[probe.Kind]; !ok || records.CheckID(probe.ID) != nil || records.KindOf(probe.ID) != want {
			t.Errorf("%s line with id %q", probe.Kind, probe.ID)
		}
		switch probe.Kind {
		case leasereport.LineC2:
			var v leasereport.C2
			if err := json.Unmarshal(l, &v); err != nil {
				t.Fatal(err)
			}
			c2s = append(c2s, v)
		case leasereport.LineName:
			if bytes.Contains(l, []byte("<script")) {
				t.Errorf("name line not HTML-safe: %s", l)
			}
		}
	}
	want := map[string]int{leasereport.LineTarget: 1, leasereport.LineLease: 1, leasereport.LineCycle: 2, leasereport.LineRevision: 4,
		leasereport.LineAllowEvent: len(r.Events), leasereport.LineC2: 3, leasereport.LineHour: 3, leasereport.LineName: 4, leasereport.LineBehaviour: 1}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("lines %v, want %v", counts, want)
	}
	if got, _ := json.Marshal(c2s); !bytes.Equal(got, must(json.Marshal(r.C2s))) {
		t.Errorf("report-c2 lines hold %s, the report %s", got, must(json.Marshal(r.C2s)))
	}
	// The report itself is data: it goes through JSON unchanged.
	var back leasereport.Report
	if err := json.Unmarshal(must(json.Marshal(r)), &back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(must(json.Marshal(&back)), must(json.Marshal(r))) {
		t.Error("the report changes through JSON")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
