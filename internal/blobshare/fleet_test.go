package blobshare_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/blobshare"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// fleet is one PostgreSQL database that hosts open with their own
// directories, as tools on a fleet's hosts do.
type fleet struct {
	t   *testing.T
	url string
}

func newFleet(t *testing.T) *fleet {
	pg := pgtest.Start(t, pgtest.WithoutFsync())
	return &fleet{t: t, url: pg.NewDatabase(t)}
}

// host opens the shared store with a directory of the host's own.
func (f *fleet) host(opts ...state.Option) *state.Store {
	f.t.Helper()
	st, err := state.Open(context.Background(), f.t.TempDir(), append(opts, state.WithShared(f.url))...)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { st.Close() })
	return st
}

// worker records a worker of host serving its blobs at url; dead makes
// its heartbeat older than its DeadAfter, stopped marks it ended.
func worker(t *testing.T, st *state.Store, host, url string, dead, stopped bool) {
	t.Helper()
	w := &records.Worker{Host: host, BlobURL: url, Slots: 1, Heartbeat: st.Now(), DeadAfter: records.Duration(time.Hour), Stopped: stopped}
	if dead {
		w.Heartbeat = st.Now().Add(-2 * time.Hour)
	}
	records.Init(w, records.KindWorker, st.Now())
	if err := st.Create(context.Background(), w); err != nil {
		t.Fatal(err)
	}
}

// serve serves st's blobs on a real listener, as tb-run worker
// --serve-blobs does.
func serve(t *testing.T, st *state.Store) string {
	srv := httptest.NewServer(blobshare.Handler(st))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestPeers: the blob servers of the live workers, each once; a dead or
// stopped worker, one serving nothing and self are left out.
func TestPeers(t *testing.T) {
	st := open(t)
	worker(t, st, "a", "http://192.0.2.1:7300", false, false)
	worker(t, st, "b", "http://192.0.2.2:7300", false, false)
	worker(t, st, "b2", "http://192.0.2.2:7300", false, false)
	worker(t, st, "dead", "http://192.0.2.3:7300", true, false)
	worker(t, st, "stopped", "http://192.0.2.4:7300", false, true)
	worker(t, st, "silent", "", false, false)
	for _, c := range []struct {
		self string
		want []string
	}{
		{"", []string{"http://192.0.2.1:7300", "http://192.0.2.2:7300"}},
		{"a", []string{"http://192.0.2.2:7300"}},
	} {
		got, err := blobshare.Peers(st, c.self)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("Peers(self %q) = %q, want %q", c.self, got, c.want)
		}
	}
}

// TestEnsureBlobAcrossHosts: two hosts share one PostgreSQL store, each
// with its own blob directory. Host b reads a blob that only host a has
// through a's worker's blob server, found by its worker record; a blob no
// one has is "not found", naming it; a peer that lies about a blob gets
// nothing stored, and one that does not answer makes it worth retrying.
func TestEnsureBlobAcrossHosts(t *testing.T) {
	ctx := context.Background()
	fl := newFleet(t)
	a := fl.host()
	b := fl.host(state.WithBlobFetcher(blobshare.FromWorkers(blobshare.NewClient(), "")))
	content := strings.Repeat("capture bytes ", 50000)
	blob, err := a.PutBlob(ctx, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	if b.HasBlob(blob.SHA256) {
		t.Fatal("the hosts share a blob directory")
	}
	if _, err := b.OpenBlob(blob.SHA256); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("open before EnsureBlob: %v", err)
	}

	// No live worker serves it yet: not found, naming the blob.
	err = b.EnsureBlob(ctx, blob.SHA256)
	if !errors.Is(err, state.ErrNotFound) || !strings.Contains(err.Error(), blob.SHA256) || fault.Code(err) != fault.ExitFailure {
		t.Fatalf("EnsureBlob with no worker: %v (exit %d)", err, fault.Code(err))
	}

	worker(t, a, "a", serve(t, a), false, false)
	if err := b.EnsureBlob(ctx, blob.SHA256); err != nil {
		t.Fatal(err)
	}
	f, err := b.OpenBlob(blob.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if string(got) != content {
		t.Fatalf("read %d bytes on host b, not the blob's %d", len(got), len(content))
	}
	if !strings.HasPrefix(b.BlobPath(blob.SHA256), b.Root()) {
		t.Fatalf("fetched blob is at %s, outside host b's directory %s", b.BlobPath(blob.SHA256), b.Root())
	}

	// A blob no host has.
	sum := sha256.Sum256([]byte("made nowhere"))
	nowhere := hex.EncodeToString(sum[:])
	err = b.EnsureBlob(ctx, nowhere)
	if !errors.Is(err, state.ErrNotFound) || !errors.Is(err, blobshare.ErrNowhere) || !strings.Contains(err.Error(), nowhere) {
		t.Fatalf("EnsureBlob of a blob no host has: %v", err)
	}

	// A worker that does not answer (nothing listens on its port), the
	// only one host c (which takes itself for a) asks: the blob may be
	// there, so the error is to retry later, and nothing is stored.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deaf := "http://" + l.Addr().String()
	l.Close()
	worker(t, a, "deaf", deaf, false, false)
	c := fl.host(state.WithBlobFetcher(blobshare.FromWorkers(blobshare.NewClient(), "a")))
	err = c.EnsureBlob(ctx, blob.SHA256)
	if err == nil || errors.Is(err, state.ErrNotFound) || fault.Code(err) != fault.ExitTempFail || !strings.Contains(err.Error(), blob.SHA256) {
		t.Fatalf("EnsureBlob with its only peer down: %v (exit %d)", err, fault.Code(err))
	}
	if _, err := os.Stat(c.BlobPath(blob.SHA256)); err == nil {
		t.Fatal("host c stored a blob it could not fetch")
	}

	// A worker that answers with other content under the digest.
	liar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "not what was asked")
	}))
	defer liar.Close()
	worker(t, a, "liar", liar.URL, false, false)
	if err := b.EnsureBlob(ctx, nowhere); err == nil || b.HasBlob(nowhere) {
		t.Fatalf("a lying peer's content was stored (err %v)", err)
	}
}
