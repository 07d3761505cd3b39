package plan

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/sample"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/yarascan"
)

// Request is one tb-plan invocation.
type Request struct {
	// Inputs are sample paths or directories; "-" (or none, with FromStdin)
	// reads records, sha256s or paths, one per line, from stdin.
	Inputs      []string
	FromStdin   bool
	Profile     string
	ProfilesDir string
	Overrides   Overrides
	Priority    int
	// Strict makes a plan that no image can run a failure (exit 1).
	Strict bool
	// Jobs is how many files are read, digested and triaged at once
	// (0: one per CPU). Records are still written and printed in input order.
	Jobs int
	// DroppedBy is added to every sample's lineage (records.Sample).
	DroppedBy *records.Drop
}

// input is one thing to plan: a file path or a stored sample's sha256.
type input struct {
	path   string
	sha256 string
	where  string // "stdin:LINE" for stdin inputs, for error messages
}

var hex64 = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// Job is a tb-plan invocation checked and its stdin read, before the state
// is touched.
type Job struct {
	req     Request
	profile Profile
	applied []string
	inputs  []input
}

// Prepare resolves the profile and reads the inputs that stdin names (when
// req.FromStdin), so that a bad request or a malformed stdin stream is
// refused whole before anything is written; each bad stdin line goes to
// out.Warnf, and the count of records passed over to out.Log.
func Prepare(req Request, stdin io.Reader, out cmdout.Sink) (*Job, error) {
	profiles, err := LoadProfiles(req.ProfilesDir)
	if err != nil {
		return nil, fault.DataErr(err)
	}
	prof, err := profiles.Get(req.Profile)
	if err != nil {
		return nil, fault.Usage(err)
	}
	resolved, applied, err := Resolve(prof, req.Overrides)
	if err != nil {
		return nil, fault.Usage(err)
	}

	var inputs []input
	for _, p := range req.Inputs {
		if p != "-" {
			inputs = append(inputs, input{path: p})
		}
	}
	if req.FromStdin {
		fromStdin, passed, bad := readStdin(stdin)
		passed.Log(out.Log)
		if len(bad) > 0 {
			var b fault.Batch
			for _, e := range bad {
				out.Warnf("%v", e)
				b.Add(fault.DataErr(e))
			}
			return nil, b.Err()
		}
		inputs = append(inputs, fromStdin...)
	}
	if len(inputs) == 0 {
		return nil, fault.Usage(errors.New("no input: give sample paths or directories, or pipe records, sha256s or paths on stdin"))
	}
	return &Job{req: req, profile: resolved, applied: applied, inputs: inputs}, nil
}

// Run plans every input, writing sample and plan records to st and, in
// input order, to out.Stdout. Bad inputs are reported one line each and the batch goes on.
// st is best opened with state.SyncOnFlush: Run flushes it at the end.
func (j *Job) Run(ctx context.Context, st *state.Store, out cmdout.Sink) error {
	req := j.req
	yaraDirs := j.profile.Yara
	if d := req.DroppedBy; d != nil {
		var c records.Cycle
		if records.KindOf(d.Cycle) != records.KindCycle || st.Get(d.Cycle, &c) != nil {
			return fault.Usage(fmt.Errorf("--dropped-by %s: no such cycle in %s", d.Cycle, st.Root()))
		}
		d.Lease, d.Sample = c.Lease, c.Sample
		// A dropped file is scanned with the rules of the sample that
		// dropped it.
		var pl records.Plan
		if err := st.Get(c.Plan, &pl); err == nil {
			yaraDirs = append(slices.Clip(yaraDirs), pl.Yara...)
		}
	}
	rules, err := yarascan.Compile(ctx, yarascan.Dirs(yaraDirs...))
	if err != nil {
		return err
	}
	defer rules.Close()
	p := &planner{ctx: ctx, log: out.Log, warnf: out.Warnf, ing: &sample.Ingester{Store: st, Priority: req.Priority, DroppedBy: req.DroppedBy},
		profile: j.profile, applied: j.applied, forced: req.Overrides.Platform, out: bufio.NewWriterSize(out.Stdout, 64<<10), yara: rules}
	jobs := req.Jobs
	if jobs <= 0 {
		jobs = runtime.GOMAXPROCS(0)
	}
	p.pipeline(j.inputs, jobs)
	if err := p.out.Flush(); err != nil {
		return err
	}
	if err := st.Flush(); err != nil {
		return fmt.Errorf("syncing state: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := p.batch.Err(); err != nil {
		return err
	}
	if req.Strict && p.notRunnable > 0 {
		return fault.Failure(fmt.Errorf("%d plan(s) not runnable (--strict)", p.notRunnable))
	}
	return nil
}

// readStdin reads every line before anything is planned, so that a
// malformed stream is refused without writing to the state. A record that
// names no sample, of a kind other than sample or plan, is passed over
// (tb-lease and tb-run print such records in a pipeline) and counted.
func readStdin(r io.Reader) ([]input, records.PassedOver, []error) {
	rd := records.NewReader(r, "stdin")
	var (
		inputs []input
		bad    []error
	)
	passed := records.PassedOver{}
	for {
		line, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			bad = append(bad, err)
			break
		}
		in, other, err := parseStdinLine(line)
		switch {
		case err != nil:
			bad = append(bad, err)
		case other != "":
			passed.Add(other)
		default:
			inputs = append(inputs, in)
		}
	}
	return inputs, passed, bad
}

