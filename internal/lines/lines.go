// Package lines reads text one line at a time with a bound on a line's
// length, so that what a guest or a log writer puts in a line decides how
// long the line is but not how much memory its reader holds. The flow log,
// the sensor logs, the trace reader and the state's journal compaction read
// through it; each decides what a line over the bound means to it. Each is
// the sensor logs' loop: every line to a parser, bad ones counted in Stats.
package lines

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// ErrTooLong is returned for a line longer than the reader's bound. The
// line counts (Line numbers it) and the next call goes on after it.
var ErrTooLong = errors.New("line too long")

// Reader reads lines of a bounded length, their newline not counted.
type Reader struct {
	br  *bufio.Reader
	max int
	buf []byte
	// line is the number of the line Next last returned; start its
	// offset and off the number of bytes consumed.
	line, start, off int64
	// skipping: the rest of a line over the bound is still to be read past.
	skipping bool
}

// NewReader reads lines of at most max bytes from r (a max of 0 sets no
// bound: for input the host alone wrote). A *bufio.Reader is read as it is,
// so what a caller has peeked at is read again.
func NewReader(r io.Reader, max int) *Reader {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 64<<10)
	}
	return &Reader{br: br, max: max}
}

// Reset reads from r as from the start, keeping the buffers.
func (r *Reader) Reset(src io.Reader) {
	r.br.Reset(src)
	r.buf = r.buf[:0]
	r.line, r.start, r.off, r.skipping = 0, 0, 0, false
}

// Line is the 1-based number of the line Next last returned (or refused
// with ErrTooLong).
func (r *Reader) Line() int64 { return r.line }

// Offset is where that line starts in the input.
func (r *Reader) Offset() int64 { return r.start }

// Next returns the next line with its newline (the last line of the input
// may have none), valid until the next call; ErrTooLong for a line over the
// bound, whose bytes are not kept; io.EOF at the end.
func (r *Reader) Next() ([]byte, error) {
	if r.skipping {
		if err := r.skipRest(); err != nil {
			return nil, err
		}
	}
	r.start = r.off
	r.buf = r.buf[:0]
	for {
		chunk, err := r.br.ReadSlice('\n')
		r.off += int64(len(chunk))
		full := errors.Is(err, bufio.ErrBufferFull)
		if err != nil && !full && err != io.EOF {
			return nil, err
		}
		if n := len(r.buf) + len(chunk); r.max > 0 && n-btoi(err == nil) > r.max {
			r.line++
			r.skipping = full
			return nil, ErrTooLong
		}
		switch {
		case full:
			r.buf = append(r.buf, chunk...)
			continue
		case len(r.buf) == 0 && len(chunk) == 0: // io.EOF after the last line
			return nil, io.EOF
		}
		r.line++
		if len(r.buf) == 0 {
			return chunk, nil // the whole line in the buffer: no copy
		}
		r.buf = append(r.buf, chunk...)
		return r.buf, nil
	}
}

// skipRest reads past the rest of a line over the bound.
func (r *Reader) skipRest() error {
	for {
		chunk, err := r.br.ReadSlice('\n')
		r.off += int64(len(chunk))
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == nil || err == io.EOF:
			r.skipping = false
			return nil
		default:
			return err
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Trim is a line without its end of line ("\n" or "\r\n", and any
// carriage returns before it).
func Trim(line []byte) []byte { return bytes.TrimRight(line, "\r\n") }

// Complete reports whether a line Next returned ended with its newline
// (the last line of a file cut short does not).
func Complete(line []byte) bool { return len(line) > 0 && line[len(line)-1] == '\n' }
