package parsejob

import (
	"errors"
	"fmt"
	"time"

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
// Without --merge, a full batch is committed in the background while the
// next one fills (one at a time, joined before the next commit starts and
// before anything else is printed), so that with a second core the
// commit's system calls overlap the encoding of the next batch's records.
// Such a batch takes no lock until its own commit, so the one committing
// cannot refuse it anything. A merge locks its key and record as it is
// queued, and a committing batch holds whole lock files: with --merge each
// batch is committed before the next one fills.
type storer struct {
	b *state.Batch
	// lines are the queued observables as they will be stored and printed.
	lines [][]byte
	since time.Time // when the first of lines was queued
	// err is the first failed commit: nothing is stored after it.
	err error
	// inflight is the batch committing in the background, if any.
	inflight *committing
	// spare and spareLines are the last joined batch and its lines'
	// slice, empty, for the next batch to fill.
	spare      *state.Batch
	spareLines [][]byte
}

// committing is a batch whose Commit runs in the background.
type committing struct {
	b     *state.Batch
	lines [][]byte
	done  chan error
}

// store writes one observable to the state and prints it. A new one, and
// with --merge one to merge into the observable its key names, is queued
// in the batch; anything else (a key or record another writer holds, the
// same observable twice in a batch) is written on its own once the batch is
// committed, so that the batch never holds locks while the store waits for
// another writer's, and stdout keeps the order of the observables.
func (o *output) store(lease string, obs *records.Observable) error {
	s := &o.storer
	if s.err != nil {
		return s.err
	}
	if s.b == nil {
		s.b = o.st.NewBatch()
	}
	key := IndexKey(lease, obs.Type, observe.Key(obs))
	records.Init(obs, records.KindObservable, o.st.Now())
	queued, err := o.queue(key, obs)
	if err != nil {
		// What the batch holds already is stored, and printed, before the
		// run fails on this one (a stored observable that does not
		// decode, say): as it would be had this one come first.
		if cerr := o.commit(); cerr != nil {
			return cerr
		}
		return o.failStore(err)
	}
	if queued {
		if len(s.lines) >= batchMax || time.Since(s.since) >= batchAge {
			return o.handOff()
		}
		return nil
	}
	if err := o.commit(); err != nil {
		return err
	}
	return o.storeAlone(key, obs)
}

// queue adds obs and its key to the batch if the batch may hold them
// (with --merge, obs merged into the stored observable its key names):
// false when this batch holds the key already (the same observable emitted
// twice), with --merge when another writer holds the key or the record, or
// the batch cannot take the merge.
func (o *output) queue(key string, obs *records.Observable) (bool, error) {
	s := &o.storer
	// Without --merge the key is only set, so its lock may wait for the
	// commit (ClaimIndex); a merge reads the stored observable under it.
	claim := s.b.ClaimIndex
	if o.req.Merge {
		claim = s.b.TryLockIndex
	}
	ok, err := claim(IndexName, key)
	if !ok || err != nil {
		return false, err
	}
	if o.req.Merge {
		// The key's lock is held: no one else can claim it until the
		// batch commits.
		id, err := s.b.Lookup(IndexName, key)
		if err == nil {
			return o.queueMerge(id, obs)
		}
		if !errors.Is(err, state.ErrNotFound) {
			return false, err
		}
	}
	line, err := s.b.Create(obs)
	if line == nil || err != nil {
		return false, err
	}
	if err := s.b.SetIndex(IndexName, key, obs.ID); err != nil {
		return false, err
	}
	if len(s.lines) == 0 {
		s.since = time.Now()
	}
	s.lines = append(s.lines, line)
	return true, nil
}

// queueMerge queues obs merged into the stored observable id.
func (o *output) queueMerge(id string, obs *records.Observable) (bool, error) {
	s := &o.storer
	cur := new(records.Observable) // the batch keeps it until Commit
	line, err := s.b.Update(id, cur, func() error {
		observe.Merge(cur, obs)
		return nil
	})
	if errors.Is(err, state.ErrNotFound) {
		return false, nil // gone since Lookup: claimed anew on its own
	}
	if line == nil || err != nil {
		return false, err
	}
	if len(s.lines) == 0 {
		s.since = time.Now()
	}
	s.lines = append(s.lines, line)
	return true, nil
}

// commit stores the queued observables, after the batch committing in the
// background, and prints them. A failure is kept: nothing more is stored
// in this run.
func (o *output) commit() error {
	if err := o.join(); err != nil {
		return err
	}
	s := &o.storer
	if s.err != nil {
		return s.err
	}
	if s.b == nil || s.b.Idle() {
		return nil
	}
	if err := s.b.Commit(); err != nil {
		return o.failStore(fmt.Errorf("storing %d observables: %w", len(s.lines), err))
	}
	err := o.print(s.lines)
	s.lines = s.lines[:0]
	return err
}

// handOff commits the queued observables in the background, after the
// batch committing there now, and starts a new batch; with --merge, now.
func (o *output) handOff() error {
	if o.req.Merge {
		return o.commit()
	}
	if err := o.join(); err != nil {
		return err
	}
	s := &o.storer
	if s.err != nil {
		return s.err
	}
	c := &committing{b: s.b, lines: s.lines, done: make(chan error, 1)}
	go func() { c.done <- c.b.Commit() }()
	s.inflight = c
	s.b, s.lines, s.spare, s.spareLines = s.spare, s.spareLines, nil, nil
	if s.b == nil {
		s.b = o.st.NewBatch()
	}
	return nil
}

// join waits for the batch committing in the background, if any, and
// prints its observables.
func (o *output) join() error {
	s := &o.storer
	c := s.inflight
	if c == nil {
		return nil
	}
	s.inflight = nil
	if err := <-c.done; err != nil {
		return o.failStore(fmt.Errorf("storing %d observables: %w", len(c.lines), err))
	}
	err := o.print(c.lines)
	// Printed: the batch and the slice may be filled again.
	s.spare, s.spareLines = c.b, c.lines[:0]
	return err
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

// failStore keeps err and drops what is queued: nothing more is stored.
func (o *output) failStore(err error) error {
	s := &o.storer
	s.err = err
	s.lines = nil
	if s.b != nil {
		s.b.Discard()
	}
	return err
}

// settle ends the storer on any return from the run: it waits for the
// batch committing in the background, prints what it stored, and lets go
// of what is queued (a run that ends early stores nothing more). The
// run's own return says why it ended; a failed commit found here is
// logged.
func (o *output) settle() {
	if err := o.join(); err != nil {
		o.log.Warn("the observables of the last batch were not stored", "err", err)
	}
	if s := &o.storer; s.b != nil {
		s.b.Discard()
	}
}

// storeAlone writes an observable the batch could not take: a new record
// and its key, or with --merge, merged into the record its key names.
func (o *output) storeAlone(key string, obs *records.Observable) error {
	ctx := o.ctx
	if !o.req.Merge {
		if err := o.st.Create(ctx, obs); err != nil {
			return err
		}
		if err := o.st.SetIndex(IndexName, key, obs.ID); err != nil {
			return err
		}
		return o.write(obs)
	}
	id, created, err := o.st.Claim(ctx, IndexName, key, func() (records.Record, error) {
		return obs, nil
	})
	if err != nil {
		return err
	}
	if created {
		return o.write(obs)
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
		return err
	}
	return o.write(&cur)
}
