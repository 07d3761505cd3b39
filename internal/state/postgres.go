package state

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// pgStore keeps the records of a fleet in one PostgreSQL database:
//
//	talkbox_records  one row per record: its current version (data), and rev
//	                 for the compare-and-set of every write
//	talkbox_journal  puts and deletes, each with its transaction's xid:
//	                 followers read them in the order pg_journal.go gives,
//	                 with no lock that writers take in turn
//	talkbox_keys     records by field value (FindBy), exactly the keys
//	                 of each record's current version, and the fleet's
//	                 queue (postgres_queue.go)
//	talkbox_index    unique keys (Claim, Lookup)
//
// A write is one transaction: it takes the record's advisory lock (which
// stands for the row even before the row exists), reads the stored version,
// builds the new one, writes it only if the row's rev is still the one read,
// and appends the journal entry (a Create reads nothing: its row is written
// only if the id has none). A process or host that dies mid-write
// leaves the transaction aborted: nothing to recover. A named lock is an
// advisory lock held by a transaction that writes nothing, which the server
// ends pgLockTimeout after its holder went silent.
type pgStore struct {
	pool *pgxpool.Pool
	// dir supplies the clock and checks this host's blobs.
	dir *dirStore
	// lockTimeout is how long a named lock outlives a silent holder
	// (default pgLockTimeout).
	lockTimeout time.Duration
	// writes counts journal entries this process appended, to compact the
	// journal now and then as the directory's journal is.
	writes atomic.Int64
}

// pgMaxConns is the pool's size unless the URL sets pool_max_conns: every
// named lock a process holds keeps one connection.
const pgMaxConns = 16

// pgLockTimeout is how long a named lock outlives a holder that stopped
// answering (a dead host), unless WithLockTimeout says otherwise: the lease
// timeout of a fleet's claims.
const pgLockTimeout = 30 * time.Second

// pgCompactEvery is how many writes of one process pass between
// compactions of the journal table.
const pgCompactEvery = 8192

const pgSchema = `
CREATE TABLE IF NOT EXISTS talkbox_records (
	id   text PRIMARY KEY,
	kind text NOT NULL,
	rev  bigint NOT NULL,
	data bytea NOT NULL
);
CREATE INDEX IF NOT EXISTS talkbox_records_kind ON talkbox_records (kind, id);
CREATE TABLE IF NOT EXISTS talkbox_journal (
	seq  bigserial PRIMARY KEY,
	at   timestamptz NOT NULL,
	op   text NOT NULL,
	kind text NOT NULL,
	id   text NOT NULL,
	rev  bigint NOT NULL,
	data bytea
);
CREATE INDEX IF NOT EXISTS talkbox_journal_id ON talkbox_journal (id, seq);
CREATE TABLE IF NOT EXISTS talkbox_keys (
	kind  text NOT NULL,
	field text NOT NULL,
	value text NOT NULL,
	id    text NOT NULL,
	PRIMARY KEY (kind, field, value, id)
);
CREATE INDEX IF NOT EXISTS talkbox_keys_id ON talkbox_keys (id);
CREATE TABLE IF NOT EXISTS talkbox_index (
	name text NOT NULL,
	key  text NOT NULL,
	id   text NOT NULL,
	PRIMARY KEY (name, key)
);
` + pgFleetSchema + pgJournalSchema

// pgNotifyChannel is where each commit that appends to the journal
// notifies followers (journaled).
const pgNotifyChannel = "talkbox_journal"

func openShared(ctx context.Context, url string, dir *dirStore, lockTimeout time.Duration) (*pgStore, error) {
	cfg, err := pgxpool.ParseConfig(withTLSDefault(url))
	if err != nil {
		return nil, fault.Usage(fmt.Errorf("state %s: %w", redactURL(url), err))
	}
	if !hasPoolMax(url) {
		cfg.MaxConns = pgMaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, pgErr(fmt.Errorf("state %s: %w", redactURL(url), err))
	}
	s := &pgStore{pool: pool, dir: dir, lockTimeout: cmp.Or(lockTimeout, pgLockTimeout)}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, pgErr(fmt.Errorf("state %s: %w", redactURL(url), err))
	}
	return s, nil
}

