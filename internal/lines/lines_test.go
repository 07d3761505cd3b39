package lines

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

type got struct {
	line       string
	n, off     int64
	tooLong    bool
	incomplete bool
}

func readAll(t *testing.T, r *Reader) []got {
	t.Helper()
	var out []got
	for {
		line, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil && !errors.Is(err, ErrTooLong) {
			t.Fatal(err)
		}
		out = append(out, got{string(line), r.Line(), r.Offset(), errors.Is(err, ErrTooLong), err == nil && !Complete(line)})
	}
}

// Lines come with their newline, numbers and offsets, across buffer
// boundaries; a line over the bound is refused without its bytes, counted,
// and reading goes on after it; the last line may lack its newline.
func TestLines(t *testing.T) {
	in := "one\n\n" + strings.Repeat("x", 40) + "\r\n" + strings.Repeat("y", 40) + "\n" + strings.Repeat("z", 41) + "\nlast"
	for _, size := range []int{16, 64 << 10} {
		r := NewReader(bufio.NewReaderSize(strings.NewReader(in), size), 40)
		want := []got{
			{"one\n", 1, 0, false, false},
			{"\n", 2, 4, false, false},
			{"", 3, 5, true, false}, // 40 x and a carriage return: 41 bytes
			{strings.Repeat("y", 40) + "\n", 4, 47, false, false},
			{"", 5, 88, true, false},
			{"last", 6, 130, false, true},
		}
		gotLines := readAll(t, r)
		if len(gotLines) != len(want) {
			t.Fatalf("buffer %d: %+v", size, gotLines)
		}
		for i := range want {
			if gotLines[i] != want[i] {
				t.Errorf("buffer %d, line %d: %+v, want %+v", size, i+1, gotLines[i], want[i])
			}
		}
	}
	if got := string(Trim([]byte("a\r\r\n"))); got != "a" {
		t.Errorf("Trim: %q", got)
	}
}

// A line of 10 MiB read with a bound of 1 KiB leaves the reader's buffers
// within the bound and its buffer: an endless line cannot exhaust memory.
func TestLongLineNotHeld(t *testing.T) {
	in := strings.Repeat("z", 10<<20) + "\nafter\n" + strings.Repeat("z", 10<<20)
	r := NewReader(strings.NewReader(in), 1<<10)
	lines := readAll(t, r)
	if len(lines) != 3 || !lines[0].tooLong || lines[1].line != "after\n" || lines[1].off != 10<<20+1 || !lines[2].tooLong {
		t.Fatalf("%+v", lines)
	}
	if c := cap(r.buf); c > 1<<10+64<<10 {
		t.Fatalf("buffer grew to %d bytes", c)
	}
}

// Without a bound a long line is read whole.
func TestUnbounded(t *testing.T) {
	in := strings.Repeat("w", 200<<10) + "\nend\n"
	r := NewReader(strings.NewReader(in), 0)
	lines := readAll(t, r)
	if len(lines) != 2 || len(lines[0].line) != 200<<10+1 || lines[1].off != 200<<10+1 {
		t.Fatalf("%d lines", len(lines))
	}
	r.Reset(strings.NewReader("again\n"))
	if lines := readAll(t, r); len(lines) != 1 || lines[0] != (got{"again\n", 1, 0, false, false}) {
		t.Fatalf("after Reset: %+v", lines)
	}
}
