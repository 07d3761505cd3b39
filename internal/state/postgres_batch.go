package state

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// pgBatch is a batch in one transaction, begun when the batch takes its
// first lock: its locks are advisory locks of that transaction (tried, never
// waited for), its records, keys and journal entries are written at Commit.
type pgBatch struct {
	s   *pgStore
	ctx context.Context
	tx  pgx.Tx
	// inClaim: tx is Claim's, which commits it.
	inClaim bool
	recs    []pgBatchRec
	keys    []batchKey
	ids     map[string]bool
	// held are the index keys ("<name>\x00<key>") whose locks the batch
	// took: an advisory lock taken again in its transaction is granted
	// again, and a batch must refuse a key it holds, as the directory's
	// does (the same observable emitted twice is written on its own).
	held map[string]bool
	// fleet: a record brings the fleet's workers work (newWork), so they
	// are woken once the batch commits.
	fleet bool
	// read are the records TryLockRecords locked and read, for Update.
	read map[string]*pgRead
}

type pgBatchRec struct {
	kind, id string
	r        records.Record
	saved    records.Meta
	data     []byte
	// update: a new version of the stored one, of revision rev, whose
	// keys were oldKeys.
	update  bool
	rev     int64
	oldKeys []records.IndexKey
}

func (s *pgStore) newBatch() batcher { return &pgBatch{s: s, ctx: context.Background()} }

func (b *pgBatch) Idle() bool { return b.tx == nil && len(b.recs) == 0 && len(b.keys) == 0 }

func (b *pgBatch) begin() error {
	if b.tx != nil {
		return nil
	}
	tx, err := b.s.pool.Begin(b.ctx)
	if err != nil {
		return pgErr(err)
	}
	b.tx = tx
	return nil
}

func (b *pgBatch) tryLock(key int64) (bool, error) {
	if err := b.begin(); err != nil {
		return false, err
	}
	var ok bool
	err := b.tx.QueryRow(b.ctx, `SELECT pg_try_advisory_xact_lock($1)`, key).Scan(&ok)
	return ok, pgErr(err)
}

// ClaimIndex is TryLockIndex: on PostgreSQL the batch's locks are its
// transaction's, taken as it fills.
func (b *pgBatch) ClaimIndex(name, key string) (bool, error) { return b.TryLockIndex(name, key) }

func (b *pgBatch) TryLockIndex(name, key string) (bool, error) {
	if err := checkIndexKey(name, key); err != nil {
		return false, err
	}
	k := name + "\x00" + key
	if b.held[k] {
		return false, nil
	}
	ok, err := b.tryLock(lockKey("index", k))
	if ok && err == nil {
		if b.held == nil {
			b.held = map[string]bool{}
		}
		b.held[k] = true
	}
	return ok, err
}

// Lookup is Store.Lookup: one query finds the key and its record.
func (b *pgBatch) Lookup(name, key string) (string, error) { return b.s.Lookup(name, key) }

func (b *pgBatch) Create(r records.Record) ([]byte, error) {
	h := r.Header()
	kind, err := checkRef(h.ID)
	if err != nil {
		return nil, err
	}
	if b.ids[h.ID] {
		return nil, nil
	}
	ok, err := b.tryLock(lockKey("record", h.ID))
	if !ok || err != nil {
		return nil, err
	}
	saved := *h
	data, err := stampRecord(h.ID, stored{}, b.s.dir.Now(), r)
	if err != nil {
		h.Rev, h.CreatedAt, h.UpdatedAt, h.V = saved.Rev, saved.CreatedAt, saved.UpdatedAt, saved.V
		return nil, err
	}
	if b.ids == nil {
		b.ids = map[string]bool{}
	}
	b.ids[h.ID] = true
	b.recs = append(b.recs, pgBatchRec{kind: kind, id: h.ID, r: r, saved: saved, data: data})
	return data, nil
}

