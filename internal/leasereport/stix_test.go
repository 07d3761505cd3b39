package leasereport_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/leasereport"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/stix/stixtest"
)

// TestWriteSTIX: a lease's report as a STIX 2.1 bundle that validates,
// with the sample as malware and its file, each C2 let through as
// infrastructure it beacons to with its indicator, and the ATT&CK
// techniques as attack patterns it uses.
func TestWriteSTIX(t *testing.T) {
	st, b := twoCycles(t)
	r := collect(t, st, leasereport.Target{Lease: b.Lease})
	var buf bytes.Buffer
	if err := leasereport.WriteSTIX(&buf, r); err != nil {
		t.Fatal(err)
	}
	if problems := stixtest.Validate(buf.Bytes()); len(problems) > 0 {
		t.Fatalf("%q\n%s", problems, buf.String())
	}
	var bundle struct {
		Objects []struct {
			Type   string
			Hashes map[string]string
		}
	}
	if err := json.Unmarshal(buf.Bytes(), &bundle); err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, o := range bundle.Objects {
		count[o.Type]++
		if o.Type == "file" && o.Hashes["SHA-256"] != r.Sample {
			t.Errorf("file %v", o.Hashes)
		}
	}
	let := 0
	for _, c := range r.C2s {
		if c.Status == records.StatusActive || c.Status == records.StatusProbation {
			let++
		}
	}
	if count["malware"] != 1 || count["file"] != 1 || count["infrastructure"] != let || count["indicator"] < let || count["attack-pattern"] == 0 {
		t.Errorf("objects by type %v (%d C2s let through)", count, let)
	}
	if strings.Contains(buf.String(), "<script") {
		t.Error("a hostile name in the bundle")
	}
}