// migrate creates the tables of a new database, or what an older one
// lacks (the schema is idempotent); hosts opening it at once take turns.
func (s *pgStore) migrate(ctx context.Context) error {
	var have bool
	if err := s.pool.QueryRow(ctx, pgSchemaCurrent).Scan(&have); err != nil {
		return err
	}
	if have {
		return nil
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := xactLock(ctx, tx, "schema", ""); err != nil {
			return err
		}
		var had, keyed, current bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('talkbox_records') IS NOT NULL, to_regclass('talkbox_fleet_keys') IS NOT NULL, (`+
			pgSchemaCurrent+`)`).Scan(&had, &keyed, &current); err != nil {
			return err
		}
		if current {
			return nil // another host migrated it meanwhile
		}
		if _, err := tx.Exec(ctx, pgSchema); err != nil {
			return err
		}
		if had && !keyed {
			return backfillFleetKeys(ctx, tx)
		}
		return nil
	})
}

func (s *pgStore) Close() error {
	s.pool.Close()
	return nil
}

func (s *pgStore) where(id string) string { return "row " + id }

// xactLock takes the advisory lock of a record, an index key or the
// journal until the transaction ends.
func xactLock(ctx context.Context, tx pgx.Tx, space, name string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey(space, name))
	return err
}

// lockKey is the advisory lock standing for a record, an index key or the
// journal. Two names sharing a key (one chance in 2^64) only serialise.
func lockKey(space, name string) int64 {
	h := fnv.New64a()
	io.WriteString(h, space)
	h.Write([]byte{0})
	io.WriteString(h, name)
	return int64(h.Sum64())
}

func (s *pgStore) commitLocked(ctx context.Context, id string, build func(prev []byte) (records.Record, []records.Record, error)) error {
	kind, err := checkRef(id)
	if err != nil {
		return err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return pgErr(err)
	}
	defer conn.Release()
	c := conn.Conn()
	var (
		r       records.Record
		saved   records.Meta
		created []records.Record
		savedC  []records.Meta
	)
	// The transaction's statements go to the server in two pipelines, a
	// round trip each (where a statement each took one, and the round trips
	// were most of a write's cost): BEGIN, the record's lock and its read;
	// every write, COMMIT and the notification that follows it. A write
	// that fails fails on the server, so that the COMMIT after it is
	// skipped (sendCommit).
	err = func() error {
		var prev []byte
		var rev int64
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(`SELECT pg_advisory_xact_lock($1)`, lockKey("record", id))
		// A statement of its own after the lock's: under READ COMMITTED a
		// statement reads as of its start, so this one sees the commit of
		// the lock's previous holder.
		b.Queue(`SELECT data, rev FROM talkbox_records WHERE id = $1`, id).QueryRow(func(row pgx.Row) error {
			if err := row.Scan(&prev, &rev); !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			return nil
		})
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		var err error
		if r, created, err = build(prev); err != nil {
			return err
		}
		h := r.Header()
		saved = *h
		old := stored{Rev: rev}
		if prev != nil && json.Unmarshal(prev, &old) != nil {
			old = stored{Rev: rev}
		}
		now := s.dir.Now()
		data, err := stampRecord(id, old, now, r)
		if err != nil {
			return err
		}
		w := &pgx.Batch{}
		if prev == nil {
			queueInsert(w, id, kind, data, h, fmt.Errorf("%s: changed by another writer while its lock was held", id))
		} else {
			queueUpdate(w, id, rev, data, h)
		}
		// The version replaced, decoded once for what its keys and flags
		// were (nil when there is none, or it does not decode).
		var was records.Record
		if prev != nil {
			was, _ = records.Decode(prev)
		}
		queueKeys(w, kind, id, was, indexKeys(r))
		wake, err := queueFleetKeys(ctx, c, w, kind, id, prev != nil, was, r)
		if err != nil {
			return err
		}
		queueWorkerKeys(w, kind, id, r)
		// The new records, each after its lock as create takes it; none
		// is a cycle or a worker (UpdateAndCreate), so none has fleet keys
		// or wakes more than the update does.
		for _, n := range created {
			nh := n.Header()
			savedC = append(savedC, *nh)
			nkind, err := checkRef(nh.ID)
			if err != nil {
				return err
			}
			ndata, err := stampRecord(nh.ID, stored{}, now, n)
			if err != nil {
				return err
			}
			w.Queue(`SELECT pg_advisory_xact_lock($1)`, lockKey("record", nh.ID))
			queueInsert(w, nh.ID, nkind, ndata, nh, fmt.Errorf("%s: %w", nh.ID, ErrExists))
			queueKeys(w, nkind, nh.ID, nil, indexKeys(n))
		}
		s.dir.hook(crashPgSending)
		return sendCommit(ctx, c, w, wake, cancelFlagged(was, r))
	}()
	if err != nil {
		for i, m := range savedC {
			restoreHeader(created[i].Header(), m)
		}
	} else if len(created) > 0 {
		s.compactNow(ctx, len(created))
	}
	return s.wrote(ctx, c, r, saved, err)
}

// create stores a new record in one round trip: BEGIN, the record's lock,
// its row (whose id, if taken, fails the transaction with ErrExists) with
// its journal entry, its keys, COMMIT and the notification.
func (s *pgStore) create(ctx context.Context, r records.Record) error {
	h := r.Header()
	id := h.ID
	kind, err := checkRef(id)
	if err != nil {
		return err
	}
	saved := *h
	data, err := stampRecord(id, stored{}, s.dir.Now(), r)
	if err != nil {
		restoreHeader(h, saved)
		return err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		restoreHeader(h, saved)
		return pgErr(err)
	}
	defer conn.Release()
	c := conn.Conn()
	err = func() error {
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		// The lock first, as every writer of the record takes it: the
		// transaction gets its xid (pg_journal.go) only once it holds it.
		b.Queue(`SELECT pg_advisory_xact_lock($1)`, lockKey("record", id))
		queueInsert(b, id, kind, data, h, fmt.Errorf("%s: %w", id, ErrExists))
		queueKeys(b, kind, id, nil, indexKeys(r))
		wake, err := queueFleetKeys(ctx, c, b, kind, id, false, nil, r)
		if err != nil {
			return err
		}
		queueWorkerKeys(b, kind, id, r)
		s.dir.hook(crashPgSending)
		return sendCommit(ctx, c, b, wake, "")
	}()
	return s.wrote(ctx, c, r, saved, err)
}

// wrote ends a write on c whose outcome is err: one that did not commit
// rolls back, and gives the caller back its record r as it was (saved),
// and one that had nothing to store (ErrNoChange) is no error; one that
// committed counts to the next compaction.
func (s *pgStore) wrote(ctx context.Context, c *pgx.Conn, r records.Record, saved records.Meta, err error) error {
	if err != nil && c.PgConn().TxStatus() != 'I' && !c.IsClosed() {
		// Not committed: end the transaction, or the pool drops the
		// connection it cannot tell the state of.
		c.Exec(ctx, `ROLLBACK`)
	}
	if errors.Is(err, ErrNoChange) {
		return nil
	}
	if err != nil {
		if r != nil {
			// Not stored (or not known to be): give the caller back its record.
			restoreHeader(r.Header(), saved)
		}
		return pgErr(err)
	}
	s.dir.hook(crashPgCommitted)
	s.compactNow(ctx, 1)
	return nil
}

// restoreHeader puts back the fields of h that stamping a write set.
func restoreHeader(h *records.Meta, saved records.Meta) {
	h.Rev, h.CreatedAt, h.UpdatedAt, h.V = saved.Rev, saved.CreatedAt, saved.UpdatedAt, saved.V
}

// queueInsert queues the insert of a new record's row and its journal
// entry, in one statement; taken is its error when the id has a row.
func queueInsert(b *pgx.Batch, id, kind string, data []byte, h *records.Meta, taken error) {
	b.Queue(`WITH r AS (INSERT INTO talkbox_records (id, kind, rev, data) VALUES ($1, $2, $3, $4) RETURNING id, kind, rev, data)
		`+pgJournalPut, id, kind, h.Rev, data, h.UpdatedAt, opPut).Fn = func(br pgx.BatchResults) error {
		_, err := br.Exec()
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == pgUniqueViolation && pe.ConstraintName == "talkbox_records_pkey" {
			return taken
		}
		return err
	}
}

// queueUpdate queues the write of a record's new version over the one of
// revision rev, with its journal entry, in one statement. A row whose rev
// is no longer rev (changed behind the record's lock) is not written, and
// the statement then fails, on the server, with a division by zero: the
// transaction is aborted there and the COMMIT queued after it skipped.
func queueUpdate(b *pgx.Batch, id string, rev int64, data []byte, h *records.Meta) {
	b.Queue(`WITH r AS (UPDATE talkbox_records SET rev = $3, data = $4 WHERE id = $1 AND rev = $2 RETURNING id, kind, rev, data),
		j AS (`+pgJournalPut+` RETURNING 1)
		SELECT 1 / count(*) FROM j`, id, rev, h.Rev, data, h.UpdatedAt, opPut).Fn = func(br pgx.BatchResults) error {
		_, err := br.Exec()
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == pgDivisionByZero {
			return fmt.Errorf("%s: changed by another writer while its lock was held", id)
		}
		return err
	}
}

// The SQLSTATEs a write maps to its own errors.
const (
	pgUniqueViolation = "23505"
	pgDivisionByZero  = "22012"
)

// pgJournalPut appends the journal entry of the version that the
// statement's first part, r, wrote: one statement for the record and its
// entry, whose data is sent once. A write that matched no row appends no
// entry ($5: when, $6: opPut).
const pgJournalPut = `INSERT INTO talkbox_journal (at, op, kind, id, rev, data) SELECT $5, $6, kind, id, rev, data FROM r`

// sendCommit ends b with COMMIT and then, in the same round trip but a
// statement of its own (journaled says why), the notifications of the
// journal's followers and, as wake says, of the fleet's workers, and of
// the workers of cancelHost (a cycle driven there flagged for cancel:
// cancelFlagged) unless it is ""; and
// sends it on c, where a transaction is open or opened by b. A statement
// of b that fails makes the server skip the rest, the COMMIT too, and
// leaves the transaction aborted (the caller rolls it back). Only the
// COMMIT's outcome is the write's: a notification that fails is made up
// for by the followers' next poll.
func sendCommit(ctx context.Context, c *pgx.Conn, b *pgx.Batch, wake fleetWake, cancelHost string) error {
	committed := false
	b.Queue(`COMMIT`).Exec(func(tag pgconn.CommandTag) error {
		if tag.String() != "COMMIT" {
			// COMMIT of a transaction that failed rolls it back.
			return pgx.ErrTxCommitRollback
		}
		committed = true
		return nil
	})
	queueNotify(b, wake)
	if cancelHost != "" {
		b.Queue(`SELECT pg_notify($1, '')`, pgCancelChannel(cancelHost))
	}
	if err := c.SendBatch(ctx, b).Close(); err != nil && !committed {
		return err
	}
	return nil
}

// cancelFlagged is the host whose workers a write must tell of a cancel:
// the one driving a cycle that the write flags for cancel ("" if none,
// or if it is driven nowhere yet, where its driver reads the flag when it
// starts).
func cancelFlagged(was, r records.Record) string {
	c, ok := r.(*records.Cycle)
	if !ok || !c.Cancel || records.CycleTerminal(c.State) {
		return ""
	}
	if old, ok := was.(*records.Cycle); ok && old.Cancel {
		return ""
	}
	return c.Host
}

// queueKeys queues into b the statements that make the record's keys
// exactly keys: those of the version it replaces (was: nil if none, or
// if it does not decode) that it no longer has go, new ones are added.
func queueKeys(b *pgx.Batch, kind, id string, was records.Record, keys []records.IndexKey) {
	var had []records.IndexKey
	if was != nil {
		had = indexKeys(was)
	}
	queueKeyChanges(b, kind, id, had, keys)
}

// queueKeyChanges queues the statements that make a record's keys, had,
// those of its new version, keys.
func queueKeyChanges(b *pgx.Batch, kind, id string, had, keys []records.IndexKey) {
	var gone, added []records.IndexKey
	for _, k := range had {
		if !slices.Contains(keys, k) {
			gone = append(gone, k)
		}
	}
	for _, k := range keys {
		if !slices.Contains(had, k) {
			added = append(added, k)
		}
	}
	if len(gone) > 0 {
		fields, values := splitKeys(gone)
		b.Queue(`DELETE FROM talkbox_keys WHERE kind = $1 AND id = $2
			AND (field, value) IN (SELECT * FROM unnest($3::text[], $4::text[]))`, kind, id, fields, values)
	}
	queueInsertKeys(b, kind, id, added)
}

func splitKeys(keys []records.IndexKey) (fields, values []string) {
	for _, k := range keys {
		fields, values = append(fields, k.Field), append(values, k.Value)
	}
	return fields, values
}

const pgInsertKeys = `INSERT INTO talkbox_keys (kind, field, value, id)
	SELECT $1, f, v, $2 FROM unnest($3::text[], $4::text[]) AS k(f, v)
	ON CONFLICT DO NOTHING`

func insertKeys(ctx context.Context, tx pgx.Tx, kind, id string, keys []records.IndexKey) error {
	if len(keys) == 0 {
		return nil
	}
	fields, values := splitKeys(keys)
	_, err := tx.Exec(ctx, pgInsertKeys, kind, id, fields, values)
	return err
}

func queueInsertKeys(b *pgx.Batch, kind, id string, keys []records.IndexKey) {
	if len(keys) > 0 {
		fields, values := splitKeys(keys)
		b.Queue(pgInsertKeys, kind, id, fields, values)
	}
}

// compactNow compacts the journal table after every pgCompactEvery writes
// of this process; a failure is left to the next time.
func (s *pgStore) compactNow(ctx context.Context, n int) {
	after := s.writes.Add(int64(n))
	if (after-int64(n))/pgCompactEvery != after/pgCompactEvery {
		s.Compact(ctx)
	}
}

func (s *pgStore) ReadRaw(id string) ([]byte, error) {
	if _, err := checkRef(id); err != nil {
		return nil, err
	}
	var data []byte
	err := s.pool.QueryRow(context.Background(), `SELECT data FROM talkbox_records WHERE id = $1`, id).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	return data, pgErr(err)
}

func (s *pgStore) Exists(id string) bool {
	if _, err := checkRef(id); err != nil {
		return false
	}
	var ok bool
	err := s.pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM talkbox_records WHERE id = $1)`, id).Scan(&ok)
	return err == nil && ok
}

