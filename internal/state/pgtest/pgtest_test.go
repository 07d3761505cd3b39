package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestRestartKeepsData shows that Kill really stops the server (a
// connection made before it is dead) and that StartAgain brings back what
// was committed just before the crash, with fsync on or off. The subtests
// run at once, so they also show that two clusters of one process do not
// collide.
func TestRestartKeepsData(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []Option
		fsync string
	}{
		{"fsync", nil, "on"},
		{"WithoutFsync", []Option{WithoutFsync()}, "off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := Start(t, tc.opts...)
			url := c.NewDatabase(t)

			before := connect(t, url)
			var fsync string
			if err := before.QueryRow(ctx, "SHOW fsync").Scan(&fsync); err != nil {
				t.Fatal(err)
			}
			if fsync != tc.fsync {
				t.Errorf("fsync = %s, want %s", fsync, tc.fsync)
			}
			if _, err := before.Exec(ctx, "CREATE TABLE t (v text); INSERT INTO t VALUES ('kept')"); err != nil {
				t.Fatal(err)
			}

			c.Kill(t)
			if _, err := before.Exec(ctx, "SELECT 1"); err == nil {
				t.Fatal("a connection made before Kill still works after it")
			}
			c.StartAgain(t)

			var v string
			if err := connect(t, url).QueryRow(ctx, "SELECT v FROM t").Scan(&v); err != nil {
				t.Fatalf("after restart: %v\nserver log:\n%s", err, c.Log())
			}
			if v != "kept" {
				t.Fatalf("after restart: got %q, want %q", v, "kept")
			}
		})
	}
}
