// Package triage identifies sample files from their headers: executable
// format, architecture, ABI and OS (ELF, PE, Mach-O), scripts and common
// archives. It reads only the few header regions it needs and never trusts
// a count or offset from the file without bounding it by the file size.
package triage

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// headSize is read up front: it holds every magic number we test, ELF program
// headers and notes of ordinary binaries, the PE section table, and the
// region UPX writes its "UPX!" marker into.
const headSize = 4096

// Inspect triages a file from its content. r gives random access (section
// headers live at the end of ELF files); size is the file size.
func Inspect(r io.ReaderAt, size int64) (t records.Triage) {
	defer func() {
		// Belt and braces: a parser bug must not take the caller down. The
		// fuzz test asserts this never fires.
		if v := recover(); v != nil {
			t = records.Triage{Format: "unknown", Problem: fmt.Sprintf("internal error: %v", v)}
		}
	}()
	if size <= 0 || r == nil {
		return records.Triage{Format: "unknown", Problem: "empty file"}
	}
	s := newSrc(r, size)
	if len(s.head) == 0 {
		t = records.Triage{Format: "unknown", Problem: "empty file"}
		if s.err != nil {
			t.Problem = "read error: " + s.err.Error()
		}
		return t
	}
	t = inspect(s)
	if s.err != nil {
		addProblem(&t, "read error: "+s.err.Error())
	}
	return t
}

func inspect(s *src) records.Triage {
	h := s.head
	switch {
	case bytes.HasPrefix(h, []byte("\x7fELF")):
		return inspectELF(s)
	case bytes.HasPrefix(h, []byte("MZ")):
		return inspectPE(s)
	case isMachO(h):
		return inspectMachO(s)
	case bytes.HasPrefix(h, []byte{0xca, 0xfe, 0xba, 0xbe}), bytes.HasPrefix(h, []byte{0xca, 0xfe, 0xba, 0xbf}):
		return inspectCafebabe(s)
	case bytes.HasPrefix(h, []byte("#!")):
		return inspectScript(h)
	case bytes.HasPrefix(h, []byte("PK\x03\x04")), bytes.HasPrefix(h, []byte("PK\x05\x06")),
		bytes.HasPrefix(h, []byte("PK\x07\x08PK\x03\x04")):
		return inspectZip(s)
	case bytes.HasPrefix(h, []byte{0x1f, 0x8b, 8}): // deflate is the only method defined
		return inspectGzip(s)
	}
	if t, ok := inspectTar(h); ok {
		return t
	}
	return records.Triage{Format: "unknown"}
}

// src is random access to the sample with the first headSize bytes cached,
// so most header reads cost nothing.
type src struct {
	r    io.ReaderAt
	size int64
	head []byte
	err  error // first read error other than EOF
}

func newSrc(r io.ReaderAt, size int64) *src {
	s := &src{r: r, size: size}
	n := min(int64(headSize), size)
	buf := make([]byte, n)
	m, err := r.ReadAt(buf, 0)
	s.noteErr(err)
	s.head = buf[:m]
	if int64(m) < n {
		// The reader holds less than size claims; believe the reader.
		s.size = int64(m)
	}
	return s
}

func (s *src) noteErr(err error) {
	if err != nil && !errors.Is(err, io.EOF) && s.err == nil {
		s.err = err
	}
}

// at returns up to n bytes at off; fewer when the file ends first. Callers
// bound n: at never allocates more than the file holds.
func (s *src) at(off int64, n int64) []byte { return s.atInto(nil, off, n) }

// atInto is at, reading into buf when it is large enough.
func (s *src) atInto(buf []byte, off int64, n int64) []byte {
	if off < 0 || n <= 0 || off >= s.size {
		return nil
	}
	if n > s.size-off {
		n = s.size - off
	}
	if off+n <= int64(len(s.head)) {
		return s.head[off : off+n]
	}
	if int64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	b := buf[:n]
	m, err := s.r.ReadAt(b, off)
	s.noteErr(err)
	return b[:m]
}

// detail sets a Details entry, allocating the map on first use.
func detail(t *records.Triage, k string, v any) {
	if t.Details == nil {
		t.Details = make(map[string]any, 4)
	}
	t.Details[k] = v
}

// addProblem appends to Problem; the first problems found are the useful
// ones, so later ones are dropped once the text is long.
func addProblem(t *records.Triage, p string) {
	switch {
	case t.Problem == "":
		t.Problem = p
	case len(t.Problem) < 200 && !strings.Contains(t.Problem, p):
		t.Problem += "; " + p
	}
}

func hasUPXMagic(head []byte) bool { return bytes.Contains(head, []byte("UPX!")) }
