package parsejob

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// TestMappedCaptureCutWhileParsed: a capture file another program cuts
// short while tb-parse reads it, mapped, is bad data named by what it
// says, after the packets before the cut: not a fault that ends the
// process (it would without capfile.Mapped.Guard around the reading).
func TestMappedCaptureCutWhileParsed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.pcap")
	conversations(t, path, 200)
	m := decodetest.MapFile(t, path)
	if fi, err := os.Stat(path); err != nil || fi.Size() < 64<<10 {
		t.Fatalf("the capture: %v, %v; want 64 KiB or more to cut", fi, err)
	}
	if err := os.Truncate(path, 8<<10); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	o := &output{ctx: ctx, log: slog.New(slog.DiscardHandler), warnf: t.Logf, req: Request{NoStore: true},
		w: bufio.NewWriter(io.Discard), carries: map[string]*carried{}}
	emitted := 0
	set := observe.NewSet(1<<10, func(*records.Observable) error { emitted++; return nil })
	sink := &inputSink{Set: set, dests: flowlog.NewDests("", set.Named, set.Add)}
	in := input{name: path, path: path}
	err := o.parsePcap(ctx, nil, m, nil, in, observe.Origin{Input: path, Source: FormatPcap}, sink)
	if fault.Code(err) != fault.ExitDataErr || !strings.Contains(err.Error(), "the file changed while it was read") {
		t.Fatalf("parsing a capture cut to 8 KiB as it was read: %v (exit %d), want bad data (exit 65)", err, fault.Code(err))
	}
	if err := set.Flush(); err != nil || emitted == 0 {
		t.Errorf("%d observables from the packets before the cut (%v)", emitted, err)
	}
}