func (s *pgStore) strings(query string, args ...any) ([]string, error) {
	rows, err := s.pool.Query(context.Background(), query, args...)
	if err != nil {
		return nil, pgErr(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, pgErr(err)
}

func (s *pgStore) List(kind string) ([]string, error) {
	if !records.ValidKind(kind) {
		return nil, fmt.Errorf("invalid kind %q", kind)
	}
	return s.strings(`SELECT id FROM talkbox_records WHERE kind = $1 ORDER BY id`, kind)
}

func (s *pgStore) Kinds() ([]string, error) {
	return s.strings(`SELECT DISTINCT kind FROM talkbox_records ORDER BY kind`)
}

func (s *pgStore) ByKey(kind, field, value string) ([]string, error) {
	return s.strings(`SELECT id FROM talkbox_keys WHERE kind = $1 AND field = $2 AND value = $3 ORDER BY id`, kind, field, value)
}

func (s *pgStore) Delete(ctx context.Context, id string) error {
	kind, err := checkRef(id)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := xactLock(ctx, tx, "record", id); err != nil {
			return err
		}
		var rev int64
		err := tx.QueryRow(ctx, `DELETE FROM talkbox_records WHERE id = $1 RETURNING rev`, id).Scan(&rev)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%s: %w", id, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM talkbox_keys WHERE id = $1`, id); err != nil {
			return err
		}
		if err := s.journal(ctx, tx, []entry{{At: s.dir.Now(), Op: opDelete, Kind: kind, ID: id, Rev: rev}}); err != nil {
			return err
		}
		s.dir.hook(crashPgWritten)
		return nil
	})
	if err != nil {
		return pgErr(err)
	}
	s.journaled(ctx, 1, false) // a record gone brings no worker work
	return nil
}

