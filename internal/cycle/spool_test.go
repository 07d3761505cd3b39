package cycle

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestDetachedTraceIsCutBetweenLines: strace writes a call when it starts
// and its result when it returns, so the trace of a detached sample read
// while a call blocks ends within a line. That line goes to the next
// cycle, whose trace starts where the last ended: each cycle's trace is
// whole lines, and together they are the one trace.
func TestDetachedTraceIsCutBetweenLines(t *testing.T) {
	e := setup(t, "hang")
	e.instrument(t, "pcap+trace")
	e.g.onSpawn = func(int) { e.appendTrace("100 1795500968.000001 nanosleep({tv_sec=2, tv_nsec=0}, ") }
	yes, w := true, 10*time.Millisecond
	c1 := e.run(t, Request{Detach: &yes, Window: &w})
	t1 := e.trace(t, c1)
	if !strings.HasSuffix(t1, ") = 0\n") || strings.Contains(t1, "nanosleep") || c1.TraceTo != int64(len(t1)) {
		t.Fatalf("cycle 1's trace (to %d) %q", c1.TraceTo, t1)
	}
	e.appendTrace("NULL) = 0 <2.000100>\n100 1795500970.000200 connect(3, {sa_family=AF_INET, sin_port=htons(80)}, 16) = 0\n100 1795500970.1 nanosleep(")
	c2 := e.run(t, Request{Detach: &yes, Window: &w})
	t2 := e.trace(t, c2)
	if want := "100 1795500968.000001 nanosleep({tv_sec=2, tv_nsec=0}, NULL) = 0 <2.000100>\n100 1795500970.000200 connect(3, {sa_family=AF_INET, sin_port=htons(80)}, 16) = 0\n"; t2 != want || c2.TraceFrom != c1.TraceTo || c2.TraceTo != c1.TraceTo+int64(len(t2)) {
		t.Fatalf("cycle 2's trace (%d-%d) %q, want %q", c2.TraceFrom, c2.TraceTo, t2, want)
	}
	// The trace of a sample that ended is final: its unfinished line is
	// kept.
	e = setup(t, "exit 0")
	e.instrument(t, "pcap+trace")
	e.g.onSpawn = func(int) { e.appendTrace("100 1795500968.000001 nanosleep({tv_sec=2, tv_nsec=0}, ") }
	if c := e.run(t, Request{}); !strings.HasSuffix(e.trace(t, c), "nanosleep({tv_sec=2, tv_nsec=0}, ") {
		t.Fatalf("the trace of a sample that ended lost its last line: %q", e.trace(t, c))
	}
}

// TestLongTraceCopiedWhole: a trace longer than one read of the guest's
// file (4 MiB) is copied to its end. The lines of a read are cut at its
// last newline; the rest of the file was taken for the end of what was
// written, so a trace past 4 MiB (a Go sample under qemu-user on a loaded
// host: qemu's RCU thread's sleeps) lost its end, exits and all, and a
// clean run read as "trace tampered".
func TestLongTraceCopiedWhole(t *testing.T) {
	e := setup(t, "exit 0")
	e.instrument(t, "pcap+trace")
	var want strings.Builder
	for i := 0; want.Len() < 9<<20; i++ {
		fmt.Fprintf(&want, "101 1795500968.%06d nanosleep({tv_sec=0, tv_nsec=10000}, 0x7fd474b7bd90) = 0 <0.000685>\n", i%1000000)
	}
	want.WriteString("100 1795500999.000001 exit_group(0) = ?\n100 1795500999.000002 +++ exited with 0 +++\n")
	e.g.onSpawn = func(int) { e.appendTrace(want.String()) }
	if got := e.trace(t, e.run(t, Request{})); !strings.Contains(got, want.String()) {
		t.Fatalf("copied %d bytes, not the %d-byte trace, ending %q", len(got), want.Len(), got[max(0, len(got)-80):])
	}
}