// tryLockAll tries the advisory locks of keys in the batch's transaction in
// one statement, and tells which it took.
func (b *pgBatch) tryLockAll(keys []int64) ([]bool, error) {
	if err := b.begin(); err != nil {
		return nil, err
	}
	took := make([]bool, len(keys))
	rows, err := b.tx.Query(b.ctx, `SELECT o, pg_try_advisory_xact_lock(k) FROM unnest($1::bigint[]) WITH ORDINALITY AS t(k, o)`, keys)
	if err != nil {
		return nil, pgErr(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			o  int64
			ok bool
		)
		if err := rows.Scan(&o, &ok); err != nil {
			return nil, pgErr(err)
		}
		took[o-1] = ok
	}
	return took, pgErr(rows.Err())
}

// TryLockIndexes takes the keys' locks in one round trip, and holds those
// before the first it could not take (the locks after it, if taken, are
// the transaction's until it ends, as a held key's are).
func (b *pgBatch) TryLockIndexes(name string, keys []string) (int, error) {
	n := len(keys)
	locks := make([]int64, 0, n)
	named := make(map[string]bool, n)
	for i, key := range keys {
		if err := checkIndexKey(name, key); err != nil {
			return 0, err
		}
		// A key the batch holds, or one named again: refused, as
		// TryLockIndex refuses it.
		if b.held[name+"\x00"+key] || named[key] {
			n = i
			break
		}
		named[key] = true
		locks = append(locks, lockKey("index", name+"\x00"+key))
	}
	if n == 0 {
		return 0, nil
	}
	took, err := b.tryLockAll(locks[:n])
	if err != nil {
		return 0, err
	}
	if b.held == nil {
		b.held = map[string]bool{}
	}
	for i, ok := range took {
		if !ok {
			return i, nil
		}
		b.held[name+"\x00"+keys[i]] = true
	}
	return n, nil
}

// LookupAll is Lookup of the keys in one query.
func (b *pgBatch) LookupAll(name string, keys []string) ([]string, error) {
	for _, key := range keys {
		if err := checkIndexKey(name, key); err != nil {
			return nil, err
		}
	}
	rows, err := b.s.pool.Query(b.ctx, `SELECT i.key, i.id FROM talkbox_index i JOIN talkbox_records r ON r.id = i.id
		WHERE i.name = $1 AND i.key = ANY($2)`, name, keys)
	if err != nil {
		return nil, pgErr(err)
	}
	defer rows.Close()
	found := make(map[string]string, len(keys))
	for rows.Next() {
		var key, id string
		if err := rows.Scan(&key, &id); err != nil {
			return nil, pgErr(err)
		}
		found[key] = id
	}
	if err := rows.Err(); err != nil {
		return nil, pgErr(err)
	}
	ids := make([]string, len(keys))
	for i, key := range keys {
		ids[i] = found[key]
	}
	return ids, nil
}

// pgRead is a stored record TryLockRecords read under its lock.
type pgRead struct {
	data  []byte
	rev   int64
	found bool
}

// TryLockRecords takes the records' locks and then reads them, in one
// round trip: the read is a statement after the locks', which under READ
// COMMITTED sees the commits of their previous holders (as Update's own
// lock and read). Update takes what was read. It stops at a cycle or a
// worker, or a record the batch has, as Update refuses them.
func (b *pgBatch) TryLockRecords(ids []string) (int, error) {
	n := len(ids)
	locks := make([]int64, 0, n)
	named := make(map[string]bool, n)
	for i, id := range ids {
		kind, err := checkRef(id)
		if err != nil {
			return 0, err
		}
		if kind == records.KindCycle || kind == records.KindWorker || b.ids[id] || b.read[id] != nil || named[id] {
			n = i
			break
		}
		named[id] = true
		locks = append(locks, lockKey("record", id))
	}
	if n == 0 {
		return 0, nil
	}
	if err := b.begin(); err != nil {
		return 0, err
	}
	took := make([]bool, n)
	read := make(map[string]*pgRead, n)
	q := &pgx.Batch{}
	q.Queue(`SELECT o, pg_try_advisory_xact_lock(k) FROM unnest($1::bigint[]) WITH ORDINALITY AS t(k, o)`, locks[:n]).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var (
				o  int64
				ok bool
			)
			if err := rows.Scan(&o, &ok); err != nil {
				return err
			}
			took[o-1] = ok
		}
		return rows.Err()
	})
	q.Queue(`SELECT id, data, rev FROM talkbox_records WHERE id = ANY($1)`, ids[:n]).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			r := &pgRead{found: true}
			var id string
			if err := rows.Scan(&id, &r.data, &r.rev); err != nil {
				return err
			}
			read[id] = r
		}
		return rows.Err()
	})
	if err := b.tx.SendBatch(b.ctx, q).Close(); err != nil {
		return 0, pgErr(err)
	}
	if b.read == nil {
		b.read = map[string]*pgRead{}
	}
	for i, ok := range took {
		if !ok {
			return i, nil
		}
		r := read[ids[i]]
		if r == nil {
			r = &pgRead{}
		}
		b.read[ids[i]] = r
	}
	return n, nil
}

