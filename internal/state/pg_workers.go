package state

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// The PostgreSQL store keeps a key of its own on each live worker with a
// free slot, beside the record's IndexKeys: keyFree, whose value is when
// the worker is taken for dead unless it beats again (Heartbeat plus
// DeadAfter, UTC, in a layout of fixed width so that the text order is the
// time order). The workers with a free slot that are alive at a time are
// then one range of the key's index, and a claim reads those instead of
// every worker record of the fleet. A worker rewrites its record every
// heartbeat, which moves its key.
const keyFree = "free"

// freeUntilLayout is RFC 3339 with nine fractional digits always written.
const freeUntilLayout = "2006-01-02T15:04:05.000000000Z"

// workerKeys are a worker record's keys of the fleet: keyFree while it has
// a free slot and has not stopped.
func workerKeys(r records.Record) []records.IndexKey {
	w, ok := r.(*records.Worker)
	if !ok || w.Stopped || w.Free() == 0 {
		return nil
	}
	until := w.Heartbeat.Add(time.Duration(w.DeadAfter)).UTC()
	return []records.IndexKey{{Field: keyFree, Value: until.Format(freeUntilLayout)}}
}

// replaceWorkerKeys makes a worker record's keyFree that of its new version.
func replaceWorkerKeys(ctx context.Context, tx pgx.Tx, kind, id string, r records.Record) error {
	if kind != records.KindWorker {
		return nil
	}
	if _, err := tx.Exec(ctx, `DELETE FROM talkbox_keys WHERE kind = $1 AND id = $2 AND field = $3`, kind, id, keyFree); err != nil {
		return err
	}
	return insertKeys(ctx, tx, kind, id, workerKeys(r))
}

// FreeWorkers returns up to n of the workers alive at now that have a free
// slot, those whose heartbeat is the latest first. On PostgreSQL it reads
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
	rows, err := pg.pool.Query(ctx, `SELECT r.data FROM talkbox_keys k JOIN talkbox_records r ON r.id = k.id
		WHERE k.kind = $1 AND k.field = $2 AND k.value >= $3 ORDER BY k.value DESC LIMIT $4`,
		records.KindWorker, keyFree, now.UTC().Format(freeUntilLayout), n)
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
		// The key is as of the record's write; the record says the rest.
		if w.Alive(now) && w.Free() > 0 {
			out = append(out, &w)
		}
	}
	return out, nil
}
