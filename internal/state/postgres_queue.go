package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// The PostgreSQL store keeps two keys of its own on each open cycle, beside
// the record's IndexKeys, exact as every key there is: a queued cycle has
// keyQueued = "PLATFORM/PINNED_TO" (its plan's platform, read when the
// cycle is written), any other open one keyActive = its Host (the fleet
// host whose runner drove it last, "" before one has; a database written
// before may still say "1"). A claim reads the first rows of the key's
// index for each value a host may take; a worker's look, the active
// cycles of its own host (and of none) from one value of the other.
const (
	keyQueued = "queued"
	keyActive = "active"
)

// pgFleetSchema marks a database whose open cycles have their fleet keys:
// one made before them gets them once, when a newer store first opens it.
const pgFleetSchema = `CREATE TABLE IF NOT EXISTS talkbox_fleet_keys ();`

type pgQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// fleetKeys are a record's keys of the fleet's queue; platforms caches the
// plans' platforms a batch has read.
func fleetKeys(ctx context.Context, q pgQuerier, r records.Record, platforms map[string]string) ([]records.IndexKey, error) {
	c, ok := r.(*records.Cycle)
	if !ok || records.CycleTerminal(c.State) {
		return nil, nil
	}
	if !queuedCycle(c) {
		return []records.IndexKey{{Field: keyActive, Value: c.Host}}, nil
	}
	plat, ok := platforms[c.Plan]
	if !ok {
		var data []byte
		err := q.QueryRow(ctx, `SELECT data FROM talkbox_records WHERE id = $1`, c.Plan).Scan(&data)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// The plan is gone: any host may try, and the cycle fails naming it.
		case err != nil:
			return nil, err
		default:
			var p records.Plan
			if err := json.Unmarshal(data, &p); err != nil {
				return nil, err
			}
			plat = p.Image.Platform
		}
		if platforms != nil {
			platforms[c.Plan] = plat
		}
	}
	return []records.IndexKey{{Field: keyQueued, Value: plat + "/" + c.PinnedTo}}, nil
}

// queueFleetKeys queues into b the statement that makes a record's fleet
// keys those of its new version, and tells whether the fleet's watchers
// must be woken when the write commits: only when the write may bring
// work to a worker that found none (newWork, capacityLost), never for a
// cycle that leaves the queue, is driven or ends, nor for a worker taking
// a cycle or freeing a slot: each wake makes every free worker of the
// fleet look, and a claim that woke the fleet made a fleet's claims cost
// as many looks as it has free workers. The statement deletes the stored
// keys the new version lacks and adds those it lacks, so that keys which
// stay are not rewritten, and records whether it added one that brings
// work, for the notification after the COMMIT (wakeIfKeysChanged): the
// COMMIT is sent before its result is back. A queued cycle's key, its
// plan's platform, is read by the statement itself (pgPlanPlatform), not
// in a round trip of its own while the record's lock is held.
func queueFleetKeys(ctx context.Context, q pgQuerier, b *pgx.Batch, kind, id string, replaces bool, was, r records.Record) (fleetWake, error) {
	switch kind {
	case records.KindWorker:
		if capacityLost(replaces, was, r) {
			return wakeFleet, nil
		}
		return wakeFollowers, nil
	case records.KindCycle:
	default:
		return wakeFollowers, nil
	}
	if c, ok := r.(*records.Cycle); ok && sameFleetKeys(was, c) {
		// Most of a cycle's writes (its steps, its timings) leave them.
		return wakeFollowers, nil
	}
	// Its keys are those of a queued cycle's queue ($5: the plan, $6: the
	// pin), or those fleetKeys gives without a read.
	var (
		newKeys = `SELECT $3::text AS field, ` + pgPlanPlatform + ` || '/' || $6::text AS value`
		args    = []any{kind, id, keyQueued, keyActive}
	)
	if c, ok := r.(*records.Cycle); ok && !records.CycleTerminal(c.State) && queuedCycle(c) {
		args = append(args, c.Plan, c.PinnedTo)
	} else {
		keys, err := fleetKeys(ctx, q, r, nil)
		if err != nil {
			return wakeFollowers, err
		}
		fields, values := splitKeys(keys)
		newKeys = `SELECT * FROM unnest($5::text[], $6::text[]) AS k(field, value)`
		args = append(args, fields, values)
	}
	// The added keys that bring work are newWork's.
	b.Queue(`WITH new AS (`+newKeys+`),
		gone AS (DELETE FROM talkbox_keys WHERE kind = $1 AND id = $2 AND field IN ($3, $4)
			AND (field, value) NOT IN (SELECT field, value FROM new)),
		added AS (INSERT INTO talkbox_keys (kind, field, value, id) SELECT $1, field, value, $2 FROM new
			ON CONFLICT DO NOTHING RETURNING field, value)
		SELECT set_config('`+pgKeysChanged+`', EXISTS (SELECT 1 FROM added WHERE field = $3 OR value = '')::text, false)`,
		args...)
	return wakeIfKeysChanged, nil
}

