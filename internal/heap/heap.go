// Package heap readies the Go heap of a process about to allocate tens of
// megabytes it will not free (tb-parse with its collector held off): the
// pages are asked for as transparent huge pages and put in place by one
// system call, before the allocations that would otherwise fault them in
// one 4 KiB page at a time.
//
// Why: on this project's test hosts (guests of a PVM hypervisor) each page
// fault and each TLB miss costs several times what it does on bare metal.
// tb-parse --no-store of the 50 MB bulk capture took 11,700 page faults
// and 0.29 s; with its heap primed, 1,300 faults and 0.15 s
// (docs/performance.md).
package heap

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// hugePage is the size of an x86-64 and arm64 transparent huge page.
const hugePage = 2 << 20

// Prime allocates n bytes (rounded up to a huge page), asks the kernel to
// back them with transparent huge pages (MADV_HUGEPAGE: the host's
// transparent_hugepage setting "madvise" or "always" grants it, "never"
// leaves 4 KiB pages) and to map them all at once (MADV_POPULATE_WRITE,
// Linux 5.14; before that, one write a page), then frees them for the
// heap's own allocations, which reuse the mapped pages without a fault.
// The collection that frees them is run here, while the heap is small. The
// pages stay the process's (its resident size grows by n) until the runtime
// returns them, which it does under GOGC or its memory limit only.
func Prime(n int) {
	if n <= 0 {
		return
	}
	b := make([]byte, (n+hugePage-1)/hugePage*hugePage)
	unix.Madvise(b, unix.MADV_HUGEPAGE) // advice: without it, small pages
	if unix.Madvise(b, unix.MADV_POPULATE_WRITE) != nil {
		for i := 0; i < len(b); i += 4096 {
			b[i] = 0
		}
	}
	b = nil
	runtime.GC()
}
