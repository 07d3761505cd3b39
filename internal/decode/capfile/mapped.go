package capfile

import (
	"fmt"
	"os"
	"runtime/debug"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Mapped is a capture file mapped in memory, read where its packets lie
// rather than copied into a buffer first: on a 1 GiB capture the copy was a
// tenth of tb-parse's time (docs/performance.md).
type Mapped struct{ b []byte }

// Map maps f, a regular file of size bytes, when it starts as a pcap or
// pcapng file does; nil when it does not (a compressed capture, a log, an
// empty file), when its start cannot be read, or when the file system
// cannot map it: the caller reads it through NewReader, which says what is
// wrong with it, if anything.
func Map(f *os.File, size int64) *Mapped {
	if size < 4 || int64(int(size)) != size {
		return nil
	}
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil || !IsCapture(magic[:]) {
		return nil
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil
	}
	unix.Madvise(b, unix.MADV_SEQUENTIAL) // advice: read-ahead, pages dropped behind
	return &Mapped{b: b}
}

// Reader reads the mapped capture. What it has read is released from the
// process's resident memory as it goes on, a window at a time.
func (m *Mapped) Reader() (*Reader, error) {
	return newReader(&bytesSource{b: m.b, release: true})
}

// Close unmaps the file: nothing read from it may be used after.
func (m *Mapped) Close() error {
	if m.b == nil {
		return nil
	}
	err := unix.Munmap(m.b)
	m.b = nil
	return err
}

// Guard runs fn, which reads m's packets on the calling goroutine, with
// that goroutine's memory faults turned into panics, and returns a fault
// at one of m's addresses as an error (the caller names the file): a
// mapped file cut short while it is
// read faults (SIGBUS) past its new end, where a read would have returned
// fewer bytes, and would otherwise end the process. Any other panic goes
// on up.
func (m *Mapped) Guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok {
			start := uintptr(unsafe.Pointer(unsafe.SliceData(m.b)))
			if a := f.Addr(); a >= start && a < start+uintptr(len(m.b)) {
				err = fmt.Errorf("the file changed while it was read (cut to less than its %d bytes?): %v", len(m.b), r)
				return
			}
		}
		panic(r)
	}()
	return fn()
}