// sameFleetKeys tells, without a read, whether a cycle's new version c
// has the fleet keys of the version it replaces, was (nil: none, or one
// that does not decode): both ended (none), both active on the same
// host, or both queued for the same plan and pin (a plan's platform does
// not change). A cycle of a database whose active key says "1" keeps it
// until a write changes its keys; the sweeps, which read every active
// cycle, find it meanwhile.
func sameFleetKeys(was records.Record, c *records.Cycle) bool {
	old, ok := was.(*records.Cycle)
	if !ok {
		return false
	}
	oldEnded, newEnded := records.CycleTerminal(old.State), records.CycleTerminal(c.State)
	if oldEnded || newEnded {
		return oldEnded && newEnded
	}
	oldQueued, newQueued := queuedCycle(old), queuedCycle(c)
	switch {
	case oldQueued != newQueued:
		return false
	case newQueued:
		return old.Plan == c.Plan && old.PinnedTo == c.PinnedTo
	default:
		return old.Host == c.Host
	}
}

// newWork tells whether a cycle's new fleet keys bring a worker work it
// did not have: the cycle is queued (newly, or again), or it is active on
// no host yet (submitted onto a lease: its lease's host takes it).
func newWork(keys []records.IndexKey) bool {
	return slices.ContainsFunc(keys, func(k records.IndexKey) bool {
		return k.Field == keyQueued || k.Field == keyActive && k.Value == ""
	})
}

// pgPlanPlatform is the platform of the plan $5 as fleetKeys reads it:
// "" when the plan is gone (any host may try, and the cycle fails naming
// it) or says none.
const pgPlanPlatform = `coalesce((SELECT convert_from(data, 'UTF8')::jsonb #>> '{image,platform}' FROM talkbox_records WHERE id = $5::text), '')`

// capacityLost tells whether a worker's new record may leave cycles to
// other workers: it stopped, it has fewer slots (or was paused), or what
// its host boots changed. A cycle another worker left to this one (placed
// on the least loaded, native first: Worker.yields) is taken by that one
// at its next look, which a worker whose slots fill does not wake.
func capacityLost(replaces bool, was, r records.Record) bool {
	w, ok := r.(*records.Worker)
	if !ok || !replaces {
		return false
	}
	old, ok := was.(*records.Worker)
	if !ok {
		return true // a stored version that does not decode
	}
	return w.Stopped && !old.Stopped || w.Slots < old.Slots ||
		!slices.Equal(old.Platforms, w.Platforms) || !slices.Equal(old.Native, w.Native)
}

// pgFleetChannel is where the commits that change a fleet's work notify
// its workers (WatchFleet), after they commit (journaled).
const pgFleetChannel = "talkbox_fleet"

