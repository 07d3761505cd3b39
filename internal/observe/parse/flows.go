package parse

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/files"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// FlowLogIndex is the state index from an input (its artifact ID, or its
// name) to the flow log parsed from it: a parse run again replaces it.
const FlowLogIndex = "flowlog"

// flowLog is the flow log of one input, written into the blob store as it
// is parsed.
type flowLog struct {
	blob *state.BlobWriter
	w    *flowlog.Writer
}

func newFlowLog(st *state.Store, in input, guard *diskspace.Guard) (*flowLog, error) {
	b, err := st.CreateBlob()
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(inputKey(in)))
	w, err := flowlog.NewWriter(guarded{b, guard}, strconv.FormatUint(binary.BigEndian.Uint64(sum[:])>>24, 36))
	if err != nil {
		b.Abort()
		return nil, err
	}
	return &flowLog{blob: b, w: w}, nil
}

func inputKey(in input) string {
	if in.artifact != "" {
		return in.artifact
	}
	return in.name
}

func (f *flowLog) abort() { f.blob.Abort() }

// guarded stops a flow log when the state's file system runs low.
type guarded struct {
	w     io.Writer
	guard *diskspace.Guard
}

func (g guarded) Write(p []byte) (int, error) {
	n, err := g.w.Write(p)
	if err == nil && g.guard != nil {
		err = g.guard.Wrote(int64(n), minReserve)
	}
	return n, err
}

// commitFlowLog publishes an input's flow log and records it as an
// artifact, even when parsing stopped early (parseErr): the connections
// read so far are in the observables too. An input without connections
// has no flow log.
func (o *output) commitFlowLog(f *flowLog, in input, parseErr error) error {
	if err := f.w.Close(); err != nil {
		return err
	}
	if f.w.Conns() == 0 {
		return nil
	}
	// Under the blob's lock from its publication to its record, so that a
	// prune (tb-capture) never deletes identical content in between.
	unlock, err := o.st.LockBlob(o.env.Ctx, f.blob.Sum())
	if err != nil {
		return err
	}
	defer unlock()
	blob, err := f.blob.Commit()
	if err != nil {
		return err
	}
	first, last := time.Unix(0, f.w.First()).UTC(), time.Unix(0, f.w.Last()).UTC()
	a := &records.Artifact{Cycle: in.cycle, Lease: in.lease, Type: flowlog.ArtifactType, URI: blob.URI(), SHA256: blob.SHA256,
		Size: blob.Size, ContentType: flowlog.ContentType, ParserStatus: "ok", Source: in.artifact, Conns: f.w.Conns(),
		FirstTS: &first, LastTS: &last, Metadata: map[string]any{"input": in.name}}
	if parseErr != nil {
		a.ParserStatus = "partial"
	}
	records.Init(a, records.KindArtifact, o.st.Now())
	if err := o.st.Create(o.env.Ctx, a); err != nil {
		return err
	}
	if err := o.st.SetIndex(FlowLogIndex, IndexKey(in.lease, flowlog.ArtifactType, inputKey(in)), a.ID); err != nil {
		return err
	}
	b, err := records.Marshal(a)
	if err != nil {
		return err
	}
	o.w.Write(b)
	return o.w.WriteByte('\n')
}

// FlowsRequest is "tb-parse flows": connections streamed back from the
// flow logs, as records or as Zeek's TSV conn.log.
type FlowsRequest struct {
	flowlog.Query
	// ZeekTSV, when set, is a file to write Zeek's TSV conn.log to instead
	// of records on stdout.
	ZeekTSV string
}

// Flows streams the selected connections.
func Flows(env *cli.Env, req FlowsRequest) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	logs, err := flowlog.Logs(st, req.Query)
	if err != nil {
		return cli.Failure(err)
	}
	if len(logs) == 0 {
		env.Log.Info("no flow log matches", "lease", req.Lease, "cycle", req.Cycle)
	}
	if req.ZeekTSV != "" {
		if err := writeZeekTSV(env, st, req, logs); err != nil {
			return cli.Failure(fmt.Errorf("--zeek %s: %w", req.ZeekTSV, err))
		}
		return nil
	}
	w := bufio.NewWriterSize(env.Stdout, 256<<10)
	var buf []byte
	err = req.Each(env.Ctx, st, logs, func(_ *records.Artifact, line []byte) error {
		buf = append(flowlog.RecordLine(buf[:0], line), '\n')
		_, err := w.Write(buf)
		return err
	})
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return cli.Failure(err)
	}
	return nil
}

// writeZeekTSV writes the TSV through a temporary file renamed into place:
// a reader never sees half a log.
func writeZeekTSV(env *cli.Env, st *state.Store, req FlowsRequest, logs []*records.Artifact) error {
	return files.WriteAtomicFunc(req.ZeekTSV, 0o644, func(f io.Writer) error {
		t, err := flowlog.NewTSVWriter(f, st.Now())
		if err != nil {
			return err
		}
		if err := req.Each(env.Ctx, st, logs, func(_ *records.Artifact, line []byte) error { return t.Write(line) }); err != nil {
			return err
		}
		return t.Close(st.Now())
	})
}
