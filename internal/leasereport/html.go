package leasereport

import (
	"bufio"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

//go:embed report.html.tmpl
var pageTemplate string

// page is what the template shows: the report and the charts and rows made
// from it.
type page struct {
	R           *Report
	Title       string
	Facts       []fact
	Timeline    chart
	CheckIns    []c2Chart
	Connections chart
	Scans       []chart
	DNS         chart
	Beacons     []c2Chart
	Records     []recordGroup
}

type fact struct {
	Name  string
	Value string
	IDs   []string
}

type c2Chart struct {
	C2    *C2
	Chart chart
}

type recordGroup struct {
	Kind string
	IDs  []string
}

var tmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"num":   num,
	"stamp": stamp,
	"secs":  seconds,
	"dash":  orDash,
	"join":  strings.Join,
	"pct":   func(f float64) string { return num(f*100) + " %" },
	"took": func(from time.Time, to *time.Time) string {
		if to == nil {
			return "—"
		}
		return to.Sub(from).Round(time.Second).String()
	},
	"indent": func(depth int) string { return strings.Repeat("\u00a0\u00a0", depth) },
	"ptime": func(t *time.Time) string {
		if t == nil {
			return "—"
		}
		return stamp(*t)
	},
	"pint": func(p *int) string {
		if p == nil {
			return "—"
		}
		return fmt.Sprint(*p)
	},
}).Parse(pageTemplate))

// WriteHTML writes the report as one self-contained HTML page: inline CSS
// and SVG, no script, nothing loaded from elsewhere (its
// Content-Security-Policy forbids it), readable without JavaScript. Every
// string from the state is escaped for the context it lands in.
func WriteHTML(w io.Writer, r *Report) error {
	bw := bufio.NewWriterSize(w, 256<<10)
	if err := tmpl.Execute(bw, newPage(r)); err != nil {
		return err
	}
	return bw.Flush()
}

func newPage(r *Report) *page {
	p := &page{R: r, Timeline: timelineChart(r)}
	switch r.Target {
	case TargetSample:
		p.Title = "Sample " + r.Sample
	case TargetCycle:
		p.Title = "Cycle " + r.ID
	default:
		p.Title = "Lease " + r.ID
	}
	counts := map[string]int{}
	for _, c := range r.Cycles {
		counts[c.State]++
	}
	var states []string
	for _, s := range []string{records.CycleCompleted, records.CycleTimedOut, records.CycleFailed, records.CycleCancelled} {
		if counts[s] > 0 {
			states = append(states, fmt.Sprintf("%d %s", counts[s], s))
			delete(counts, s)
		}
	}
	for _, s := range sortedKeys(counts) {
		states = append(states, fmt.Sprintf("%d %s", counts[s], s))
	}
	var leaseIDs []string
	var health []string
	for _, l := range r.Leases {
		leaseIDs = append(leaseIDs, l.ID)
		if l.Missing {
			health = append(health, "record missing")
			continue
		}
		health = append(health, fmt.Sprintf("%s, %s (as of %s)", orDash(l.State), orDash(l.Health), stamp(l.Seen)))
	}
	p.Facts = []fact{
		{Name: "sample", Value: orDash(r.Sample)},
		{Name: "leases", IDs: leaseIDs},
		{Name: "lease state and health", Value: orDash(strings.Join(health, "; "))},
		{Name: "span", Value: fmt.Sprintf("%s to %s (%s)", stamp(r.From), stamp(r.To), r.To.Sub(r.From).Round(time.Second))},
		{Name: "cycles", Value: fmt.Sprintf("%d: %s", len(r.Cycles), orDash(strings.Join(states, ", ")))},
		{Name: "C2s", Value: fmt.Sprintf("%d", len(r.C2s))},
		{Name: "allow-list revisions", Value: fmt.Sprintf("%d", len(r.Revisions))},
	}
	ax := newHourAxis(r)
	for i := range r.C2s {
		v := &r.C2s[i]
		value := v.Value
		p.CheckIns = append(p.CheckIns, c2Chart{C2: v, Chart: hourChart(r, ax, fmt.Sprintf("checkins-%d", i), "check-ins per hour to "+value, "check-ins",
			[]series{
				{answeredColour, "answered", func(h *Hour) float64 { a, _ := checkIns(h, value); return float64(a) }},
				{sinkholedColour, "sinkholed", func(h *Hour) float64 { _, s := checkIns(h, value); return float64(s) }},
			}, func(h *Hour) string {
				a, s := checkIns(h, value)
				return fmt.Sprintf("%s: %d check-ins to %s, %d answered, %d sinkholed%s", stamp(h.Hour), a+s, value, a, s, estimated(h))
			})})
		p.Beacons = append(p.Beacons, c2Chart{C2: v, Chart: histChart(v, i)})
	}
	p.Connections = hourChart(r, ax, "connections-chart", "connection attempts per hour", "connections", []series{
		{estColour, "established", func(h *Hour) float64 { return float64(h.Established) }},
		{connColour, "not answered", func(h *Hour) float64 { return float64(h.Connections - h.Established) }},
	}, func(h *Hour) string {
		return fmt.Sprintf("%s: %d connections, %d established%s", stamp(h.Hour), h.Connections, h.Established, estimated(h))
	})
	for i, target := range r.ScanTargets {
		p.Scans = append(p.Scans, hourChart(r, ax, fmt.Sprintf("scan-%d", i), "scan rate per hour on "+target, "per second", []series{
			{scanColour, "", func(h *Hour) float64 { return scanOf(h, target).Rate }},
		}, func(h *Hour) string {
			s := scanOf(h, target)
			return fmt.Sprintf("%s: %d connections of the scan of %s, %s a second%s", stamp(h.Hour), s.Conns, target, num(s.Rate), estimated(h))
		}))
	}
	p.DNS = hourChart(r, ax, "dns-chart", "DNS names first seen per hour", "names", []series{
		{dnsColour, "", func(h *Hour) float64 { return float64(len(h.NewNames)) }},
	}, func(h *Hour) string {
		return fmt.Sprintf("%s: %d names first seen: %s", stamp(h.Hour), len(h.NewNames), strings.Join(h.NewNames, ", "))
	})
	p.Records = recordGroups(r)
	return p
}

