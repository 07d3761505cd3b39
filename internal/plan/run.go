package plan

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"sync"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/sample"
	"github.com/talkbox-sandbox/talkbox/internal/state"
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
}

// input is one thing to plan: a file path or a stored sample's sha256.
type input struct {
	path   string
	sha256 string
	where  string // "stdin:LINE" for stdin inputs, for error messages
}

var hex64 = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// Run plans every input, writing sample and plan records to the state and to
// stdout. Bad inputs are reported one line each and the batch goes on; a
// malformed stdin stream is refused whole before anything is written.
func Run(env *cli.Env, req Request) error {
	profiles, err := LoadProfiles(req.ProfilesDir)
	if err != nil {
		return cli.DataErr(err)
	}
	prof, err := profiles.Get(req.Profile)
	if err != nil {
		return cli.Usage(err)
	}
	resolved, applied, err := Resolve(prof, req.Overrides)
	if err != nil {
		return cli.Usage(err)
	}

	var inputs []input
	for _, p := range req.Inputs {
		if p != "-" {
			inputs = append(inputs, input{path: p})
		}
	}
	if req.FromStdin {
		fromStdin, bad := readStdin(env.Stdin)
		if len(bad) > 0 {
			var b cli.Batch
			for _, e := range bad {
				env.Warnf("%v", e)
				b.Add(cli.DataErr(e))
			}
			return b.Err()
		}
		inputs = append(inputs, fromStdin...)
	}
	if len(inputs) == 0 {
		return cli.Usage(errors.New("no input: give sample paths or directories, or pipe records, sha256s or paths on stdin"))
	}

	st, err := env.OpenState(state.WithDurability(state.SyncOnFlush))
	if err != nil {
		return err
	}
	p := &planner{env: env, ing: &sample.Ingester{Store: st, Priority: req.Priority},
		profile: resolved, applied: applied, forced: req.Overrides.Platform, out: records.NewWriter(env.Stdout)}
	jobs := req.Jobs
	if jobs <= 0 {
		jobs = runtime.GOMAXPROCS(0)
	}
	p.pipeline(inputs, jobs)
	if err := p.out.Flush(); err != nil {
		return err
	}
	if err := st.Flush(); err != nil {
		return fmt.Errorf("syncing state: %w", err)
	}
	if err := env.Ctx.Err(); err != nil {
		return err
	}
	if err := p.batch.Err(); err != nil {
		return err
	}
	if req.Strict && p.notRunnable > 0 {
		return cli.Failure(fmt.Errorf("%d plan(s) not runnable (--strict)", p.notRunnable))
	}
	return nil
}

// readStdin reads every line before anything is planned, so that a
// malformed stream is refused without writing to the state.
func readStdin(r io.Reader) ([]input, []error) {
	rd := records.NewReader(r, "stdin")
	var (
		inputs []input
		bad    []error
	)
	for {
		line, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			bad = append(bad, err)
			break
		}
		in, err := parseStdinLine(line)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		inputs = append(inputs, in)
	}
	return inputs, bad
}

func parseStdinLine(l records.Line) (input, error) {
	where := fmt.Sprintf("%s:%d", l.Name, l.No)
	text := string(l.Data)
	switch {
	case l.Data[0] == '{':
		rec, err := records.Decode(l.Data)
		if err != nil {
			return input{}, l.Err(err)
		}
		sha := sampleSHA256(rec)
		if sha == "" {
			return input{}, l.Err(fmt.Errorf("record %s (kind %q) names no sample sha256", rec.Header().ID, rec.Header().Kind))
		}
		return input{sha256: sha, where: where}, nil
	case hex64.MatchString(text):
		return input{sha256: bytes2lower(text), where: where}, nil
	case len(text) > 66 && hex64.MatchString(text[:64]) && (text[64] == ' ' || text[64] == '\t'):
		// sha256sum(1) output: the digest names a stored sample.
		return input{sha256: bytes2lower(text[:64]), where: where}, nil
	default:
		return input{path: text, where: where}, nil
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
	env         *cli.Env
	ing         *sample.Ingester
	profile     Profile
	applied     []string
	forced      string
	out         *records.Writer
	batch       cli.Batch
	notRunnable int
}

func (p *planner) fail(err error) {
	p.env.Warnf("%v", err)
	p.batch.Add(err)
}

// job is one input in flight: a file being prepared by a worker, a stored
// sample's sha256, or a walk error, kept in input order.
type job struct {
	in   input
	path string
	err  error
	done chan struct{}
	prep *sample.Prepared
}

// pipeline prepares files (read, digest, triage) on jobs workers while this
// goroutine stores them and prints their records in input order. At most
// 2×jobs prepared files wait in memory.
func (p *planner) pipeline(inputs []input, jobs int) {
	ctx := p.env.Ctx
	order := make(chan *job, 2*jobs)
	work := make(chan *job, 2*jobs)
	buffers := make(chan []byte, 3*jobs+1)
	var workers sync.WaitGroup
	for range jobs {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for j := range work {
				var buf []byte
				select {
				case buf = <-buffers:
				default:
				}
				j.prep, j.err = sample.Prepare(j.path, buf)
				close(j.done)
			}
		}()
	}
	go func() {
		defer close(order)
		defer close(work)
		ready := func(j *job) *job { close(j.done); return j }
		for _, in := range inputs {
			if ctx.Err() != nil {
				return
			}
			if in.sha256 != "" {
				order <- ready(&job{in: in, done: make(chan struct{})})
				continue
			}
			sample.Walk(ctx, in.path, func(path string) {
				j := &job{path: path, done: make(chan struct{})}
				order <- j
				work <- j
			}, func(err error) {
				order <- ready(&job{err: err, done: make(chan struct{})})
			})
		}
	}()
	for j := range order {
		<-j.done
		switch {
		case j.err != nil:
			p.fail(j.err)
		case j.in.sha256 != "":
			p.planStored(j.in)
		case ctx.Err() != nil:
			j.prep.Close()
		default:
			p.planPrepared(j.prep)
			if data := j.prep.Data(); data != nil {
				select {
				case buffers <- data[:0]:
				default:
				}
			}
		}
	}
	workers.Wait()
}

func (p *planner) planPrepared(prep *sample.Prepared) {
	path := prep.Path
	smp, _, err := p.ing.Save(p.env.Ctx, prep)
	if err != nil {
		p.fail(err)
		return
	}
	if smp.Problem != "" {
		// Still recorded (analysts want to see it), but the input was bad.
		p.fail(cli.DataErr(fmt.Errorf("%s: %s", path, smp.Problem)))
	}
	p.emit(smp)
}

func (p *planner) planStored(in input) {
	smp, err := p.ing.BySHA256(in.sha256)
	if errors.Is(err, state.ErrNotFound) {
		p.fail(cli.DataErr(fmt.Errorf("%s: no sample with sha256 %s in %s", in.where, in.sha256, p.ing.Store.Root())))
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
		p.fail(cli.Usage(err))
		return
	}
	if err := p.ing.Store.Create(p.env.Ctx, pl); err != nil {
		p.fail(fmt.Errorf("%s: storing plan: %w", smp.ID, err))
		return
	}
	if !pl.Runnable {
		p.notRunnable++
		p.env.Log.Debug("plan not runnable", "sample", smp.ID, "reason", pl.Reason)
	}
	if err := p.out.Write(smp); err != nil {
		p.fail(err)
		return
	}
	if err := p.out.Write(pl); err != nil {
		p.fail(err)
		return
	}
	if err := p.out.Flush(); err != nil {
		p.fail(err)
	}
}
