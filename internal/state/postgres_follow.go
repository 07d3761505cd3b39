package state

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgFollower reads the journal table past the last seq it returned, and
// waits for the next commit on a connection that LISTENs to the channel
// every journal append notifies.
type pgFollower struct {
	s      *pgStore
	listen *pgxpool.Conn
	last   int64
	buf    []JournalEntry
}

// pgFollowBatch is how many entries one query reads.
const pgFollowBatch = 512

// pgWaitAtMost bounds a wait for a notification, in case one was lost with
// a connection.
const pgWaitAtMost = 2 * time.Second

func (s *pgStore) follow(ctx context.Context, fromStart bool) (Follower, error) {
	fl := &pgFollower{s: s}
	// Listen before reading where the journal ends, so that no commit
	// falls between the two unnoticed.
	if err := fl.relisten(ctx); err != nil {
		return nil, err
	}
	if !fromStart {
		if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM talkbox_journal`).Scan(&fl.last); err != nil {
			fl.Close()
			return nil, pgErr(err)
		}
	}
	return fl, nil
}

func (fl *pgFollower) relisten(ctx context.Context) error {
	if fl.listen != nil {
		fl.listen.Release()
		fl.listen = nil
	}
	c, err := fl.s.pool.Acquire(ctx)
	if err != nil {
		return pgErr(err)
	}
	if _, err := c.Exec(ctx, `LISTEN `+pgNotifyChannel); err != nil {
		c.Release()
		return pgErr(err)
	}
	fl.listen = c
	return nil
}

func (fl *pgFollower) Next() (*JournalEntry, error) {
	if len(fl.buf) == 0 {
		rows, err := fl.s.pool.Query(context.Background(), `SELECT seq, at, op, kind, id, rev, data FROM talkbox_journal
			WHERE seq > $1 ORDER BY seq LIMIT $2`, fl.last, pgFollowBatch)
		if err != nil {
			return nil, pgErr(err)
		}
		var e JournalEntry
		var seq int64
		var data []byte
		_, err = pgx.ForEachRow(rows, []any{&seq, &e.At, &e.Op, &e.Kind, &e.ID, &e.Rev, &data}, func() error {
			e.At = e.At.UTC()
			e.Record = append([]byte(nil), data...)
			fl.buf = append(fl.buf, e)
			fl.last = seq
			return nil
		})
		if err != nil {
			fl.buf = nil
			return nil, pgErr(err)
		}
		if len(fl.buf) == 0 {
			return nil, nil
		}
	}
	e := fl.buf[0]
	fl.buf = fl.buf[1:]
	return &e, nil
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
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		return nil
	}
	// The connection is gone (the server restarted): listen on a new one,
	// and read again whatever was committed meanwhile.
	fl.listen.Conn().Close(context.Background())
	return fl.relisten(ctx)
}

func (fl *pgFollower) Close() error {
	if fl.listen != nil {
		fl.listen.Conn().Exec(context.Background(), `UNLISTEN *`)
		fl.listen.Release()
		fl.listen = nil
	}
	return nil
}
