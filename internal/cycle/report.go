package cycle

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// ReportCmd prints a short human summary of cycles: what ran, what was
// seen, what was promoted and why, what was refused, and what to do next.
func ReportCmd(env *cli.Env, ids []string) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	var batch cli.Batch
	for _, id := range ids {
		if err := Report(st, env.Stdout, id); err != nil {
			env.Warnf("%v", err)
			batch.Add(err)
		}
	}
	return batch.Err()
}

// Report writes the summary of one cycle.
func Report(st *state.Store, w io.Writer, id string) error {
	var c records.Cycle
	if err := st.Get(id, &c); err != nil {
		return notFound("cycle", id, err)
	}
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	took := ""
	if c.StartedAt != nil && c.CompletedAt != nil {
		took = " in " + c.CompletedAt.Sub(*c.StartedAt).Round(time.Millisecond).String()
	}
	p("cycle %s: %s%s (lease %s)", c.ID, c.State, took, c.Lease)
	if c.Previous != "" {
		p("  follows %s", c.Previous)
	}
	if c.Revision != "" {
		p("  allow-list in force: %s (%d active)", c.Revision, c.Allowed)
	} else {
		p("  allow-list in force: none (everything sinkholed)")
	}
	if c.Error != "" {
		p("  error: %s", c.Error)
	}
	if c.Execution != "" {
		var ex records.ExecutionSnapshot
		if err := st.Get(c.Execution, &ex); err == nil {
			what := execSummary(&ex)
			p("  run: %s after %s; %d bytes of stdout, %d of stderr", what, ex.Duration.D().Round(time.Millisecond), ex.StdoutBytes, ex.StderrBytes)
			for _, l := range lastN(ex.StdoutTail, 3) {
				p("    | %s", l)
			}
			for _, l := range lastN(ex.StderrTail, 2) {
				p("    ! %s", l)
			}
		}
	}
	if c.Analysis == "" {
		return nil
	}
	var a records.RunAnalysis
	if err := st.Get(c.Analysis, &a); err != nil {
		return err
	}
	var counts []string
	for _, k := range sortedKeysInt(a.Observables) {
		counts = append(counts, fmt.Sprintf("%d %s", a.Observables[k], k))
	}
	p("  seen: %s", orNone(strings.Join(counts, ", ")))
	if len(a.Domains) > 0 {
		p("  names: %s", strings.Join(a.Domains, ", "))
	}
	reasons := entryReasons(st, a.Revision)
	for _, k := range a.Promoted {
		p("  promoted: %s — %s", k, orNone(reasons[k]))
	}
	for _, f := range a.Refused {
		ex := ""
		if len(f.Examples) > 0 {
			ex = " (" + strings.Join(f.Examples, ", ") + ")"
		}
		p("  refused: %s [%s] — %s%s", f.Target, f.Class, f.Reason, ex)
	}
	p("  classification: %s", orNone(strings.Join(a.Classification, ", ")))
	p("  recommendation: %s — %s", a.Recommendation, strings.Join(a.Reasons, "; "))
	return nil
}

// entryReasons maps "type value" keys of a revision's entries to the
// classifier's reasons.
func entryReasons(st *state.Store, rev string) map[string]string {
	out := map[string]string{}
	if rev == "" {
		return out
	}
	var rv records.AllowRevision
	if st.Get(rev, &rv) != nil {
		return out
	}
	f, err := st.OpenBlob(strings.TrimPrefix(rv.Content, "blob:sha256:"))
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, records.MaxLine)
	for sc.Scan() {
		var e records.AllowEntry
		if records.Unmarshal(sc.Bytes(), &e) == nil {
			out[e.Type+" "+e.Value] = fmt.Sprintf("%s, score %.2f: %s", e.Class, e.Score, e.Reason)
		}
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

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
