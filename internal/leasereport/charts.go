package leasereport

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// A chart is an inline SVG: its geometry is computed here and the template
// only prints numbers and text (escaped).
type chart struct {
	ID, Label string
	W, H      float64
	// Crisp draws shapes on whole pixels: bars of a pixel or two stay
	// solid instead of blurring into stripes.
	Crisp bool
	Lines []line
	Rects []rect
	Polys []poly
	Texts []text
}

type rect struct {
	X, Y, W, H float64
	Fill       string
	Title      string
}

type line struct {
	X1, Y1, X2, Y2 float64
	Stroke         string
	Dash           bool
}

type poly struct {
	Points string
	Fill   string
	Title  string
}

type text struct {
	X, Y   float64
	Anchor string
	Class  string
	Text   string
}

// Colours: outcomes of cycles, causes of revisions, lease health, and the
// series of the charts. The timeline's are used nowhere else (the page's
// CSS colours text with others), so a test can find the timeline in a
// screenshot by them.
var (
	outcomeColour = map[string]string{
		records.CycleCompleted: "#2e7d32",
		records.CycleTimedOut:  "#ef6c00",
		records.CycleFailed:    "#c62828",
		records.CycleCancelled: "#6d4c41",
	}
	runningColour = "#0277bd"
	causeColour   = map[string]string{
		"promote": "#6a1b9a", "approve": "#00838f", "reject": "#ad1457", "revoke": "#ad1457", "expire": "#795548", "rollback": "#37474f",
		"revert": "#ef6c00",
	}
	otherCause   = "#546e7a"
	healthColour = map[string]string{
		records.HealthHealthy: "#a5d6a7", records.HealthUnhealthy: "#ef9a9a",
	}
	unknownHealth = "#cfd8dc"

	answeredColour  = "#1565c0"
	sinkholedColour = "#90a4ae"
	connColour      = "#b0bec5"
	estColour       = "#37474f"
	scanColour      = "#e65100"
	dnsColour       = "#5e35b1"
	histColour      = "#00695c"
	outsideColour   = "#ffb300"
	gridColour      = "#e0e0e0"
	orderColour     = "#283593"
	attackColour    = "#b71c1c"
)

const (
	chartW  = 1160.0
	marginL = 120.0
	marginR = 16.0
)

// timeAxis maps times of [from, to] onto [x0, x1].
type timeAxis struct {
	from, to time.Time
	x0, x1   float64
}

func (a timeAxis) x(t time.Time) float64 {
	span := a.to.Sub(a.from)
	if span <= 0 {
		return a.x0
	}
	f := float64(t.Sub(a.from)) / float64(span)
	return a.x0 + math.Max(0, math.Min(1, f))*(a.x1-a.x0)
}

var tickSteps = []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour,
	2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour, 2 * 24 * time.Hour, 7 * 24 * time.Hour, 14 * 24 * time.Hour,
	28 * 24 * time.Hour}

// ticks are the grid lines of the axis: at most about max of them, on
// round times, labelled with the date where it changes.
func (a timeAxis) ticks(c *chart, y0, y1 float64, max int) {
	span := a.to.Sub(a.from)
	step := tickSteps[len(tickSteps)-1]
	for _, s := range tickSteps {
		if span/s <= time.Duration(max) {
			step = s
			break
		}
	}
	day := ""
	for t := a.from.Truncate(step); !t.After(a.to); t = t.Add(step) {
		if t.Before(a.from) {
			continue
		}
		x := a.x(t)
		c.Lines = append(c.Lines, line{X1: x, Y1: y0, X2: x, Y2: y1, Stroke: gridColour})
		label := t.Format("15:04")
		if step < time.Minute {
			label = t.Format("15:04:05")
		}
		if d := t.Format("Jan 2"); d != day {
			label, day = d+" "+label, d
		}
		c.Texts = append(c.Texts, text{X: x, Y: y0 - 4, Anchor: "middle", Class: "tick", Text: label})
	}
}

