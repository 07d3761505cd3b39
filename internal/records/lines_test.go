package records

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestWriterLine(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	type action struct {
		Action string `json:"action"`
		Lease  string `json:"lease,omitempty"`
	}
	if err := w.Line(LineReapAction, action{Action: "destroy-domain", Lease: "lease_x"}); err != nil {
		t.Fatal(err)
	}
	if err := w.Line(LineAllowDiff, struct{}{}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		kind string
		v    any
	}{
		{"lease", action{}},                              // a stored kind
		{"", action{}},                                   // no kind
		{"Reap-Action", action{}},                        // not lower case
		{LineReapAction, []int{1}},                       // not an object
		{LineReapAction, map[string]string{"kind": "x"}}, // a second kind
	} {
		if err := w.Line(bad.kind, bad.v); err == nil {
			t.Errorf("Line(%q, %#v) succeeded", bad.kind, bad.v)
		}
	}
	w.Flush()
	want := `{"kind":"reap-action","action":"destroy-domain","lease":"lease_x"}` + "\n" + `{"kind":"allow-diff"}` + "\n"
	if buf.String() != want {
		t.Fatalf("got %q, want %q", buf.String(), want)
	}
	if err := CheckLines(&buf, "out"); err != nil {
		t.Fatal(err)
	}
}

func TestCheckLines(t *testing.T) {
	var s Sample
	Init(&s, KindSample, time.Now())
	rec, _ := Marshal(&s)
	good := string(rec) + "\n" + `{"kind":"lease-decision","image":"i"}` + "\n"
	if err := CheckLines(strings.NewReader(good), "stdout"); err != nil {
		t.Fatalf("good lines: %v", err)
	}
	for in, want := range map[string]string{
		"cycle c1: completed\n":                      "stdout:1: not a JSON object",
		good + `{"action":"reap"}` + "\n":            `stdout:3: no "kind"`,
		`{"kind":""}` + "\n":                         `stdout:1: no "kind"`,
		`{"kind":"sample"}` + "\n":                   `stdout:1: a sample record without "id"`,
		`{"kind":"plan","id":"` + s.ID + `"}` + "\n": "does not belong to kind",
		good + "\n":                 "stdout:3: not a JSON object",
		`{"kind":"lease-decision"}`: "stdout:1: no newline at the end",
		`{"kind":"Lease"}` + "\n":   `invalid kind "Lease"`,
	} {
		err := CheckLines(strings.NewReader(in), "stdout")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckLines(%q) = %v, want an error with %q", in, err, want)
		}
	}
}
