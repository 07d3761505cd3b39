// Package parsejob is tb-parse's job runner: it gathers inputs (artifact
// records on stdin, or paths), recognises each by content, runs the matching
// decoder, deduplicates the observables and stores and prints them.
package parsejob

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/talkbox-sandbox/talkbox/internal/behave"
	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/decode"
	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/eve"
	"github.com/talkbox-sandbox/talkbox/internal/decode/packet"
	"github.com/talkbox-sandbox/talkbox/internal/decode/zeek"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/lines"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/progress"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Request is one tb-parse invocation.
type Request struct {
	// Inputs are files; "-" (or none, with FromStdin) reads artifact
	// records or paths from stdin, one per line.
	Inputs    []string
	FromStdin bool
	// Lease and Cycle scope observables from path inputs (artifact records
	// carry their own).
	Lease, Cycle string
	// Merge folds observables into those the state holds for the lease.
	Merge bool
	// NoStore only prints.
	NoStore  bool
	MaxFlows int
	MaxHeld  int
	// MinFree is what must stay free on the state's file system: below
	// it, parsing stops before writing more (exit 75).
	MinFree diskspace.Threshold
	// Progress shows each input's bytes read (nil: nothing shown).
	Progress *progress.Meter
}

// Formats recognised by content.
const (
	FormatPcap = "pcap"
	FormatZeek = "zeek"
	FormatEVE  = "eve"
)

// IndexName is the state index from (lease, type, value) to an observable.
const IndexName = "observable"

// input is one thing to parse.
type input struct {
	name     string // path or blob URI, for messages and provenance
	path     string
	blob     string // sha256 of a stored blob
	artifact string
	cycle    string
	lease    string
	where    string // stdin:LINE for stdin inputs
	typ      string // the artifact's type (pcap, sensor-log, guest-log, …)
	capture  string // the capture an artifact was rotated from
	reason   string // why tb-capture closed the file (stop: the last)
	// followed: a later input of this run is of the same stream (see
	// streamOf), and continues the connections this one leaves open.
	followed bool
}

// label names the input in a message: its name, after its stdin line.
func (in input) label() string {
	if in.where != "" {
		return in.where + ": " + in.name
	}
	return in.name
}

// Job is a tb-parse invocation with its inputs read, before the state is
// opened (if it is needed at all).
type Job struct {
	req    Request
	inputs []input
	// batch holds the bad stdin lines, already reported: the rest of the
	// inputs are still parsed.
	batch fault.Batch
	// passed counts the stdin records that name nothing to parse (a
	// lease's, a capture's): Run logs them.
	passed records.PassedOver
}

// Prepare reads the inputs that stdin names (when req.FromStdin); each bad
// line goes to warnf and the others are parsed. Without any input, and no
// record on stdin passed over, it is a usage error.
func Prepare(req Request, stdin io.Reader, warnf func(format string, a ...any)) (*Job, error) {
	j := &Job{req: req, passed: records.PassedOver{}}
	for _, p := range req.Inputs {
		if p != "-" {
			j.inputs = append(j.inputs, input{name: p, path: p, lease: req.Lease, cycle: req.Cycle})
		}
	}
	if req.FromStdin {
		in, bad := readStdin(stdin, req, j.passed)
		for _, e := range bad {
			warnf("%v", e)
			j.batch.Add(fault.DataErr(e))
		}
		j.inputs = append(j.inputs, in...)
	}
	if len(j.inputs) == 0 && len(j.passed) == 0 {
		if j.batch.Failed() > 0 {
			return nil, j.batch.Err()
		}
		return nil, fault.Usage(errors.New("no input: give capture or log files, or pipe artifact records or paths on stdin"))
	}
	return j, nil
}