func checkIns(h *Hour, c2 string) (answered, sinkholed int64) {
	for _, ci := range h.CheckIns {
		if ci.C2 == c2 {
			return ci.Answered, ci.Sinkholed
		}
	}
	return 0, 0
}

func scanOf(h *Hour, target string) HourScan {
	for _, s := range h.Scans {
		if s.Target == target {
			return s
		}
	}
	return HourScan{}
}

func estimated(h *Hour) string {
	if h.Estimated {
		return " (estimated from observables)"
	}
	return ""
}

// Records lists the ID of every record the report shows, by kind.
func (r *Report) Records() []string {
	var ids []string
	add := func(vs ...string) {
		for _, v := range vs {
			if v != "" && records.CheckID(v) == nil {
				ids = append(ids, v)
			}
		}
	}
	add(r.ID)
	for _, l := range r.Leases {
		add(l.ID, l.Plan)
	}
	for _, c := range r.Cycles {
		add(c.ID, c.Revision, c.Promoted, c.Execution, c.Analysis)
		add(c.FlowLogs...)
	}
	for _, rv := range r.Revisions {
		add(rv.ID, rv.Cycle, rv.RollbackOf)
	}
	for _, e := range r.Events {
		add(e.Revision, e.Entry, e.LastRevision, e.Cycle)
	}
	for _, v := range r.C2s {
		add(v.Entry, v.EstimatedIn)
		add(v.Observables...)
	}
	for _, n := range r.Names {
		add(n.Observable)
	}
	for _, o := range r.Orders {
		add(o.Observable)
	}
	for _, a := range r.Attacks {
		add(a.Observable)
	}
	for _, f := range r.Files {
		add(f.Sample)
	}
	if b := r.Behaviour; b != nil {
		add(b.Analysis)
		add(b.Cycles...)
		add(b.DroppedSamples...)
		for _, it := range b.Items {
			add(it.First)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

func recordGroups(r *Report) []recordGroup {
	var out []recordGroup
	for _, id := range r.Records() {
		k := records.KindOf(id)
		if n := len(out); n == 0 || out[n-1].Kind != k {
			out = append(out, recordGroup{Kind: k})
		}
		out[len(out)-1].IDs = append(out[len(out)-1].IDs, id)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
