package clitest

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Kinds is "kinds [KIND...]": every line of the last command's stdout is a
// JSON object with a kind (and a stored kind's id), the contract that lets
// pipelines route every line; with KINDs, there is at least one line and
// each is of one of them. "! kinds" is not allowed: a script that expects
// lines without a kind is testing the wrong thing.
func Kinds(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("usage: kinds [KIND...] (no negation)")
	}
	out := ts.ReadFile("stdout")
	ts.Check(records.CheckLines(strings.NewReader(out), "stdout"))
	if len(args) == 0 {
		return
	}
	if out == "" {
		ts.Fatalf("stdout is empty; want %s lines", strings.Join(args, ", "))
	}
	for i, l := range bytes.Split(bytes.TrimSuffix([]byte(out), []byte{'\n'}), []byte{'\n'}) {
		var p struct {
			Kind string `json:"kind"`
		}
		ts.Check(json.Unmarshal(l, &p))
		if !slices.Contains(args, p.Kind) {
			ts.Fatalf("stdout:%d: a %s line, want %s", i+1, p.Kind, strings.Join(args, " or "))
		}
	}
}
