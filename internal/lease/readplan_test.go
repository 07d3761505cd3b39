package lease

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
)

// A plan on stdin among other records: the first plan is used, stdin is
// read to the end, and the rest (a second plan too) is passed over and
// counted in the log; a line that is not a record is bad data by number.
func TestReadPlanPassesOver(t *testing.T) {
	const meta = `"v":1,"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"`
	lines := []string{
		`{"kind":"sample","id":"sample_01JD0000000000000000000000",` + meta + `}`,
		`{"kind":"plan","id":"plan_01JD0000000000000000000001",` + meta + `,"runnable":true}`,
		`{"kind":"plan","id":"plan_01JD0000000000000000000002",` + meta + `,"runnable":true}`,
		`{"kind":"sample","id":"sample_01JD0000000000000000000001",` + meta + `}`,
	}
	// More than the reader buffers, so that stopping early leaves some.
	tail := strings.Repeat(lines[3]+"\n", 4000)
	in := strings.NewReader(strings.Join(lines, "\n") + "\n" + tail)
	var logged bytes.Buffer
	p, err := ReadPlan(nil, in, "", slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil || p.ID != "plan_01JD0000000000000000000001" {
		t.Fatalf("ReadPlan = %+v, %v, want the first plan", p, err)
	}
	if in.Len() != 0 {
		t.Errorf("%d bytes of stdin left unread", in.Len())
	}
	for _, want := range []string{"kind=plan count=1", "kind=sample count=4002"} {
		if !strings.Contains(logged.String(), `records it does not use" `+want) {
			t.Errorf("log %q does not say %s", logged.String(), want)
		}
	}

	bad := strings.NewReader(lines[1] + "\n" + lines[0] + "\n{\"kind\":\n" + lines[2] + "\n")
	_, err = ReadPlan(nil, bad, "", slog.New(slog.DiscardHandler))
	if fault.Code(err) != fault.ExitDataErr || !strings.HasPrefix(err.Error(), "stdin:3: ") {
		t.Fatalf("a line that is not a record: %v (exit %d), want stdin:3, exit 65", err, fault.Code(err))
	}
}
