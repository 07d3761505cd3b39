package parsejob

import (
	"bytes"
	"io"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// The handover (a capture's findings folded on a second goroutine) changes
// nothing of what a run finds: with one core, where the decoder's sink is
// called directly, and with two, the observables are the same, in the same
// order, their IDs and times aside. A --max-held below the capture's
// distinct observables makes the order of the findings matter: the set
// writes out its least recently updated half whenever it is full.
func TestHandoverChangesNothing(t *testing.T) {
	input := filepath.Join(t.TempDir(), "conv.pcap")
	conversations(t, input, 600)
	stamps := regexp.MustCompile(`"(id|created_at|updated_at)":"[^"]*"`)
	parse := func(procs int) []byte {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		var out bytes.Buffer
		if err := tbParse("", nil, Request{Inputs: []string{input}, Lease: storeLease, NoStore: true, MaxHeld: 97}, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		return stamps.ReplaceAll(out.Bytes(), nil)
	}
	direct, handedOver := parse(1), parse(2)
	if n := bytes.Count(direct, []byte("\n")); n < 1000 {
		t.Fatalf("%d observables: too few to hold the set past --max-held", n)
	}
	if !bytes.Equal(direct, handedOver) {
		t.Errorf("the observables differ with the handover:\n%.2000s\nwithout:\n%.2000s", handedOver, direct)
	}
}

// failingSink panics on its nth observable, as a bug in the sets or the
// store would.
type failingSink struct {
	n, seen int
}

func (s *failingSink) Add(*records.Observable) {
	if s.seen++; s.seen == s.n {
		panic("the sink's bug")
	}
}

func (s *failingSink) Conn(*flowlog.Conn) {}

// TestHandoverRaisesTheSinksPanic: a panic of the sink's goroutine is
// raised again on the decoder's, at its next hand-over or at close, with
// the sink's stack, where the tool's recovery reports it (exit 1, not a
// crash with Go's 2); meanwhile the decoder is never left waiting.
func TestHandoverRaisesTheSinksPanic(t *testing.T) {
	for _, tc := range []struct {
		name  string
		found int // findings handed over
	}{
		{"at a hand-over", 10 * handoverBatch},
		{"at close", 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startHandover(&failingSink{n: 3})
			closing := false
			defer func() {
				p, ok := recover().(*goroutinePanic)
				if !ok || p.String() != "the sink's bug" || !bytes.Contains(p.PanicStack(), []byte("failingSink")) {
					t.Errorf("recovered %v, want the sink's panic with its stack", p)
				}
				// With batches to hand over after the panic, the decoder
				// meets it at one of them, not only at the end.
				if atHandOver := tc.found > 2*handoverBatch; closing == atHandOver {
					t.Errorf("raised while closing: %v", closing)
				}
			}()
			for range tc.found {
				h.Add(&records.Observable{})
			}
			closing = true
			h.close()
			t.Error("no panic")
		})
	}
}
