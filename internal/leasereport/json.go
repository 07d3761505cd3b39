package leasereport

import (
	"io"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// The output-only line kinds of WriteJSON. Each line's id is the stored
// record it describes (a lease, a cycle, a revision, an allow-list entry,
// an observable, an analysis), or, for a line that sums several up (the
// report, an hour), the report's target.
const (
	LineTarget     = "report-target"
	LineLease      = "report-lease"
	LineCycle      = "report-cycle"
	LineRevision   = "report-revision"
	LineAllowEvent = "report-allow-event"
	LineC2         = "report-c2"
	LineHour       = "report-hour"
	LineName       = "report-name"
	LineBehaviour  = "report-behaviour"
)

// WriteJSON writes the report as JSON lines: the target first, then its
// leases, cycles, revisions, allow-list events, C2s, hours, DNS names and
// behaviour, each line with its kind and the id of its record.
func WriteJSON(w io.Writer, r *Report) error {
	out := records.NewWriter(w)
	var err error
	line := func(kind string, v any) {
		if err == nil {
			err = out.Line(kind, v)
		}
	}
	line(LineTarget, struct {
		ID          string    `json:"id"`
		Target      string    `json:"target"`
		Sample      string    `json:"sample,omitempty"`
		From        time.Time `json:"from"`
		To          time.Time `json:"to"`
		Generated   time.Time `json:"generated"`
		ScanTargets []string  `json:"scan_targets,omitempty"`
		Notes       []string  `json:"notes,omitempty"`
	}{r.ID, r.Target, r.Sample, r.From, r.To, r.Generated, r.ScanTargets, r.Notes})
	for _, l := range r.Leases {
		line(LineLease, l)
	}
	for _, c := range r.Cycles {
		line(LineCycle, c)
	}
	for _, rv := range r.Revisions {
		line(LineRevision, rv)
	}
	for _, e := range r.Events {
		line(LineAllowEvent, struct {
			ID string `json:"id"`
			AllowEvent
		}{e.Revision, e})
	}
	for _, c := range r.C2s {
		line(LineC2, struct {
			ID string `json:"id"`
			C2
		}{c.Entry, c})
	}
	for _, h := range r.Hours {
		line(LineHour, struct {
			ID string `json:"id"`
			Hour
		}{r.ID, h})
	}
	for _, n := range r.Names {
		line(LineName, struct {
			ID string `json:"id"`
			Name
		}{n.Observable, n})
	}
	if b := r.Behaviour; b != nil {
		line(LineBehaviour, struct {
			ID string `json:"id"`
			Behaviour
		}{b.Analysis, *b})
	}
	if err != nil {
		return err
	}
	return out.Flush()
}
