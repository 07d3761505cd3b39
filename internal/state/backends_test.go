package state

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// testBackend is where a test's records live: the directory, or a database
// of a throw-away PostgreSQL cluster (url).
type testBackend struct {
	name string
	url  string
}

// eachBackend runs a store test against both backends.
func eachBackend(t *testing.T, f func(t *testing.T, be testBackend)) {
	t.Run("dir", func(t *testing.T) { f(t, testBackend{name: "dir"}) })
	t.Run("postgres", func(t *testing.T) {
		c := pgtest.Start(t, pgtest.WithoutFsync())
		f(t, testBackend{name: "postgres", url: c.NewDatabase(t)})
	})
}

// opts are more plus what opens the backend.
func (be testBackend) opts(more ...Option) []Option {
	if be.url != "" {
		more = append(more, WithShared(be.url))
	}
	return more
}

// env tells a worker process the backend (sharedFromEnv).
func (be testBackend) env() []string {
	if be.url == "" {
		return nil
	}
	return []string{"TB_SHARED=" + be.url}
}

// sharedFromEnv is WithShared(TB_SHARED) in a worker process, when it is set.
func sharedFromEnv() Option {
	url := os.Getenv("TB_SHARED")
	return func(s *Store) {
		if url != "" {
			s.shared = url
		}
	}
}

// TestFollowJournal follows the journal while writers commit, on both
// backends: every change arrives once, each record's in revision order, and
// a follower started at the end sees only what comes after it.
func TestFollowJournal(t *testing.T) { eachBackend(t, followJournal) }

