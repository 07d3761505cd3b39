package parsejob

import (
	"bytes"
	"io"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"
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
