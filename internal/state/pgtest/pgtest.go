// Package pgtest starts throw-away PostgreSQL servers for tests and
// benchmarks of the PostgreSQL state backend, so that they need no server
// set up beforehand and can crash and restart one at will.
package pgtest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
)

// port only names the socket (DIR/.s.PGSQL.5432): the server listens on no
// TCP port, so clusters in different directories never collide.
const port = 5432

// Cluster is a PostgreSQL server started for one test (or benchmark) on a
// temporary directory, reachable only on a Unix socket.
type Cluster struct {
	bin  string              // directory holding initdb and pg_ctl
	dir  string              // socket directory; data and log live under it
	cred *syscall.Credential // whom initdb and pg_ctl run as; nil: ourselves
	opts string              // the server's command line options (pg_ctl -o)

	mu  sync.Mutex
	dbs int // databases NewDatabase has created, to name the next one
}

type config struct {
	noFsync        bool
	maxConns       int
	statementStats bool
}

// Option changes how Start sets up a cluster.
type Option func(*config)

// WithoutFsync is for tests where durability against power loss is not the
// point: with fsync=off a commit costs no disk flush. A crash of the server
// (Kill) still loses no commit, because its WAL is written to the page cache
// before the commit returns. That is why synchronous_commit stays on:
// turning it off made commits no faster here, and lost every commit of the
// last ~200 ms to Kill. Benchmarks leave fsync on, so that they measure what
// a real server costs.
func WithoutFsync() Option {
	return func(c *config) { c.noFsync = true }
}

// WithMaxConnections lets the server take n connections instead of 200:
// a benchmark of many simulated hosts, each with connections of its own.
func WithMaxConnections(n int) Option {
	return func(c *config) { c.maxConns = n }
}

// WithStatementStats loads pg_stat_statements, so that a test can count
// the statements a piece of work runs and the rows they return (Statements).
func WithStatementStats() Option {
	return func(c *config) { c.statementStats = true }
}

