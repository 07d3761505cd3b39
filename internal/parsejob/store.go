package parsejob

import (
	"bytes"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/crashhook"
	"github.com/talkbox-sandbox/talkbox/internal/decode/packet"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// batchMax is how many observables are stored together: one intent, one
// journal append (one transaction on PostgreSQL) for all of them. A record
// costs its writes either way; what a batch saves is the per-write intent,
// journal append and rename, and past a few hundred records that saving is
// spent: each lock the batch holds lengthens the list the kernel scans to
// place the next one (two locks per observable: its record and its key),
// and the batch's records are unprinted until it commits.
const batchMax = 256

// batchAge bounds how long a queued observable waits for its batch to
// fill: the batch is committed at the next observable once its first is
// this old, and at the end of every input whatever its age, so a long run
// shows its progress in the state and on stdout as it goes.
const batchAge = time.Second

// storer stores a run's observables through state batches and prints each
// once its batch is committed: a printed observable is always stored.
//
// The observables of a batch are gathered here and the batch is filled
// (each record encoded, its key claimed; with --merge, each merged into
// the stored observable its key names) and committed on a goroutine of
// its own: up to jobsInFlight batches at once, each committed after the
// one before it is committed, so that the journal and stdout keep the
// order of the observables while, with a second core, one batch fills as
// the one before it fills or commits and this goroutine gathers the next.
//
// Without --merge a batch fills after the one before it is filled: such a
// batch takes no lock on the directory store until its commit, so the one
// before it cannot refuse it anything there, and on PostgreSQL, where a
// batch locks as it fills, filling in order keeps a key met again in the
// next batch from being taken there first (fillAndCommit). With --merge a
// batch locks its keys and records as it fills, on both stores, and the
// batches fill at once: the reads and merges are most of a --merge run's
// work. A key is then never in two batches in flight (gather): the later
// batch could take its lock first, and the earlier one, which writes it
// on its own, would wait for a batch that waits for it.
type storer struct {
	// err is the first failure: nothing is stored after it.
	err error
	// pending are the observables of the next batch.
	pending []pendingObs
	// since is when the first of pending came.
	since time.Time
	// jobs are the batches being filled and committed, oldest first;
	// spare are joined ones, for the next batches to reuse.
	jobs  []*batchJob
	spare []*batchJob
	// With --merge: the batch in flight or pending that has each key.
	keyJob map[string]*batchJob
	// next is the job pending's observables go to (with --merge, named by
	// keyJob before it is dispatched).
	next *batchJob
}

// jobsInFlight is how many batches may be filled and committed at once.
const jobsInFlight = 2

type pendingObs struct {
	key string
	obs *records.Observable
}

// batchJob fills and commits a batch on a goroutine of its own.
type batchJob struct {
	obs []pendingObs
	b   *state.Batch
	// lines are the observables stored, as stored, in order.
	lines [][]byte
	// res is this run of the job's outcome; after the outcome of the job
	// whose batch commits before this one's. A job is reused once joined,
	// its outcome never: the job after it may not have read it yet.
	res, after *jobOutcome
}

type jobOutcome struct {
	// filled is closed once the job's batch holds all it will: on
	// PostgreSQL a batch locks what it queues, so a batch fills only after
	// the one before it, or it could take a key that one writes on its
	// own (fillAndCommit), and wait for it.
	filled chan struct{}
	done   chan struct{}
	// err is why the job stored no more than its lines: errSkipped when
	// the job before it failed.
	err error
	// panicked is the job's panic, which joinOldest raises again.
	panicked *goroutinePanic
}

// errSkipped: the batch before this one failed, so nothing was stored.
var errSkipped = errors.New("not stored: an earlier batch failed")

// store writes one observable to the state and prints it, once its batch
// is committed.
func (o *output) store(lease string, obs *records.Observable) error {
	s := &o.storer
	if s.err != nil {
		return s.err
	}
	key := IndexKey(lease, obs.Type, observe.Key(obs))
	records.Init(obs, records.KindObservable, o.st.Now())
	if o.req.Merge {
		if err := o.gather(key); err != nil {
			return err
		}
	}
	if len(s.pending) == 0 {
		s.since = time.Now()
	}
	s.pending = append(s.pending, pendingObs{key, obs})
	if len(s.pending) >= batchMax || time.Since(s.since) >= batchAge {
		return o.dispatch()
	}
	return nil
}

// gather makes room for key in the next batch (with --merge): a batch in
// flight that has it is joined first, and those before it.
func (o *output) gather(key string) error {
	s := &o.storer
	if s.keyJob == nil {
		s.keyJob = make(map[string]*batchJob)
	}
	if s.next == nil {
		s.next = o.newJob()
	}
	if j := s.keyJob[key]; j != nil && j != s.next {
		for slices.Contains(s.jobs, j) {
			if err := o.joinOldest(); err != nil {
				return err
			}
		}
	}
	s.keyJob[key] = s.next
	return nil
}

// newJob is a joined job to reuse, or a new one.
func (o *output) newJob() *batchJob {
	s := &o.storer
	if n := len(s.spare); n > 0 {
		j := s.spare[n-1]
		s.spare = s.spare[:n-1]
		return j
	}
	return &batchJob{b: o.st.NewBatch()}
}

// dispatch starts the job of the pending observables, after joining the
// oldest job when jobsInFlight are running. The jobs done already are
// joined first, so that their observables reach stdout now rather than
// when the next dispatch has to wait for them.
func (o *output) dispatch() error {
	s := &o.storer
	if len(s.pending) == 0 {
		return nil
	}
	for len(s.jobs) > 0 && (len(s.jobs) == jobsInFlight || isClosed(s.jobs[0].res.done)) {
		if err := o.joinOldest(); err != nil {
			return err
		}
	}
	j := s.next
	if j == nil {
		j = o.newJob()
	}
	s.next = nil
	j.obs, s.pending = s.pending, j.obs[:0]
	j.res, j.after = &jobOutcome{filled: make(chan struct{}), done: make(chan struct{})}, nil
	if n := len(s.jobs); n > 0 {
		j.after = s.jobs[n-1].res
	}
	s.jobs = append(s.jobs, j)
	go o.fillAndCommit(j)
	return nil
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// fillAndCommit fills j's batch, without --merge once the batch before it
// is filled, and commits it once that one is committed. An observable the
// batch cannot take (the same one twice in a batch, emitted early and seen
// again; a key or record another writer holds, or on PostgreSQL a key the
// batch before it still held as this one filled; with --merge, a record in
// a lock file the batch before it held whole as it committed) is written
// on its own after what the batch took, and the rest go in the batch
// again; without --merge the next batch fills after all that.
func (o *output) fillAndCommit(j *batchJob) {
	res := j.res
	filled := false
	defer func() {
		if r := recover(); r != nil {
			// A bug here (what a sample wrote may reach it) is raised
			// again on the run's goroutine when it joins this job, where
			// the tool's recovery reports it (exit 1, not Go's 2); the
			// batches after this one store nothing.
			res.panicked = &goroutinePanic{value: r, stack: debug.Stack()}
			res.err = fmt.Errorf("storing %d observables: %v", len(j.obs), r)
			j.lines = j.lines[:0]
		}
		if !filled {
			close(res.filled)
		}
		close(res.done)
	}()
	if crashhook.Enabled {
		crashhook.Panic(packet.FaultEnv, "commit")
	}
	if a := j.after; a != nil && !o.req.Merge {
		<-a.filled
	}
	fillBatch := fill
	if o.req.Merge {
		fillBatch = fillMerging
	}
	waited := false
	rest := j.obs
	for {
		before := len(j.lines)
		n, fillErr := fillBatch(j.b, rest, &j.lines)
		if !filled && n == len(rest) && fillErr == nil {
			filled = true
			close(res.filled)
		}
		if !waited {
			waited = true
			if a := j.after; a != nil {
				<-a.done
				if a.err != nil {
					j.b.Discard()
					j.lines, res.err = j.lines[:0], errSkipped
					return
				}
			}
		}
		if !j.b.Idle() {
			if err := j.b.Commit(); err != nil {
				res.err = fmt.Errorf("storing %d observables: %w", len(j.lines)-before, err)
				j.lines = j.lines[:before]
				return
			}
		}
		if fillErr != nil || n == len(rest) {
			res.err = fillErr
			return
		}
		// The batch fills again, and a state directory's batch reuses the
		// buffer its lines are in (its Create says so): these are printed
		// at the end.
		for i := before; i < len(j.lines); i++ {
			j.lines[i] = bytes.Clone(j.lines[i])
		}
		line, err := o.storeAlone(rest[n].key, rest[n].obs)
		if err != nil {
			res.err = err
			return
		}
		j.lines = append(j.lines, line)
		rest = rest[n+1:]
	}
}

// fill queues obs in b, their lines appended to lines, up to the first
// the batch cannot take (n) or the first error.
func fill(b *state.Batch, obs []pendingObs, lines *[][]byte) (n int, err error) {
	for i, p := range obs {
		ok, err := b.ClaimIndex(IndexName, p.key)
		if !ok || err != nil {
			return i, err
		}
		line, err := b.Create(p.obs)
		if line == nil || err != nil {
			return i, err
		}
		if err := b.SetIndex(IndexName, p.key, p.obs.ID); err != nil {
			return i, err
		}
		*lines = append(*lines, line)
	}
	return len(obs), nil
}

// joinOldest waits for the oldest job and prints what it stored; its
// failure is kept.
func (o *output) joinOldest() error {
	s := &o.storer
	j := s.jobs[0]
	s.jobs = append(s.jobs[:0], s.jobs[1:]...)
	<-j.res.done
	if p := j.res.panicked; p != nil {
		panic(p)
	}
	err := o.print(j.lines)
	if j.res.err != nil {
		err = o.failStore(j.res.err)
	}
	// Printed: the job's batch and slices may be filled again.
	for _, p := range j.obs {
		if s.keyJob[p.key] == j {
			delete(s.keyJob, p.key)
		}
	}
	j.lines, j.after = j.lines[:0], nil
	clear(j.obs)
	s.spare = append(s.spare, j)
	return err
}

// fillMerging is fill with --merge: each observable is merged into the
// stored one its key names, or is new. It takes each step for all of obs
// before the next (the keys' locks, their lookups, the records' locks, the
// merges), so that the directory store reads what may have changed of the
// keys, and of the records, once for all of them, and PostgreSQL asks for
// each step in one round trip (state.Batch's TryLockIndexes, LookupAll,
// TryLockRecords).
func fillMerging(b *state.Batch, obs []pendingObs, lines *[][]byte) (int, error) {
	keys := make([]string, len(obs))
	for i, p := range obs {
		keys[i] = p.key
	}
	// limit is how many of obs the batch can take, err why no more.
	limit, err := b.TryLockIndexes(IndexName, keys)
	var ids []string
	if err == nil {
		ids, err = b.LookupAll(IndexName, keys[:limit])
	}
	limit = len(ids)
	if err == nil {
		stored := make([]string, 0, limit)
		for _, id := range ids {
			if id != "" {
				stored = append(stored, id)
			}
		}
		var n int
		n, err = b.TryLockRecords(stored)
		if n < len(stored) {
			// The observables up to the first record not locked.
			limit = slices.Index(ids, stored[n])
		}
	}
	for i, p := range obs[:limit] {
		line, qerr := queueMerge(b, p.key, ids[i], p.obs)
		if line == nil || qerr != nil {
			return i, qerr
		}
		*lines = append(*lines, line)
	}
	return limit, err
}

// queueMerge adds obs to b merged into the stored observable id (its key
// and the record locked by the batch), or new with its key when id is "".
// Nil when the batch cannot take the merge, or the record is gone since
// the key was read (the observable is then claimed anew on its own).
func queueMerge(b *state.Batch, key, id string, obs *records.Observable) ([]byte, error) {
	if id != "" {
		cur := new(records.Observable) // the batch keeps it until Commit
		line, err := b.Update(id, cur, func() error {
			observe.Merge(cur, obs)
			return nil
		})
		if errors.Is(err, state.ErrNotFound) {
			return nil, nil
		}
		return line, err
	}
	line, err := b.Create(obs)
	if line == nil || err != nil {
		return nil, err
	}
	if err := b.SetIndex(IndexName, key, obs.ID); err != nil {
		return nil, err
	}
	return line, nil
}

// commit stores what is gathered, after the jobs running, and prints it.
// A failure is kept: nothing more is stored in this run.
func (o *output) commit() error {
	if err := o.dispatch(); err != nil {
		return err
	}
	if err := o.join(); err != nil {
		return err
	}
	return o.storer.err
}

// join waits for every job running and prints what each stored; the
// first failure is returned (not a job's that skipped its batch for the
// failure before it).
func (o *output) join() error {
	var first error
	for len(o.storer.jobs) > 0 {
		if err := o.joinOldest(); err != nil && first == nil && !errors.Is(err, errSkipped) {
			first = err
		}
	}
	return first
}

// print writes committed observables' lines.
func (o *output) print(lines [][]byte) error {
	for _, line := range lines {
		o.w.Write(line)
		if err := o.w.WriteByte('\n'); err != nil {
			return err
		}
	}
	return nil
}

// failStore keeps err and drops what is gathered and queued: nothing more
// is stored.
func (o *output) failStore(err error) error {
	s := &o.storer
	if s.err == nil {
		s.err = err
	}
	s.pending = s.pending[:0]
	return err
}

// settle ends the storer on any return from the run: it waits for the
// jobs running, prints what they stored, and lets go of what is queued (a
// run that ends early stores nothing more). The run's own return says why
// it ended; a failed commit found here is logged.
func (o *output) settle() {
	if err := o.join(); err != nil {
		o.log.Warn("the observables of the last batch were not stored", "err", err)
	}
}

// storeAlone writes an observable a batch could not take, and returns its
// line: a new record and its key, or with --merge, merged into the record
// its key names.
func (o *output) storeAlone(key string, obs *records.Observable) ([]byte, error) {
	ctx := o.ctx
	if !o.req.Merge {
		if err := o.st.Create(ctx, obs); err != nil {
			return nil, err
		}
		if err := o.st.SetIndex(IndexName, key, obs.ID); err != nil {
			return nil, err
		}
		return records.Marshal(obs)
	}
	id, created, err := o.st.Claim(ctx, IndexName, key, func() (records.Record, error) {
		return obs, nil
	})
	if err != nil {
		return nil, err
	}
	if created {
		return records.Marshal(obs)
	}
	var cur records.Observable
	err = o.st.Update(ctx, id, &cur, func(exists bool) error {
		if !exists {
			return fmt.Errorf("%s: %w", id, state.ErrNotFound)
		}
		observe.Merge(&cur, obs)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return records.Marshal(&cur)
}
