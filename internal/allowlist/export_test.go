package allowlist

import (
	"bytes"
	"os"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// TestExportReturnsWriteError: every format's export onto a full disk
// fails whenever it writes anything, a header alone included.
func TestExportReturnsWriteError(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	one := []*records.AllowEntry{{Type: records.AllowEndpoint, Value: "198.51.100.7:443/tcp", Class: "c2", Reason: "seen"}}
	for _, f := range Formats {
		for _, es := range [][]*records.AllowEntry{nil, one} {
			o := ExportOptions{Format: f, Table: "talkbox", Set: "allow", SIDBase: 1}
			var buf bytes.Buffer
			if err := Export(&buf, es, o); err != nil {
				t.Fatalf("%s export of %d entries: %v", f, len(es), err)
			}
			if buf.Len() == 0 {
				continue
			}
			if err := Export(full, es, o); err == nil {
				t.Errorf("%s export of %d entries onto /dev/full: no error", f, len(es))
			}
		}
	}
}
