package records

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Output-only line kinds: what a command prints that is not a stored record
// (a decision, an action it took, a status, a summary). They carry a kind so
// that a pipeline can route every stdout line by kind without skipping any,
// but no id, since nothing stores them. Their names are hyphenated, which no
// stored kind can be (ValidKind), so the two never collide and a reader that
// wants records can tell them apart by the kind alone.
const (
	LineLeaseDecision   = "lease-decision"   // tb-lease acquire --dry-run
	LineReapAction      = "reap-action"      // tb-lease reap
	LineHealAction      = "heal-action"      // tb-lease heal
	LineHostReport      = "host-report"      // tb-lease inspect host
	LineAllowClass      = "allow-class"      // tb-allow classify
	LineAllowApplied    = "allow-applied"    // tb-allow apply (and the commands that apply)
	LineAllowDiff       = "allow-diff"       // tb-allow diff
	LineLabStatus       = "lab-status"       // tb-capture net up, net status
	LineLabCheck        = "lab-check"        // tb-capture net check
	LineAllowElement    = "allow-element"    // tb-capture allow
	LineReconcileAction = "reconcile-action" // tb-capture reconcile
	LineCaptureStatus   = "capture-status"   // tb-capture status
	LineCycleReport     = "cycle-report"     // tb-run report --format json
	LineSpecSummary     = "spec-summary"     // tb-build specs --format json
	LineImageVerified   = "image-verified"   // tb-build verify
	LineImageRemoved    = "image-removed"    // tb-build rm
	LineImageSmoke      = "image-smoke"      // tb-build smoke
	LineGCSummary       = "gc-summary"       // tb-build gc
	LineProfileSummary  = "profile-summary"  // tb-plan profiles
	LineFlowConn        = "flow-conn"        // tb-parse flows
)

// ValidLineKind reports whether k is an output-only kind: lower-case words
// joined by hyphens, at least two of them.
func ValidLineKind(k string) bool {
	if len(k) > 32 || !strings.Contains(k, "-") || k[0] == '-' || k[len(k)-1] == '-' || strings.Contains(k, "--") {
		return false
	}
	for _, c := range k {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// Line writes v, which must encode as a JSON object without a "kind" of its
// own, as one output-only line whose first field is "kind". It is the one way
// a tool prints a line that is not a stored record.
func (w *Writer) Line(kind string, v any) error {
	if !ValidLineKind(kind) {
		return fmt.Errorf("output line kind %q: want lower-case words joined by hyphens", kind)
	}
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(body) < 2 || body[0] != '{' {
		return fmt.Errorf("%s line: %T does not encode as a JSON object", kind, v)
	}
	// A second "kind" would make the line mean two things depending on the
	// reader's JSON library.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(body, &keys); err != nil {
		return err
	}
	if _, ok := keys["kind"]; ok {
		return fmt.Errorf("%s line: %T has a kind field of its own", kind, v)
	}
	w.w.WriteString(`{"kind":"`)
	w.w.WriteString(kind)
	w.w.WriteByte('"')
	if len(body) > 2 {
		w.w.WriteByte(',')
	}
	w.w.Write(body[1:])
	return w.w.WriteByte('\n')
}

// PrintLine writes one output-only line straight to out, for a command
// that prints a single line and has no Writer of its own.
func PrintLine(out io.Writer, kind string, v any) error {
	w := NewWriter(out)
	if err := w.Line(kind, v); err != nil {
		return err
	}
	return w.Flush()
}

// checkLine checks the contract every stdout line of a tool keeps: one JSON
// object with a kind, and, for a stored kind, an id of that kind.
func checkLine(b []byte) error {
	var probe struct {
		Kind *string `json:"kind"`
		ID   string  `json:"id"`
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return errors.New("not a JSON object")
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return cleanJSONError(err)
	}
	switch {
	case probe.Kind == nil || *probe.Kind == "":
		return errors.New(`no "kind"`)
	case ValidLineKind(*probe.Kind):
		return nil
	case !ValidKind(*probe.Kind):
		return fmt.Errorf("invalid kind %q", *probe.Kind)
	case probe.ID == "":
		return fmt.Errorf(`a %s record without "id"`, *probe.Kind)
	}
	if err := CheckID(probe.ID); err != nil {
		return err
	}
	if KindOf(probe.ID) != *probe.Kind {
		return fmt.Errorf("id %q does not belong to kind %q", probe.ID, *probe.Kind)
	}
	return nil
}

// CheckLines runs checkLine on every line of r, blank ones included (a
// pipeline would have to skip those too), and returns the first failure as
// a LineError naming the input.
func CheckLines(r io.Reader, name string) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	if b[len(b)-1] != '\n' {
		return &LineError{Name: name, Line: bytes.Count(b, []byte{'\n'}) + 1, Err: errors.New("no newline at the end")}
	}
	for i, l := range bytes.Split(b[:len(b)-1], []byte{'\n'}) {
		if err := checkLine(l); err != nil {
			return &LineError{Name: name, Line: i + 1, Err: err}
		}
	}
	return nil
}
