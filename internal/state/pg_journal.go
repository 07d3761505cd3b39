package state

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The journal table's order without a lock that every commit takes in turn.
//
// Each entry carries its transaction's xid (xid8: never wraps). The oldest
// transaction still running, pg_snapshot_xmin(pg_current_snapshot()), is a
// watermark: every transaction with a smaller xid has ended, so its entries
// are committed (or gone with it) and no entry with a smaller xid will ever
// appear. A follower reads the journal window by window, each window the
// entries whose xid lies between the last watermark and the current one,
// in seq order (seq is taken from a sequence as the entry is inserted); it
// never skips an entry committed late, it only waits for it.
//
// Each record's revisions arrive in their order because a transaction gets
// its xid with its first write, and every write comes after the record
// locks the transaction takes (commitLocked, create, Delete,
// pgBatch.flush): the transaction writing a record's next revision got its
// xid after the one writing the previous revision committed, so its xid is
// the larger one and its seq too. A transaction that holds a lock for long
// writes nothing (named locks, lockNamed), so it has no xid and does not
// hold the watermark back.
//
// pgJournalSchema adds the xid to a journal made before it: entries written
// before count as committed long ago (xid 0); new ones get their writer's.
const pgJournalSchema = `
ALTER TABLE talkbox_journal ADD COLUMN IF NOT EXISTS xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE talkbox_journal ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
CREATE INDEX IF NOT EXISTS talkbox_journal_xid ON talkbox_journal (xid, seq);
`

// pgSchemaCurrent tells whether the database has every table and column
// this store writes: the fleet's keys' marker and the journal's xids.
const pgSchemaCurrent = `SELECT to_regclass('talkbox_fleet_keys') IS NOT NULL AND EXISTS (SELECT 1 FROM pg_attribute
	WHERE attrelid = to_regclass('talkbox_journal') AND attname = 'xid' AND NOT attisdropped)`

// journal appends entries in the writer's transaction; journaled tells
// the followers once it has committed.
func (s *pgStore) journal(ctx context.Context, tx pgx.Tx, es []entry) error {
	_, err := tx.Exec(ctx, pgJournalInsert, journalArgs(es)...)
	return err
}

const pgJournalInsert = `INSERT INTO talkbox_journal (at, op, kind, id, rev, data)
	SELECT at, op, kind, id, rev, data
	FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bytea[])
		WITH ORDINALITY AS e(at, op, kind, id, rev, data, n)
	ORDER BY n`

func journalArgs(es []entry) []any {
	n := len(es)
	ats, ops, kinds, ids := make([]time.Time, n), make([]string, n), make([]string, n), make([]string, n)
	revs, data := make([]int64, n), make([][]byte, n)
	for i, e := range es {
		ats[i], ops[i], kinds[i], ids[i], revs[i] = e.At, e.Op, e.Kind, e.ID, e.Rev
		if e.Op == opPut {
			data[i] = e.Record
		}
	}
	return []any{ats, ops, kinds, ids, revs, data}
}

// journaled follows the commit of n journal entries: it wakes the
// followers, and the fleet's workers when fleet says the commit brought
// them work (queueFleetKeys), and compacts the journal now and then.
// The notifications go after the commit, in a statement of their own that
// writes nothing, because PostgreSQL commits the transactions that NOTIFY
// one at a time (under a lock held through the commit's flush to disk): a
// NOTIFY inside every write would make writers take turns again. A
// follower that is not woken (this process died between the commit and
// the notification, or the notification failed) reads the entries at its
// next poll (pgWaitAtMost), a worker at its next heartbeat.
func (s *pgStore) journaled(ctx context.Context, n int, fleet bool) {
	if n == 0 {
		return
	}
	b := &pgx.Batch{}
	if fleet {
		queueNotify(b, wakeFleet)
	} else {
		queueNotify(b, wakeFollowers)
	}
	s.pool.SendBatch(ctx, b).Close()
	s.compactNow(ctx, n)
}

// fleetWake says whom a commit notifies (queueNotify): the journal's
// followers always, the fleet's workers when it changed their work.
type fleetWake uint8

const (
	wakeFollowers fleetWake = iota
	wakeFleet
	// wakeIfKeysChanged: the fleet too if the write's fleet-keys statement
	// (queueFleetKeys) added a key that brings work, as it recorded in the session's
	// setting pgKeysChanged. Set by a session-wide set_config in the
	// transaction, the setting outlives the COMMIT (and goes with a
	// rollback); every write that reads it set it first. Read where it
	// was never set (a pooler that moved the session), it wakes only the
	// followers: the workers' next heartbeat makes up for it.
	wakeIfKeysChanged
)

