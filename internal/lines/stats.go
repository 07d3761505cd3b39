package lines

import "fmt"

// Stats counts the lines a log reader read and the bad ones, keeping the
// first problem for the one-line error.
type Stats struct {
	Lines    int64
	Bad      int64
	FirstBad error
}

// AddBad counts a bad line.
func (s *Stats) AddBad(line int64, err error) {
	s.Bad++
	if s.FirstBad == nil {
		s.FirstBad = fmt.Errorf("line %d: %w", line, err)
	}
}
