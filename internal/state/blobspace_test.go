package state_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// TestBlobWritesKeepMinFree stores blobs on a 16 MiB tmpfs whose store
// keeps 8 MiB free: a blob that fits is stored; one that would cross the
// threshold fails with exit 75 naming it, whether its size is known ahead
// (a file, bytes) or only found while writing (a stream, as a guest's
// stdout), and leaves nothing behind, neither a blob nor a temp file.
func TestBlobWritesKeepMinFree(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	min := diskspace.Threshold{Bytes: 8 << 20}
	st, err := state.Open(ctx, root, state.WithMinFree(min))
	if err != nil {
		t.Fatal(err)
	}

	small := bytes.Repeat([]byte("s"), 1<<20)
	if _, err := st.PutBlob(ctx, bytes.NewReader(small)); err != nil {
		t.Fatalf("a blob that fits: %v", err)
	}

	big := bytes.Repeat([]byte("b"), 10<<20)
	sum := sha256.Sum256(big)
	sha := hex.EncodeToString(sum[:])
	low := func(what string, err error, name string) {
		t.Helper()
		if fault.Code(err) != fault.ExitTempFail || !errors.Is(err, diskspace.ErrLow) || !strings.Contains(err.Error(), name) {
			t.Fatalf("%s: %v (exit %d), want exit 75 naming %s", what, err, fault.Code(err), name)
		}
		if st.HasBlob(sha) {
			t.Fatalf("%s: the blob was stored", what)
		}
		if left, _ := os.ReadDir(filepath.Join(root, "tmp")); len(left) != 0 {
			t.Fatalf("%s: left in tmp: %v", what, left)
		}
		fr, err := diskspace.Check(root)
		if err != nil || fr.Avail < min.Bytes {
			t.Fatalf("%s: %d bytes free after the refusal, below the %d kept", what, fr.Avail, min.Bytes)
		}
	}

	_, err = st.PutBlobBytes(ctx, sha, big)
	low("PutBlobBytes", err, sha)

	f := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(f, big, 0o600); err != nil {
		t.Fatal(err)
	}
	fh, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	_, err = st.PutBlobKnown(ctx, sha, fh)
	low("PutBlobKnown of a file", err, sha)

	// A stream says nothing of its length: the write stops on its way.
	_, err = st.PutBlob(ctx, io.MultiReader(bytes.NewReader(big)))
	low("PutBlob of a stream", err, "being stored")
}