func followJournal(t *testing.T, be testBackend) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), be.opts(WithDurability(SyncOnFlush))...)
	var ids []string
	for range 4 {
		c := newCounter(s)
		if err := s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	fromStart, err := s.FollowJournal(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	defer fromStart.Close()
	fromEnd, err := s.FollowJournal(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	defer fromEnd.Close()
	const writers, n = 8, 40
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			var c counterRec
			for i := range n {
				id := ids[(w+i)%len(ids)]
				if err := s.Update(ctx, id, &c, func(bool) error { c.Total++; return nil }); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	// The follower runs while the writers write: it waits (Wait) whenever
	// it has caught up.
	read := func(fl Follower, want int) map[string][]int64 {
		revs := map[string][]int64{}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		for got := 0; got < want; {
			e, err := fl.Next()
			if err != nil {
				t.Fatal(err)
			}
			if e == nil {
				if err := fl.Wait(wctx); err != nil {
					t.Fatalf("after %d of %d entries: %v", got, want, err)
				}
				continue
			}
			revs[e.ID] = append(revs[e.ID], e.Rev)
			got++
		}
		return revs
	}
	all := read(fromStart, len(ids)+writers*n)
	later := read(fromEnd, writers*n)
	for w := 0; w < writers; w++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for name, revs := range map[string]map[string][]int64{"from the start": all, "from the end": later} {
		for id, rs := range revs {
			for i := 1; i < len(rs); i++ {
				if rs[i] != rs[i-1]+1 {
					t.Fatalf("%s: %s's revisions arrive as %v", name, id, rs)
				}
			}
		}
	}
	if e, err := fromStart.Next(); err != nil || e != nil {
		t.Fatalf("more than was written: %+v, %v", e, err)
	}
	if rs := later[ids[0]]; len(rs) == 0 || rs[0] != 2 {
		t.Fatalf("the follower from the end started at revision %v of %s, want 2 (the first update)", rs, ids[0])
	}
}

// TestPostgresRestart stops the database under a store in use: writes fail
// as worth retrying (exit 75) while it is down, and succeed once it is back
// with nothing lost; a follower carries on across it.
func TestPostgresRestart(t *testing.T) {
	ctx := context.Background()
	c := pgtest.Start(t)
	be := testBackend{name: "postgres", url: c.NewDatabase(t)}
	s := openT(t, t.TempDir(), be.opts()...)
	r := newCounter(s)
	if err := s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	fl, err := s.FollowJournal(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	bump := func() error {
		var x counterRec
		return s.Update(ctx, r.ID, &x, func(bool) error { x.Total++; return nil })
	}
	if err := bump(); err != nil {
		t.Fatal(err)
	}
	c.Kill(t)
	err = bump()
	if err == nil || fault.Code(err) != fault.ExitTempFail {
		t.Fatalf("update with the database down: %v (exit %d), want exit %d", err, fault.Code(err), fault.ExitTempFail)
	}
	if _, err := s.List(testKind); fault.Code(err) != fault.ExitTempFail {
		t.Fatalf("list with the database down: %v, want exit %d", err, fault.ExitTempFail)
	}
	c.StartAgain(t)
	if err := bump(); err != nil {
		t.Fatalf("update after the restart: %v", err)
	}
	got := getCounter(t, s, r.ID)
	if got.Total != 2 || got.Rev != 3 {
		t.Fatalf("after the restart: total %d rev %d, want 2 and 3 (the failed update not applied)", got.Total, got.Rev)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var revs []int64
	for len(revs) < 2 {
		e, err := fl.Next()
		if err != nil {
			// The follower's own reads fail while the server restarts.
			if fault.Code(err) != fault.ExitTempFail {
				t.Fatal(err)
			}
			continue
		}
		if e == nil {
			if err := fl.Wait(wctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		revs = append(revs, e.Rev)
	}
	if revs[0] != 2 || revs[1] != 3 {
		t.Fatalf("followed revisions %v, want [2 3]", revs)
	}
	assertConsistent(t, s)
}

// workerLockHold takes a named lock, says so, and holds it until killed.
func workerLockHold() {
	ctx := context.Background()
	s, err := Open(ctx, mustEnv("TB_DIR"), sharedFromEnv(), WithLockTimeout(time.Second))
	if err != nil {
		fail("open: %v", err)
	}
	if _, err := s.Lock(ctx, "held"); err != nil {
		fail("lock: %v", err)
	}
	fmt.Println("locked")
	select {}
}

// TestPostgresLockFreedFromSilentHolder: a named lock of the shared
// database stays with a live holder however long it holds it, and is freed
// by the server once the holder goes silent (SIGSTOP: a host that died
// without closing its connections), after the lock timeout.
func TestPostgresLockFreedFromSilentHolder(t *testing.T) {
	ctx := context.Background()
	c := pgtest.Start(t, pgtest.WithoutFsync())
	be := testBackend{name: "postgres", url: c.NewDatabase(t)}
	dir := t.TempDir()
	s := openT(t, dir, be.opts()...)
	holder := workerCmd(t, "lockhold", append(be.env(), "TB_DIR="+dir)...)
	var stderr bytes.Buffer
	holder.Stderr = &stderr
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	holder.Stdin = nil
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "locked\n" {
		holder.Process.Kill()
		holder.Wait()
		t.Fatalf("the holder said %q: %s", line, stderr.Bytes())
	}
	try := func() bool {
		unlock, ok, err := s.TryLock(ctx, "held")
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			unlock()
		}
		return ok
	}
	// Three lock timeouts with the holder alive: never free.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if try() {
			t.Fatal("the lock was free while its holder lived")
		}
	}
	if err := holder.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Signal(syscall.SIGCONT)
	for end := time.Now().Add(30 * time.Second); !try(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the lock of a silent holder was never freed")
		}
	}
}

// TestPostgresCompact: compacting the journal table keeps each record's
// last row, so that a replay still gives the records, and drops the rest.
func TestPostgresCompact(t *testing.T) {
	ctx := context.Background()
	c := pgtest.Start(t, pgtest.WithoutFsync())
	s := openT(t, t.TempDir(), testBackend{url: c.NewDatabase(t)}.opts()...)
	var ids []string
	for range 3 {
		r := newCounter(s)
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
		for range 4 {
			var x counterRec
			if err := s.Update(ctx, r.ID, &x, func(bool) error { x.Total++; return nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Delete(ctx, ids[2]); err != nil {
		t.Fatal(err)
	}
	st, err := s.Compact(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 3 records × 5 puts + 1 delete: the last of each of the 3 is kept.
	if st.Kept != 3 || st.Dropped != 13 {
		t.Fatalf("compaction kept %d and dropped %d rows, want 3 and 13", st.Kept, st.Dropped)
	}
	assertConsistent(t, s)
	if got := getCounter(t, s, ids[0]); got.Total != 4 || got.Rev != 5 {
		t.Fatalf("after compaction: total %d rev %d", got.Total, got.Rev)
	}
}

// TestPostgresNotifyWakesFollower: a commit wakes a waiting follower by
// NOTIFY, well before the fallback poll (pgWaitAtMost) would.
func TestPostgresNotifyWakesFollower(t *testing.T) {
	ctx := context.Background()
	c := pgtest.Start(t, pgtest.WithoutFsync())
	s := openT(t, t.TempDir(), testBackend{url: c.NewDatabase(t)}.opts()...)
	fl, err := s.FollowJournal(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if err := s.Create(ctx, newCounter(s)); err != nil {
		t.Fatal(err)
	}
	// Half the fallback: only a notification returns Wait in time.
	wctx, cancel := context.WithTimeout(ctx, pgWaitAtMost/2)
	defer cancel()
	if err := fl.Wait(wctx); err != nil {
		t.Fatalf("the follower was not woken by the commit: %v", err)
	}
	if e, err := fl.Next(); err != nil || e == nil {
		t.Fatalf("after the wake-up: %+v, %v", e, err)
	}
}

// TestPostgresKeysAreExact: on PostgreSQL a record is found only under the
// keys of its current version (a cycle that ended leaves "open").
func TestPostgresKeysAreExact(t *testing.T) {
	ctx := context.Background()
	c := pgtest.Start(t, pgtest.WithoutFsync())
	s := openT(t, t.TempDir(), testBackend{url: c.NewDatabase(t)}.opts()...)
	cy := &records.Cycle{State: records.CyclePending, Plan: "plan_01JD00000000000000000000P1", Sample: "aa"}
	records.Init(cy, records.KindCycle, s.Now())
	if err := s.Create(ctx, cy); err != nil {
		t.Fatal(err)
	}
	open := func() []string {
		ids, err := s.ByKey(records.KindCycle, records.KeyOpen, "1")
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	if got := open(); len(got) != 1 || got[0] != cy.ID {
		t.Fatalf("open cycles %v, want [%s]", got, cy.ID)
	}
	var n records.Cycle
	if err := s.Update(ctx, cy.ID, &n, func(bool) error { n.State = records.CycleCompleted; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := open(); len(got) != 0 {
		t.Fatalf("open cycles %v after the cycle ended, want none", got)
	}
	if got, _ := s.ByKey(records.KindCycle, records.KeySample, "aa"); len(got) != 1 {
		t.Fatalf("the cycle lost a key it kept: %v", got)
	}
}
