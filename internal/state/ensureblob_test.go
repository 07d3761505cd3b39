package state_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// TestEnsureBlob: a blob the host has is read without asking the
// fetcher; one it lacks is stored by the fetcher, given the store; without
// a fetcher, or when the fetcher finds it nowhere, the error is
// ErrNotFound naming the blob, as OpenBlob's is.
func TestEnsureBlob(t *testing.T) {
	ctx := context.Background()
	source, err := state.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	remote, err := source.PutBlob(ctx, strings.NewReader("made on another host"))
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	fetch := func(ctx context.Context, st *state.Store, sha string) error {
		asked = append(asked, sha)
		f, err := source.OpenBlob(sha)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = st.PutBlobKnown(ctx, sha, f)
		return err
	}
	st, err := state.Open(ctx, t.TempDir(), state.WithBlobFetcher(fetch))
	if err != nil {
		t.Fatal(err)
	}
	local, err := st.PutBlob(ctx, strings.NewReader("made here"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.EnsureBlob(ctx, local.SHA256); err != nil || len(asked) != 0 {
		t.Fatalf("EnsureBlob of a local blob: %v, fetcher asked for %q", err, asked)
	}
	if err := st.EnsureBlob(ctx, remote.SHA256); err != nil {
		t.Fatal(err)
	}
	f, err := st.OpenBlob(remote.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if string(got) != "made on another host" || len(asked) != 1 {
		t.Fatalf("read %q after fetching %q", got, asked)
	}

	sum := sha256.Sum256([]byte("nowhere"))
	missing := hex.EncodeToString(sum[:])
	if err := st.EnsureBlob(ctx, missing); !errors.Is(err, state.ErrNotFound) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("EnsureBlob of a blob no one has: %v", err)
	}
	if err := st.EnsureBlob(ctx, "../../records"); err == nil || errors.Is(err, state.ErrNotFound) || len(asked) != 2 {
		t.Fatalf("EnsureBlob of no digest: %v (fetcher asked for %q)", err, asked)
	}

	alone, err := state.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := alone.EnsureBlob(ctx, remote.SHA256); !errors.Is(err, state.ErrNotFound) || !strings.Contains(err.Error(), remote.SHA256) {
		t.Fatalf("EnsureBlob without a fetcher: %v", err)
	}
}
