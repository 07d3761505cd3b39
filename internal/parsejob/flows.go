package parsejob

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/decode/packet"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
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
	w, err := flowlog.NewWriter(guarded{b, guard})
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
	unlock, err := o.st.LockBlob(o.ctx, f.blob.Sum())
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
	if err := o.st.Create(o.ctx, a); err != nil {
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

// Flows streams the selected connections of st's flow logs to out.Stdout
// (or to req.ZeekTSV).
func Flows(ctx context.Context, st *state.Store, req FlowsRequest, out cmdout.Sink) error {
	logs, err := flowlog.Logs(st, req.Query)
	if err != nil {
		return fault.Failure(err)
	}
	if len(logs) == 0 {
		out.Log.Info("no flow log matches", "lease", req.Lease, "cycle", req.Cycle)
	}
	for _, a := range logs {
		if err := st.EnsureBlob(ctx, a.SHA256); err != nil {
			return fmt.Errorf("%s: %w", a.ID, err) // exit 75 when a host that may hold it did not answer
		}
	}
	if req.ZeekTSV != "" {
		if err := writeZeekTSV(ctx, st, req, logs); err != nil {
			return fault.Failure(fmt.Errorf("--zeek %s: %w", req.ZeekTSV, err))
		}
		return nil
	}
	w := bufio.NewWriterSize(out.Stdout, 256<<10)
	var buf []byte
	err = req.Each(ctx, st, logs, func(_ *records.Artifact, rec *flowlog.Record) error {
		buf = append(flowlog.RecordLine(buf[:0], rec.Line), '\n')
		_, err := w.Write(buf)
		return err
	})
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return fault.Failure(err)
	}
	return nil
}

// writeZeekTSV writes the TSV through a temporary file renamed into place:
// a reader never sees half a log.
func writeZeekTSV(ctx context.Context, st *state.Store, req FlowsRequest, logs []*records.Artifact) error {
	return files.WriteAtomicFunc(req.ZeekTSV, 0o644, func(f io.Writer) error {
		t, err := flowlog.NewTSVWriter(f, st.Now())
		if err != nil {
			return err
		}
		if err := req.Each(ctx, st, logs, func(_ *records.Artifact, rec *flowlog.Record) error { return t.Write(rec) }); err != nil {
			return err
		}
		return t.Close(st.Now())
	})
}

// A connection still open at the end of one capture file continues in the
// next file of its stream, with its roles and state (packet.Carried). A
// stream is the files tb-capture rotates out of one capture (pcap artifacts
// of one lease and capture, in the capture's order, across runs: what the
// last one left open is kept in the state, one file per capture running),
// or else the inputs of one lease in one run, in the order given.

// streamOf names the stream of an input.
func streamOf(in input) string {
	if rotated(in) {
		return in.lease + "\x00" + in.capture
	}
	return in.lease + "\x00"
}

// rotated reports an artifact tb-capture rotated out of a capture.
func rotated(in input) bool { return in.capture != "" && in.typ == "pcap" }

// captureEnded reports the last file of a capture: tb-capture closed it
// because the capture ended (stopped, out of room, failed, or its daemon
// died and the file was recovered), not to rotate.
func captureEnded(in input) bool {
	switch in.reason {
	case "stop", "low-space", "disk-full", "error", "recovered":
		return true
	}
	return false
}

// carrySlack is how much earlier than the previous file's last packet a
// file may start and still continue it: packets taken on several CPUs
// reach the capture slightly out of order.
const carrySlack = int64(time.Second)

// carryVersion is the format of a stored carry.
const carryVersion = 1

type carryHeader struct {
	Version int    `json:"version"`
	Source  string `json:"source"` // the input that left the connections open
	End     int64  `json:"end"`    // its last packet, Unix nanoseconds
}

// carried is what one input left open for the next of its stream.
type carried struct {
	carryHeader
	Conns []packet.Carried
}

// previous returns what the input before in, in its stream, left open:
// for a rotated artifact, the pcap artifact registered just before it in
// its capture (from this run, or from the state when an earlier run parsed
// it); for other inputs, the previous one of the lease in this run.
func (o *output) previous(stream string, in input) *carried {
	c := o.carries[stream]
	if !rotated(in) || o.st == nil {
		return c
	}
	pred := o.predecessor(in)
	if pred == "" {
		return nil
	}
	if c != nil && c.Source == pred {
		return c
	}
	c, err := readCarry(o.st, stream)
	if err != nil {
		o.log.Warn("connections carried from the previous capture not read; roles are guessed again", "input", in.name, "err", err)
		return nil
	}
	if c != nil && c.Source == pred {
		return c
	}
	return nil
}

