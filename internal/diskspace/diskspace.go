// Package diskspace is the health monitor's free-space check: it tells a
// writer (the capture daemon, tb-parse) to stop cleanly while the file
// system still has room to close, register and record what it was doing,
// instead of running into ENOSPC half-way through a file.
//
// The API is small:
//
//	f, err := diskspace.Check(path)            // statfs(2): Free{Avail, Total}
//	min := diskspace.DefaultThreshold()        // 1 GiB and 2 %, the larger wins
//	g := &diskspace.Guard{Path: st.Root(), Min: min}
//	if _, err := g.Check(reserve); err != nil { … }  // before a unit of work
//	if err := g.Wrote(n, reserve); err != nil { … }  // after each write: cheap
//	errors.Is(err, diskspace.ErrLow)           // low, not broken: exit 75
//	var le *diskspace.LowError; errors.As(err, &le)  // the figures
//
// "Low" means that once the writer has written reserve more bytes (what it
// still has to put on disk to finish cleanly: the copy of the open file into
// the blob store, say), fewer than the threshold's bytes would be left to
// unprivileged writers (statfs f_bavail). A Guard re-reads the figures only
// when the bytes written since its last reading could have used half of the
// margin it saw then, so calling Wrote per packet costs an addition; writers
// also call Check on a timer and between units of work, because other
// processes write to the same file system.
package diskspace

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Free is one reading of a file system's space, in bytes.
type Free struct {
	Path string `json:"path"`
	// Avail is what unprivileged writers may still use (f_bavail); root
	// may use the reserved blocks beyond it, but the monitor stops before.
	Avail int64 `json:"avail"`
	Total int64 `json:"total"`
}

// Percent is Avail as a percentage of Total.
func (f Free) Percent() float64 {
	if f.Total <= 0 {
		return 0
	}
	return float64(f.Avail) * 100 / float64(f.Total)
}

// Check reads the space of the file system holding path.
func Check(path string) (Free, error) {
	var s unix.Statfs_t
	for {
		err := unix.Statfs(path, &s)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return Free{Path: path}, fmt.Errorf("free space of %s: %w", path, err)
		}
		break
	}
	bs := cmp.Or(int64(s.Frsize), int64(s.Bsize))
	return Free{Path: path, Avail: int64(s.Bavail) * bs, Total: int64(s.Blocks) * bs}, nil
}

// Threshold is how much must stay free: the file system is low when fewer
// than Bytes, or fewer than Percent of its size, would be left. Zero
// disables either bound.
type Threshold struct {
	Bytes   int64   `json:"bytes,omitempty"`
	Percent float64 `json:"percent,omitempty"`
}

// Defaults: 1 GiB leaves room to register a file of the default rotation
// sizes and the records of a cycle; 2 % keeps large disks from being run
// down to their last gigabyte, where ext4 and xfs slow down.
const (
	DefaultBytes   = 1 << 30
	DefaultPercent = 2
)

// DefaultThreshold is 1 GiB and 2 %.
func DefaultThreshold() Threshold { return Threshold{Bytes: DefaultBytes, Percent: DefaultPercent} }

// Floor is the bytes that must stay free on a file system of total bytes.
func (t Threshold) Floor(total int64) int64 {
	p := int64(math.Ceil(t.Percent * float64(total) / 100))
	return max(t.Bytes, p, 0)
}

// Zero reports whether the threshold checks nothing.
func (t Threshold) Zero() bool { return t.Bytes <= 0 && t.Percent <= 0 }

func (t Threshold) String() string {
	switch {
	case t.Zero():
		return "none"
	case t.Percent <= 0:
		return Size(t.Bytes).String()
	case t.Bytes <= 0:
		return strconv.FormatFloat(t.Percent, 'g', -1, 64) + "%"
	}
	return Size(t.Bytes).String() + " or " + strconv.FormatFloat(t.Percent, 'g', -1, 64) + "%, the larger"
}

// ErrLow matches (errors.Is) every *LowError.
var ErrLow = errors.New("low on disk space")

// LowError is a file system below its threshold, with the figures.
type LowError struct {
	Free Free
	Min  Threshold
	// Reserve is what the writer still had to write when it checked.
	Reserve int64
}

func (e *LowError) Error() string {
	s := fmt.Sprintf("%s: %s free (%.1f%%), below the %s that must stay free", e.Free.Path, Size(e.Free.Avail),
		e.Free.Percent(), Size(e.Min.Floor(e.Free.Total)))
	if e.Reserve > 0 {
		s += fmt.Sprintf(" once the %s still to write is written", Size(e.Reserve))
	}
	return s
}

// Is makes errors.Is(err, ErrLow) true.
func (e *LowError) Is(target error) bool { return target == ErrLow }