// InputBytes is the size of the inputs on this host's disk: files, and
// blobs st holds (st is nil when not NeedsState); a blob still to be
// fetched from a peer counts nothing.
func (j *Job) InputBytes(st *state.Store) int64 {
	var n int64
	for _, in := range j.inputs {
		path := in.path
		if in.blob != "" {
			if st == nil {
				continue
			}
			path = st.BlobPath(in.blob)
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// NeedsState tells whether Run needs the state: to store observables, or
// to read inputs that are stored blobs.
func (j *Job) NeedsState() bool {
	need := !j.req.NoStore
	for _, in := range j.inputs {
		need = need || in.blob != ""
	}
	return need
}

// Run parses every input, printing the observables to out.Stdout and
// storing them in st (nil when not NeedsState; else best opened with
// state.SyncOnFlush). Bad inputs are reported one line each and the rest
// are still processed; the exit code is the first failure's.
func (j *Job) Run(ctx context.Context, st *state.Store, out cmdout.Sink) error {
	req, inputs, batch := j.req, j.inputs, &j.batch
	j.passed.Log(out.Log)
	o := &output{ctx: ctx, log: out.Log, warnf: out.Warnf, st: st, req: req, w: bufio.NewWriterSize(out.Stdout, 256<<10), carries: map[string]*carried{}}
	defer o.settle()
	if st != nil && !req.NoStore {
		o.guard = &diskspace.Guard{Path: st.Root(), Min: req.MinFree}
		if _, err := o.guard.Check(minReserve); err != nil {
			return o.lowSpace(err)
		}
	}
	sets := map[string]*observe.Set{}
	// One cycle's destinations per lease at a time: inputs come cycle by
	// cycle, and a scan is one observable per cycle.
	dests := map[string]*flowlog.Dests{}
	destCycle := map[string]string{}
	later := map[string]bool{}
	for i := len(inputs) - 1; i >= 0; i-- {
		s := streamOf(inputs[i])
		inputs[i].followed = later[s]
		later[s] = true
	}
	for _, in := range inputs {
		if err := ctx.Err(); err != nil {
			return err
		}
		set := sets[in.lease]
		if set == nil {
			lease := in.lease
			set = observe.NewSet(req.MaxHeld, func(obs *records.Observable) error { return o.emit(lease, obs) })
			sets[in.lease] = set
		}
		d := dests[in.lease]
		if d != nil && destCycle[in.lease] != in.cycle {
			d.Flush()
			d = nil
		}
		if d == nil {
			d = flowlog.NewDests(in.cycle, set.Named, set.Add)
			dests[in.lease], destCycle[in.lease] = d, in.cycle
		}
		if err := parseOne(ctx, st, in, req, &inputSink{Set: set, dests: d}, o); err != nil {
			if errors.Is(err, diskspace.ErrLow) {
				return o.lowSpace(err)
			}
			err = fmt.Errorf("%s: %w", in.label(), err)
			out.Warnf("%v", err)
			batch.Add(err)
		}
		if err := o.commit(); err != nil {
			return errors.Join(err, o.w.Flush())
		}
	}
	if o.guard != nil {
		if _, err := o.guard.Check(minReserve); err != nil {
			return o.lowSpace(err)
		}
	}
	leases := slices.Sorted(maps.Keys(sets))
	for _, lease := range leases {
		dests[lease].Flush()
		if err := sets[lease].Flush(); err != nil {
			// What the batch in flight stored is printed first.
			if jerr := o.join(); jerr != nil {
				err = errors.Join(err, jerr)
			}
			if ferr := o.w.Flush(); ferr != nil {
				return errors.Join(err, ferr)
			}
			return err
		}
	}
	if err := o.commit(); err != nil {
		return errors.Join(err, o.w.Flush())
	}
	if err := o.w.Flush(); err != nil {
		return err
	}
	if st != nil {
		if err := st.Flush(); err != nil {
			return fault.Failure(err)
		}
	}
	return batch.Err()
}

// readStdin reads artifact records (any record with a uri, path or
// sha256) or bare paths, one per line; a record that names nothing to
// parse (a lease's, a capture's) is passed over and counted
// in passed, so that pipes compose.
func readStdin(r io.Reader, req Request, passed records.PassedOver) ([]input, []error) {
	var ins []input
	var bad []error
	rd := records.NewReader(r, "stdin")
	for {
		l, err := rd.Next()
		if err == io.EOF {
			return ins, bad
		}
		if err != nil {
			return ins, append(bad, err)
		}
		where := fmt.Sprintf("stdin:%d", l.No)
		if l.Data[0] != '{' {
			p := string(l.Data)
			ins = append(ins, input{name: p, path: p, lease: req.Lease, cycle: req.Cycle, where: where})
			continue
		}
		// Generic, whatever the kind: tb-parse needs a few fields and must
		// not depend on the artifact's Go type.
		var rec records.Generic
		if err := records.Unmarshal(l.Data, &rec); err != nil {
			bad = append(bad, l.Err(err))
			continue
		}
		in, err := fromRecord(&rec, req)
		if errors.Is(err, errNothingToParse) {
			passed.Add(rec.Kind)
			continue
		}
		if err != nil {
			bad = append(bad, l.Err(err))
			continue
		}
		in.where = where
		ins = append(ins, in)
	}
}

// fromRecord picks what tb-parse needs from an artifact record without
// depending on its Go type: uri ("blob:sha256:<hex>", "file://path" or a
// path) or path, sha256, cycle and lease.
func fromRecord(rec records.Record, req Request) (input, error) {
	h := rec.Header()
	str := func(k string) string {
		var s string
		if raw, ok := h.Extra[k]; ok {
			_ = json.Unmarshal(raw, &s)
		}
		return s
	}
	in := input{artifact: h.ID, cycle: str("cycle"), lease: str("lease"), typ: str("type"), capture: str("capture"),
		reason: str("reason")}
	if _, pruned := h.Extra["pruned_at"]; pruned {
		return in, fmt.Errorf("%s: pruned by retention (its content is gone)", h.ID)
	}
	if in.cycle == "" {
		in.cycle = req.Cycle
	}
	if in.lease == "" {
		in.lease = req.Lease
	}
	uri := str("uri")
	if uri == "" {
		uri = str("path")
	}
	switch {
	case strings.HasPrefix(uri, "blob:sha256:"):
		in.blob = strings.ToLower(strings.TrimPrefix(uri, "blob:sha256:"))
		in.name = uri
	case strings.HasPrefix(uri, "file://"):
		in.path = strings.TrimPrefix(uri, "file://")
		in.name = in.path
	case uri != "":
		in.path, in.name = uri, uri
	case str("sha256") != "":
		in.blob = strings.ToLower(str("sha256"))
		in.name = "blob:sha256:" + in.blob
	default:
		return in, errNothingToParse
	}
	return in, nil
}

// errNothingToParse is a record with no uri, path or sha256: readStdin
// passes it over.
var errNothingToParse = errors.New("record has no uri, path or sha256 to parse")

// inputSink is where one input's decoder sends what it finds: observables
// to the lease's set, connections to the cycle's destinations and to the
// input's flow log.
type inputSink struct {
	*observe.Set
	dests  *flowlog.Dests
	origin observe.Origin
	flows  *flowlog.Writer
	err    error
	stop   context.CancelCauseFunc
}

func (s *inputSink) Conn(c *flowlog.Conn) {
	s.dests.Conn(c, &s.origin)
	if s.flows != nil && s.err == nil {
		if s.err = s.flows.Write(c); s.err != nil {
			s.stop(s.err) // the decoder stops at its next check
		}
	}
}

func parseOne(ctx context.Context, st *state.Store, in input, req Request, sink *inputSink, out *output) (err error) {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	sink.stop = stop
	var f *os.File
	if in.blob != "" {
		if err = st.EnsureBlob(ctx, in.blob); err == nil {
			f, err = st.OpenBlob(in.blob)
		}
		if errors.Is(err, state.ErrNotFound) {
			return fault.DataErr(err)
		}
		if fault.Code(err) == fault.ExitTempFail {
			return err // a host that may hold it did not answer
		}
	} else {
		f, err = os.Open(in.path)
	}
	if err != nil {
		return fault.Failure(err)
	}
	defer f.Close()
	var size int64
	regular := false
	if fi, err := f.Stat(); err == nil {
		if fi.IsDir() {
			return fault.Failure(errors.New("is a directory"))
		}
		size, regular = fi.Size(), fi.Mode().IsRegular()
	}
	bar := req.Progress.Bar(cmp.Or(in.artifact, in.name), size, progress.Bytes)
	defer bar.Done()
	// A capture file is read where it lies, mapped; anything else (a
	// compressed capture, a log, a pipe) through a buffer.
	var mapped *capfile.Mapped
	if regular {
		mapped = capfile.Map(f, size)
	}
	var br *bufio.Reader
	format := FormatPcap
	if mapped != nil {
		defer mapped.Close()
	} else {
		var closer func()
		if br, closer, err = decompress(bar.Reader(f)); err != nil {
			return fault.DataErr(err)
		}
		defer closer()
		format, err = Detect(br)
	}
	if err != nil {
		if in.artifact != "" && in.typ != "" && in.typ != "pcap" {
			// Sensors write logs tb-parse does not read (guest logs,
			// INetSim's): not an error in a pipeline of artifacts.
			out.log.Info("skipping artifact in a format tb-parse does not read", "artifact", in.artifact, "type", in.typ)
			return nil
		}
		return fault.DataErr(err)
	}
	origin := observe.Origin{Artifact: in.artifact, Cycle: in.cycle, Input: in.name, Source: format}
	sink.origin = origin
	if format == behave.FormatStrace || format == behave.FormatQEMU {
		// A trace has no connections: no flow log.
		res, err := behave.Parse(ctx, br, origin, sink, out.traceOptions(in, format))
		var stats lines.Stats
		if res != nil {
			stats = res.Stats
		}
		return logErr(out.log, in.name, stats.Lines, stats.Bad, stats.FirstBad, err)
	}
	if !req.NoStore {
		fl, ferr := newFlowLog(st, in, out.guard)
		if ferr != nil {
			return fault.Failure(ferr)
		}
		defer fl.abort()
		sink.flows = fl.w
		defer func() {
			if sink.err != nil {
				err = fmt.Errorf("flow log: %w", sink.err)
				if !errors.Is(sink.err, diskspace.ErrLow) {
					err = fault.Failure(err)
				}
				return
			}
			if cerr := out.commitFlowLog(fl, in, err); cerr != nil {
				err = fault.Failure(fmt.Errorf("flow log: %w", cerr))
			}
		}()
	}
	out.log.Debug("parsing", "input", in.name, "format", format)
	switch format {
	case FormatPcap:
		return out.parsePcap(ctx, br, mapped, bar, in, origin, sink)
	case FormatZeek:
		stats, err := zeek.Read(ctx, br, origin, sink)
		return logErr(out.log, in.name, stats.Lines, stats.Bad, stats.FirstBad, err)
	default:
		stats, err := eve.Read(ctx, br, origin, sink)
		return logErr(out.log, in.name, stats.Lines, stats.Bad, stats.FirstBad, err)
	}
}

func logErr(log *slog.Logger, name string, lines, bad int64, first error, err error) error {
	log.Debug("parsed", "input", name, "lines", lines, "bad", bad)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return err
		}
		return fault.DataErr(err)
	}
	if bad > 0 {
		return fault.DataErr(fmt.Errorf("%d malformed line(s), the first: %v", bad, first))
	}
	return nil
}

// parsePcap decodes a capture, mapped or through br. The connections the
// previous capture of its stream left open are continued (when this one
// starts after that one ended), and those this one leaves open are kept
// for the next.
func (o *output) parsePcap(ctx context.Context, br *bufio.Reader, mapped *capfile.Mapped, bar *progress.Bar, in input, origin observe.Origin, sink decode.Sink) error {
	req := o.req
	var rd *capfile.Reader
	var err error
	if mapped != nil {
		rd, err = mapped.Reader()
	} else {
		rd, err = capfile.NewReader(br)
	}
	if err != nil {
		return fault.DataErr(err)
	}
	stream := streamOf(in)
	prev := o.previous(stream, in)
	// With one core nothing would run beside the decoder: the handover
	// would only add its copies (3-4% of a run).
	if runtime.GOMAXPROCS(0) > 1 {
		h := startHandover(sink)
		defer h.close()
		sink = h
	}
	dec := packet.New(packet.Config{MaxFlows: req.MaxFlows, Origin: origin, Sink: sink})
	var p capfile.Packet
	var last int64
	seen := false
	read := func() error {
		for {
			if err := rd.Next(&p); err != nil {
				return err
			}
			if !seen && prev != nil && p.TS >= prev.End-carrySlack {
				skipped := dec.Seed(prev.Conns)
				o.log.Debug("continuing connections", "input", origin.Input, "from", prev.Source, "conns", len(prev.Conns), "skipped", skipped)
			}
			seen = true
			last = max(last, p.TS)
			dec.Packet(&p)
			if p.N&0xffff == 0 {
				if mapped != nil {
					bar.SetCurrent(rd.Offset()) // a mapped file is not read through the bar
				}
				if err := ctx.Err(); err != nil {
					return err
				}
			}
		}
	}
	if mapped != nil {
		err = mapped.Guard(read)
		bar.SetCurrent(rd.Offset())
	} else {
		err = read()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	// The connections left open are described only for a capture that
	// follows: a later input of the stream, or a later run's (kept in the
	// state).
	maxCarry := 0
	if in.followed || rotated(in) && o.st != nil && !req.NoStore {
		maxCarry = packet.DefaultMaxCarry
	}
	c := &carried{carryHeader: carryHeader{Version: carryVersion, Source: inputKey(in), End: last}, Conns: dec.FinishCarry(maxCarry)}
	if !seen && prev != nil {
		// No packet: the previous file's connections go on to the next.
		c.End, c.Conns = prev.End, prev.Conns
	}
	o.keep(stream, in, c)
	s := dec.Stats
	o.log.Debug("parsed", "input", origin.Input, "packets", s.Packets, "bytes", s.Bytes, "flows", s.Flows,
		"malformed", s.Malformed, "faults", s.Faults, "non_ip", s.NonIP, "fragments", s.Fragments, "evicted", s.Evicted, "bad_dns", s.BadDNS, "bad_dns_records", s.BadDNSRecords)
	// Packets the decoder failed on: the rest of the capture is stored,
	// and the run fails as for bad data, so that no pipeline (tb-run's
	// cycle among them) takes the capture's observables for whole.
	var faulted error
	if s.Faults > 0 {
		faulted = fault.DataErr(fmt.Errorf("the decoder failed on %d packet(s) and passed over them, the first at %s (a bug in tb-parse: please report it with the capture)", s.Faults, s.Fault))
	}
	if err == io.EOF {
		return faulted
	}
	if errors.Is(err, capfile.ErrCutShort) {
		// What a crash or a full disk leaves: everything before the cut
		// is whole, and a pipeline under pipefail must not fail for it.
		o.warnf("%s: %v; the packets before it were parsed", in.label(), err)
		return faulted
	}
	// Malformed content and corrupt or truncated compression alike.
	return fault.DataErr(errors.Join(err, faulted))
}

// decompress undoes gzip (one or more members) when the content starts with
// its magic.
func decompress(f io.Reader) (*bufio.Reader, func(), error) {
	br := bufio.NewReaderSize(f, capfile.BufferSize)
	m, _ := br.Peek(4)
	if bytes.Equal(m, zstdMagic) {
		// tb-run's traces and tb-parse's own flow logs.
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, fmt.Errorf("zstd: %w", err)
		}
		return bufio.NewReaderSize(zr, capfile.BufferSize), zr.Close, nil
	}
	if len(m) >= 2 && m[0] == 0x1f && m[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip: %w", err)
		}
		return bufio.NewReaderSize(gzipErrs{zr}, capfile.BufferSize), func() { zr.Close() }, nil
	}
	return br, func() {}, nil
}

