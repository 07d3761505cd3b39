package cycle

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Summary is what a report says about one cycle; the text and the JSON
// forms are both rendered from it, so they cannot disagree.
type Summary struct {
	Cycle    string            `json:"cycle"`
	State    string            `json:"state"`
	Took     *records.Duration `json:"took,omitempty"`
	Lease    string            `json:"lease"`
	Previous string            `json:"previous,omitempty"`
	// GuestClock is the guest's clock against the host's when the cycle
	// prepared it (the cycle record's).
	GuestClock *records.GuestClock `json:"guest_clock,omitempty"`
	// Revision is the allow-list revision in force (none: everything
	// sinkholed) and Allowed its active entries.
	Revision string      `json:"revision,omitempty"`
	Allowed  int         `json:"allowed"`
	Error    string      `json:"error,omitempty"`
	Run      *RunSummary `json:"run,omitempty"`
	// The rest comes from the run's analysis, when there is one.
	Analysis       string                    `json:"analysis,omitempty"`
	Seen           map[string]int            `json:"seen,omitempty"`
	Connections    int64                     `json:"connections,omitempty"`
	Names          []string                  `json:"names,omitempty"`
	Promoted       []Promoted                `json:"promoted,omitempty"`
	Refused        []records.Refusal         `json:"refused,omitempty"`
	Behaviour      *records.BehaviourSummary `json:"behaviour,omitempty"`
	Classification []string                  `json:"classification,omitempty"`
	Recommendation string                    `json:"recommendation,omitempty"`
	Reasons        []string                  `json:"reasons,omitempty"`
}

// RunSummary is how the sample's run ended, with the last lines it wrote.
type RunSummary struct {
	Outcome     string           `json:"outcome"`
	Duration    records.Duration `json:"duration"`
	StdoutBytes int64            `json:"stdout_bytes"`
	StderrBytes int64            `json:"stderr_bytes"`
	StdoutTail  []string         `json:"stdout_tail,omitempty"`
	StderrTail  []string         `json:"stderr_tail,omitempty"`
}

