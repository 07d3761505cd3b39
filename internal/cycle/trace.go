package cycle

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/talkbox-sandbox/talkbox/internal/behave"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// A traced sample's trace is written where the sample is told nothing of:
// a directory named by a keyed hash of the cycle's guest files, which no
// command line, environment or file the sample can read names (the
// tracer's own command line does, to a sample that reads it). Beside it
// the launcher writes the tracer's PID (TRACE.pid) and, once the tracer
// has exited, its end record (TRACE.end): the exit status and the
// SHA-256 of the cycle's end key and that status. The end key reaches the
// launcher on its standard input, so a sample can forge the record only
// by reading the launcher's memory.

// traceKey is the host's secret behind every cycle's trace directory and
// end key; it never leaves the host's state directory.
func (r *Runner) traceKey() ([]byte, error) {
	p := r.St.Path("tb-run", "trace.key")
	key, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, 32)
		rand.Read(key)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return nil, err
		}
		// Written aside and linked into place: two runners starting at
		// once agree on one key, and none reads a half-written one.
		tmp := p + "." + hex.EncodeToString(key[:8])
		if err := os.WriteFile(tmp, key, 0o600); err != nil {
			return nil, err
		}
		err = os.Link(tmp, p)
		os.Remove(tmp)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		key, err = os.ReadFile(p)
	}
	if err != nil {
		return nil, err
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("%s: not a 32-byte key", p)
	}
	return key, nil
}

func (r *Runner) keyed(c *records.Cycle, use string) (string, error) {
	key, err := r.traceKey()
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(use + "\x00" + c.GuestOut))
	return hex.EncodeToString(m.Sum(nil)), nil
}

// tracePath is where the cycle's trace is written in the guest.
func (r *Runner) tracePath(c *records.Cycle) (string, error) {
	dir, err := r.keyed(c, "dir")
	if err != nil {
		return "", err
	}
	return "/var/lib/" + dir[:24] + "/t", nil
}

// endKey is what the launcher reads on its standard input.
func (r *Runner) endKey(c *records.Cycle) (string, error) { return r.keyed(c, "end") }

// endDigest is the end record's digest of an exit status.
func endDigest(key, status string) string {
	sum := sha256.Sum256([]byte(key + " " + status))
	return hex.EncodeToString(sum[:])
}

// untraced is the whole trace (one line) the launcher writes when the
// guest has no strace.
const untraced = "# tb-run: strace not found in the guest; the sample runs untraced"

// checkTrace looks for signs that the sample tampered with its trace: the
// end record missing or not the launcher's, and what behave.Tracer finds
// in the trace. What it finds is one evasion observable of the cycle,
// "trace tampered".
func (r *Runner) checkTrace(ctx context.Context, c *records.Cycle, g Guest, ex *records.ExecutionSnapshot, trace *stream) error {
	path, err := r.tracePath(c)
	if err != nil {
		return err
	}
	tr := &behave.Tracer{PIDs: []int{c.GuestPID}, Dir: filepath.Dir(path), Continued: c.TraceFrom > 0}
	if b, err := g.ReadFileAt(ctx, path+".pid", 0, 32); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 && pid != c.GuestPID {
			tr.PIDs = append(tr.PIDs, pid)
		}
	}
	if !ex.Running {
		key, err := r.endKey(c)
		if err != nil {
			return err
		}
		b, rerr := g.ReadFileAt(ctx, path+".end", 0, 256)
		status, digest, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
		switch {
		case rerr != nil || len(b) == 0:
			tr.Findings = append(tr.Findings, "the launcher wrote no end record (killed, or the record removed)")
		case !hmac.Equal([]byte(digest), []byte(endDigest(key, status))):
			tr.Findings = append(tr.Findings, fmt.Sprintf("the end record is not the launcher's: %.80q", b))
		default:
			tr.Ended = true
		}
	}
	sink := &tamperSink{}
	origin := observe.Origin{Cycle: c.ID, Source: "tb-run"}
	emulator, err := r.emulator(c)
	if err != nil {
		return err
	}
	opts := behave.Options{Format: behave.FormatStrace, Exe: c.GuestPath, Cwd: c.Workdir, Emulator: emulator, Tracer: tr}
	if c.LaunchedAt != nil {
		opts.Start = *c.LaunchedAt
	}
	var in io.Reader = strings.NewReader("") // no trace: the findings alone
	if trace.sha != "" {
		f, err := r.St.OpenBlob(trace.sha)
		if err != nil {
			return err
		}
		defer f.Close()
		dec, err := zstd.NewReader(f)
		if err != nil {
			return err
		}
		defer dec.Close()
		br := bufio.NewReaderSize(dec, 64<<10)
		in = br
		if head, _ := br.Peek(len(untraced) + 2); string(head) == untraced+"\n" {
			// Nothing was traced: no processes to have ended, no lines
			// to read.
			tr.Ended, in = false, strings.NewReader("")
		}
	}
	if _, err := behave.Parse(ctx, in, origin, sink, opts); err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	if sink.o == nil {
		return nil
	}
	o := sink.o
	o.Lease, o.Cycle = c.Lease, c.ID
	r.Log.Warn("the trace was tampered with", "cycle", c.ID, "seen", o.Evasion.Paths)
	records.Init(o, records.KindObservable, r.St.Now())
	return r.St.Create(ctx, o)
}

// emulator is the user-mode emulator the cycle's sample runs under (its
// plan's), "" for a native sample.
func (r *Runner) emulator(c *records.Cycle) (string, error) {
	var p records.Plan
	if err := r.St.Get(c.Plan, &p); err != nil {
		return "", err
	}
	if p.Emulation == nil {
		return "", nil
	}
	return p.Emulation.Emulator, nil
}

// tamperSink keeps the "trace tampered" observable of a parse.
type tamperSink struct{ o *records.Observable }

func (s *tamperSink) Add(o *records.Observable) {
	if o.Evasion != nil && o.Evasion.Technique == behave.TechTraceTampered {
		s.o = o
	}
}