func checkIndexKey(name, key string) error {
	if !records.ValidKind(name) || !validIndexKey(key) {
		return fmt.Errorf("invalid index key %s/%s", name, key)
	}
	return nil
}

func (s *pgStore) Lookup(name, key string) (string, error) {
	if err := checkIndexKey(name, key); err != nil {
		return "", err
	}
	return s.lookup(context.Background(), s.pool, name, key)
}

// lookup is Lookup in a transaction or out of one; a key whose record has
// gone counts as absent.
func (s *pgStore) lookup(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, name, key string) (string, error) {
	var id string
	err := q.QueryRow(ctx, `SELECT i.id FROM talkbox_index i JOIN talkbox_records r ON r.id = i.id
		WHERE i.name = $1 AND i.key = $2`, name, key).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%s %s: %w", name, key, ErrNotFound)
	}
	return id, pgErr(err)
}

func (s *pgStore) Claim(ctx context.Context, name, key string, newRecord func() (records.Record, error)) (string, bool, error) {
	if err := checkIndexKey(name, key); err != nil {
		return "", false, err
	}
	var (
		id      string
		created bool
		fleet   bool // the fleet's workers are woken once it commits
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := xactLock(ctx, tx, "index", name+"\x00"+key); err != nil {
			return err
		}
		found, err := s.lookup(ctx, tx, name, key)
		if err == nil {
			id = found
			return nil
		}
		if !errors.Is(err, ErrNotFound) {
			return err
		}
		r, err := newRecord()
		if err != nil {
			return err
		}
		id = r.Header().ID
		if err := records.CheckID(id); err != nil {
			return fmt.Errorf("claim %s %s: %w", name, key, err)
		}
		b := &pgBatch{s: s, ctx: ctx, tx: tx, held: map[string]bool{name + "\x00" + key: true}} // by xactLock above
		line, err := b.Create(r)
		if err == nil && line == nil {
			err = fmt.Errorf("claim %s %s: record %s is locked by another writer", name, key, id)
		}
		if err == nil {
			err = b.SetIndex(name, key, id)
		}
		if err == nil {
			err = b.flush()
		}
		if err != nil {
			b.giveBack()
			return err
		}
		s.dir.hook(crashPgWritten)
		created, fleet = true, b.fleet
		return nil
	})
	if err != nil {
		return "", false, pgErr(err)
	}
	if created {
		s.journaled(ctx, 1, fleet)
	}
	return id, created, nil
}