// timelineChart draws the lease(s): a row of cycles coloured by outcome and
// a band of the lease's health under it per lease, the allow-list
// revisions as markers on a row of their own above, and, when the bot was
// ordered to attack or attacked, a row of its orders (markers) and floods
// (bars) between them.
func timelineChart(r *Report) chart {
	leases := r.Leases
	if len(leases) == 0 {
		leases = []Lease{{ID: "", Missing: true}}
	}
	const rowH, barH, bandH, top = 46.0, 22.0, 8.0, 30.0
	revY := top + 6
	botH := 0.0
	if len(r.Orders)+len(r.Attacks) > 0 {
		botH = 26
	}
	rowsY := top + 34 + botH
	h := rowsY + rowH*float64(len(leases)) + 40
	c := chart{ID: "timeline-chart", Label: "timeline: cycles coloured by outcome, allow-list revisions as markers, lease health", W: chartW, H: h,
		Crisp: true}
	from, to := timelineDomain(r)
	ax := timeAxis{from: from, to: to, x0: marginL, x1: chartW - marginR}
	ax.ticks(&c, top, h-40, 12)
	c.Texts = append(c.Texts, text{X: 8, Y: revY + 12, Class: "row", Text: "allow-list"})
	// A revision that changed a status is a marker with a line down the
	// rows; one that only refreshed evidence (every cycle's promote, on a
	// long lease) is a tick, unless there are few.
	few := len(r.Revisions) <= 40
	for _, rv := range r.Revisions {
		x := ax.x(rv.At)
		col := causeColour[rv.Cause]
		if col == "" {
			col = otherCause
		}
		title := fmt.Sprintf("%s: %s #%d of %s at %s, %d status changes, %d active", rv.ID, rv.Cause, rv.Seq, rv.Chain, stamp(rv.At),
			rv.Changes, rv.Active)
		if rv.Changes == 0 && !few {
			c.Rects = append(c.Rects, rect{X: x - 0.5, Y: revY + 8, W: 1, H: 6, Fill: col, Title: title})
			continue
		}
		c.Lines = append(c.Lines, line{X1: x, Y1: revY + 16, X2: x, Y2: h - 40, Stroke: col, Dash: true})
		c.Polys = append(c.Polys, poly{Points: fmt.Sprintf("%s,%s %s,%s %s,%s", num(x-6), num(revY), num(x+6), num(revY), num(x), num(revY+14)),
			Fill: col, Title: title})
	}
	if botH > 0 {
		botY := top + 34
		c.Texts = append(c.Texts, text{X: 8, Y: botY + 12, Class: "row", Text: "bot"})
		orderAt := map[string]time.Time{}
		for _, o := range r.Orders {
			orderAt[o.Observable] = o.At
		}
		for _, a := range r.Attacks {
			x0, x1 := ax.x(a.Start), ax.x(a.End)
			carried := ""
			if a.Order != "" {
				carried = fmt.Sprintf(", carrying out the order %s (%s s after it)", a.Order, num(a.OrderDelay))
			}
			if at, ok := orderAt[a.OrderObservable]; ok {
				// order -> attack: a line from the order's marker to
				// the flood it was carried out by.
				c.Lines = append(c.Lines, line{X1: ax.x(at), Y1: botY + 9, X2: x0, Y2: botY + 9, Stroke: orderColour})
			}
			c.Rects = append(c.Rects, rect{X: x0, Y: botY + 2, W: math.Max(x1-x0, 2), H: 14, Fill: attackColour,
				Title: fmt.Sprintf("attack: %s flood on %s, %d packets (%s/s)%s, %s to %s%s", a.Vector, a.Target, a.Packets, num(a.PPS),
					map[bool]string{true: ", spoofed", false: ""}[a.Spoofed], stamp(a.Start), stamp(a.End), carried)})
		}
		for _, o := range r.Orders {
			x := ax.x(o.At)
			c.Polys = append(c.Polys, poly{Points: fmt.Sprintf("%s,%s %s,%s %s,%s %s,%s", num(x), num(botY), num(x+6), num(botY+9), num(x), num(botY+18), num(x-6), num(botY+9)),
				Fill: orderColour, Title: fmt.Sprintf("order (%s): %s on %s ports %s for %ds, from %s at %s", o.Family, o.Vector,
					strings.Join(o.Targets, " "), orDash(strings.Join(o.Ports, ",")), o.Duration, orDash(strings.Join(o.Servers, " ")), stamp(o.At))})
		}
	}
	for i, l := range leases {
		y := rowsY + rowH*float64(i)
		label := "cycles"
		if len(leases) > 1 {
			label = shortID(l.ID)
		}
		c.Texts = append(c.Texts, text{X: 8, Y: y + barH/2 + 4, Class: "row", Text: label},
			text{X: 8, Y: y + barH + 4 + bandH, Class: "row small", Text: "health"})
		for _, cy := range r.Cycles {
			if len(leases) > 1 && cy.Lease != l.ID {
				continue
			}
			x0, x1 := ax.x(cy.Start()), ax.x(cy.End(r.To))
			col := outcomeColour[cy.State]
			if col == "" {
				col = runningColour
			}
			c.Rects = append(c.Rects, rect{X: x0, Y: y, W: math.Max(x1-x0, 2), H: barH, Fill: col, Title: cycleTitle(&cy, r.To)})
		}
		from, to := r.From, r.To
		if l.StartedAt != nil && l.StartedAt.After(from) {
			from = *l.StartedAt
		}
		if l.ReleasedAt != nil && l.ReleasedAt.Before(to) {
			to = *l.ReleasedAt
		}
		col := healthColour[l.Health]
		if col == "" {
			col = unknownHealth
		}
		x0, x1 := ax.x(from), ax.x(to)
		c.Rects = append(c.Rects, rect{X: x0, Y: y + barH + 4, W: math.Max(x1-x0, 2), H: bandH, Fill: col, Title: leaseTitle(&l)})
	}
	c.H = legend(&c, h-22, outcomeLegend(r)) + 4
	return c
}

