package lines

import (
	"bufio"
	"context"
	"errors"
	"strings"
	"testing"
)

// A line over MaxLogLine never reaches the log's parser: it is counted bad
// and reading goes on with the next line, numbered as in the file.
func TestEachSkipsLongLines(t *testing.T) {
	in := "first\r\n\n" + strings.Repeat("x", MaxLogLine+10) + "\nlast"
	var got []string
	var nums []int64
	var st Stats
	err := Each(context.Background(), bufio.NewReader(strings.NewReader(in)), &st, func(line []byte, n int64) error {
		got, nums = append(got, string(line)), append(nums, n)
		return nil
	})
	if err != nil || len(got) != 2 || got[0] != "first" || got[1] != "last" || nums[1] != 4 {
		t.Fatalf("%d lines, numbered %v, %v", len(got), nums, err)
	}
	if st.Lines != 3 || st.Bad != 1 || !errors.Is(st.FirstBad, ErrTooLong) || !strings.HasPrefix(st.FirstBad.Error(), "line 3:") {
		t.Fatalf("%+v", st)
	}
}