func (s *pgStore) SetIndex(name, key, id string) error {
	if err := checkIndexKey(name, key); err != nil {
		return err
	}
	if err := records.CheckID(id); err != nil {
		return err
	}
	ctx := context.Background()
	return pgErr(pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := xactLock(ctx, tx, "index", name+"\x00"+key); err != nil {
			return err
		}
		return setIndexRow(ctx, tx, name, key, id)
	}))
}

func setIndexRow(ctx context.Context, tx pgx.Tx, name, key, id string) error {
	_, err := tx.Exec(ctx, `INSERT INTO talkbox_index (name, key, id) VALUES ($1, $2, $3)
		ON CONFLICT (name, key) DO UPDATE SET id = EXCLUDED.id`, name, key, id)
	return err
}

// Lock holds the lock's advisory lock in a transaction on a connection of
// its own: the lock is released when unlock rolls it back, or when the
// connection ends (the holder died, or the database restarted). The
// transaction writes nothing, so it never gets an xid and does not hold
// back the journal's followers (pg_journal.go) for as long as it is held.
func (s *pgStore) Lock(ctx context.Context, name string) (func(), error) {
	unlock, _, err := s.lockNamed(ctx, name, true)
	return unlock, err
}

func (s *pgStore) TryLock(ctx context.Context, name string) (func(), bool, error) {
	return s.lockNamed(ctx, name, false)
}