// gzipErrs names decompression errors as such.
type gzipErrs struct{ r io.Reader }

func (g gzipErrs) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("gzip: %w", err)
	}
	return n, err
}

// Detect names the format of a stream from its first bytes: a capture, a
// Zeek log (TSV with its #separator header, or JSON lines with Zeek's
// fields) or Suricata EVE JSON (event_type).
func Detect(br *bufio.Reader) (string, error) {
	head, err := br.Peek(64 << 10)
	if len(head) == 0 {
		if err != nil && err != io.EOF {
			return "", err
		}
		return "", errors.New("empty input")
	}
	if capfile.IsCapture(head) {
		return FormatPcap, nil
	}
	if bytes.HasPrefix(head, []byte("#separator")) {
		return FormatZeek, nil
	}
	if f := behave.Detect(head); f != "" {
		return f, nil
	}
	trimmed := bytes.TrimLeft(head, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '{' {
		line := trimmed
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line = line[:i]
		}
		if bytes.Contains(line, []byte(`"event_type"`)) {
			return FormatEVE, nil
		}
		if bytes.Contains(line, []byte(`"ts"`)) {
			return FormatZeek, nil
		}
	}
	return "", errors.New("not a pcap, pcapng, Zeek log, Suricata EVE file or system-call trace")
}

