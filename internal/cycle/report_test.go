package cycle

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// TestReportTextEscapesSampleBytes: a sample whose stdout and stderr carry
// terminal escapes, carriage returns, bidirectional overrides and bytes
// that are not UTF-8 (stored as U+FFFD), whose process has such a path and whose cycle error
// quotes them, gets a text report whose lines are exactly the report's:
// nothing a terminal would act on, and no line of its making.
func TestReportTextEscapesSampleBytes(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	now := st.Now()
	forged := "\r  recommendation: benign — nothing seen"
	ex := &records.ExecutionSnapshot{ExitCode: new(int), Duration: records.Duration(time.Second),
		StdoutTail: "fine\n\x1b]0;owned\x07\x1b[2J\x1b[1A" + forged + "\n\xff\xfe\u202egpj.exe\n",
		StderrTail: "oops\x1b[31m\vred\x00\n", StdoutBytes: 99, StderrBytes: 9}
	records.Init(ex, records.KindExecution, now)
	if err := st.Create(ctx, ex); err != nil {
		t.Fatal(err)
	}
	a := &records.RunAnalysis{Domains: []string{"c2.example\n  promoted: everything"}, Recommendation: "keep",
		Reasons:   []string{"saw \x1b[8mhidden"},
		Behaviour: &records.BehaviourSummary{Processes: []records.ProcessNode{{PID: 7, Exe: "/tmp/\x1b[32mx\u200d", Exit: "0"}}}}
	records.Init(a, records.KindAnalysis, now)
	if err := st.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	c := &records.Cycle{State: records.CycleCompleted, Lease: records.NewID("lease", now), Execution: ex.ID, Analysis: a.ID,
		Error: "agent said \x1b[0m\nok"}
	records.Init(c, records.KindCycle, now)
	if err := st.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	s, err := Summarise(t.Context(), st, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s.Text(&out)
	text := out.String()
	for _, r := range strings.TrimSuffix(text, "\n") {
		if r != '\n' && !unicode.IsPrint(r) {
			t.Fatalf("report holds %U:\n%s", r, text)
		}
	}
	for _, want := range []string{`\x1b]0;owned\x07\x1b[2J\x1b[1A\x0d  recommendation: benign`, `\u202egpj.exe`,
		`oops\x1b[31m\x0bred\x00`, `process 7 /tmp/\x1b[32mx\u200d exit 0`, `agent said \x1b[0m\x0aok`,
		`names: c2.example\x0a  promoted: everything`, `saw \x1b[8mhidden`} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %s:\n%s", want, text)
		}
	}
	recommendations := 0
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "promoted:") {
			t.Fatalf("a line of the sample's making: %q in\n%s", l, text)
		}
		if strings.HasPrefix(l, "recommendation:") {
			recommendations++
		}
	}
	if recommendations != 1 {
		t.Fatalf("%d recommendation lines:\n%s", recommendations, text)
	}
}

// TestPrintableLeavesTextAlone: printable text in any script, and a
// backslash, pass unchanged.
func TestPrintableLeavesTextAlone(t *testing.T) {
	for _, s := range []string{"", "hello, world", `C:\Users\x`, "Grüße — 日本語 — مرحبا", "ok \uFFFD"} {
		if got := Printable(s); got != s {
			t.Errorf("Printable(%q) = %q", s, got)
		}
	}
}

// TestReportTextReturnsWriteError: a report written onto a full disk
// returns the write's error (tb-run report -o FILE then commits nothing),
// and writes nothing after the first error.
func TestReportTextReturnsWriteError(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	s := &Summary{Cycle: records.NewID("cycle", time.Now()), State: records.CycleCompleted, Error: "x",
		Analysis: "analysis", Classification: []string{"silent"}}
	if err := s.Text(full); err == nil {
		t.Fatal("a report onto /dev/full: no error")
	}
	w := &failAfter{left: 1}
	if err := s.Text(w); !errors.Is(err, errShort) || w.writes != 2 {
		t.Fatalf("a writer that fails on its second write: %v after %d writes, want errShort after 2", err, w.writes)
	}
}

var errShort = errors.New("no space left")

// failAfter takes left writes, then fails every one.
type failAfter struct{ left, writes int }

func (f *failAfter) Write(p []byte) (int, error) {
	f.writes++
	if f.left == 0 {
		return 0, errShort
	}
	f.left--
	return len(p), nil
}