func (s *pgStore) lockNamed(ctx context.Context, name string, wait bool) (func(), bool, error) {
	if _, err := s.dir.namedLockPath(name); err != nil {
		return nil, false, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, pgErr(err)
	}
	c := conn.Conn()
	// One round trip, the statements in a pipeline: BEGIN, the timeout,
	// the lock. A holder that goes silent (its host died, its network
	// went) is cut off by the server after lockTimeout, which frees the
	// lock; a live one keeps its transaction busy below.
	got := true
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SELECT set_config('idle_in_transaction_session_timeout', $1, true)`, strconv.FormatInt(s.lockTimeout.Milliseconds(), 10))
	if wait {
		b.Queue(`SELECT pg_advisory_xact_lock($1)`, lockKey("named", name))
	} else {
		b.Queue(`SELECT pg_try_advisory_xact_lock($1)`, lockKey("named", name)).QueryRow(func(row pgx.Row) error {
			return row.Scan(&got)
		})
	}
	err = c.SendBatch(ctx, b).Close()
	if err != nil || !got {
		if !c.IsClosed() && c.PgConn().TxStatus() != 'I' {
			c.Exec(context.Background(), `ROLLBACK`)
		}
		conn.Release()
		return nil, false, pgErr(err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(s.lockTimeout / 4)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				c.Exec(context.Background(), `SELECT 1`)
			}
		}
	}()
	var once sync.Once
	unlock := func() {
		once.Do(func() {
			close(stop)
			<-stopped
			c.Exec(context.Background(), `ROLLBACK`)
			conn.Release()
		})
	}
	return unlock, true, nil
}

// Compact deletes the journal entries a later entry of the same record
// supersedes, as the directory's compaction keeps only each record's last.
func (s *pgStore) Compact(ctx context.Context) (CompactStats, error) {
	var st CompactStats
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM talkbox_journal j
			WHERE EXISTS (SELECT 1 FROM talkbox_journal k WHERE k.id = j.id AND k.seq > j.seq)`)
		if err != nil {
			return err
		}
		st.Dropped = int(tag.RowsAffected())
		var kept int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM talkbox_journal`).Scan(&kept); err != nil {
			return err
		}
		st.Kept = int(kept)
		return nil
	})
	return st, pgErr(err)
}

func (s *pgStore) Replay(ctx context.Context) (map[string][]byte, JournalStats, error) {
	out := map[string][]byte{}
	var st JournalStats
	rows, err := s.pool.Query(ctx, `SELECT op, id, data FROM talkbox_journal ORDER BY seq`)
	if err != nil {
		return nil, st, pgErr(err)
	}
	var op, id string
	var data []byte
	_, err = pgx.ForEachRow(rows, []any{&op, &id, &data}, func() error {
		st.Entries++
		if op == opPut {
			out[id] = append([]byte(nil), data...)
		} else {
			delete(out, id)
		}
		return nil
	})
	return out, st, pgErr(err)
}

// Check decodes every record and, with Repair, adds the keys one lacks;
// with opts.Blobs it also checks this host's blobs.
func (s *pgStore) Check(ctx context.Context, opts CheckOptions) (*CheckReport, error) {
	rep := &CheckReport{}
	kinds, err := s.Kinds()
	if err != nil {
		return nil, err
	}
	rep.Kinds = len(kinds)
	for _, kind := range kinds {
		ids, err := s.List(kind)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			rep.Records++
			rec := records.New(kind)
			if err := getRecord(s, id, rec); err != nil {
				if !errors.Is(err, ErrNotFound) {
					rep.problem(id, s.where(id), "%v", err)
				}
				continue
			}
			if h := rec.Header(); h.ID != id || h.Kind != kind {
				rep.problem(id, s.where(id), "stored as %s of kind %s", h.ID, h.Kind)
			}
			if err := s.checkKeys(ctx, rep, rec, opts.Repair); err != nil {
				return nil, err
			}
		}
	}
	if opts.Blobs {
		if err := s.dir.checkBlobs(ctx, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

func (s *pgStore) checkKeys(ctx context.Context, rep *CheckReport, rec records.Record, repair bool) error {
	h := rec.Header()
	for _, k := range indexKeys(rec) {
		var ok bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM talkbox_keys WHERE kind = $1 AND field = $2 AND value = $3 AND id = $4)`,
			h.Kind, k.Field, k.Value, h.ID).Scan(&ok); err != nil {
			return pgErr(err)
		}
		if ok {
			continue
		}
		if !repair {
			rep.problem(h.ID, s.where(h.ID), "not found under its key %s=%s", k.Field, k.Value)
			continue
		}
		if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			return insertKeys(ctx, tx, h.Kind, h.ID, []records.IndexKey{k})
		}); err != nil {
			return pgErr(err)
		}
		rep.Repaired = append(rep.Repaired, fmt.Sprintf("%s: key %s=%s", h.ID, k.Field, k.Value))
	}
	return nil
}

// pgErr classes what the database could not do: a lost or refused
// connection, a server shutting down or a deadlock is worth retrying later
// (exit 75); the statement's own errors are failures.
func pgErr(err error) error {
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrExists) || errors.Is(err, context.Canceled) {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code[:2] == "08", pe.Code[:2] == "57", pe.Code == "40001", pe.Code == "40P01", pe.Code == "53300":
			return fault.TempFail(err)
		}
		return err
	}
	var ne net.Error
	var ce *pgconn.ConnectError
	if errors.As(err, &ne) || errors.As(err, &ce) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return fault.TempFail(err)
	}
	return err
}