// output stores and prints deduplicated observables.
type output struct {
	// ctx is the run's; log its logger.
	ctx   context.Context
	log   *slog.Logger
	warnf func(format string, a ...any) // the sink's: one line on stderr
	st    *state.Store
	req   Request
	w     *bufio.Writer
	buf   []byte
	guard *diskspace.Guard
	// carries are the connections the last input of a stream left open
	// (see streamOf), for at most maxCarried streams, oldest first in
	// carryOrder.
	carries    map[string]*carried
	carryOrder []string
	// storer batches the observables' writes (store.go).
	storer storer
}

var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// traceOptions are what the cycle of a trace says of the traced run: when
// the sample started (a QEMU log has no times), from where, in which
// directory, and its observation window (a longer sleep is evasion).
func (o *output) traceOptions(in input, format string) behave.Options {
	opts := behave.Options{Format: format}
	var c records.Cycle
	if in.cycle == "" || o.st == nil || o.st.Get(in.cycle, &c) != nil {
		return opts
	}
	opts.Exe, opts.Cwd = c.GuestPath, c.Workdir
	// An emulated sample's trace is of its emulator too: behave leaves out
	// each emulator's own start-up.
	var p records.Plan
	if c.Plan != "" && o.st.Get(c.Plan, &p) == nil && p.Emulation != nil {
		opts.Emulator = p.Emulation.Emulator
	}
	opts.Window = c.Timeout.D()
	if c.Detach {
		opts.Window = c.Window.D()
	}
	if c.LaunchedAt != nil {
		opts.Start = *c.LaunchedAt
	}
	return opts
}