// Start runs initdb and pg_ctl start on a new temporary directory, and
// stops the server and removes the directory in t.Cleanup. It fails the
// test with the server's log when something does not start; it never
// skips, because a backend whose tests skip silently is a backend untested.
func Start(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	bin, err := findBin()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{bin: bin}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root.
		c.cred, err = postgresUser()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Short and under /tmp whatever TMPDIR says: a socket's path must fit
	// in 107 bytes.
	c.dir, err = os.MkdirTemp("/tmp", "tbpg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.cleanup(t))
	if c.cred != nil {
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	c.initdb(t)

	c.opts = fmt.Sprintf("-k %s -p %d -c listen_addresses='' -c max_connections=%d", c.dir, port, cmp.Or(cfg.maxConns, 200))
	if cfg.noFsync {
		c.opts += " -c fsync=off"
	}
	if cfg.statementStats {
		c.opts += " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
	}
	c.StartAgain(t)
	return c
}

// cleanup stops the server however the test ended (a server left running
// would outlive the test binary) and removes its directory. An immediate
// stop is enough: the data is about to be deleted.
func (c *Cluster) cleanup(t testing.TB) func() {
	return func() {
		if _, err := os.Stat(filepath.Join(c.dataDir(), "postmaster.pid")); err == nil {
			if out, err := c.pgCtl("stop", "-m", "immediate"); err != nil {
				t.Errorf("pgtest: stopping the server in %s: %v\n%s\nserver log:\n%s", c.dir, err, out, c.Log())
				return // removing the directory under a live server would hide it
			}
		}
		if err := os.RemoveAll(c.dir); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	}
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *Cluster) logFile() string { return filepath.Join(c.dir, "log") }

// initdb creates the cluster. It syncs what it wrote (no --no-sync): that
// saved nothing measurable here, and would leave benchmarks competing with
// the write-back of the new cluster's files.
func (c *Cluster) initdb(t testing.TB) {
	t.Helper()
	args := []string{"--auth=trust", "-U", "postgres", "--encoding=UTF8", "-D", c.dataDir()}
	out, err := c.run("initdb", append(args, "--locale=C.UTF-8")...)
	if err != nil && bytes.Contains(out, []byte("locale")) {
		// A C library without C.UTF-8: collation does not matter to the
		// backend, which compares keys as bytes.
		first := out
		if err := os.RemoveAll(c.dataDir()); err != nil {
			t.Fatal(err)
		}
		out, err = c.run("initdb", append(args, "--no-locale")...)
		out = append(append(first, "\n--- retried with --no-locale:\n"...), out...)
	}
	if err != nil {
		t.Fatalf("pgtest: initdb in %s: %v\n%s", c.dir, err, out)
	}
}

// URL is a connection string for database db on the socket as the
// superuser. It names the port as well as the host so that PGPORT in the
// environment cannot redirect it.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", db, c.dir, port)
}

// NewDatabase creates a fresh database and returns its URL, so that tests
// sharing a cluster (and its start-up time) do not see each other's rows.
func (c *Cluster) NewDatabase(t testing.TB) string {
	t.Helper()
	c.mu.Lock()
	c.dbs++
	name := fmt.Sprintf("tb_%d", c.dbs)
	c.mu.Unlock()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("pgtest: connecting to %s: %v\nserver log:\n%s", c.dir, err, c.Log())
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	return c.URL(name)
}

// StatementRows counts what the statements run on database url since the
// last count (or its creation) returned, by table: the rows of each
// statement that names the table. The cluster needs WithStatementStats.
func (c *Cluster) StatementRows(t testing.TB, url string, tables ...string) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	out := map[string]int64{}
	for _, table := range tables {
		var n int64
		if err := conn.QueryRow(ctx, `SELECT coalesce(sum(rows), 0)::bigint FROM pg_stat_statements
			WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query ~ ('\m' || $1 || '\M')`, table).Scan(&n); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		out[table] = n
	}
	if _, err := conn.Exec(ctx, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)`); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return out
}

// Stop shuts the server down cleanly (pg_ctl stop -m fast): connections are
// cut, and the server checkpoints before it exits.
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	c.ctl(t, "stop", "-m", "fast")
}

// Kill stops the server as a crash would (pg_ctl stop -m immediate): no
// checkpoint, so the next start has to recover from the WAL.
func (c *Cluster) Kill(t testing.TB) {
	t.Helper()
	c.ctl(t, "stop", "-m", "immediate")
}

// StartAgain starts the server on the same directory and socket after Stop
// or Kill, so URLs taken before stay valid.
func (c *Cluster) StartAgain(t testing.TB) {
	t.Helper()
	c.ctl(t, "start", "-l", c.logFile(), "-o", c.opts)
}

// Restart is Stop then StartAgain.
func (c *Cluster) Restart(t testing.TB) {
	t.Helper()
	c.Stop(t)
	c.StartAgain(t)
}

// Log returns the server log so far, for failure messages.
func (c *Cluster) Log() string {
	b, err := os.ReadFile(c.logFile())
	if err != nil {
		return fmt.Sprintf("(no server log: %v)", err)
	}
	return string(b)
}

// ctl runs pg_ctl, which waits (-w) until the server is up or gone: no
// polling here.
func (c *Cluster) ctl(t testing.TB, args ...string) {
	t.Helper()
	if out, err := c.pgCtl(args...); err != nil {
		t.Fatalf("pgtest: pg_ctl %s in %s: %v\n%s\nserver log:\n%s", args[0], c.dir, err, out, c.Log())
	}
}

func (c *Cluster) pgCtl(args ...string) ([]byte, error) {
	return c.run("pg_ctl", append([]string{"-w", "-D", c.dataDir()}, args...)...)
}

// run runs one of the cluster's programs as the cluster's owner. It runs in
// the cluster's directory because initdb and pg_ctl look up their own path
// and fail in a working directory the postgres user cannot read.
func (c *Cluster) run(prog string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(c.bin, prog), args...)
	cmd.Dir = c.dir
	cmd.Env = cleanEnv()
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd.CombinedOutput()
}

// cleanEnv is the environment without PG* variables: PGDATA, PGPORT,
// PGOPTIONS and the like would change which cluster pg_ctl acts on or how
// the server starts.
func cleanEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PG") })
}

const noPostgres = "pgtest: PostgreSQL not found (no /usr/lib/postgresql/*/bin/pg_ctl, no pg_ctl on PATH): install the Debian package postgresql (scripts/deps.sh does)"

// findBin returns the directory of the newest PostgreSQL that Debian
// installed, which need not be on PATH, else that of pg_ctl on PATH.
func findBin() (string, error) {
	ctls, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(ctls) > 0 {
		version := func(p string) []int {
			var v []int
			for _, f := range strings.Split(filepath.Base(filepath.Dir(filepath.Dir(p))), ".") {
				n, _ := strconv.Atoi(f)
				v = append(v, n)
			}
			return v
		}
		// Numerically: 9.6 is older than 15.
		newest := slices.MaxFunc(ctls, func(a, b string) int { return slices.Compare(version(a), version(b)) })
		return filepath.Dir(newest), nil
	}
	ctl, err := exec.LookPath("pg_ctl")
	if err != nil {
		return "", errors.New(noPostgres)
	}
	return filepath.Dir(ctl), nil
}

// postgresUser is whom root runs the server as: the account the Debian
// package creates.
func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root, and PostgreSQL refuses to; looking up the user postgres to run it as: %v (the Debian package postgresql creates it)", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: user postgres: uid %q: %v", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: user postgres: gid %q: %v", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// Connect opens a connection of its own to the database at url, as
// another client would, closed when the test ends (or sooner, by the
// caller).
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	return conn
}
