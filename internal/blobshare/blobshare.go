// Package blobshare lets the hosts of a fleet read each other's blobs: a
// blob stays on the host that made it (a sample planned there, a capture
// made there), and another host that needs it fetches it from that host's
// worker, which serves its blob store by digest over HTTP. Each request
// carries the fleet's token (state.BlobToken, kept in the shared database),
// without which nothing is served. What is fetched is read only up to the
// size the peer announced, within the store's free-space guard, and checked
// against its sha256 before it is stored, so a peer can neither pass off
// other content nor fill the disk.
package blobshare

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Path is where a blob is served: Path + its sha256.
const Path = "/blobs/sha256/"

// Handler serves the host's blobs by digest: GET (or HEAD) Path+SHA256
// with the fleet's token as a bearer token, 404 when the host does not
// have it, 401 without the token. It lists nothing.
func Handler(st *state.Store) http.Handler {
	tok := &token{st: st}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := tok.check(r); err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="talkbox blobs"`)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		sha, ok := strings.CutPrefix(r.URL.Path, Path)
		if !ok || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
			http.NotFound(w, r)
			return
		}
		f, err := st.OpenBlob(sha)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeContent(w, r, "", fi.ModTime(), f)
	})
}

// token is the fleet's blob token, read from the store once.
type token struct {
	st   *state.Store
	mu   sync.Mutex
	hash []byte
}

// check compares the request's bearer token with the fleet's in constant
// time: digests of both, so that the time does not depend on the length
// of what was sent either.
func (t *token) check(r *http.Request) error {
	t.mu.Lock()
	if t.hash == nil {
		want, err := t.st.BlobToken(r.Context())
		if err != nil {
			t.mu.Unlock()
			return errors.New("no blob token to check against")
		}
		h := sha256.Sum256([]byte(want))
		t.hash = h[:]
	}
	want := t.hash
	t.mu.Unlock()
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	g := sha256.Sum256([]byte(got))
	if !ok || subtle.ConstantTimeCompare(g[:], want) != 1 {
		return errors.New("the fleet's blob token is required")
	}
	return nil
}

// CheckAddr refuses to serve blobs on an unspecified address (":7300",
// "0.0.0.0:7300", "[::]:7300"), which would offer them on every network of
// the host, unless anyAddr says that is meant.
func CheckAddr(addr string, anyAddr bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fault.Usage(fmt.Errorf("--serve-blobs %s: %w", addr, err))
	}
	if anyAddr {
		return nil
	}
	if ip, err := netip.ParseAddr(host); host == "" || err == nil && ip.IsUnspecified() {
		return fault.Usage(fmt.Errorf("--serve-blobs %s listens on every address of the host: name the fleet network's address (or add --serve-blobs-any)", addr))
	}
	return nil
}

// ErrNowhere is returned when no peer has the blob. The error also wraps
// state.ErrNotFound, as a blob missing from the host's own store does,
// unless a peer could not be asked: then it is worth retrying later
// (fault.TempFail), since that peer may hold it.
var ErrNowhere = errors.New("no host of the fleet serves it")

// nowhere is Fetch's error when no peer had the blob: one line naming the
// blob, the peers asked and those that failed.
type nowhere struct {
	sha    string
	asked  int
	failed []error
}

func (e *nowhere) Error() string {
	msg := fmt.Sprintf("blob %s: not on this host, and %s (%d blob servers asked)", e.sha, ErrNowhere, e.asked)
	for _, err := range e.failed {
		msg += "; " + err.Error()
	}
	return msg
}

func (e *nowhere) Unwrap() []error {
	if len(e.failed) > 0 {
		return append([]error{ErrNowhere}, e.failed...)
	}
	return []error{ErrNowhere, state.ErrNotFound}
}

// Fetch stores the blob with this digest from the first of peers (base
// URLs of workers' blob servers) that has it, unless the store has it
// already.
func Fetch(ctx context.Context, st *state.Store, client *http.Client, sha string, peers []string) error {
	if st.HasBlob(sha) {
		return nil
	}
	e := &nowhere{sha: sha, asked: len(peers)}
	for _, p := range peers {
		err := fetchFrom(ctx, st, client, strings.TrimSuffix(p, "/")+Path+sha, sha)
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			e.failed = append(e.failed, err)
		}
	}
	if len(e.failed) > 0 {
		return fault.TempFail(e)
	}
	return e
}

// Peers are the blob servers of the live workers of the fleet whose
// records st holds, but self's (none when self is ""): content addressing
// makes any host holding a blob as good as the one that made it.
func Peers(st *state.Store, self string) ([]string, error) {
	now := st.Now()
	ws, err := state.Find(st, records.KindWorker, func(w *records.Worker) bool {
		return w.Host != self && w.BlobURL != "" && w.Alive(now)
	})
	if err != nil {
		return nil, err
	}
	urls := make([]string, 0, len(ws))
	for _, w := range ws {
		if !slices.Contains(urls, w.BlobURL) {
			urls = append(urls, w.BlobURL)
		}
	}
	return urls, nil
}

// FromWorkers is the state.BlobFetcher of a fleet whose hosts keep their
// own blobs: it fetches a blob from the live workers' blob servers (Peers),
// with client.
func FromWorkers(client *http.Client, self string) state.BlobFetcher {
	return func(ctx context.Context, st *state.Store, sha string) error {
		peers, err := Peers(st, self)
		if err != nil {
			return fmt.Errorf("blob %s: finding the fleet's blob servers: %w", sha, err)
		}
		return Fetch(ctx, st, client, sha, peers)
	}
}

// NewClient is an HTTP client for Fetch: a peer that does not connect or
// answer is given up in seconds, and a whole transfer after an hour.
func NewClient() *http.Client {
	return &http.Client{
		Timeout: time.Hour,
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 30 * time.Second,
			IdleConnTimeout:       90 * time.Second,
		},
	}
}

func fetchFrom(ctx context.Context, st *state.Store, client *http.Client, url, sha string) error {
	token, err := st.BlobToken(ctx)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return os.ErrNotExist
	default:
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	// The blob's size is what the peer announced, and no more is read: a
	// peer that does not say, or says more than the store's free-space
	// guard allows, sends nothing to disk.
	if resp.ContentLength < 0 {
		return fmt.Errorf("%s: no Content-Length: refused", url)
	}
	body := &sized{r: io.LimitReader(resp.Body, resp.ContentLength+1), left: resp.ContentLength}
	// PutBlobKnown checks the digest as it writes: content that is not
	// the blob asked for is not stored.
	if _, err := st.PutBlobKnown(ctx, sha, body); err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	return nil
}

// sized reads a body of a known length, failing on a byte more; its Len is
// what the store's free-space guard checks before writing.
type sized struct {
	r    io.Reader
	left int64
}

func (s *sized) Len() int { return int(s.left) }

func (s *sized) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.left -= int64(n)
	if s.left < 0 {
		return n, errors.New("more bytes than its Content-Length")
	}
	return n, err
}
