package parsejob

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// jobOf is a batch job of new observables of the given values (domains of
// storeLease) on batch b, to be run by hand, with its outcome's channels
// made.
func jobOf(b *state.Batch, st *state.Store, values ...string) *batchJob {
	j := &batchJob{b: b, res: &jobOutcome{filled: make(chan struct{}), done: make(chan struct{})}}
	for i, v := range values {
		obs := observe.Origin{Input: "test"}.New(records.ObsDomain, v, time.Unix(int64(i), 0).UTC(), int64(i+1), 0)
		obs.Lease = storeLease
		records.Init(obs, records.KindObservable, st.Now())
		j.obs = append(j.obs, pendingObs{IndexKey(storeLease, obs.Type, observe.Key(obs)), obs})
	}
	return j
}

func storedCount(t *testing.T, st *state.Store) int {
	t.Helper()
	n := 0
	for _, os := range storedObservables(t, st, false) {
		n += len(os)
	}
	return n
}

// A job whose batch is to commit after one that failed stores nothing:
// nothing is stored after a failure, even where the state would now take
// it.
func TestJobAfterAFailedOneStoresNothing(t *testing.T) {
	st := storeBackend{name: "dir"}.open(t, t.TempDir(), "")
	o := &output{ctx: context.Background(), st: st}
	failed := &jobOutcome{filled: make(chan struct{}), done: make(chan struct{}), err: errors.New("the batch before failed")}
	close(failed.filled)
	close(failed.done)
	j := jobOf(st.NewBatch(), st, "a.example", "b.example")
	j.after = failed
	o.fillAndCommit(j)
	if !errors.Is(j.res.err, errSkipped) || len(j.lines) != 0 {
		t.Fatalf("job after a failed one: err %v, %d lines; want %v and none", j.res.err, len(j.lines), errSkipped)
	}
	if n := storedCount(t, st); n != 0 {
		t.Fatalf("%d observables stored after a failed batch", n)
	}
}

// A job that meets an observable its batch cannot take (here the same key
// twice: emitted early and seen again) commits what the batch holds,
// writes that one on its own and fills the batch again with the rest; the
// lines it gives for printing are each observable as stored, those of the
// first fill too, although the batch reused their buffer for the second.
// The batch is one a larger job used before, as a spare one is: a new
// batch's buffer grows into a new array at its first commit, and leaves
// the lines in the old one.
func TestJobThatFillsAgainKeepsItsLines(t *testing.T) {
	st := storeBackend{name: "dir"}.open(t, t.TempDir(), "")
	o := &output{ctx: context.Background(), st: st}
	b := st.NewBatch()
	warm := values("warm", 200)
	w := jobOf(b, st, warm...)
	o.fillAndCommit(w)
	if w.res.err != nil {
		t.Fatal(w.res.err)
	}
	// host0 twice: the same key again.
	vs := append(append(values("host", 40), "host0.example"), values("other", 40)...)
	j := jobOf(b, st, vs...)
	o.fillAndCommit(j)
	if j.res.err != nil {
		t.Fatal(j.res.err)
	}
	if len(j.lines) != len(vs) {
		t.Fatalf("%d lines for %d observables", len(j.lines), len(vs))
	}
	for i, line := range j.lines {
		id := j.obs[i].obs.ID
		raw, err := st.ReadRaw(id)
		if err != nil || !bytes.Equal(raw, line) {
			t.Fatalf("line %d, for %s:\n%s\nstored:\n%s (%v)", i, id, line, raw, err)
		}
	}
	if n := storedCount(t, st); n != len(warm)+len(vs) {
		t.Fatalf("%d observables stored, want %d", n, len(warm)+len(vs))
	}
}

// A job that is done is printed when the next one is dispatched, not only
// once jobsInFlight are running: a run that emits slowly shows each batch
// as it is stored.
func TestDoneJobIsPrintedAtTheNextDispatch(t *testing.T) {
	st := storeBackend{name: "dir"}.open(t, t.TempDir(), "")
	var out bytes.Buffer
	o := &output{ctx: context.Background(), st: st, w: bufio.NewWriter(&out)}
	defer o.settle()
	emit := func(prefix string, n int) {
		for _, p := range jobOf(nil, st, values(prefix, n)...).obs {
			if err := o.store(storeLease, p.obs); err != nil {
				t.Fatal(err)
			}
		}
	}
	emit("first", batchMax) // a full batch: dispatched
	if len(o.storer.jobs) != 1 {
		t.Fatalf("%d jobs running after a full batch, want 1", len(o.storer.jobs))
	}
	<-o.storer.jobs[0].res.done
	emit("second", batchMax)
	if err := o.w.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(out.Bytes(), []byte("\n")); n != batchMax {
		t.Fatalf("%d lines printed once the first batch was done and the second dispatched, want %d", n, batchMax)
	}
}

func values(prefix string, n int) []string {
	var vs []string
	for i := range n {
		vs = append(vs, fmt.Sprintf("%s%d.example", prefix, i))
	}
	return vs
}
