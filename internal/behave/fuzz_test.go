package behave

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
)

// FuzzTrace: every byte of a trace is the sample's to choose (its paths and
// arguments, and whole lines once it writes into the trace), so the parser
// must take any input as strace's, as QEMU's, under an emulator and with a
// tracer to check for tampering, and stay within its bounds.
func FuzzTrace(f *testing.F) {
	seeds, err := filepath.Glob("testdata/*.*")
	if err != nil {
		f.Fatal(err)
	}
	for _, n := range seeds {
		if filepath.Ext(n) == ".md" {
			continue
		}
		b, err := os.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(0))
	}
	for _, s := range []string{tamperedTrace, crossedClones, reusedPID, childEndedFirst} {
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, b []byte, mode uint8) {
		opts := Options{Window: time.Minute, Start: time.Unix(1795500000, 0), Exe: "/tmp/bot", Cwd: "/tmp"}
		switch mode % 4 {
		case 1:
			opts.Format = FormatStrace
			opts.Tracer = &Tracer{PIDs: []int{498, 499}, Dir: "/var/lib/0123456789abcdef", Ended: true}
		case 2:
			opts.Format = FormatStrace
			opts.Emulator = "/usr/bin/qemu-mips-static"
		case 3:
			opts.Format = FormatQEMU
			opts.Tracer = &Tracer{PIDs: []int{498}, Dir: "/var/lib/0123456789abcdef", Ended: true}
		}
		sink := decodetest.New(observe.Origin{})
		res, err := Parse(context.Background(), bytes.NewReader(b), observe.Origin{Input: "trace", Cycle: "c1"}, sink, opts)
		if err != nil {
			if opts.Format == "" {
				return // not recognised as a trace
			}
			t.Fatal(err)
		}
		if res.Stats.Bad > res.Stats.Lines {
			t.Fatalf("%d bad of %d lines", res.Stats.Bad, res.Stats.Lines)
		}
		if n := len(res.Processes); n > MaxProcesses || int64(n) > res.Trace.Processes {
			t.Fatalf("%d processes kept of %d", n, res.Trace.Processes)
		}
		if res.Trace.Processes < 0 || res.Trace.Threads < 0 || res.Trace.OmittedProcesses < 0 {
			t.Fatalf("counts below zero: %+v", res.Trace)
		}
	})
}
