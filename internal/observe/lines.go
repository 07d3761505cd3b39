package observe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/talkbox-sandbox/talkbox/internal/lines"
)

// MaxLogLine bounds one line of a sensor log; longer lines are skipped
// (and counted as malformed) without being held in memory.
const MaxLogLine = 1 << 20

// ErrLongLine reports a line over MaxLogLine.
var ErrLongLine = fmt.Errorf("line longer than %d bytes", MaxLogLine)

// EachLine calls fn for every non-blank line of a log, counting lines in st;
// an error from fn marks that line bad and reading goes on, as does an
// over-long line. The returned error is for the stream itself.
func EachLine(ctx context.Context, br *bufio.Reader, st *LineStats, fn func(line []byte, n int64) error) error {
	lr := lines.NewReader(br, MaxLogLine)
	for {
		line, err := lr.Next()
		n := lr.Line()
		if err == io.EOF {
			return nil
		}
		if errors.Is(err, lines.ErrTooLong) {
			st.Lines++
			st.AddBad(n, ErrLongLine)
			continue
		}
		if err != nil {
			return err
		}
		if n&0xfff == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		line = lines.Trim(line)
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		st.Lines++
		if err := fn(line, n); err != nil {
			st.AddBad(n, err)
		}
	}
}