// pgKeysChanged is the session setting of wakeIfKeysChanged.
const pgKeysChanged = "talkbox.fleet_keys_changed"

// queueNotify queues the notifications of a commit (journaled): in a
// pipeline, after the COMMIT of the transaction they follow.
//
// PostgreSQL signals every backend that listens in the database at each
// notification, whatever channel it listens to, and each one signalled
// wakes and reads the notification queue: a fleet of a thousand workers
// has a thousand listening backends, so that a notification on every
// commit made every commit cost a thousand wake-ups on the server. The
// journal's channel is notified only while a follower holds the follower
// lock (followerLock): a commit that can take that lock's shared side at
// once has no follower to wake.
func queueNotify(b *pgx.Batch, wake fleetWake) {
	followers := `CASE WHEN pg_try_advisory_xact_lock_shared($2) THEN NULL ELSE pg_notify($1, '') END`
	switch wake {
	case wakeFleet:
		b.Queue(`SELECT `+followers+`, pg_notify($3, '')`, pgNotifyChannel, followerLock(), pgFleetChannel)
	case wakeIfKeysChanged:
		b.Queue(`SELECT `+followers+`, CASE WHEN current_setting('`+pgKeysChanged+`', true) = 'true' THEN pg_notify($3, '') END`,
			pgNotifyChannel, followerLock(), pgFleetChannel)
	default:
		b.Queue(`SELECT `+followers, pgNotifyChannel, followerLock())
	}
}

// followerLock is the advisory lock a follower of the journal holds,
// exclusive, on its listening connection, for as long as it listens:
// while one holds it, commits notify the journal's channel (every
// follower listening to it hears them). One follower holds it at a time;
// another that could not take it tries again at each of its waits, and
// meanwhile reads what is committed at least every pgWaitAtMost, as it
// does after a lost notification. A follower that dies lets go of it with
// its connection.
func followerLock() int64 { return lockKey("journal", "follower") }

// pgFollower reads the journal table window by window (see above), and
// waits for the next commit on a connection that LISTENs to the channel
// every journal append notifies.
type pgFollower struct {
	s      *pgStore
	listen *pgxpool.Conn
	// holds: the listening connection holds followerLock.
	holds bool
	// from is the last watermark: every entry whose xid is below it has
	// been read.
	from uint64
	// upto ends the window being read (0: none open); after is the seq of
	// the last entry read in it.
	upto  uint64
	after int64
	// before is the snapshot a follower from the journal's end started at
	// (its text; "" for one from the start): the entries committed in it
	// are not followed. It matters only to xids below beforeEnd, its xmax.
	before    string
	beforeEnd uint64
	buf       []JournalEntry
}

// pgFollowBatch is how many entries one query reads.
const pgFollowBatch = 512

// pgWaitAtMost bounds a wait for a notification, in case one was lost with
// a connection, and is how long an entry waits behind a transaction with an
// xid that writes no journal entry (nothing notifies when it ends).
const pgWaitAtMost = 2 * time.Second

func (s *pgStore) follow(ctx context.Context, fromStart bool) (Follower, error) {
	fl := &pgFollower{s: s}
	// Listen before taking the snapshot, so that no commit falls between
	// the two unnoticed.
	if err := fl.relisten(ctx); err != nil {
		return nil, err
	}
	if !fromStart {
		if err := s.pool.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&fl.before); err != nil {
			fl.Close()
			return nil, pgErr(err)
		}
		xmin, xmax, err := snapshotBounds(fl.before)
		if err != nil {
			fl.Close()
			return nil, err
		}
		fl.from, fl.beforeEnd = xmin, xmax
	}
	return fl, nil
}

