package blobshare_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/blobshare"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

func open(t *testing.T) *state.Store {
	t.Helper()
	st, err := state.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestFetchFromAPeer: a host fetches a blob it lacks from the peer that
// serves it, over real HTTP; a peer without it is passed over, and a peer
// that serves other content under the digest gets nothing stored.
func TestFetchFromAPeer(t *testing.T) {
	ctx := context.Background()
	owner, other, needer := open(t), open(t), open(t)
	content := strings.Repeat("sample bytes ", 10000)
	b, err := owner.PutBlob(ctx, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	has := httptest.NewServer(blobshare.Handler(owner))
	defer has.Close()
	hasNot := httptest.NewServer(blobshare.Handler(other))
	defer hasNot.Close()

	if err := blobshare.Fetch(ctx, needer, http.DefaultClient, b.SHA256, []string{hasNot.URL}); !errors.Is(err, blobshare.ErrNowhere) {
		t.Fatalf("fetch from a peer without it: %v", err)
	}
	if err := blobshare.Fetch(ctx, needer, http.DefaultClient, b.SHA256, []string{hasNot.URL, has.URL + "/"}); err != nil {
		t.Fatal(err)
	}
	f, err := needer.OpenBlob(b.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if string(got) != content {
		t.Fatalf("fetched %d bytes, not the blob's %d", len(got), len(content))
	}

	// A peer that answers with other content under the digest.
	liar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "not the sample")
	}))
	defer liar.Close()
	sum := sha256.Sum256([]byte("the real thing"))
	sha := hex.EncodeToString(sum[:])
	if err := blobshare.Fetch(ctx, needer, http.DefaultClient, sha, []string{liar.URL}); err == nil || needer.HasBlob(sha) {
		t.Fatalf("a lying peer's content was stored (err %v)", err)
	}
}

// TestHandlerServesOnlyBlobs: nothing but GET and HEAD of a digest.
func TestHandlerServesOnlyBlobs(t *testing.T) {
	st := open(t)
	b, err := st.PutBlob(context.Background(), strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(blobshare.Handler(st))
	defer srv.Close()
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", blobshare.Path + b.SHA256, 200},
		{"HEAD", blobshare.Path + b.SHA256, 200},
		{"POST", blobshare.Path + b.SHA256, 404},
		{"GET", blobshare.Path, 404},
		{"GET", blobshare.Path + "../../records", 404},
		{"GET", "/", 404},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.want)
		}
	}
}
