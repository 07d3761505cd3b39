// Package heap readies the Go heap of a process about to allocate tens of
// megabytes it will not free (tb-parse with its collector held off): the
// heap is grown by the bytes it will need, in memory the kernel backs with
// transparent huge pages, so that the allocations fault their pages in
// 2 MiB at a time instead of 4 KiB.
//
// Why: on this project's test hosts (guests of a PVM hypervisor) each page
// fault and each TLB miss costs several times what it does on bare metal.
// tb-parse --no-store of the 50 MB bulk capture took 11,700 page faults
// and 0.29 s; with its heap primed, 1,300 faults and 0.15 s
// (docs/performance.md).
package heap

import (
	"bytes"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePage is the size of an x86-64 and arm64 transparent huge page.
const hugePage = 2 << 20

// Prime allocates n bytes (rounded up to a huge page), asks the kernel to
// back them with transparent huge pages (MADV_HUGEPAGE: the host's
// transparent_hugepage setting "madvise" or "always" grants it), then frees
// them for the heap's own allocations, which fault them in a huge page at
// a time as they are used. The collection that frees them is run here,
// while the heap is small.
//
// The huge pages are not mapped all at once beforehand: a guest whose
// hypervisor takes free memory back (virtio-balloon's free page reporting
// hands it free 2 MiB blocks) pays the hypervisor's first touch of every
// such page again, so memory mapped and never used costs as much as memory
// used: 96 MiB mapped in one call took 133-203 ms after 3 s idle on the
// test host, 60 MiB touched a huge page at a time 58-113 ms. Where the
// host grants no huge pages ("never"), the memory is mapped in one call in
// 4 KiB pages instead (MADV_POPULATE_WRITE), which a fault per page would
// cost far more than. The pages stay the process's until the runtime
// returns them, which it does under GOGC or its memory limit only.
func Prime(n int) {
	if n <= 0 {
		return
	}
	b := make([]byte, (n+hugePage-1)/hugePage*hugePage)
	if hugePagesGranted() {
		unix.Madvise(b, unix.MADV_HUGEPAGE) // advice: without it, small pages
		// The heap aligns b to its own pages only: the parts of b outside
		// its whole huge pages would fault 4 KiB at a time, so they are
		// mapped now.
		head := int(-uintptr(unsafe.Pointer(&b[0])) & (hugePage - 1))
		populate(b[:head])
		populate(b[head+(len(b)-head)/hugePage*hugePage:])
	} else {
		populate(b)
	}
	b = nil
	runtime.GC()
}

// populate maps b's pages now, in one call where the kernel can
// (MADV_POPULATE_WRITE, Linux 5.14), else one write a page.
func populate(b []byte) {
	if len(b) == 0 || unix.Madvise(b, unix.MADV_POPULATE_WRITE) == nil {
		return
	}
	for i := 0; i < len(b); i += 4096 {
		b[i] = 0
	}
}

// hugePagesGranted reports whether the kernel backs memory advised
// MADV_HUGEPAGE with transparent huge pages: its setting is "always" or
// "madvise", not "never" or absent.
func hugePagesGranted() bool {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	return err == nil && !bytes.Contains(b, []byte("[never]"))
}
