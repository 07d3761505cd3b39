package records

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
)

// MaxLine bounds one input line, so a stream of garbage cannot exhaust memory.
const MaxLine = 16 << 20

// LineError names the input and line of a malformed record. Its text is the
// "NAME:LINE: reason" form every tool prints.
type LineError struct {
	Name string
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("%s:%d: %v", e.Name, e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// FaultCode classes a malformed record as bad data (exit 65) wherever it is
// returned from.
func (e *LineError) FaultCode() int { return fault.ExitDataErr }

// Reader reads JSON lines, skipping blank lines, and reports errors with the
// input name and line number.
type Reader struct {
	name string
	sc   *bufio.Scanner
	line int
}

// NewReader reads JSON lines from r; name is used in errors ("stdin", a path).
func NewReader(r io.Reader, name string) *Reader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLine)
	return &Reader{name: name, sc: sc}
}

// Line is one raw line of input with its position.
type Line struct {
	Name string
	No   int
	Data []byte
}

// Err wraps err with this line's position.
func (l Line) Err(err error) error { return &LineError{Name: l.Name, Line: l.No, Err: err} }

// Next returns the next non-blank line, io.EOF at the end, or a LineError.
// The returned Data is only valid until the next call.
func (r *Reader) Next() (Line, error) {
	for r.sc.Scan() {
		r.line++
		b := bytes.TrimSpace(r.sc.Bytes())
		if len(b) == 0 {
			continue
		}
		return Line{Name: r.name, No: r.line, Data: b}, nil
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return Line{}, &LineError{Name: r.name, Line: r.line + 1, Err: fmt.Errorf("line longer than %d bytes", MaxLine)}
		}
		return Line{}, &LineError{Name: r.name, Line: r.line + 1, Err: err}
	}
	return Line{}, io.EOF
}

// Record decodes the next record.
func (r *Reader) Record() (Record, error) {
	l, err := r.Next()
	if err != nil {
		return nil, err
	}
	rec, err := Decode(l.Data)
	if err != nil {
		return nil, l.Err(err)
	}
	return rec, nil
}

// Writer writes one record per line. It is not safe for concurrent use.
type Writer struct {
	w *bufio.Writer
}

// NewWriter writes records to w; call Flush when done.
func NewWriter(w io.Writer) *Writer { return &Writer{w: bufio.NewWriter(w)} }

// Write encodes one record followed by a newline.
func (w *Writer) Write(r Record) error {
	b, err := Marshal(r)
	if err != nil {
		return err
	}
	w.w.Write(b)
	return w.w.WriteByte('\n')
}

// Flush writes buffered records out.
func (w *Writer) Flush() error { return w.w.Flush() }

// Finish flushes w and, when *err is nil, sets it to the flush's error: a
// command's "defer w.Finish(&err)" prints what it wrote before failing and
// never turns a stream cut short (a closed pipe, a full disk) into exit 0.
func (w *Writer) Finish(err *error) {
	if ferr := w.Flush(); *err == nil {
		*err = ferr
	}
}