// pgCancelChannel is where the commit that flags a cycle for cancel
// notifies the workers of the host that drives it (WatchFleet), after it
// commits (sendCommit): a channel per host, named by a hash of the host
// (a channel name is at most 63 bytes), so that the rest of the fleet's
// workers are not woken by it.
func pgCancelChannel(host string) string {
	return fmt.Sprintf("talkbox_cancel_%016x", uint64(lockKey("cancel", host)))
}

func (s *pgStore) listenFleet(ctx context.Context, host string) (*pgxpool.Conn, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, pgErr(err)
	}
	b := &pgx.Batch{}
	b.Queue(`LISTEN ` + pgFleetChannel)
	b.Queue(`LISTEN ` + pgx.Identifier{pgCancelChannel(host)}.Sanitize())
	if err := c.SendBatch(ctx, b).Close(); err != nil {
		c.Release()
		return nil, pgErr(err)
	}
	return c, nil
}

// watchFleet listens on a connection of its own; one lost (the server
// restarted) is replaced, with a signal on both channels for what was
// committed meanwhile.
func (s *pgStore) watchFleet(ctx context.Context, host string, work, cancels chan struct{}) error {
	conn, err := s.listenFleet(ctx, host)
	if err != nil {
		return err
	}
	cancelChannel := pgCancelChannel(host)
	go func() {
		defer close(work)
		defer close(cancels)
		for {
			if conn == nil {
				sleepOrDone(ctx, time.Second)
				if ctx.Err() != nil {
					return
				}
				if conn, err = s.listenFleet(ctx, host); err != nil {
					continue
				}
				signal(work)
				signal(cancels)
			}
			n, err := conn.Conn().WaitForNotification(ctx)
			if ctx.Err() != nil {
				conn.Conn().Exec(context.Background(), `UNLISTEN *`)
				conn.Release()
				return
			}
			if err != nil {
				conn.Conn().Close(context.Background())
				conn.Release()
				conn = nil
				continue
			}
			if n.Channel == cancelChannel {
				signal(cancels)
			} else {
				signal(work)
			}
		}
	}()
	return nil
}

// backfillFleetKeys gives the open cycles of a database made before the
// fleet keys theirs.
func backfillFleetKeys(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, `SELECT r.data FROM talkbox_keys k JOIN talkbox_records r ON r.id = k.id
		WHERE k.kind = $1 AND k.field = $2 AND k.value = '1'`, records.KindCycle, records.KeyOpen)
	if err != nil {
		return err
	}
	var open []*records.Cycle
	var data []byte
	if _, err := pgx.ForEachRow(rows, []any{&data}, func() error {
		var c records.Cycle
		if records.Unmarshal(data, &c) == nil { // Check reports one that does not decode
			open = append(open, &c)
		}
		return nil
	}); err != nil {
		return err
	}
	platforms := map[string]string{}
	for _, c := range open {
		keys, err := fleetKeys(ctx, tx, c, platforms)
		if err != nil {
			return err
		}
		if err := insertKeys(ctx, tx, records.KindCycle, c.ID, keys); err != nil {
			return err
		}
	}
	return nil
}

// errEnough stops reading rows once a claim has what it asked for.
var errEnough = errors.New("enough rows")

