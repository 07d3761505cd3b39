package state

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Blobs are never rewritten, but retention deletes those no record needs.
// A record that refers to a blob is created after the blob is stored; a
// deleter checks that nothing refers to the blob, then removes it. LockBlob
// orders the two: a writer holds it from storing (or finding) the blob to
// creating its record, a deleter from its reference check to the removal,
// so that no record is ever created for a blob that is being deleted.

// LockBlob takes the lock of one blob (one byte of locks/blobs, so that no
// file is created per blob). It also excludes other goroutines of this
// process.
func (s *dirStore) LockBlob(ctx context.Context, sha string) (unlock func(), err error) {
	if !validSHA256(sha) {
		return nil, fmt.Errorf("invalid sha256 %q", sha)
	}
	unlock, _, err = lockFile(ctx, filepath.Join(s.blobRoot, "locks", "blobs"), lockOffset(sha), true)
	return unlock, err
}

// DeleteBlob removes a stored blob; the caller holds LockBlob and has made
// sure no record still needs it. A blob already gone is not an error, so a
// deletion cut short by a crash can simply be done again. Its directory is
// kept: other blobs land there, and this process remembers it exists.
func (s *dirStore) DeleteBlob(sha string) error {
	if !validSHA256(sha) {
		return fmt.Errorf("invalid sha256 %q", sha)
	}
	err := os.Remove(s.BlobPath(sha))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting blob %s: %w", sha, err)
	}
	return s.syncDir(filepath.Dir(s.BlobPath(sha)))
}

// BlobOf returns the sha256 of a "blob:sha256:HEX" URI.
func BlobOf(uri string) (sha string, ok bool) {
	sha, ok = strings.CutPrefix(uri, "blob:sha256:")
	return sha, ok && validSHA256(sha)
}
