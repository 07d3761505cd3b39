// Package behave reads the behaviour trace of a cycle — strace's output for
// the sample and its descendants, or QEMU's user-mode strace log — and
// turns it into behaviour observables: processes, paths, network system
// calls, persistence and tampering, evasion, and a summary of the trace.
package behave

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/lines"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Formats read.
const (
	FormatStrace = "strace"      // strace -f -ttt [-T] [-y] -o FILE
	FormatQEMU   = "qemu-strace" // QEMU_LOG=strace (or -strace) of a user-mode emulator
)

// TraceSet is the system calls the guest traces (strace -e trace=...):
// those the observables are made of. Names prefixed with ? are skipped where
// the architecture or the strace version does not know them.
const TraceSet = "execve,?execveat,clone,?clone3,?fork,?vfork,exit,exit_group," +
	"kill,tkill,tgkill,prctl,ptrace," +
	"?open,openat,?openat2,?creat,?unlink,unlinkat,?rename,?renameat,?renameat2," +
	"?link,linkat,?symlink,symlinkat,?chmod,fchmod,fchmodat,?mkdir,mkdirat,chdir,fchdir,?readlink,readlinkat," +
	"socket,connect,bind,listen,?accept,accept4,sendto,sendmsg," +
	"?nanosleep,clock_nanosleep,?clock_nanosleep_time64," +
	"?getuid,?geteuid,?getuid32,?geteuid32,?setuid,?setuid32,?setreuid,?setreuid32,?setresuid,?setresuid32," +
	"?io_uring_setup," +
	"?settimeofday,?clock_settime,?clock_settime64,?stime,?adjtimex,?clock_adjtime,?clock_adjtime64"

// StraceOptions are strace's options for the trace, which tb-run's guest
// launcher passes with -o FILE: strace follows every descendant (-f) into one
// file (no -ff), with times since the epoch (-ttt) and each call's duration
// (-T), strings up to 256 bytes, without attach and detach notes on the
// sample's stderr (-q; exits and signals stay in the trace), and only the
// calls of TraceSet stopping the sample (--seccomp-bpf, strace 5.3 or
// later).
const StraceOptions = "-f -ttt -T -q -s 256 --seccomp-bpf -e trace=" + TraceSet

// Bounds of what one trace yields, so that a bot forking, writing or
// connecting without pause costs bounded memory and observables.
const (
	MaxProcesses  = 512  // process observables (the first to start)
	MaxPaths      = 1024 // path observables
	MaxNetDests   = 1024 // netcall destinations tracked one by one
	MaxNetGroups  = 256  // (call, port) groups counted for scans
	MaxTechniques = 256  // persistence and evasion observables
	// ProcScanMin distinct /proc/PID directories of other processes opened
	// make a /proc scan.
	ProcScanMin = 16
	maxArgv     = 32  // arguments kept per exec
	maxArgLen   = 256 // bytes kept per argument
	maxFDs      = 1 << 16
)

// Options are what the caller knows of the traced run.
type Options struct {
	// Format is FormatStrace or FormatQEMU; empty to recognise it.
	Format string
	// Window is the observation window: a single sleep requested for
	// longer is evasion. Zero: no sleep is.
	Window time.Duration
	// Start is when the trace began: the time of every line of a QEMU log,
	// which has none.
	Start time.Time
	// Exe is the path the sample was started from, when the trace does not
	// show its exec (QEMU); Cwd its working directory, for relative paths;
	// UID its user id, when known.
	Exe string
	Cwd string
	UID *int64
	// Emulator is the user-mode emulator (qemu-mips-static, or its path)
	// that binfmt_misc runs the sample under, when the trace is strace's
	// of an emulated sample: what each instance of it does before the
	// emulated program's first call is dropped (emulator.go).
	Emulator string
	// Tracer, when set, has the trace checked for tampering (tamper.go).
	Tracer *Tracer
}