func (s *pgStore) queued(ctx context.Context, f QueueFilter, n int) ([][]byte, error) {
	var out [][]byte
	var data []byte
	if f.Platforms != nil && f.Host != "" {
		// One ordered index scan per key value the host may take, each
		// stopping after n rows: the cost is n per value, whatever the
		// queue's length.
		var values []string
		plats := f.Platforms
		if len(plats) > 0 {
			plats = append(slices.Clone(plats), "")
		}
		for _, p := range plats {
			values = append(values, p+"/", p+"/"+f.Host)
		}
		err := s.lockingRead(ctx, func(rows pgx.Rows) error {
			_, err := pgx.ForEachRow(rows, []any{&data}, func() error {
				out = append(out, append([]byte(nil), data...))
				return nil
			})
			return err
		}, `SELECT r.data FROM unnest($1::text[]) AS v(value)
			CROSS JOIN LATERAL (SELECT id FROM talkbox_keys
				WHERE kind = $2 AND field = $3 AND value = v.value
				ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED) q
			JOIN talkbox_records r ON r.id = q.id
			ORDER BY q.id LIMIT $4`, values, records.KindCycle, keyQueued, n)
		return out, err
	}
	if f.Platforms == nil && f.Host == "" {
		// Every queued cycle (a look at what no host takes): the first n,
		// and only those locked for the statement. Read as below, every
		// row of the queue was locked until the last was sorted, and the
		// writes taking cycles out of the queue waited for it.
		err := s.lockingRead(ctx, func(rows pgx.Rows) error {
			_, err := pgx.ForEachRow(rows, []any{&data}, func() error {
				out = append(out, append([]byte(nil), data...))
				return nil
			})
			return err
		}, pgQueuedFirst, records.KindCycle, keyQueued, n)
		return out, err
	}
	// Any platform, or any pin: filtered as the queue is read, oldest
	// first (a sort of the whole queue: for a worker that does not say
	// what it boots).
	var value string
	err := s.lockingRead(ctx, func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&data, &value}, func() error {
			plat, pin, _ := strings.Cut(value, "/")
			if f.takes(plat, pin) {
				out = append(out, append([]byte(nil), data...))
			}
			if len(out) == n {
				return errEnough
			}
			return nil
		})
		if errors.Is(err, errEnough) {
			err = nil
		}
		return err
	}, `SELECT r.data, k.value FROM talkbox_keys k JOIN talkbox_records r ON r.id = k.id
		WHERE k.kind = $1 AND k.field = $2 ORDER BY k.id FOR UPDATE OF k SKIP LOCKED`, records.KindCycle, keyQueued)
	return out, err
}

// pgQueuedFirst reads the first $3 queued cycles by ID, whatever their key
// value. The key's index is by value, then ID: ordered by ID alone, the
// read sorted every key of the queue to return a few (25-35 ms a call at
// 100,000 queued, which every idle worker made once a heartbeat). It finds
// each value the key has (one probe of the index a value, a queue having
// a few: its platforms and pins), reads the first $3 of each in the
// index's order, keeps the first $3 of those, and reads their records one
// probe each (OFFSET 0 keeps the planner from joining the whole table).
const pgQueuedFirst = `WITH RECURSIVE v(value) AS (
		(SELECT value FROM talkbox_keys WHERE kind = $1 AND field = $2 ORDER BY value LIMIT 1)
		UNION ALL
		SELECT (SELECT value FROM talkbox_keys WHERE kind = $1 AND field = $2 AND value > v.value ORDER BY value LIMIT 1)
		FROM v WHERE v.value IS NOT NULL)
	SELECT r.data FROM (SELECT q.id FROM v
			CROSS JOIN LATERAL (SELECT id FROM talkbox_keys
				WHERE kind = $1 AND field = $2 AND value = v.value
				ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) q
			WHERE v.value IS NOT NULL
			ORDER BY q.id LIMIT $3) f
		CROSS JOIN LATERAL (SELECT data FROM talkbox_records WHERE id = f.id OFFSET 0) r
	ORDER BY f.id`