// parseStdinLine is the input a line names, or the kind of a record that
// names no sample and is not one of the kinds tb-plan uses.
func parseStdinLine(l records.Line) (in input, other string, err error) {
	where := fmt.Sprintf("%s:%d", l.Name, l.No)
	text := string(l.Data)
	switch {
	case l.Data[0] == '{':
		rec, err := records.Decode(l.Data)
		if err != nil {
			return input{}, "", l.Err(err)
		}
		h := rec.Header()
		sha := sampleSHA256(rec)
		switch {
		case sha != "":
			return input{sha256: sha, where: where}, "", nil
		case h.Kind == records.KindSample || h.Kind == records.KindPlan:
			// A sample or plan names its sample: without one it is bad data.
			return input{}, "", l.Err(fmt.Errorf("record %s (kind %q) names no sample sha256", h.ID, h.Kind))
		}
		return input{}, h.Kind, nil
	case hex64.MatchString(text):
		return input{sha256: bytes2lower(text), where: where}, "", nil
	case len(text) > 66 && hex64.MatchString(text[:64]) && (text[64] == ' ' || text[64] == '\t'):
		// sha256sum(1) output: the digest names a stored sample.
		return input{sha256: bytes2lower(text[:64]), where: where}, "", nil
	default:
		return input{path: text, where: where}, "", nil
	}
}

// sampleSHA256 finds the sample a record refers to: a sample's own sha256, a
// plan's sample_sha256, or either field on any other kind.
func sampleSHA256(rec records.Record) string {
	switch r := rec.(type) {
	case *records.Sample:
		return r.SHA256
	case *records.Plan:
		return r.SampleSHA256
	}
	for _, k := range []string{"sha256", "sample_sha256"} {
		if raw, ok := rec.Header().Extra[k]; ok {
			s := string(bytes.Trim(raw, `"`))
			if b, err := hex.DecodeString(s); err == nil && len(b) == 32 {
				return bytes2lower(s)
			}
		}
	}
	return ""
}

func bytes2lower(s string) string { return string(bytes.ToLower([]byte(s))) }

type planner struct {
	ctx         context.Context
	log         *slog.Logger
	warnf       func(format string, a ...any)
	ing         *sample.Ingester
	profile     Profile
	applied     []string
	forced      string
	out         *bufio.Writer // records, one JSON line each
	batch       fault.Batch
	notRunnable int
	yara        *yarascan.Rules

	// pending holds new samples and their plans, queued in writes, until
	// writes is handed to the committer goroutine (commits), which stores
	// them and prints their records in input order while the next batch
	// fills. last is the batch handed over last.
	writes  *state.Batch
	pending []planned
	commits chan *committing
	last    *committing
}

// committing is a batch handed to the committer goroutine.
type committing struct {
	b     *state.Batch
	items []planned
	done  chan struct{} // closed once stored and printed
}

// planned is a sample and its plan queued in a batch, with their JSON as
// stored (printed as is: encoding them again would cost as much as storing).
type planned struct {
	smp             *records.Sample
	pl              *records.Plan
	smpLine, plLine []byte
	err             error // the plan could not be made or queued: reported, nothing printed
	alone           bool  // the plan is written after the batch, on its own
}

// batchMax is how many samples are written together (one journal append,
// their locks held until then). Each lock a descriptor holds lengthens the
// list the kernel scans to place the next one, so bigger batches cost more
// per sample past a point.
const batchMax = 64

