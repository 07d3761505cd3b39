package cycle

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/klauspost/compress/zstd"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Artifact types of what the sample leaves in the guest.
const (
	ArtifactStdout = "guest-stdout"
	ArtifactStderr = "guest-stderr"
	// ArtifactTrace is the sample's system-call trace (Cycle.Tracer),
	// zstd-compressed.
	ArtifactTrace = "behaviour-trace"
	// ArtifactMemoryDump is the guest's memory (tb-lease dump).
	ArtifactMemoryDump = "memory-dump"
)

// maxTrace bounds the trace kept per cycle, before compression.
const maxTrace = 256 << 20

// spool copies what the sample writes in the guest (its stdout and stderr,
// and its trace) out as it grows, each from where the cycle's range of it
// starts (a detached sample's files span cycles).
type spool struct {
	r       *Runner
	c       *records.Cycle
	streams []*stream
	// low is the first blob write the store refused for low space.
	low error
}

type stream struct {
	typ, path string
	from, max int64
	file      *os.File
	w         io.Writer     // file, or enc over it
	enc       *zstd.Encoder // for the trace
	n         int64         // bytes of the cycle's range: those read but the held
	read      int64         // bytes read from the guest
	held      []byte        // the trace: its last line while unfinished (see store)
	tail      []byte        // stdout and stderr: the last lines
	truncated bool          // max reached
	sha       string        // the stored blob's
}

func newSpool(r *Runner, c *records.Cycle, trace string) *spool {
	_, out, errp := guestFiles(c)
	s := &spool{r: r, c: c, streams: []*stream{
		{typ: ArtifactStdout, path: out, from: c.StdoutFrom, max: r.maxOutput()},
		{typ: ArtifactStderr, path: errp, from: c.StderrFrom, max: r.maxOutput()},
	}}
	if c.Tracer != "" {
		s.streams = append(s.streams, &stream{typ: ArtifactTrace, path: trace, from: c.TraceFrom, max: maxTrace})
	}
	return s
}

func (s *spool) close() {
	for _, st := range s.streams {
		if st.file != nil {
			st.file.Close()
			os.Remove(st.file.Name())
		}
	}
}

func (s *spool) stream(typ string) *stream {
	for _, st := range s.streams {
		if st.typ == typ {
			return st
		}
	}
	return &stream{}
}

// pull copies out what the sample's output files gained; final also
// copies the trace, which is read once, when the cycle stops watching.
func (s *spool) pull(ctx context.Context, g Guest, final bool) error {
	for _, st := range s.streams {
		if st.typ == ArtifactTrace && !final {
			continue
		}
		if err := s.pullStream(ctx, g, st); err != nil {
			return err
		}
	}
	return nil
}

func (s *spool) pullStream(ctx context.Context, g Guest, st *stream) error {
	if st.file == nil {
		dir := s.r.St.Path("tb-run", "spool")
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
		f, err := os.CreateTemp(dir, s.c.ID+"-*")
		if err != nil {
			return err
		}
		st.file, st.w = f, f
		if st.typ == ArtifactTrace {
			if st.enc, err = zstd.NewWriter(f, zstd.WithEncoderLevel(zstd.SpeedFastest)); err != nil {
				return err
			}
			st.w = st.enc
		}
	}
	for st.read < st.max {
		want := int(min(st.max-st.read, 4<<20))
		b, err := g.ReadFileAt(ctx, st.path, st.from+st.read, want)
		if err != nil {
			if st.read == 0 {
				return nil // not created yet (or the launcher failed before)
			}
			return fmt.Errorf("reading the sample's %s: %w", st.typ, err)
		}
		if len(b) == 0 {
			return nil
		}
		// Whether the file's end was reached is told by what was read,
		// before a trace's read is cut at its last newline: a whole read
		// so cut was taken for the end, and a trace past one read lost
		// the rest, its processes' exits with it.
		atEnd := len(b) < want
		st.read += int64(len(b))
		if st.typ == ArtifactTrace {
			// strace writes a call when it starts and its result when it
			// returns: a line is unfinished while a call blocks.
			b = append(st.held, b...)
			i := bytes.LastIndexByte(b, '\n') + 1
			st.held = append([]byte(nil), b[i:]...)
			b = b[:i]
		} else {
			st.tail = lastLines(append(st.tail, b...), 10, 2048)
		}
		if _, err := st.w.Write(b); err != nil {
			return err
		}
		st.n = st.read - int64(len(st.held))
		if atEnd {
			return nil // at the end of what was written so far
		}
	}
	st.truncated = true
	return nil
}

// store puts what was copied into the blob store as artifacts of the
// cycle. The trace of a sample that keeps running (detached) ends with
// its last whole line, and the next cycle's starts with the line unfinished
// now: each cycle's trace is whole lines, and together they are the one
// trace.
func (s *spool) store(ctx context.Context, ex *records.ExecutionSnapshot) ([]string, error) {
	var ids []string
	for _, st := range s.streams {
		if st.file == nil {
			continue
		}
		if len(st.held) > 0 && !ex.Running {
			if _, err := st.w.Write(st.held); err != nil {
				return nil, err
			}
			st.n, st.held = st.read, nil
		}
		if st.enc != nil {
			if err := st.enc.Close(); err != nil {
				return nil, err
			}
		}
		if _, err := st.file.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
		b, err := s.r.St.PutBlob(ctx, st.file)
		if errors.Is(err, diskspace.ErrLow) {
			// The store keeps its free space for records: what the sample
			// did is still recorded, without this output (its tail and
			// size are kept), and the cycle then fails for the low space.
			ex.NotStored = append(ex.NotStored, st.typ)
			s.low = cmp.Or(s.low, err)
			s.r.Log.Warn("not stored: the blob store is low on space", "output", st.typ, "err", err)
			s.fillExecution(ex, st, "")
			continue
		}
		if err != nil {
			return nil, err
		}
		st.sha = b.SHA256
		a := &records.Artifact{Cycle: s.c.ID, Lease: s.c.Lease, Type: st.typ, URI: b.URI(), SHA256: b.SHA256, Size: b.Size,
			ContentType: "text/plain", ParserStatus: "none", Metadata: map[string]any{"offset": st.from}}
		switch st.typ {
		case ArtifactStdout:
			a.Metadata["guest_path"] = "stdout"
		case ArtifactStderr:
			a.Metadata["guest_path"] = "stderr"
		case ArtifactTrace:
			a.ContentType, a.ParserStatus = "text/plain+zstd", "pending"
			a.Metadata["guest_path"], a.Metadata["tracer"], a.Metadata["bytes"] = st.path, s.c.Tracer, st.n
			if st.truncated {
				a.Metadata["truncated"] = true
			}
		}
		records.Init(a, records.KindArtifact, s.r.St.Now())
		if err := s.r.St.Create(ctx, a); err != nil {
			return nil, err
		}
		ids = append(ids, a.ID)
		s.fillExecution(ex, st, a.ID)
	}
	return ids, nil
}

// fillExecution puts an output's artifact (empty when not stored), size
// and tail into the execution record.
func (s *spool) fillExecution(ex *records.ExecutionSnapshot, st *stream, artifact string) {
	switch st.typ {
	case ArtifactStdout:
		ex.Stdout, ex.StdoutBytes, ex.StdoutTail = artifact, st.n, string(st.tail)
	case ArtifactStderr:
		ex.Stderr, ex.StderrBytes, ex.StderrTail = artifact, st.n, string(st.tail)
	}
}
