package state

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// TestPostgresJournalOrder: writers commit to the journal table with no
// lock that they take in turn, and followers still see every entry exactly
// once, each record's in revision order, also an entry whose transaction
// took its seq first and commits last (held open by the test, between its
// statements and its commit, while other writers commit dozens of entries
// past it and the followers read). A follower that read past the highest
// committed seq would skip that entry.
func TestPostgresJournalOrder(t *testing.T) {
	ctx := context.Background()
	c := pgtest.Start(t, pgtest.WithoutFsync())

	t.Run("late commit", func(t *testing.T) {
		url := c.NewDatabase(t)
		s := openT(t, t.TempDir(), WithShared(url))
		defer s.Close()
		var ids []string
		for range 5 {
			r := newCounter(s)
			if err := s.Create(ctx, r); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, r.ID)
		}
		late, shared := ids[0], ids[1:]
		fromStart, err := s.FollowJournal(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		defer fromStart.Close()

		// The late writer writes as the store does (commitLocked: the
		// record's lock, then its row and journal entry in one statement),
		// on a connection of the test's, and stops before its COMMIT: the
		// store sends a write's COMMIT in the round trip of its statements,
		// so only another connection can hold one open between the two.
		lateConn := pgtest.Connect(t, url)
		var lateRec counterRec
		if err := s.Get(late, &lateRec); err != nil {
			t.Fatal(err)
		}
		lateRec.Total++
		lateData, err := stampRecord(late, stored{Rev: lateRec.Rev, CreatedAt: lateRec.CreatedAt}, s.Now(), &lateRec)
		if err != nil {
			t.Fatal(err)
		}
		lateTx, err := lateConn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer lateTx.Rollback(ctx)
		if _, err := lateTx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey("record", late)); err != nil {
			t.Fatal(err)
		}
		tag, err := lateTx.Exec(ctx, `WITH r AS (UPDATE talkbox_records SET rev = $3, data = $4 WHERE id = $1 AND rev = $2 RETURNING id, kind, rev, data)
			`+pgJournalPut, late, lateRec.Rev-1, lateRec.Rev, lateData, lateRec.UpdatedAt, opPut)
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("late write: %v, %d journal entries, want 1", err, tag.RowsAffected())
		}
		// A follower from the end starts while the late entry is in
		// flight: it must see it, and none of the entries before it.
		fromEnd, err := s.FollowJournal(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		defer fromEnd.Close()

		const writers, n = 8, 10
		errs := make(chan error, writers)
		for w := range writers {
			go func() {
				var r counterRec
				for i := range n {
					if err := s.Update(ctx, shared[(w+i)%len(shared)], &r, func(bool) error { r.Total++; return nil }); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range writers {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		// The followers read all they can now, while the late entry is
		// still uncommitted.
		seen := map[Follower]map[string][]int64{fromStart: {}, fromEnd: {}}
		drain := func(fl Follower) {
			for {
				e, err := fl.Next()
				if err != nil {
					t.Fatal(err)
				}
				if e == nil {
					return
				}
				seen[fl][e.ID] = append(seen[fl][e.ID], e.Rev)
			}
		}
		drain(fromStart)
		drain(fromEnd)
		if err := lateTx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		// A last entry, committed after the late one: once a follower has
		// it, it has had every entry before it.
		sentinel := newCounter(s)
		if err := s.Create(ctx, sentinel); err != nil {
			t.Fatal(err)
		}
		for fl := range seen {
			for len(seen[fl][sentinel.ID]) == 0 {
				drain(fl)
				if len(seen[fl][sentinel.ID]) == 0 {
					if err := fl.Wait(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		span := func(from, to int64) []int64 {
			var revs []int64
			for r := from; r <= to; r++ {
				revs = append(revs, r)
			}
			return revs
		}
		total := map[string]int64{late: 2, sentinel.ID: 1}
		for i := range writers * n {
			total[shared[i%len(shared)]]++
		}
		for _, id := range shared {
			total[id]++ // its Create
		}
		for name, fl := range map[string]Follower{"from the start": fromStart, "from the end": fromEnd} {
			for id, last := range total {
				first := int64(1)
				if fl == fromEnd && id != sentinel.ID {
					first = 2 // the follower started after each Create
				}
				if got, want := seen[fl][id], span(first, last); !slices.Equal(got, want) {
					t.Errorf("%s: %s's revisions arrived as %v, want %v", name, id, got, want)
				}
			}
		}
	})

	t.Run("named lock", func(t *testing.T) {
		// A named lock is held for as long as a cycle runs: it must not
		// hold back what a follower may read.
		s := openT(t, t.TempDir(), WithShared(c.NewDatabase(t)))
		defer s.Close()
		unlock, err := s.Lock(ctx, "cycle-x")
		if err != nil {
			t.Fatal(err)
		}
		defer unlock()
		fl, err := s.FollowJournal(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		defer fl.Close()
		r := newCounter(s)
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		e, err := fl.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e == nil || e.ID != r.ID {
			t.Fatalf("with a named lock held, a committed entry is not readable: got %+v, want %s", e, r.ID)
		}
	})

	t.Run("journal from before the xids", func(t *testing.T) {
		url := c.NewDatabase(t)
		s := openT(t, t.TempDir(), WithShared(url))
		r := newCounter(s)
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		s.Close()
		conn := pgtest.Connect(t, url)
		if _, err := conn.Exec(ctx, `ALTER TABLE talkbox_journal DROP COLUMN xid`); err != nil {
			t.Fatal(err)
		}
		s = openT(t, t.TempDir(), WithShared(url))
		defer s.Close()
		fl, err := s.FollowJournal(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		defer fl.Close()
		var x counterRec
		if err := s.Update(ctx, r.ID, &x, func(bool) error { x.Total++; return nil }); err != nil {
			t.Fatal(err)
		}
		var revs []int64
		for len(revs) < 2 {
			e, err := fl.Next()
			if err != nil {
				t.Fatal(err)
			}
			if e == nil {
				if err := fl.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				continue
			}
			revs = append(revs, e.Rev)
		}
		if !slices.Equal(revs, []int64{1, 2}) {
			t.Fatalf("revisions across the migration: %v, want [1 2]", revs)
		}
	})
}

// TestPostgresJournalNotifiesOnlyFollowers: PostgreSQL signals every
// backend listening in the database at each notification, whatever its
// channel (a fleet's thousand workers each listen), so a commit notifies
// the journal's channel only while a follower follows: a listener that is
// not a follower hears none of the commits made with no follower, hears
// those made while one follows, and none again once it closed; a second
// follower takes over the follower lock at its next wait once the first
// closed.
func TestPostgresJournalNotifiesOnlyFollowers(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Start(t, pgtest.WithoutFsync()).NewDatabase(t)
	s := openT(t, t.TempDir(), WithShared(url))
	defer s.Close()
	listen := pgtest.Connect(t, url)
	if _, err := listen.Exec(ctx, `LISTEN `+pgNotifyChannel); err != nil {
		t.Fatal(err)
	}
	// notified tells whether a commit of the store notified the channel:
	// the commit's notification comes before the test's marker.
	notified := func() bool {
		t.Helper()
		if err := s.Create(ctx, newCounter(s)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.rec.(*pgStore).pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, pgNotifyChannel); err != nil {
			t.Fatal(err)
		}
		woke := false
		for {
			wctx, cancel := context.WithTimeout(ctx, time.Minute) // a hang guard
			n, err := listen.WaitForNotification(wctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if n.Payload == "marker" {
				return woke
			}
			woke = true
		}
	}
	if notified() {
		t.Errorf("a commit with no follower notified the journal's channel")
	}
	first, err := s.FollowJournal(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.FollowJournal(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if !notified() {
		t.Errorf("a commit while a follower follows did not notify the journal's channel")
	}
	first.Close()
	// Woken by nothing (the lock's holder closed), the wait ends at
	// pgWaitAtMost, and takes the lock.
	for drain := true; drain; {
		e, err := second.Next()
		if err != nil {
			t.Fatal(err)
		}
		drain = e != nil
	}
	if err := second.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !notified() {
		t.Errorf("a commit after the second follower's wait did not notify the journal's channel")
	}
	second.Close()
	if notified() {
		t.Errorf("a commit once every follower closed notified the journal's channel")
	}
}