// lockAndRead takes a record's lock and reads it in one round trip: the
// read is a statement of its own after the lock's, which under READ
// COMMITTED sees the commit of the lock's previous holder (and is not
// looked at if the lock was not taken).
func (b *pgBatch) lockAndRead(id string, locked, found *bool, prev *[]byte, rev *int64) error {
	q := &pgx.Batch{}
	q.Queue(`SELECT pg_try_advisory_xact_lock($1)`, lockKey("record", id)).QueryRow(func(row pgx.Row) error {
		return row.Scan(locked)
	})
	q.Queue(`SELECT data, rev FROM talkbox_records WHERE id = $1`, id).QueryRow(func(row pgx.Row) error {
		err := row.Scan(prev, rev)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		*found = err == nil
		return err
	})
	return pgErr(b.tx.SendBatch(b.ctx, q).Close())
}

// Update queues a new version of a stored record: under the record's lock
// (a lock of the batch's transaction, tried) it reads the stored version
// into r, calls fn, and stamps the result, as Store.Update would. Nil, and
// no error: the lock is held elsewhere, the record is in the batch already,
// or it is a cycle or a worker, whose writes keep the fleet's keys and wake
// its workers, and which are written on their own.
func (b *pgBatch) Update(id string, r records.Record, fn func() error) ([]byte, error) {
	kind, err := checkRef(id)
	if err != nil {
		return nil, err
	}
	if kind == records.KindCycle || kind == records.KindWorker || b.ids[id] {
		return nil, nil
	}
	if err := b.begin(); err != nil {
		return nil, err
	}
	var (
		locked, found bool
		prev          []byte
		rev           int64
	)
	if r := b.read[id]; r != nil {
		delete(b.read, id)
		locked, found, prev, rev = true, r.found, r.data, r.rev
	} else if err := b.lockAndRead(id, &locked, &found, &prev, &rev); err != nil {
		return nil, err
	}
	if !locked {
		return nil, nil
	}
	if !found {
		return nil, fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	resetRecord(r)
	if err := records.Unmarshal(prev, r); err != nil {
		return nil, fmt.Errorf("%s: stored record does not decode: %w", id, err)
	}
	oldKeys := indexKeys(r)
	old := stored{Rev: rev, CreatedAt: r.Header().CreatedAt}
	if err := fn(); err != nil {
		return nil, err
	}
	h := r.Header()
	saved := *h
	data, err := stampRecord(id, old, b.s.dir.Now(), r)
	if err != nil {
		h.Rev, h.CreatedAt, h.UpdatedAt, h.V = saved.Rev, saved.CreatedAt, saved.UpdatedAt, saved.V
		return nil, err
	}
	if b.ids == nil {
		b.ids = map[string]bool{}
	}
	b.ids[id] = true
	b.recs = append(b.recs, pgBatchRec{kind: kind, id: id, r: r, saved: saved, data: data, update: true, rev: rev, oldKeys: oldKeys})
	return data, nil
}

func (b *pgBatch) SetIndex(name, key, id string) error {
	if err := checkIndexKey(name, key); err != nil {
		return err
	}
	if err := records.CheckID(id); err != nil {
		return err
	}
	if !b.held[name+"\x00"+key] {
		return fmt.Errorf("index key %s/%s set in a batch that does not hold its lock", name, key)
	}
	b.keys = append(b.keys, batchKey{Op: opIndex, Index: name, Key: key, ID: id})
	return nil
}

// flush writes what the batch queued into its transaction.
func (b *pgBatch) flush() error {
	es := make([]entry, 0, len(b.recs))
	platforms := map[string]string{}
	fleet := false // a record the fleet's workers watch for
	updates := &pgx.Batch{}
	for _, r := range b.recs {
		if r.update {
			// Its statement appends its journal entry; Update took no
			// cycle or worker, so it has no fleet's keys to keep.
			queueUpdate(updates, r.id, r.rev, r.data, r.r.Header())
			queueKeyChanges(updates, r.kind, r.id, r.oldKeys, indexKeys(r.r))
			continue
		}
		tag, err := b.tx.Exec(b.ctx, `INSERT INTO talkbox_records (id, kind, rev, data) VALUES ($1, $2, 1, $3) ON CONFLICT DO NOTHING`, r.id, r.kind, r.data)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("%s: %w", r.id, ErrExists)
		}
		keys, err := fleetKeys(b.ctx, b.tx, r.r, platforms)
		if err != nil {
			return err
		}
		keys = append(keys, workerKeys(r.r)...)
		if err := insertKeys(b.ctx, b.tx, r.kind, r.id, append(indexKeys(r.r), keys...)); err != nil {
			return err
		}
		fleet = fleet || newWork(keys)
		h := r.r.Header()
		es = append(es, entry{At: h.UpdatedAt, Op: opPut, Kind: r.kind, ID: r.id, Rev: h.Rev, Record: r.data})
	}
	if updates.Len() > 0 {
		if err := b.tx.SendBatch(b.ctx, updates).Close(); err != nil {
			return err
		}
	}
	for _, k := range b.keys {
		if err := setIndexRow(b.ctx, b.tx, k.Index, k.Key, k.ID); err != nil {
			return err
		}
	}
	if len(es) == 0 {
		return nil
	}
	b.fleet = fleet
	return b.s.journal(b.ctx, b.tx, es)
}

