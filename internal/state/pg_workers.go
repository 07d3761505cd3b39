package state

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// The PostgreSQL store keeps two keys of its own on a worker record,
// beside its IndexKeys, whose value is a time by which the worker is taken
// for dead unless it beats again (UTC, in a layout of fixed width so that
// the text order is the time order): keyLive while it has not stopped,
// keyFree while it also has a free slot. The workers alive at a time (with
// a free slot) are then one range of the key's index: a claim reads those
// with a free slot instead of every worker record of the fleet, and the
// live ones are read in one query.
//
// The value is coarse: Heartbeat plus DeadAfter rounded up to a multiple of
// DeadAfter, so that it is never before the worker's death and at most
// DeadAfter after it, and a reader keeps only the records that say the
// worker is alive. A worker rewrites its record every heartbeat; were the
// key its exact expiry, every beat would delete the key and insert another,
// and each deleted entry, until vacuumed, lies in the range that every
// read of live or free workers scans and checks against the table: about
// DeadAfter/heartbeat entries a worker (12 at tb-run worker's defaults),
// 170 ms a read at 1,000 workers. Coarse, the key moves once every
// DeadAfter, and the writes that leave it as it was do not touch it.
const (
	keyLive = "live"
	keyFree = "free"
)

// freeUntilLayout is RFC 3339 with nine fractional digits always written.
const freeUntilLayout = "2006-01-02T15:04:05.000000000Z"

// workerKeys are a worker record's keys of the fleet.
func workerKeys(r records.Record) []records.IndexKey {
	w, ok := r.(*records.Worker)
	if !ok || w.Stopped {
		return nil
	}
	until := w.Heartbeat.Add(time.Duration(w.DeadAfter)).UTC()
	if step := time.Duration(w.DeadAfter); step > 0 {
		if up := until.Truncate(step); up.Before(until) {
			until = up.Add(step)
		}
	}
	value := until.Format(freeUntilLayout)
	keys := []records.IndexKey{{Field: keyLive, Value: value}}
	if w.Free() > 0 {
		keys = append(keys, records.IndexKey{Field: keyFree, Value: value})
	}
	return keys
}

// queueWorkerKeys queues into b the statement that makes a worker record's
// keys of the fleet those of its new version: it deletes the stored ones
// the new version lacks and adds those it lacks, so that a key that stays
// (most heartbeats) is neither deleted nor written.
func queueWorkerKeys(b *pgx.Batch, kind, id string, r records.Record) {
	if kind != records.KindWorker {
		return
	}
	fields, values := splitKeys(workerKeys(r))
	b.Queue(`WITH new AS (SELECT * FROM unnest($5::text[], $6::text[]) AS k(field, value)),
		gone AS (DELETE FROM talkbox_keys WHERE kind = $1 AND id = $2 AND field IN ($3, $4)
			AND (field, value) NOT IN (SELECT field, value FROM new))
		INSERT INTO talkbox_keys (kind, field, value, id) SELECT $1, field, value, $2 FROM new
		ON CONFLICT DO NOTHING`, kind, id, keyLive, keyFree, fields, values)
}

// LiveWorkers returns the workers alive at now: on PostgreSQL in one
// query, one range of an index; on the directory, from every worker record.
func LiveWorkers(ctx context.Context, st *Store, now time.Time) ([]*records.Worker, error) {
	pg, ok := st.rec.(*pgStore)
	if !ok {
		return Find(st, records.KindWorker, func(w *records.Worker) bool { return w.Alive(now) })
	}
	return workersByExpiry(ctx, pg, keyLive, now, -1, func(w *records.Worker) bool { return w.Alive(now) })
}

// FreeWorkers returns up to n of the workers alive at now that have a free
// slot: on the directory those whose heartbeat is the latest first, on
// PostgreSQL those whose key expires the latest first. On PostgreSQL it reads
// one range of an index, n rows at most, whatever the number of workers in
// the fleet; on the directory, every worker record.
func FreeWorkers(ctx context.Context, st *Store, now time.Time, n int) ([]*records.Worker, error) {
	pg, ok := st.rec.(*pgStore)
	if !ok {
		all, err := Find(st, records.KindWorker, func(w *records.Worker) bool { return w.Alive(now) && w.Free() > 0 })
		if err != nil {
			return nil, err
		}
		slices.SortFunc(all, func(a, b *records.Worker) int { return b.Heartbeat.Compare(a.Heartbeat) })
		return all[:min(n, len(all))], nil
	}
	return workersByExpiry(ctx, pg, keyFree, now, n, func(w *records.Worker) bool { return w.Alive(now) && w.Free() > 0 })
}

// workersByExpiry reads the workers whose key field has not expired at
// now, the latest to expire first, n at most (-1: all), those keep keeps:
// the key is as of the record's write and coarse, the record says the rest.
func workersByExpiry(ctx context.Context, pg *pgStore, field string, now time.Time, n int, keep func(*records.Worker) bool) ([]*records.Worker, error) {
	limit := any(nil) // LIMIT NULL: no limit
	if n >= 0 {
		limit = n
	}
	// Planned with its values at every call (an unnamed statement, whose
	// description alone is cached), never with a plan the server keeps for
	// any values: how many rows of the keys' table a kind, a field and a
	// bound select differs by orders of magnitude (a fleet's 1,000 workers
	// beside its 100,000 queued cycles), and the generic plan, which the
	// server may settle on after five calls, sorts the field's whole range
	// in parallel (87 ms for 200 workers' rows, where the index range takes
	// 11 ms).
	rows, err := pg.pool.Query(ctx, `SELECT r.data FROM talkbox_keys k JOIN talkbox_records r ON r.id = k.id
		WHERE k.kind = $1 AND k.field = $2 AND k.value >= $3 ORDER BY k.value DESC LIMIT $4`,
		pgx.QueryExecModeCacheDescribe, records.KindWorker, field, now.UTC().Format(freeUntilLayout), limit)
	if err != nil {
		return nil, pgErr(err)
	}
	raw, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, pgErr(err)
	}
	out := make([]*records.Worker, 0, len(raw))
	for _, data := range raw {
		var w records.Worker
		if err := records.Unmarshal(data, &w); err != nil {
			return nil, err
		}
		if keep(&w) {
			out = append(out, &w)
		}
	}
	return out, nil
}