// Dropped is a file the trace wrote and left: the cycle copies it out.
type Dropped struct {
	Path string
	PID  int64
	Exe  string    // the writer's executable
	At   time.Time // the last write
	Line int64
}

// Result is what a trace held besides the observables: the summary, the
// processes (the first MaxProcesses, by start), and the dropped files.
type Result struct {
	Format    string
	Stats     lines.Stats
	Trace     records.TraceInfo
	Processes []records.ProcessInfo
	Dropped   []Dropped
}

// Detect names the format of a trace from its first bytes: FormatStrace,
// FormatQEMU, or "" for neither. The first line must be a trace line;
// strace is told from QEMU by its timestamps, its error names and the ", "
// between its arguments (QEMU writes "," and "errno=N").
func Detect(head []byte) string {
	lines := bytes.Split(head, []byte("\n"))
	if len(lines) > 1 && len(head) >= 64<<10 {
		lines = lines[:len(lines)-1] // cut by the peek
	}
	format, seen := "", 0
	for _, b := range lines {
		b = bytes.TrimRight(b, "\r")
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		l := lexStrace(b)
		if l.kind == lineBad {
			if seen == 0 {
				return "" // the first line is no trace line
			}
			continue
		}
		seen++
		if l.kind == lineCall || l.kind == lineUnfinished || l.kind == lineResumed {
			switch {
			case !l.ts.IsZero(), l.kind != lineCall, bytes.Contains(b, []byte(" = -1 E")):
				return FormatStrace
			case bytes.Contains(b, []byte(" = -1 errno=")):
				return FormatQEMU
			}
			// strace separates arguments with ", ", QEMU with ",".
			if i := topComma(l.body); i >= 0 && i+1 < len(l.body) {
				if l.body[i+1] == ' ' {
					return FormatStrace
				}
				format = FormatQEMU
			}
		}
		if seen >= 64 {
			break
		}
	}
	if seen == 0 {
		return ""
	}
	return cmp.Or(format, FormatQEMU) // no times and nothing of strace's
}

// ErrNotTrace reports input in neither format.
var ErrNotTrace = errors.New("not an strace output or a QEMU strace log")

// Sink receives a trace's observables, which it owns after the call.
type Sink interface {
	Add(o *records.Observable)
}

// Parse reads a trace and passes its observables to sink, with origin's
// provenance (its Source defaults to the format). Lines that are no trace
// line are counted in the result's Stats and skipped; the error is for the
// stream itself, or ErrNotTrace. What was read before an error is emitted.
func Parse(ctx context.Context, r io.Reader, origin observe.Origin, sink Sink, opts Options) (*Result, error) {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 64<<10)
	}
	format := opts.Format
	if format == "" {
		head, err := br.Peek(64 << 10)
		if len(head) == 0 && err != nil && err != io.EOF {
			return nil, err
		}
		if format = Detect(head); format == "" {
			return nil, ErrNotTrace
		}
	}
	if format != FormatStrace && format != FormatQEMU {
		return nil, fmt.Errorf("unknown trace format %q", format)
	}
	origin.Source = cmp.Or(origin.Source, format)
	t := newTrace(format, origin, opts)
	err := t.read(ctx, br)
	t.finish(sink)
	return t.res, err
}

// read feeds every line to the trace; a line over lines.MaxLogLine is
// counted bad and skipped without being held.
func (t *trace) read(ctx context.Context, br *bufio.Reader) error {
	lr := lines.NewReader(br, lines.MaxLogLine)
	for {
		line, err := lr.Next()
		n := lr.Line()
		switch {
		case err == io.EOF:
			return nil
		case err != nil && !errors.Is(err, lines.ErrTooLong):
			return err
		}
		if n&0xfff == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		t.res.Stats.Lines++
		if err != nil {
			t.res.Stats.AddBad(n, lines.ErrTooLong)
		} else if b := lines.Trim(line); len(bytes.TrimSpace(b)) > 0 {
			t.line(b, n, lines.Complete(line))
		}
	}
}
