package heap

import (
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// faults is the process's minor page faults so far.
func faults() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Minflt
}

// allocate makes n bytes of small objects, as a parser does, and keeps
// them until it has counted the page faults they took.
func allocate(n int) int64 {
	before := faults()
	keep := make([][]byte, 0, n/256)
	for range n / 256 {
		b := make([]byte, 256)
		b[0] = 1
		keep = append(keep, b)
	}
	f := faults() - before
	runtime.KeepAlive(keep)
	return f
}

// TestHelperAllocate is the child process of TestPrimedHeapTakesNoFaults:
// a fresh heap, primed or not, with the collector off, as tb-parse runs.
func TestHelperAllocate(t *testing.T) {
	mode := os.Getenv("TB_HEAP_CHILD")
	if mode == "" {
		return // only as the child
	}
	debug.SetGCPercent(-1)
	if mode == "primed" {
		Prime(32 << 20)
	}
	os.Stdout.WriteString("faults " + strconv.FormatInt(allocate(16<<20), 10) + "\n")
}

// TestPrimedHeapTakesNoFaults: 16 MiB of small objects on a fresh heap
// fault in their pages one by one (4,096 faults with 4 KiB pages, fewer
// where the host gives every process huge pages); on a primed heap only
// the runtime's own bookkeeping faults (about 100 here).
func TestPrimedHeapTakesNoFaults(t *testing.T) {
	count := func(mode string) int64 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperAllocate$", "-test.count=1")
		cmd.Env = append(os.Environ(), "TB_HEAP_CHILD="+mode)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s child: %v: %s", mode, err, out)
		}
		_, after, ok := strings.Cut(string(out), "faults ")
		n, err := strconv.ParseInt(strings.TrimSpace(strings.SplitN(after, "\n", 2)[0]), 10, 64)
		if !ok || err != nil {
			t.Fatalf("%s child said %q", mode, out)
		}
		return n
	}
	unprimed, primed := count("unprimed"), count("primed")
	t.Logf("16 MiB of 256-byte objects: %d page faults on a fresh heap, %d on a primed one", unprimed, primed)
	if primed > 512 {
		t.Fatalf("%d page faults for 16 MiB on a primed heap (%d unprimed)", primed, unprimed)
	}
}
