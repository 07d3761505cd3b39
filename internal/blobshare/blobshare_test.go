package blobshare_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/blobshare"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
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
	fl := newFleet(t)
	owner, other, needer := fl.host(), fl.host(), fl.host()
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

// get requests path of srv with the bearer token tok ("" for none).
func get(t *testing.T, method, url, tok string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestHandlerServesOnlyBlobs: nothing but GET and HEAD of a digest, and
// nothing at all without the token.
func TestHandlerServesOnlyBlobs(t *testing.T) {
	st := open(t)
	b, err := st.PutBlob(context.Background(), strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := st.BlobToken(context.Background())
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
		if code, _ := get(t, c.method, srv.URL+c.path, tok); code != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, code, c.want)
		}
		if code, _ := get(t, c.method, srv.URL+c.path, ""); code != http.StatusUnauthorized {
			t.Errorf("%s %s without the token: %d, want 401", c.method, c.path, code)
		}
	}
}

// TestBlobServerNeedsTheFleetsToken: over real HTTP on loopback, a request
// without the fleet's token, or with another's, is refused (401) and gets
// none of the blob; a host of another fleet (its own database) fetches
// nothing and stores nothing.
func TestBlobServerNeedsTheFleetsToken(t *testing.T) {
	ctx := context.Background()
	fl := newFleet(t)
	owner := fl.host()
	content := strings.Repeat("secret capture ", 1000)
	b, err := owner.PutBlob(ctx, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(blobshare.Handler(owner))
	defer srv.Close()
	stranger := newFleet(t).host()
	otherTok, err := stranger.BlobToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"", otherTok, "x"} {
		code, body := get(t, "GET", srv.URL+blobshare.Path+b.SHA256, tok)
		if code != http.StatusUnauthorized || strings.Contains(body, "secret capture") {
			t.Fatalf("token %q: %d %q", tok, code, body)
		}
	}
	err = blobshare.Fetch(ctx, stranger, http.DefaultClient, b.SHA256, []string{srv.URL})
	if err == nil || !strings.Contains(err.Error(), "401") || stranger.HasBlob(b.SHA256) {
		t.Fatalf("another fleet's host fetched: %v", err)
	}
	// The fleet's own hosts share the token through the database.
	if err := blobshare.Fetch(ctx, fl.host(), http.DefaultClient, b.SHA256, []string{srv.URL}); err != nil {
		t.Fatal(err)
	}
}

// streamer is a peer that answers every request with total bytes of
// garbage, announcing length as its Content-Length (-1: none, streamed);
// sent is how much it got written before the client hung up.
func streamer(t *testing.T, length, total int64) (url string, sent <-chan int64) {
	ch := make(chan int64, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if length >= 0 {
			w.Header().Set("Content-Length", fmt.Sprint(length))
		}
		w.WriteHeader(http.StatusOK)
		buf := make([]byte, 1<<20)
		var n int64
		for n < total {
			k, err := w.Write(buf)
			n += int64(k)
			if err != nil {
				break
			}
			w.(http.Flusher).Flush()
		}
		ch <- n
	}))
	t.Cleanup(srv.Close)
	return srv.URL, ch
}

// TestFetchReadsNoMoreThanAnnounced: a peer that streams without saying
// how much is cut off at once, and one that announces more than the
// store's free-space guard allows has nothing written: neither's content
// is stored, and each could send only what the socket buffers hold.
func TestFetchReadsNoMoreThanAnnounced(t *testing.T) {
	ctx := context.Background()
	sum := sha256.Sum256([]byte("the real thing"))
	sha := hex.EncodeToString(sum[:])
	const total = 256 << 20

	needer := open(t)
	url, sent := streamer(t, -1, total)
	err := blobshare.Fetch(ctx, needer, http.DefaultClient, sha, []string{url})
	if err == nil || needer.HasBlob(sha) {
		t.Fatalf("a peer streaming without a length: %v", err)
	}
	if n := <-sent; n >= total {
		t.Fatalf("the fetch read all %d bytes the peer streamed", n)
	}

	// A store that keeps all but 64 MiB of its file system free.
	dir := t.TempDir()
	fr, err := diskspace.Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	guarded, err := state.Open(ctx, dir, state.WithMinFree(diskspace.Threshold{Bytes: fr.Avail - 64<<20}))
	if err != nil {
		t.Fatal(err)
	}
	url, sent = streamer(t, 1<<40, total)
	err = blobshare.Fetch(ctx, guarded, http.DefaultClient, sha, []string{url})
	if !errors.Is(err, diskspace.ErrLow) || fault.Code(err) != fault.ExitTempFail || strings.Contains(err.Error(), "after") || guarded.HasBlob(sha) {
		t.Fatalf("a peer announcing 1 TiB: %v (exit %d)", err, fault.Code(err))
	}
	if n := <-sent; n >= total {
		t.Fatalf("the fetch read all %d bytes the peer sent", n)
	}
}

// TestCheckAddr: an unspecified address serves the blobs on every network
// of the host, so it is refused unless meant.
func TestCheckAddr(t *testing.T) {
	for _, c := range []struct {
		addr    string
		anyAddr bool
		ok      bool
	}{
		{"192.0.2.5:7300", false, true},
		{"localhost:7300", false, true},
		{"[2001:db8::5]:7300", false, true},
		{":7300", false, false},
		{"0.0.0.0:7300", false, false},
		{"[::]:7300", false, false},
		{"0.0.0.0:7300", true, true},
		{"7300", false, false},
	} {
		err := blobshare.CheckAddr(c.addr, c.anyAddr)
		if (err == nil) != c.ok || err != nil && fault.Code(err) != fault.ExitUsage {
			t.Errorf("CheckAddr(%q, %v) = %v", c.addr, c.anyAddr, err)
		}
	}
}
