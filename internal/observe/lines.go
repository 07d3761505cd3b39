package observe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
)

// MaxLogLine bounds one line of a sensor log; longer lines are skipped
// (and counted as malformed) without being held in memory.
const MaxLogLine = 1 << 20

// ErrLongLine reports a line over MaxLogLine.
var ErrLongLine = fmt.Errorf("line longer than %d bytes", MaxLogLine)

// LineReader reads lines of bounded length.
type LineReader struct {
	br   *bufio.Reader
	buf  []byte
	line int64
}

// NewLineReader reads lines from br.
func NewLineReader(br *bufio.Reader) *LineReader { return &LineReader{br: br} }

// Next returns the next line without its end of line, its 1-based number,
// and ErrLongLine for a line that was too long (already skipped), or io.EOF.
// The line is valid until the next call.
func (r *LineReader) Next() ([]byte, int64, error) {
	r.buf = r.buf[:0]
	long := false
	for {
		chunk, err := r.br.ReadSlice('\n')
		if !long {
			if len(r.buf)+len(chunk) > MaxLogLine {
				long = true
				r.buf = r.buf[:0]
			} else {
				r.buf = append(r.buf, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == io.EOF && len(r.buf) == 0 && !long {
			if len(chunk) == 0 {
				return nil, r.line, io.EOF
			}
		}
		if err != nil && err != io.EOF {
			return nil, r.line, err
		}
		r.line++
		if long {
			return nil, r.line, ErrLongLine
		}
		return bytes.TrimRight(r.buf, "\r\n"), r.line, nil
	}
}

// EachLine calls fn for every non-blank line of a log, counting lines in st;
// an error from fn marks that line bad and reading goes on, as does an
// over-long line. The returned error is for the stream itself.
func EachLine(ctx context.Context, br *bufio.Reader, st *LineStats, fn func(line []byte, n int64) error) error {
	lr := NewLineReader(br)
	for {
		line, n, err := lr.Next()
		if err == io.EOF {
			return nil
		}
		if errors.Is(err, ErrLongLine) {
			st.Lines++
			st.AddBad(n, err)
			continue
		}
		if err != nil {
			return err
		}
		if n&0xfff == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		st.Lines++
		if err := fn(line, n); err != nil {
			st.AddBad(n, err)
		}
	}
}
