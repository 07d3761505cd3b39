package state

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
)

// Blob names stored content by its digest.
type Blob struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// URI is how records refer to a blob.
func (b Blob) URI() string { return "blob:sha256:" + b.SHA256 }

func validSHA256(h string) bool {
	if len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && h == toLower(h)
}

func toLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'F' {
			b[i] = c + 32
		}
	}
	return string(b)
}

// BlobPath is where the blob with this digest lives (whether or not it exists).
func (s *dirStore) BlobPath(sha string) string {
	if !validSHA256(sha) {
		// Never a stored blob, and never outside the blob directory.
		return filepath.Join(s.blobRoot, "blobs", "sha256", "invalid")
	}
	return filepath.Join(s.blobRoot, "blobs", "sha256", sha[:2], sha)
}

// HasBlob reports whether a blob is stored.
func (s *dirStore) HasBlob(sha string) bool {
	if !validSHA256(sha) {
		return false
	}
	_, err := os.Stat(s.BlobPath(sha))
	return err == nil
}

// EnsureBlob makes sure the blob with this digest is in the host's blob
// store before it is read (OpenBlob, BlobPath): nil when it is there, else
// it is fetched through the store's BlobFetcher. Without a fetcher, or
// when no one has the blob, the error wraps ErrNotFound, as OpenBlob's.
func (s *Store) EnsureBlob(ctx context.Context, sha string) error {
	if !validSHA256(sha) {
		return fmt.Errorf("invalid sha256 %q", sha)
	}
	if s.HasBlob(sha) {
		return nil
	}
	if s.fetchBlob == nil {
		return fmt.Errorf("blob %s: %w", sha, ErrNotFound)
	}
	return s.fetchBlob(ctx, s, sha)
}

// OpenBlob opens a stored blob for reading.
func (s *dirStore) OpenBlob(sha string) (*os.File, error) {
	if !validSHA256(sha) {
		return nil, fmt.Errorf("invalid sha256 %q", sha)
	}
	f, err := os.Open(s.BlobPath(sha))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("blob %s: %w", sha, ErrNotFound)
	}
	return f, err
}

// PutBlob stores the content of r and returns its digest. Content already
// stored is not written again.
func (s *dirStore) PutBlob(ctx context.Context, r io.Reader) (Blob, error) {
	return s.putBlob(ctx, "", r)
}

// PutBlobKnown stores content whose sha256 the caller already computed; when
// that blob exists nothing is read. The digest is checked while writing.
func (s *dirStore) PutBlobKnown(ctx context.Context, sha string, r io.Reader) (Blob, error) {
	if !validSHA256(sha) {
		return Blob{}, fmt.Errorf("invalid sha256 %q", sha)
	}
	if st, err := os.Stat(s.BlobPath(sha)); err == nil {
		return Blob{SHA256: sha, Size: st.Size()}, nil
	}
	return s.putBlob(ctx, sha, r)
}

func (s *dirStore) putBlob(ctx context.Context, want string, r io.Reader) (Blob, error) {
	if err := ctx.Err(); err != nil {
		return Blob{}, err
	}
	name := want
	if name == "" {
		name = "being stored"
	}
	g, err := s.blobGuard(name, knownSize(r))
	if err != nil {
		return Blob{}, err
	}
	w, err := s.CreateBlob()
	if err != nil {
		return Blob{}, err
	}
	defer w.Abort()
	var dst io.Writer = w
	if g != nil {
		dst = guardedWriter{w: w, g: g}
	}
	if _, err := io.Copy(dst, r); err != nil {
		if g != nil && want == "" && errors.Is(err, diskspace.ErrLow) {
			// Name the content by what was read of it.
			err = fmt.Errorf("%w (the first %d bytes have sha256 %s)", err, w.n, w.Sum())
		}
		return Blob{}, err
	}
	if sum := hex.EncodeToString(w.h.Sum(nil)); want != "" && sum != want {
		return Blob{}, fmt.Errorf("blob content has sha256 %s, expected %s", sum, want)
	}
	return w.Commit()
}

// BlobWriter writes a blob as it is produced (a flow log while tb-parse
// reads its capture): nothing is visible under a digest until Commit.
type BlobWriter struct {
	s    *dirStore
	f    *os.File
	h    hash.Hash
	n    int64
	done bool
}

// CreateBlob starts a blob in the store's temporary directory.
func (s *dirStore) CreateBlob() (*BlobWriter, error) {
	tmp, err := createTemp(filepath.Join(s.blobRoot, "tmp"), "blob-")
	if err != nil {
		return nil, err
	}
	return &BlobWriter{s: s, f: tmp, h: sha256.New()}, nil
}

func (w *BlobWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.h.Write(p[:n])
	w.n += int64(n)
	return n, err
}

// Sum is the digest of what was written so far: the blob's, once done.
func (w *BlobWriter) Sum() string { return hex.EncodeToString(w.h.Sum(nil)) }

// Commit publishes the blob under its digest.
func (w *BlobWriter) Commit() (Blob, error) {
	defer w.Abort()
	s := w.s
	sum := w.Sum()
	if s.durability == SyncEachWrite {
		if err := w.f.Sync(); err != nil {
			return Blob{}, err
		}
	}
	if err := w.f.Chmod(0o444); err != nil {
		return Blob{}, err
	}
	s.hook(crashBlobTemp)
	if err := s.linkIntoPlace(w.f.Name(), s.BlobPath(sum), w.n); err != nil {
		return Blob{}, err
	}
	s.hook(crashBlobLinked)
	return Blob{SHA256: sum, Size: w.n}, nil
}

// Abort removes an uncommitted blob (after Commit, its temporary name).
func (w *BlobWriter) Abort() {
	if w.done {
		return
	}
	w.done = true
	w.f.Close()
	os.Remove(w.f.Name())
}

// linkIntoPlace publishes a finished temp file under its final name. link(2)
// never replaces an existing blob: blobs are not rewritten, except one whose
// size is wrong (cut short by a power cut before a Flush), which is replaced.
func (s *dirStore) linkIntoPlace(tmp, final string, size int64) error {
	if err := s.ensureDir(filepath.Dir(final)); err != nil {
		return err
	}
	err := os.Link(tmp, final)
	if errors.Is(err, fs.ErrExist) {
		err = nil
		if st, serr := os.Stat(final); serr == nil && st.Size() != size {
			err = os.Rename(tmp, final)
		}
	}
	if err != nil {
		return err
	}
	return s.syncPlaced(final)
}
