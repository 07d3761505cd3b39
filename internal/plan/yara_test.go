package plan

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/yarascan"
)

// TestDroppedFileScannedWithItsSamplesRules: a file a cycle's sample
// dropped is scanned with the rules of that sample's plan, and its match
// is the lease's and the cycle's (what the cycle's analysis reads).
func TestDroppedFileScannedWithItsSamplesRules(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := state.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	rules := t.TempDir()
	rule := `rule TalkboxDrop { strings: $s = "dropped by the Talkbox test beacon" condition: $s }`
	if err := os.WriteFile(filepath.Join(rules, "drops.yar"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	pl := &records.Plan{Yara: []string{rules}}
	records.Init(pl, records.KindPlan, st.Now())
	c := &records.Cycle{State: records.CycleCompleted, Lease: "lease_01JD0000000000000000000000", Sample: strings.Repeat("0", 64)}
	records.Init(c, records.KindCycle, st.Now())
	c.Plan = pl.ID
	for _, r := range []records.Record{pl, c} {
		if err := st.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "0")
	if err := os.WriteFile(file, []byte("#!/bin/sh\n# dropped by the Talkbox test beacon: does nothing\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := runRequest(ctx, dir, Request{Inputs: []string{file}, Profile: "default", DroppedBy: &records.Drop{Cycle: c.ID, Path: "/var/tmp/x/.tbdrop"}}, &stdout, &stderr); err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	found, err := state.FindBy(st, records.KindObservable, records.KeyCycle, c.ID, func(o *records.Observable) bool { return o.Yara != nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 {
		t.Fatalf("%d yara observables of the cycle; stdout %s", len(found), stdout.String())
	}
	o := found[0]
	if o.Value != "drops:TalkboxDrop" || o.Lease != c.Lease || o.Yara.Target != yarascan.TargetDropped || o.Provenance[0].Input != "/var/tmp/x/.tbdrop" {
		t.Fatalf("observable %+v %+v", o, o.Yara)
	}
}