// flush hands the batch being filled to the committer, once the one before
// is done (one batch is stored while the next fills), and starts another.
func (p *planner) flush() {
	if len(p.pending) == 0 && p.writes.Idle() {
		return
	}
	next := p.ing.Store.NewBatch()
	if p.last != nil {
		<-p.last.done
		next = p.last.b // committed, and so empty again
	}
	c := &committing{b: p.writes, items: p.pending, done: make(chan struct{})}
	p.commits <- c
	p.last = c
	p.writes, p.pending = next, nil
}

// sync flushes and waits until every batch is stored and printed: before
// anything else is written or printed, so that records come out in input
// order and no write waits for a lock a pending batch holds.
func (p *planner) sync() {
	p.flush()
	if p.last != nil {
		<-p.last.done
	}
}

func (p *planner) fail(err error) {
	p.warnf("%v", err)
	p.batch.Add(err)
}

// job is one input: a file a worker prepares, a stored sample's sha256, or
// a walk error.
type job struct {
	in   input
	path string
	err  error
	prep *sample.Prepared
}

// chunk is up to chunkMax consecutive jobs, handed from the walker to the
// workers and to this goroutine together: one hand-over (and one wake-up)
// per chunk rather than per file. Workers take its files one at a time, so
// one chunk is still prepared on every worker at once.
type chunk struct {
	jobs  []*job
	files int64        // jobs that are files
	next  atomic.Int64 // the next job a worker takes
	left  atomic.Int64 // files not prepared yet
	done  chan struct{}
}

const chunkMax = 32

// pipeline prepares files (read, digest, triage, blob) on jobs workers
// while this goroutine stores their records, a batch at a time, and prints
// them in input order. Prepared files hold no content (the blob has it), so
// what waits in memory is a few chunks of digests and triage.
func (p *planner) pipeline(inputs []input, jobs int) {
	ctx := p.ctx
	st := p.ing.Store
	order := make(chan *chunk, 2)
	work := make(chan *chunk, 2*jobs)
	var workers sync.WaitGroup
	for range jobs {
		workers.Add(1)
		go func() {
			defer workers.Done()
			var buf []byte // reused for the content of every file that fits
			for c := range work {
				for {
					i := c.next.Add(1) - 1
					if i >= int64(len(c.jobs)) {
						break
					}
					j := c.jobs[i]
					if j.path == "" {
						continue
					}
					j.prep, j.err = sample.Prepare(j.path, buf)
					if j.err == nil {
						if data := j.prep.Data(); data != nil {
							buf = data[:0]
						}
						if j.err = j.prep.StoreBlob(ctx, st); j.err != nil {
							j.prep = nil
						}
					}
					if c.left.Add(-1) == 0 {
						close(c.done)
					}
				}
			}
		}()
	}
	go func() {
		defer close(order)
		defer close(work)
		c := &chunk{done: make(chan struct{})}
		send := func() {
			if len(c.jobs) == 0 {
				return
			}
			c.left.Store(c.files)
			order <- c
			if c.files == 0 {
				close(c.done)
			}
			for range min(c.files, int64(jobs)) {
				work <- c
			}
			c = &chunk{done: make(chan struct{})}
		}
		add := func(j *job) {
			c.jobs = append(c.jobs, j)
			if j.path != "" {
				c.files++
			}
			if len(c.jobs) == chunkMax {
				send()
			}
		}
		for _, in := range inputs {
			if ctx.Err() != nil {
				return
			}
			if in.sha256 != "" {
				add(&job{in: in})
				continue
			}
			sample.Walk(ctx, in.path, func(path string) {
				add(&job{path: path})
			}, func(err error) {
				add(&job{err: err})
			})
		}
		send()
	}()
	p.writes = st.NewBatch()
	p.commits = make(chan *committing)
	defer close(p.commits)
	go func() {
		for c := range p.commits {
			p.commit(c.b, c.items)
			close(c.done)
		}
	}()
	for {
		var c *chunk
		var ok bool
		select {
		case c, ok = <-order:
		default:
			// Nothing is on its way: store what is queued rather than hold
			// its records (and locks) while the input is slow.
			p.flush()
			c, ok = <-order
		}
		if !ok {
			break
		}
		<-c.done
		for _, j := range c.jobs {
			switch {
			case ctx.Err() != nil:
				if j.prep != nil {
					j.prep.Close()
				}
			case j.err != nil:
				p.sync()
				p.fail(j.err)
			case j.in.sha256 != "":
				p.sync()
				p.planStored(j.in)
			default:
				p.planPrepared(j.prep)
			}
		}
	}
	// What was queued before an interruption was prepared whole: store it.
	p.sync()
	workers.Wait()
}