// predecessor is the pcap artifact registered before in's in its capture
// (the last one when in's is not listed yet: tb-capture lists an artifact
// after creating it).
func (o *output) predecessor(in input) string {
	var c records.Capture
	if err := o.st.Get(in.capture, &c); err != nil {
		return ""
	}
	i := slices.Index(c.Artifacts, in.artifact)
	if i < 0 {
		i = len(c.Artifacts)
	}
	for i--; i >= 0; i-- {
		var a records.Artifact
		if o.st.Get(c.Artifacts[i], &a) == nil && a.Type == "pcap" {
			return a.ID
		}
	}
	return ""
}

// maxCarried bounds the streams whose carry a run holds in memory (each
// at most packet.DefaultMaxCarry connections): those of rotated artifacts
// the state keeps are read back from it.
const maxCarried = 4

// keep records what an input left open for the next input of its stream:
// for a rotated artifact in the state, unless the state holds what a later
// file of the capture left (an older file parsed again), and otherwise in
// memory for the rest of the run. The last file of a capture leaves
// nothing.
func (o *output) keep(stream string, in input, c *carried) {
	delete(o.carries, stream)
	o.carryOrder = slices.DeleteFunc(o.carryOrder, func(s string) bool { return s == stream })
	if rotated(in) && o.st != nil && !o.req.NoStore {
		stored, err := writeCarry(o.ctx, o.st, stream, c, captureEnded(in))
		if err != nil {
			o.log.Warn("connections open at the end of the capture not kept for the next", "input", in.name, "err", err)
		}
		if stored || captureEnded(in) {
			return
		}
	}
	if len(o.carryOrder) == maxCarried {
		delete(o.carries, o.carryOrder[0])
		o.carryOrder = o.carryOrder[1:]
	}
	o.carries[stream] = c
	o.carryOrder = append(o.carryOrder, stream)
}

// carryPath is where the state keeps what a stream's last file left open.
func carryPath(st *state.Store, stream string) string {
	sum := sha256.Sum256([]byte(stream))
	return st.Path("parse", "carry", hex.EncodeToString(sum[:16])+".json.gz")
}

// readCarry reads a stream's stored carry (nil when there is none, or when
// it is of another version).
func readCarry(st *state.Store, stream string) (*carried, error) {
	c, err := readCarryFile(carryPath(st, stream), false)
	if err != nil || c == nil || c.Version != carryVersion {
		return nil, err
	}
	return c, nil
}

// readCarryFile reads a stored carry, or with headerOnly only its header
// (nil when there is none).
func readCarryFile(path string, headerOnly bool) (*carried, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dec := json.NewDecoder(zr)
	var c carried
	if err := dec.Decode(&c.carryHeader); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if headerOnly || c.Version != carryVersion {
		return &c, nil
	}
	for {
		var conn packet.Carried
		err := dec.Decode(&conn)
		if err == io.EOF {
			return &c, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		c.Conns = append(c.Conns, conn)
	}
}

// writeCarry stores a stream's carry (gzip'd JSON lines: the header, then
// one connection a line), or removes it when the stream ended or left
// nothing open, unless what is stored comes from a later file. It reports
// whether the state now holds c.
func writeCarry(ctx context.Context, st *state.Store, stream string, c *carried, ended bool) (bool, error) {
	unlock, err := st.Lock(ctx, "parse-carry")
	if err != nil {
		return false, err
	}
	defer unlock()
	path := carryPath(st, stream)
	if h, err := readCarryFile(path, true); err == nil && h != nil && h.Version == carryVersion && h.End > c.End {
		return false, nil
	}
	if ended || len(c.Conns) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
		return len(c.Conns) == 0, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, err
	}
	err = files.WriteAtomicFunc(path, 0o644, func(w io.Writer) error {
		zw := gzip.NewWriter(w)
		enc := json.NewEncoder(zw)
		if err := enc.Encode(c.carryHeader); err != nil {
			return err
		}
		for i := range c.Conns {
			if err := enc.Encode(&c.Conns[i]); err != nil {
				return err
			}
		}
		return zw.Close()
	})
	return err == nil, err
}
