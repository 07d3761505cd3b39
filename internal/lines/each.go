package lines

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
)

// MaxLogLine bounds one line of a sensor log or a behaviour trace; longer
// lines are skipped (and counted as malformed) without being held in
// memory.
const MaxLogLine = 1 << 20

// Each calls fn for every non-blank line of a log, its end of line trimmed,
// counting lines in st; an error from fn marks that line bad and reading
// goes on, as does a line over MaxLogLine (ErrTooLong). The returned error
// is for the stream itself.
func Each(ctx context.Context, br *bufio.Reader, st *Stats, fn func(line []byte, n int64) error) error {
	lr := NewReader(br, MaxLogLine)
	for {
		line, err := lr.Next()
		n := lr.Line()
		if err == io.EOF {
			return nil
		}
		if errors.Is(err, ErrTooLong) {
			st.Lines++
			st.AddBad(n, ErrTooLong)
			continue
		}
		if err != nil {
			return err
		}
		if n&0xfff == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		line = Trim(line)
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		st.Lines++
		if err := fn(line, n); err != nil {
			st.AddBad(n, err)
		}
	}
}