// planPrepared queues new content in the batch; anything else (content
// stored before, or being stored by another process) is written on its own
// once the batch is committed.
func (p *planner) planPrepared(prep *sample.Prepared) {
	smp, line, err := p.ing.Queue(p.writes, prep)
	if err != nil || smp == nil {
		p.sync()
		if err == nil {
			smp, _, err = p.ing.Save(p.ctx, prep)
		}
		prep.Close()
		if err != nil {
			p.fail(err)
			return
		}
		p.problem(prep.Path, smp)
		p.emit(smp)
		return
	}
	p.pending = append(p.pending, p.queuePlan(smp, line))
	if len(p.pending) >= batchMax {
		p.flush()
	}
}

// queuePlan makes the plan of a queued sample and queues it too.
func (p *planner) queuePlan(smp *records.Sample, smpLine []byte) planned {
	q := planned{smp: smp, smpLine: smpLine}
	pl, err := Make(smp, p.profile, p.applied, p.forced, p.ing.Store.Now())
	if err != nil {
		q.err = fault.Usage(err)
		return q
	}
	line, err := p.writes.Create(pl)
	switch {
	case err != nil:
		q.err = fmt.Errorf("%s: storing plan: %w", smp.ID, err)
	case line == nil:
		// Its ID is in the batch already (never for a new ID, in
		// practice): the plan is written on its own once the batch is.
		q.alone = true
	default:
		q.pl, q.plLine = pl, line
	}
	return q
}

// commit writes a batch and prints its records in order.
func (p *planner) commit(b *state.Batch, items []planned) {
	err := b.Commit()
	for _, q := range items {
		if err != nil {
			p.fail(fmt.Errorf("%s: storing sample: %w", q.smp.Source, err))
			continue
		}
		p.problem(q.smp.Source, q.smp)
		switch {
		case q.err != nil:
			p.fail(q.err)
		case q.alone:
			p.emit(q.smp)
		default:
			p.print(q.smp, q.pl, q.smpLine, q.plLine)
		}
	}
	if err := p.out.Flush(); err != nil {
		p.fail(err)
	}
}

// problem reports an input whose sample's headers are bad: still recorded
// (analysts want to see it), but the input was bad.
func (p *planner) problem(path string, smp *records.Sample) {
	if smp.Problem != "" {
		p.fail(fault.DataErr(fmt.Errorf("%s: %s", path, smp.Problem)))
	}
}

func (p *planner) planStored(in input) {
	smp, err := p.ing.BySHA256(in.sha256)
	if errors.Is(err, state.ErrNotFound) {
		p.fail(fault.DataErr(fmt.Errorf("%s: no sample with sha256 %s in %s", in.where, in.sha256, p.ing.Store.Root())))
		return
	}
	if err != nil {
		p.fail(fmt.Errorf("%s: %w", in.where, err))
		return
	}
	p.emit(smp)
}

// emit writes a plan for the sample and prints both records.
func (p *planner) emit(smp *records.Sample) {
	pl, err := Make(smp, p.profile, p.applied, p.forced, p.ing.Store.Now())
	if err != nil {
		p.fail(fault.Usage(err))
		return
	}
	if err := p.ing.Store.Create(p.ctx, pl); err != nil {
		p.fail(fmt.Errorf("%s: storing plan: %w", smp.ID, err))
		return
	}
	p.print(smp, pl, nil, nil)
	if err := p.out.Flush(); err != nil {
		p.fail(err)
	}
}

// print writes a stored sample and its plan to stdout: the lines given,
// as stored, or else their encoding.
func (p *planner) print(smp *records.Sample, pl *records.Plan, smpLine, plLine []byte) {
	if !pl.Runnable {
		p.notRunnable++
		p.log.Debug("plan not runnable", "sample", smp.ID, "reason", pl.Reason)
	}
	for _, r := range []struct {
		rec  records.Record
		line []byte
	}{{smp, smpLine}, {pl, plLine}} {
		line := r.line
		if line == nil {
			var err error
			if line, err = records.Marshal(r.rec); err != nil {
				p.fail(err)
				return
			}
		}
		p.out.Write(line)
		p.out.WriteByte('\n')
	}
	p.scan(smp)
}