// timelineDomain is the time the timeline spans: the report's span, or,
// from three hours on, the whole hours it touches, so that the per-hour
// charts under it line up with it.
func timelineDomain(r *Report) (from, to time.Time) {
	if r.To.Sub(r.From) < 3*time.Hour {
		return r.From, r.To
	}
	return r.From.Truncate(time.Hour), r.To.Truncate(time.Hour).Add(time.Hour)
}

func outcomeLegend(r *Report) []swatch {
	var out []swatch
	for _, s := range []string{records.CycleCompleted, records.CycleTimedOut, records.CycleFailed, records.CycleCancelled} {
		out = append(out, swatch{outcomeColour[s], s})
	}
	out = append(out, swatch{runningColour, "in progress"})
	seen := map[string]bool{}
	for _, rv := range r.Revisions {
		if !seen[rv.Cause] {
			seen[rv.Cause] = true
			col := causeColour[rv.Cause]
			if col == "" {
				col = otherCause
			}
			out = append(out, swatch{col, "revision: " + rv.Cause})
		}
	}
	return append(out, swatch{healthColour[records.HealthHealthy], "healthy"}, swatch{healthColour[records.HealthUnhealthy], "unhealthy"},
		swatch{unknownHealth, "health unknown"})
}

type swatch struct{ colour, label string }

// legend draws swatches from y on, in as many lines as they need, and
// returns the y below them.
func legend(c *chart, y float64, items []swatch) float64 {
	x := marginL
	for _, s := range items {
		w := 16 + 6.5*float64(len(s.label)) + 16
		if x+w > chartW-marginR && x > marginL {
			x, y = marginL, y+18
		}
		c.Rects = append(c.Rects, rect{X: x, Y: y, W: 12, H: 12, Fill: s.colour})
		c.Texts = append(c.Texts, text{X: x + 16, Y: y + 10, Class: "legend", Text: s.label})
		x += w
	}
	return y + 18
}

func cycleTitle(c *Cycle, until time.Time) string {
	s := fmt.Sprintf("%s: %s, %s to %s (%s)", c.ID, c.State, stamp(c.Start()), stamp(c.End(until)), c.End(until).Sub(c.Start()).Round(time.Second))
	if c.Recommendation != "" {
		s += "; " + c.Recommendation + ": " + strings.Join(c.Reasons, "; ")
	}
	if c.Error != "" {
		s += "; error: " + c.Error
	}
	return s
}

func leaseTitle(l *Lease) string {
	if l.Missing {
		return l.ID + ": record missing"
	}
	s := fmt.Sprintf("%s: %s, health %s (as of %s)", l.ID, l.State, orDash(l.Health), stamp(l.Seen))
	if l.Restarts > 0 {
		s += fmt.Sprintf(", %d restarts", l.Restarts)
	}
	if l.Error != "" {
		s += "; error: " + l.Error
	}
	return s
}

