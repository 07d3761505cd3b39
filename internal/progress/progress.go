// Package progress shows how far long work has got (phase, amount done,
// rate, time left) on a terminal, and nothing anywhere else: a tool whose
// stderr is a file or a pipe logs its steps and prints no bars, so logs
// and cron mail stay readable.
package progress

import (
	"bytes"
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tidwall/gjson"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/sys/unix"
)

// Unit is what a bar counts.
type Unit int

const (
	// Items are things (files, elements, steps), shown as numbers.
	Items Unit = iota
	// Bytes are shown in KiB, MiB, GiB.
	Bytes
)

// Meter draws the bars of one command. A nil Meter draws nothing: its
// methods are safe to call, so domain code need not ask whether there is
// a terminal.
type Meter struct {
	p *mpb.Progress

	mu     sync.Mutex
	status *Status // the status line the log's messages update, if any
}

// ForTerminal returns a Meter drawing on f when f is a terminal, nil
// otherwise.
func ForTerminal(ctx context.Context, f *os.File) *Meter {
	if f == nil || !IsTerminal(f) {
		return nil
	}
	return New(ctx, f)
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// New returns a Meter drawing on w whatever w is (tests draw into a
// pseudo-terminal or a buffer).
func New(ctx context.Context, w io.Writer) *Meter {
	return &Meter{p: mpb.NewWithContext(ctx, mpb.WithOutput(w), mpb.WithWidth(40), mpb.WithAutoRefresh())}
}

// Bar is one phase of the work. A nil Bar does nothing.
type Bar struct {
	b *mpb.Bar
}

// Bar starts a bar for a phase of total units (0 when unknown yet:
// SetTotal later).
func (m *Meter) Bar(phase string, total int64, unit Unit) *Bar {
	if m == nil {
		return nil
	}
	counters := decor.CountersNoUnit("%d / %d", decor.WCSyncWidth)
	speed := decor.AverageSpeed(nil, "%.0f/s")
	if unit == Bytes {
		counters = decor.CountersKibiByte("% .1f / % .1f", decor.WCSyncWidth)
		speed = decor.AverageSpeed(decor.SizeB1024(0), "% .1f")
	}
	b := m.p.AddBar(total,
		mpb.PrependDecorators(decor.Name(phase, decor.WCSyncSpaceR), counters),
		mpb.AppendDecorators(decor.Percentage(decor.WCSyncSpace), decor.Name(" "), speed,
			decor.Name(" left "), decor.AverageETA(decor.ET_STYLE_MMSS)),
	)
	return &Bar{b: b}
}

// Add counts n more units done.
func (b *Bar) Add(n int64) {
	if b != nil {
		b.b.IncrInt64(n)
	}
}

// SetCurrent sets the amount done so far.
func (b *Bar) SetCurrent(n int64) {
	if b != nil {
		b.b.SetCurrent(n)
	}
}

// SetTotal sets the amount the phase will reach.
func (b *Bar) SetTotal(total int64) {
	if b != nil {
		b.b.SetTotal(total, false)
	}
}

// Done ends the phase, complete or not.
func (b *Bar) Done() {
	if b != nil && !b.b.Completed() {
		b.b.SetTotal(-1, true)
	}
}

// Reader counts what is read through r on the bar.
func (b *Bar) Reader(r io.Reader) io.Reader {
	if b == nil {
		return r
	}
	return &countingReader{r: r, b: b}
}

type countingReader struct {
	r io.Reader
	b *Bar
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.b.b.IncrBy(n)
	return n, err
}

// Wait ends every bar still running and returns once the last frame is
// drawn.
func (m *Meter) Wait() {
	if m == nil {
		return
	}
	m.p.Wait()
}

// Status is a line for work whose amount is not known (a guest booting, an
// image building): a spinner, the work's latest phase, and the time it has
// taken so far. A nil Status does nothing.
type Status struct {
	b     *mpb.Bar
	phase atomic.Value // string
}

// Status starts the command's status line; the log's messages (LogWriter)
// become its phase.
func (m *Meter) Status(name string) *Status {
	if m == nil {
		return nil
	}
	s := &Status{}
	s.phase.Store("")
	s.b = m.p.New(0, mpb.SpinnerStyle(),
		mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR), decor.Elapsed(decor.ET_STYLE_MMSS, decor.WCSyncSpaceR)),
		mpb.AppendDecorators(decor.Any(func(decor.Statistics) string { return s.phase.Load().(string) })),
	)
	m.mu.Lock()
	m.status = s
	m.mu.Unlock()
	return s
}

// Phase sets the text after the spinner.
func (s *Status) Phase(text string) {
	if s != nil {
		s.phase.Store(text)
	}
}

// Done ends the status line.
func (s *Status) Done() {
	if s != nil && !s.b.Completed() {
		s.b.SetTotal(-1, true)
	}
}

// LogWriter is where a tool's log goes: straight to W, or, while a Meter
// draws on the same terminal, above its bars (a line written under them
// would be drawn over), each line's message also becoming the phase of
// the Meter's status line.
type LogWriter struct {
	W io.Writer

	mu sync.Mutex
	m  *Meter
}

// Route sends the log through m until m is done (nil: straight to W).
func (l *LogWriter) Route(m *Meter) {
	l.mu.Lock()
	l.m = m
	l.mu.Unlock()
}

func (l *LogWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	m := l.m
	l.mu.Unlock()
	if m != nil {
		m.mu.Lock()
		status := m.status
		m.mu.Unlock()
		status.Phase(message(b))
		if n, err := m.p.Write(b); err == nil {
			return n, nil
		}
	}
	return l.W.Write(b)
}

// message is a log line's message (text or JSON handler), with its phase
// or step attribute when it has one.
func message(line []byte) string {
	line = bytes.TrimSpace(line)
	if len(line) > 0 && line[0] == '{' {
		r := gjson.GetManyBytes(line, "msg", "phase")
		return strings.TrimSpace(r[0].String() + " " + r[1].String())
	}
	msg := textAttr(line, "msg")
	if phase := textAttr(line, "phase"); phase != "" {
		msg += " " + phase
	}
	return msg
}

// textAttr is the value of key=value in a line of slog's text handler.
func textAttr(line []byte, key string) string {
	i := bytes.Index(line, []byte(" "+key+"="))
	if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if len(v) > 0 && v[0] == '"' {
		if s, err := strconv.QuotedPrefix(string(v)); err == nil {
			u, _ := strconv.Unquote(s)
			return u
		}
	}
	if j := bytes.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return string(v)
}