// lockingRead runs a read of queued cycles that locks the rows it returns
// (FOR UPDATE SKIP LOCKED: claims made at once skip each other's) in a
// transaction of its own, in one round trip, that commits without waiting
// for its WAL to reach the disk. Its row locks are all it writes and end
// with it, so that a crash loses nothing a flush would have kept; waited
// for, the flush was an fsync on every claim's path.
func (s *pgStore) lockingRead(ctx context.Context, read func(pgx.Rows) error, sql string, args ...any) error {
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SET LOCAL synchronous_commit = off`)
	b.Queue(sql, args...)
	b.Queue(`COMMIT`)
	br := s.pool.SendBatch(ctx, b)
	err := func() error {
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		err = read(rows)
		rows.Close()
		if err != nil {
			return err
		}
		if err := rows.Err(); err != nil {
			return err
		}
		_, err = br.Exec()
		return err
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return pgErr(err)
}

// unlocked tells, for each named lock, whether no one holds it: each
// taken and let go at once, all in one statement (a try of the advisory
// lock that TryLock's holder keeps; nothing is written).
func (s *pgStore) unlocked(ctx context.Context, names []string) ([]bool, error) {
	keys := make([]int64, len(names))
	for i, n := range names {
		keys[i] = lockKey("named", n)
	}
	rows, err := s.pool.Query(ctx, `SELECT pg_try_advisory_xact_lock(k) FROM unnest($1::bigint[]) WITH ORDINALITY AS l(k, i) ORDER BY i`, keys)
	if err != nil {
		return nil, pgErr(err)
	}
	free, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	if err == nil && len(free) != len(names) {
		err = fmt.Errorf("asked about %d locks, told of %d", len(names), len(free))
	}
	return free, pgErr(err)
}

// activeRefs reads the active cycles (whose key names the host or no
// host, when host is not nil: one range of the keys' index for each) with
// their leases' hosts, the fields taken from the records by the server.
func (s *pgStore) activeRefs(ctx context.Context, host *string) ([]ActiveRef, error) {
	where, args := ``, []any{records.KindCycle, keyActive}
	if host != nil {
		where, args = `AND k.value IN ($3, '')`, append(args, *host)
	}
	// The cycle and its lease are lateral lookups, one probe of the
	// primary key each, kept from being flattened into joins (OFFSET 0):
	// as joins the planner reads every record of the store (a hash join)
	// to find a few hundred.
	rows, err := s.pool.Query(ctx, `SELECT k.id, c.host, c.lease, c.updated, l.host IS NOT NULL, coalesce(l.host, '')
		FROM talkbox_keys k
		CROSS JOIN LATERAL (SELECT coalesce(j->>'host', '') AS host, coalesce(j->>'lease', '') AS lease,
				coalesce(j->>'updated_at', '') AS updated
			FROM (SELECT convert_from(data, 'UTF8')::jsonb AS j FROM talkbox_records WHERE id = k.id OFFSET 0) r) c
		LEFT JOIN LATERAL (SELECT coalesce(convert_from(data, 'UTF8')::jsonb->>'host', '') AS host
			FROM talkbox_records WHERE id = c.lease OFFSET 0) l ON true
		WHERE k.kind = $1 AND k.field = $2 `+where+` ORDER BY k.id`, args...)
	if err != nil {
		return nil, pgErr(err)
	}
	var out []ActiveRef
	var ref ActiveRef
	var updated string
	_, err = pgx.ForEachRow(rows, []any{&ref.ID, &ref.Host, &ref.Lease, &updated, &ref.LeaseFound, &ref.LeaseHost}, func() error {
		ref.UpdatedAt = time.Time{}
		if updated != "" {
			t, err := time.Parse(time.RFC3339Nano, updated)
			if err != nil {
				return fmt.Errorf("cycle %s: updated_at %q: %w", ref.ID, updated, err)
			}
			ref.UpdatedAt = t
		}
		out = append(out, ref)
		return nil
	})
	return out, pgErr(err)
}

// countLiveWorkers counts the live keys not expired at now (a stopped
// worker has none; one dead for less than its DeadAfter may still have
// one: workerKeys).
func (s *pgStore) countLiveWorkers(ctx context.Context, now time.Time) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM talkbox_keys WHERE kind = $1 AND field = $2 AND value >= $3`,
		records.KindWorker, keyLive, now.UTC().Format(freeUntilLayout)).Scan(&n)
	return n, pgErr(err)
}