// giveBack restores the headers of records that were not stored.
func (b *pgBatch) giveBack() {
	for _, r := range b.recs {
		h := r.r.Header()
		h.Rev, h.CreatedAt, h.UpdatedAt, h.V = r.saved.Rev, r.saved.CreatedAt, r.saved.UpdatedAt, r.saved.V
	}
}

func (b *pgBatch) Discard() {
	if b.tx != nil {
		b.tx.Rollback(context.Background())
	}
	b.giveBack()
	b.tx, b.recs, b.keys, b.ids, b.held, b.fleet, b.read = nil, nil, nil, nil, nil, false, nil
}

func (b *pgBatch) Commit() error {
	if b.tx == nil {
		return nil
	}
	err := b.flush()
	if err == nil {
		b.s.dir.hook(crashPgWritten)
		err = b.tx.Commit(b.ctx)
	} else {
		b.tx.Rollback(context.Background())
	}
	if err != nil {
		b.giveBack()
	}
	n := len(b.recs)
	fleet := b.fleet
	b.tx, b.recs, b.keys, b.ids, b.held, b.fleet, b.read = nil, nil, nil, nil, nil, false, nil
	if err != nil {
		return pgErr(err)
	}
	b.s.journaled(b.ctx, n, fleet)
	return nil
}

// hasPoolMax tells whether the URL sizes the pool itself.
func hasPoolMax(u string) bool { return strings.Contains(u, "pool_max_conns=") }

// redactURL drops a password from a URL for messages.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable PostgreSQL URL)"
	}
	return p.Redacted()
}