// Low returns a *LowError when f, after reserve more bytes, is below t.
func (t Threshold) Low(f Free, reserve int64) error {
	if t.Zero() || f.Avail-max(reserve, 0) >= t.Floor(f.Total) {
		return nil
	}
	return &LowError{Free: f, Min: t, Reserve: max(reserve, 0)}
}

// Guard watches one file system for one writer. It is not safe for
// concurrent use; the zero Min never reports low.
type Guard struct {
	Path string
	Min  Threshold

	last    Free
	read    bool
	budget  int64 // bytes the writer may write before the next reading
	written int64 // since the last reading
	reserve int64 // the reserve at the last reading
}

// Check reads the file system now and returns *LowError when it is low
// once reserve more bytes are written.
func (g *Guard) Check(reserve int64) (Free, error) {
	f, err := Check(g.Path)
	if err != nil {
		return f, err
	}
	g.last, g.read, g.written, g.reserve = f, true, 0, max(reserve, 0)
	if err := g.Min.Low(f, reserve); err != nil {
		g.budget = 0
		return f, err
	}
	g.budget = (f.Avail - g.reserve - g.Min.Floor(f.Total)) / 2
	return f, nil
}

// Wrote accounts n bytes just written, with the writer's reserve now, and
// reads the file system again only when they may have used half the margin
// seen at the last reading (or there has been none).
func (g *Guard) Wrote(n, reserve int64) error {
	if g.Min.Zero() {
		return nil
	}
	g.written += n
	if g.read && g.written+max(reserve-g.reserve, 0) < g.budget {
		return nil
	}
	_, err := g.Check(reserve)
	return err
}

// Last is the reading the guard made last (zero before the first).
func (g *Guard) Last() Free { return g.last }

// WriteMetrics writes Prometheus textfile metrics for one reading against
// its threshold: talkbox_state_free_bytes, talkbox_state_size_bytes,
// talkbox_state_min_free_bytes and talkbox_state_low_space (1 when low).
func WriteMetrics(w io.Writer, f Free, min Threshold) error {
	low := 0
	if min.Low(f, 0) != nil {
		low = 1
	}
	_, err := fmt.Fprintf(w, `# HELP talkbox_state_free_bytes Bytes unprivileged writers may still use on the state directory's file system.
# TYPE talkbox_state_free_bytes gauge
talkbox_state_free_bytes{path=%[1]q} %[2]d
# HELP talkbox_state_size_bytes Size of the state directory's file system.
# TYPE talkbox_state_size_bytes gauge
talkbox_state_size_bytes{path=%[1]q} %[3]d
# HELP talkbox_state_min_free_bytes Bytes that must stay free: below it capture and parsing stop.
# TYPE talkbox_state_min_free_bytes gauge
talkbox_state_min_free_bytes{path=%[1]q} %[4]d
# HELP talkbox_state_low_space 1 when the state's file system is below its threshold (capture and parsing stop), 0 otherwise.
# TYPE talkbox_state_low_space gauge
talkbox_state_low_space{path=%[1]q} %[5]d
`, f.Path, f.Avail, f.Total, min.Floor(f.Total), low)
	return err
}

// Size is a byte count given as 123, 10K, 512M, 1.5G, 2T (powers of 1024;
// KiB, MiB, GiB, TiB too) or 10KB, 512MB, 1GB, 2TB (powers of 1000). It
// is a flag type (encoding.TextUnmarshaler).
type Size int64

// ParseSize parses a Size.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || num == "" {
		return 0, fmt.Errorf("size %q: want a number of bytes, e.g. 500M, 10G, 2TB", s)
	}
	mult := map[string]float64{"": 1, "b": 1,
		"k": 1 << 10, "kib": 1 << 10, "kb": 1e3,
		"m": 1 << 20, "mib": 1 << 20, "mb": 1e6,
		"g": 1 << 30, "gib": 1 << 30, "gb": 1e9,
		"t": 1 << 40, "tib": 1 << 40, "tb": 1e12}[strings.ToLower(unit)]
	if mult == 0 {
		return 0, fmt.Errorf("size %q: unknown unit %q (K, M, G, T, KB, MB, GB, TB)", s, unit)
	}
	b := v * mult
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return Size(b), nil
}

// UnmarshalText parses a flag's value.
func (z *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return err
	}
	*z = v
	return nil
}

// String is the size in the largest binary unit that keeps one decimal.
func (z Size) String() string {
	v := float64(z)
	for _, u := range []string{"B", "KiB", "MiB", "GiB", "TiB"} {
		if math.Abs(v) < 1024 || u == "TiB" {
			if u == "B" {
				return strconv.FormatInt(int64(z), 10) + " B"
			}
			return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) + " " + u
		}
		v /= 1024
	}
	return ""
}