// minReserve is what the observables and records of a run need at most
// beyond the flow logs (the held observables are bounded by --max-held);
// the flow logs are watched as they are written.
const minReserve = 64 << 20

// lowSpace stops the run cleanly when the state's file system runs low:
// the flow log being written is discarded, nothing else of the unfinished
// work is stored, an event says why, and the exit code says retry later.
func (o *output) lowSpace(err error) error {
	if jerr := o.join(); jerr != nil {
		err = fmt.Errorf("%w (and storing the observables: %v)", err, jerr)
	}
	if ferr := o.w.Flush(); ferr != nil {
		err = fmt.Errorf("%w (and writing the observables: %v)", err, ferr)
	}
	now := o.st.Now()
	ev := &records.Event{Type: "parse.low-space", Subject: o.st.Root(), Detail: err.Error(), At: now}
	records.Init(ev, records.KindEvent, now)
	if cerr := o.st.Create(context.WithoutCancel(o.ctx), ev); cerr != nil {
		err = fmt.Errorf("%w (and the event: %v)", err, cerr)
	}
	if ferr := o.st.Flush(); ferr != nil {
		err = fmt.Errorf("%w (and flushing the state: %v)", err, ferr)
	}
	return fault.TempFail(fmt.Errorf("state %s: %w; nothing of the unfinished inputs was stored, run again once there is room", o.st.Root(), err))
}

// write prints one record as a JSON line: the bytes records.Writer would
// write, without its reflection for the common case.
func (o *output) write(obs *records.Observable) error {
	if len(obs.Extra) > 0 {
		b, err := records.Marshal(obs)
		if err != nil {
			return err
		}
		o.w.Write(b)
		return o.w.WriteByte('\n')
	}
	o.buf = append(obs.AppendJSON(o.buf[:0]), '\n')
	_, err := o.w.Write(o.buf)
	return err
}

// IndexKey is the state index key of an observable: the sha256 of lease,
// type and observe.Key (the value, with the cycle for per-cycle types).
func IndexKey(lease, typ, value string) string {
	var in [256]byte // most keys' input: no allocation but the result's
	b := append(append(append(append(append(in[:0], lease...), 0), typ...), 0), value...)
	sum := sha256.Sum256(b)
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}

func (o *output) emit(lease string, obs *records.Observable) error {
	obs.Lease = lease
	if o.req.NoStore {
		records.Init(obs, records.KindObservable, nowOf(o.st))
		return o.write(obs)
	}
	return o.store(lease, obs)
}

func nowOf(st *state.Store) time.Time {
	if st != nil {
		return st.Now()
	}
	return time.Now()
}