// snapshotBounds reads xmin and xmax from a pg_snapshot's text, XMIN:XMAX:XIPS.
func snapshotBounds(snap string) (xmin, xmax uint64, err error) {
	f := strings.SplitN(snap, ":", 3)
	if len(f) == 3 {
		if xmin, err = strconv.ParseUint(f[0], 10, 64); err == nil {
			if xmax, err = strconv.ParseUint(f[1], 10, 64); err == nil {
				return xmin, xmax, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("PostgreSQL snapshot %q: not XMIN:XMAX:XIPS", snap)
}

func (fl *pgFollower) relisten(ctx context.Context) error {
	fl.unlisten()
	c, err := fl.s.pool.Acquire(ctx)
	if err != nil {
		return pgErr(err)
	}
	if _, err := c.Exec(ctx, `LISTEN `+pgNotifyChannel); err != nil {
		c.Release()
		return pgErr(err)
	}
	fl.listen = c
	// Listening first: a commit that finds the lock held notifies a
	// connection that already listens.
	return fl.holdLock(ctx)
}

// holdLock takes followerLock on the listening connection, if no other
// follower holds it.
func (fl *pgFollower) holdLock(ctx context.Context) error {
	if fl.holds {
		return nil
	}
	err := fl.listen.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, followerLock()).Scan(&fl.holds)
	return pgErr(err)
}

// unlisten gives the listening connection back to the pool, listening to
// nothing and holding no lock.
func (fl *pgFollower) unlisten() {
	if fl.listen == nil {
		return
	}
	if !fl.listen.Conn().IsClosed() {
		fl.listen.Conn().Exec(context.Background(), `UNLISTEN *; SELECT pg_advisory_unlock_all()`)
	}
	fl.listen.Release()
	fl.listen, fl.holds = nil, false
}

func (fl *pgFollower) Next() (*JournalEntry, error) {
	for opened := false; len(fl.buf) == 0; {
		if fl.upto == 0 {
			if opened {
				return nil, nil // caught up with the last window
			}
			if err := fl.open(); err != nil {
				return nil, err
			}
			opened = true
		}
		if err := fl.read(); err != nil {
			return nil, err
		}
	}
	e := fl.buf[0]
	fl.buf = fl.buf[1:]
	return &e, nil
}

// open starts a window at the current watermark.
func (fl *pgFollower) open() error {
	var upto string
	err := fl.s.pool.QueryRow(context.Background(), `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`).Scan(&upto)
	if err != nil {
		return pgErr(err)
	}
	if fl.upto, err = strconv.ParseUint(upto, 10, 64); err != nil {
		return fmt.Errorf("PostgreSQL xmin %q: %w", upto, err)
	}
	fl.after = 0
	return nil
}

// read reads the window's next entries, and closes the window when none
// are left in it.
func (fl *pgFollower) read() error {
	q := `SELECT seq, at, op, kind, id, rev, data FROM talkbox_journal
		WHERE xid >= $1::text::xid8 AND xid < $2::text::xid8 AND seq > $3`
	args := []any{strconv.FormatUint(fl.from, 10), strconv.FormatUint(fl.upto, 10), fl.after}
	if fl.before != "" && fl.from < fl.beforeEnd {
		q += ` AND NOT pg_visible_in_snapshot(xid, $5::text::pg_snapshot)`
		args = append(args, pgFollowBatch, fl.before)
	} else {
		args = append(args, pgFollowBatch)
	}
	rows, err := fl.s.pool.Query(context.Background(), q+` ORDER BY seq LIMIT $4`, args...)
	if err != nil {
		return pgErr(err)
	}
	var (
		got  []JournalEntry
		e    JournalEntry
		seq  int64
		data []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&seq, &e.At, &e.Op, &e.Kind, &e.ID, &e.Rev, &data}, func() error {
		e.At = e.At.UTC()
		e.Record = append([]byte(nil), data...)
		got = append(got, e)
		return nil
	})
	if err != nil {
		return pgErr(err)
	}
	fl.buf = got
	if len(got) > 0 {
		fl.after = seq
	}
	if len(got) < pgFollowBatch {
		fl.from, fl.upto = fl.upto, 0
	}
	return nil
}

func (fl *pgFollower) Wait(ctx context.Context) error {
	if fl.listen == nil {
		// Listening was lost with the server; whatever was committed
		// since is read by the next Next.
		return fl.relisten(ctx)
	}
	wctx, cancel := context.WithTimeout(ctx, pgWaitAtMost)
	defer cancel()
	_, err := fl.listen.Conn().WaitForNotification(wctx)
	switch {
	case err == nil, ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		// The follower that held the lock may have gone.
		if err := fl.holdLock(ctx); err != nil && ctx.Err() == nil {
			fl.listen.Conn().Close(context.Background())
			return fl.relisten(ctx)
		}
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	// The connection is gone (the server restarted): listen on a new one,
	// and read again whatever was committed meanwhile.
	fl.listen.Conn().Close(context.Background())
	return fl.relisten(ctx)
}

func (fl *pgFollower) Close() error {
	fl.unlisten()
	return nil
}