// hourAxis is the per-hour charts' x axis: every hour of the report's
// span, where the timeline has it when it spans whole hours.
type hourAxis struct {
	first time.Time
	n     int
	x0, w float64 // left edge, width of one hour
}

func newHourAxis(r *Report) hourAxis {
	first, last := r.From.Truncate(time.Hour), r.To.Truncate(time.Hour)
	if len(r.Hours) > 0 {
		first, last = minTime(first, r.Hours[0].Hour), maxTime(last, r.Hours[len(r.Hours)-1].Hour)
	}
	a := hourAxis{x0: marginL, first: first, n: int(last.Sub(first)/time.Hour) + 1}
	a.w = (chartW - marginR - a.x0) / float64(a.n)
	return a
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (a hourAxis) x(t time.Time) float64 { return a.x0 + float64(t.Sub(a.first)/time.Hour)*a.w }

// series is one stacked part of a bar chart's bars.
type series struct {
	colour string
	name   string
	value  func(h *Hour) float64
}

// hourChart draws bars per hour, the series stacked, with a y axis from 0
// to a round maximum; title says what a bar's hover text says.
func hourChart(r *Report, ax hourAxis, id, label, unit string, ss []series, title func(h *Hour) string) chart {
	const h, top, bottom = 160.0, 24.0, 26.0
	c := chart{ID: id, Label: label, W: chartW, H: h, Crisp: true}
	maxV := 0.0
	for i := range r.Hours {
		sum := 0.0
		for _, s := range ss {
			sum += s.value(&r.Hours[i])
		}
		maxV = math.Max(maxV, sum)
	}
	top1 := niceCeil(maxV)
	plotH := h - top - bottom
	y := func(v float64) float64 { return top + plotH*(1-v/top1) }
	for _, v := range []float64{0, top1 / 2, top1} {
		c.Lines = append(c.Lines, line{X1: ax.x0, Y1: y(v), X2: chartW - marginR, Y2: y(v), Stroke: gridColour})
		c.Texts = append(c.Texts, text{X: ax.x0 - 6, Y: y(v) + 4, Anchor: "end", Class: "tick", Text: num(v)})
	}
	c.Texts = append(c.Texts, text{X: 4, Y: 10, Class: "tick", Text: unit})
	gap := math.Min(ax.w*0.15, 3)
	for i := range r.Hours {
		hr := &r.Hours[i]
		base := 0.0
		for _, s := range ss {
			v := s.value(hr)
			if v <= 0 {
				continue
			}
			c.Rects = append(c.Rects, rect{X: ax.x(hr.Hour) + gap/2, Y: y(base + v), W: math.Max(ax.w-gap, 1), H: y(base) - y(base+v), Fill: s.colour,
				Title: title(hr)})
			base += v
		}
	}
	step := max(1, int(math.Ceil(float64(ax.n)/12)))
	for k := 0; k < ax.n; k += step {
		t := ax.first.Add(time.Duration(k) * time.Hour)
		label := t.Format("15:04")
		if k == 0 || t.Hour() < step {
			label = t.Format("Jan 2 15:04")
		}
		c.Lines = append(c.Lines, line{X1: ax.x(t), Y1: h - bottom, X2: ax.x(t), Y2: h - bottom + 4, Stroke: "#90a4ae"})
		c.Texts = append(c.Texts, text{X: ax.x(t), Y: h - bottom + 14, Anchor: "middle", Class: "tick", Text: label})
	}
	var sw []swatch
	for _, s := range ss {
		if s.name != "" {
			sw = append(sw, swatch{s.colour, s.name})
		}
	}
	if len(sw) > 0 {
		x := chartW - marginR
		for i := len(sw) - 1; i >= 0; i-- {
			x -= 16 + 7*float64(len(sw[i].label)) + 12
			c.Rects = append(c.Rects, rect{X: x, Y: 0, W: 10, H: 10, Fill: sw[i].colour})
			c.Texts = append(c.Texts, text{X: x + 14, Y: 9, Class: "legend", Text: sw[i].label})
		}
	}
	return c
}

// histChart draws a C2's inter-arrival histogram, the median and the
// classifier's interval marked.
func histChart(v *C2, i int) chart {
	const w, h, top, bottom, left = 560.0, 170.0, 16.0, 30.0, 44.0
	c := chart{ID: fmt.Sprintf("histogram-%d", i), Label: "inter-arrival histogram of the check-ins to " + v.Value, W: w, H: h}
	if len(v.Histogram) == 0 {
		return c
	}
	maxC := 0
	for _, b := range v.Histogram {
		maxC = max(maxC, b.Count)
	}
	top1 := niceCeil(float64(maxC))
	plotH, plotW := h-top-bottom, w-left-10
	bw := plotW / float64(len(v.Histogram))
	y := func(n float64) float64 { return top + plotH*(1-n/top1) }
	for _, n := range []float64{0, top1 / 2, top1} {
		c.Lines = append(c.Lines, line{X1: left, Y1: y(n), X2: w - 10, Y2: y(n), Stroke: gridColour})
		c.Texts = append(c.Texts, text{X: left - 6, Y: y(n) + 4, Anchor: "end", Class: "tick", Text: num(n)})
	}
	// x of an interval within the binned range (outside bins have a bar
	// of their own at either end).
	inner := v.Histogram
	off := 0
	if inner[0].Outside {
		inner, off = inner[1:], 1
	}
	if n := len(inner); n > 0 && inner[n-1].Outside {
		inner = inner[:n-1]
	}
	lo, hi := inner[0].From, inner[len(inner)-1].To
	xOf := func(s float64) float64 { return left + bw*(float64(off)+float64(len(inner))*(s-lo)/(hi-lo)) }
	for k, b := range v.Histogram {
		col, what := histColour, fmt.Sprintf("%s to %s", seconds(b.From), seconds(b.To))
		if b.Outside {
			col = outsideColour
			if b.To == 0 {
				what = "over " + seconds(b.From)
			} else {
				what = "under " + seconds(b.To)
			}
		}
		if b.Count > 0 {
			c.Rects = append(c.Rects, rect{X: left + bw*float64(k) + 0.5, Y: y(float64(b.Count)), W: math.Max(bw-1, 1), H: y(0) - y(float64(b.Count)),
				Fill: col, Title: fmt.Sprintf("%d intervals %s", b.Count, what)})
		}
	}
	for k, s := range []float64{lo, (lo + hi) / 2, hi} {
		c.Texts = append(c.Texts, text{X: xOf(s), Y: h - bottom + 14, Anchor: []string{"start", "middle", "end"}[k], Class: "tick", Text: seconds(s)})
	}
	if v.Median > 0 {
		x := xOf(v.Median)
		c.Lines = append(c.Lines, line{X1: x, Y1: top - 4, X2: x, Y2: y(0), Stroke: "#212121", Dash: true})
	}
	if v.Beacon != nil {
		if s := v.Beacon.Interval.D().Seconds(); s >= lo && s <= hi {
			x := xOf(s)
			c.Lines = append(c.Lines, line{X1: x, Y1: top - 4, X2: x, Y2: y(0), Stroke: causeColour["promote"]})
		}
	}
	c.Texts = append(c.Texts, text{X: w - 10, Y: h - 4, Anchor: "end", Class: "tick", Text: "seconds between check-ins"})
	return c
}

// niceCeil rounds v up to a round number (at least 1): 1, 1.2, 1.5, 2,
// 2.5, 3, 4, 5, 6 or 8 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// num formats a coordinate or a count: at most two decimals, none when
// whole.
func num(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return fmt.Sprintf("%d", int64(v))
	}
	s := fmt.Sprintf("%.2f", v)
	return strings.TrimRight(strings.TrimRight(s, "0"), ".")
}

// seconds formats a number of seconds for a person: "4.2 s", "60.7 s",
// "5m17s", "2h3m".
func seconds(s float64) string {
	switch {
	case s < 100:
		return num(math.Round(s*10)/10) + " s"
	case s < 3600:
		return time.Duration(math.Round(s) * float64(time.Second)).String()
	}
	return time.Duration(math.Round(s/60) * float64(time.Minute)).String()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// shortID is an ID's kind and last characters, for a label with no room.
func shortID(id string) string {
	if len(id) < 12 {
		return id
	}
	return records.KindOf(id) + "…" + id[len(id)-6:]
}
