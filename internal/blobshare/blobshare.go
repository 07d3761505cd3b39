// Package blobshare lets the hosts of a fleet read each other's blobs: a
// blob stays on the host that made it (a sample planned there, a capture
// made there), and another host that needs it fetches it from that host's
// worker, which serves its blob store by digest over HTTP. What is fetched
// is checked against its sha256 before it is stored, so a peer cannot pass
// off other content.
package blobshare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Path is where a blob is served: Path + its sha256.
const Path = "/blobs/sha256/"

// Handler serves the host's blobs by digest: GET (or HEAD) Path+SHA256,
// 404 when the host does not have it. It lists nothing.
func Handler(st *state.Store) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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

// ErrNowhere is returned when no peer has the blob.
var ErrNowhere = errors.New("no host of the fleet serves it")

// Fetch stores the blob with this digest from the first of peers (base
// URLs of workers' blob servers) that has it, unless the store has it
// already.
func Fetch(ctx context.Context, st *state.Store, client *http.Client, sha string, peers []string) error {
	if st.HasBlob(sha) {
		return nil
	}
	var errs []error
	for _, p := range peers {
		err := fetchFrom(ctx, st, client, strings.TrimSuffix(p, "/")+Path+sha, sha)
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return fmt.Errorf("blob %s: %w", sha, errors.Join(append([]error{ErrNowhere}, errs...)...))
}

func fetchFrom(ctx context.Context, st *state.Store, client *http.Client, url, sha string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
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
	// PutBlobKnown checks the digest as it writes: content that is not
	// the blob asked for is not stored.
	if _, err := st.PutBlobKnown(ctx, sha, io.LimitReader(resp.Body, 1<<40)); err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	return nil
}