// Promoted is an allow-list entry the cycle added and the classifier's reason.
type Promoted struct {
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

// Summarise gathers what a report says about one cycle; ctx bounds the
// fetch of its revision's content from the fleet host that wrote it.
func Summarise(ctx context.Context, st *state.Store, id string) (*Summary, error) {
	var c records.Cycle
	if err := st.Get(id, &c); err != nil {
		return nil, notFound("cycle", id, err)
	}
	r := &Summary{Cycle: c.ID, State: c.State, Lease: c.Lease, Previous: c.Previous, GuestClock: c.GuestClock,
		Revision: c.Revision, Allowed: c.Allowed, Error: c.Error}
	if c.StartedAt != nil && c.CompletedAt != nil {
		d := records.Duration(c.CompletedAt.Sub(*c.StartedAt).Round(time.Millisecond))
		r.Took = &d
	}
	if c.Execution != "" {
		var ex records.ExecutionSnapshot
		if err := st.Get(c.Execution, &ex); err == nil {
			r.Run = &RunSummary{Outcome: execSummary(&ex), Duration: records.Duration(ex.Duration.D().Round(time.Millisecond)),
				StdoutBytes: ex.StdoutBytes, StderrBytes: ex.StderrBytes,
				StdoutTail: lastN(ex.StdoutTail, 3), StderrTail: lastN(ex.StderrTail, 2)}
		}
	}
	if c.Analysis == "" {
		return r, nil
	}
	var a records.RunAnalysis
	if err := st.Get(c.Analysis, &a); err != nil {
		return nil, err
	}
	r.Analysis, r.Seen, r.Names, r.Refused, r.Connections = a.ID, a.Observables, a.Domains, a.Refused, a.Connections
	r.Classification, r.Recommendation, r.Reasons = a.Classification, a.Recommendation, a.Reasons
	r.Behaviour = a.Behaviour
	reasons := entryReasons(ctx, st, a.Revision)
	for _, k := range a.Promoted {
		r.Promoted = append(r.Promoted, Promoted{Key: k, Reason: reasons[k]})
	}
	return r, nil
}

// Text writes the summary for a person. Most of what it shows came from
// the sample (its output, the names it looked up, its processes' paths):
// every string is printed through Printable, so that none can move the
// cursor, colour, retitle or clear the terminal, or end a line and forge
// the ones after it. It returns the first write error and writes nothing
// after it: a report cut short by a full disk or a closed pipe must not
// pass for a whole one.
func (r *Summary) Text(w io.Writer) error {
	var werr error
	p := func(format string, a ...any) {
		if werr != nil {
			return
		}
		for i, v := range a {
			if s, ok := v.(string); ok {
				a[i] = Printable(s)
			}
		}
		_, werr = fmt.Fprintf(w, format+"\n", a...)
	}
	took := ""
	if r.Took != nil {
		took = " in " + r.Took.String()
	}
	p("cycle %s: %s%s (lease %s)", r.Cycle, r.State, took, r.Lease)
	if r.Previous != "" {
		p("  follows %s", r.Previous)
	}
	if gc := r.GuestClock; gc != nil && gc.Found.D().Abs() > records.ClockTolerance {
		// What a revert restored or a sample set: the dates it ran on.
		set := "set to within " + gc.Left.D().Abs().Round(time.Millisecond).String()
		if gc.Error != "" {
			set = "not set (" + gc.Error + "): the sample ran on it"
		}
		p("  guest clock: %s the host's at the start, %s", clockOffset(gc.Found.D()), set)
	}
	if r.Revision != "" {
		p("  allow-list in force: %s (%d active)", r.Revision, r.Allowed)
	} else {
		p("  allow-list in force: none (everything sinkholed)")
	}
	if r.Error != "" {
		p("  error: %s", r.Error)
	}
	if ex := r.Run; ex != nil {
		p("  run: %s after %s; %d bytes of stdout, %d of stderr", ex.Outcome, ex.Duration, ex.StdoutBytes, ex.StderrBytes)
		for _, l := range ex.StdoutTail {
			p("    | %s", l)
		}
		for _, l := range ex.StderrTail {
			p("    ! %s", l)
		}
	}
	if r.Analysis == "" {
		return werr
	}
	var counts []string
	for _, k := range slices.Sorted(maps.Keys(r.Seen)) {
		counts = append(counts, fmt.Sprintf("%d %s", r.Seen[k], k))
	}
	p("  seen: %s; %d connections in the flow log", orNone(strings.Join(counts, ", ")), r.Connections)
	if len(r.Names) > 0 {
		p("  names: %s", strings.Join(r.Names, ", "))
	}
	for _, pr := range r.Promoted {
		p("  promoted: %s — %s", pr.Key, orNone(pr.Reason))
	}
	for _, f := range r.Refused {
		ex := ""
		if len(f.Examples) > 0 {
			ex = " (" + strings.Join(f.Examples, ", ") + ")"
		}
		p("  refused: %s [%s] — %s%s", f.Target, f.Class, f.Reason, ex)
	}
	if b := r.Behaviour; b != nil {
		p("  behaviour:")
		b.Tree(func(depth int, n records.ProcessNode) {
			line := fmt.Sprintf("process %d %s", n.PID, orNone(n.Exe))
			if len(n.Names) > 0 {
				line += " (" + strings.Join(n.Names, ", ") + ")"
			}
			if n.Exit != "" {
				line += " exit " + n.Exit
			}
			p("    %s%s", strings.Repeat("  ", depth), line)
		})
		for _, l := range []struct {
			what string
			vs   []string
		}{{"dropped", b.Dropped}, {"planned from them", b.DroppedSamples}, {"persistence", b.Persistence}, {"evasion", b.Evasion},
			{"tried", b.Tried}, {"listening", b.Listening}} {
			if len(l.vs) > 0 {
				p("    %s: %s", l.what, strings.Join(l.vs, ", "))
			}
		}
	}
	p("  classification: %s", orNone(strings.Join(r.Classification, ", ")))
	p("  recommendation: %s — %s", r.Recommendation, strings.Join(r.Reasons, "; "))
	return werr
}

// clockOffset says how far and which way a guest's clock was off.
func clockOffset(d time.Duration) string {
	way := "ahead of"
	if d < 0 {
		way, d = "behind", -d
	}
	return d.Round(time.Second).String() + " " + way
}

// entryReasons maps "type value" keys of a revision's entries to the
// classifier's reasons.
func entryReasons(ctx context.Context, st *state.Store, rev string) map[string]string {
	out := map[string]string{}
	if rev == "" {
		return out
	}
	// Read as tb-allow reads it: digest checked, fetched from the host
	// that wrote it if need be.
	_, entries, err := (&allowlist.Book{St: st}).Revision(ctx, rev)
	if err != nil {
		return out
	}
	for _, e := range entries {
		out[e.Type+" "+e.Value] = fmt.Sprintf("%s, score %.2f: %s", e.Class, e.Score, e.Reason)
	}
	return out
}

func lastN(s string, n int) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return nil
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

// Printable is s with what a terminal would act on escaped: a control
// byte or a byte that is not UTF-8 as \xNN, a rune that is not printable
// (a bidirectional override, a zero-width joiner) as \uNNNN. Printable
// text, in any script, is left as it is.
func Printable(s string) string {
	clean := true
	for _, c := range s {
		if c == utf8.RuneError || !unicode.IsPrint(c) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		c, n := utf8.DecodeRuneInString(s)
		switch {
		case c == utf8.RuneError && n <= 1, c < utf8.RuneSelf && !unicode.IsPrint(c):
			fmt.Fprintf(&b, "\\x%02x", s[0])
		case !unicode.IsPrint(c):
			fmt.Fprintf(&b, "\\u%04x", c)
		default:
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
