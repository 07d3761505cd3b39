package image

import (
	"fmt"
	"strings"
	"testing"
)

// TestLogTailReason: a failed mmdebstrap's one-line reason is its last
// error line, or its last line, however much it printed before.
func TestLogTailReason(t *testing.T) {
	tail := &logTail{}
	for i := range 5000 {
		fmt.Fprintf(tail, "I: line %d of a long build\n", i)
	}
	if got := tail.reason(); got != "I: line 4999 of a long build" || len(tail.b) > logTailMax {
		t.Errorf("no error line: %q (%d bytes kept)", got, len(tail.b))
	}
	fmt.Fprint(tail, "E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease\nW: cleaning up\n")
	if got := tail.reason(); !strings.HasPrefix(got, "E: Failed to fetch") {
		t.Errorf("with an error line: %q", got)
	}
}
