package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// PutBlobBytes stores content held in memory, whose sha256 the caller has
// just computed from these very bytes (it is not computed again), and
// returns the blob; when that blob exists (with this size) nothing is
// written. It is the batch ingester's PutBlobKnown: the file is created unnamed (O_TMPFILE)
// and linked into place once whole, three system calls fewer than a named
// temporary file (no random name, no chmod, no unlink) and no churn in
// tmp/. A crash before the link leaves nothing behind. Where O_TMPFILE is
// not supported, or to replace a blob of the wrong size, it writes as
// PutBlob does.
func (s *dirStore) PutBlobBytes(ctx context.Context, sha string, data []byte) (Blob, error) {
	if !validSHA256(sha) {
		return Blob{}, fmt.Errorf("invalid sha256 %q", sha)
	}
	final := s.BlobPath(sha)
	var st unix.Stat_t
	if unix.Stat(final, &st) == nil && st.Size == int64(len(data)) {
		return Blob{SHA256: sha, Size: st.Size}, nil
	}
	if err := ctx.Err(); err != nil {
		return Blob{}, err
	}
	if _, err := s.blobGuard(sha, int64(len(data))); err != nil {
		return Blob{}, err
	}
	if err := s.ensureDir(filepath.Dir(final)); err != nil {
		return Blob{}, err
	}
	linked, err := s.linkTmpfile(filepath.Dir(final), final, data, 0o444, crashBlobTemp)
	if err != nil {
		return Blob{}, err
	}
	if !linked {
		if unix.Stat(final, &st) == nil && st.Size == int64(len(data)) {
			return Blob{SHA256: sha, Size: st.Size}, nil // another writer's
		}
		// No O_TMPFILE here, or a blob of the wrong size in place (cut short
		// by a power cut): the general path handles both.
		return s.putBlob(ctx, sha, bytes.NewReader(data))
	}
	s.hook(crashBlobLinked)
	return Blob{SHA256: sha, Size: int64(len(data))}, nil
}

// noTmpfile, set by tests only, makes newTmpfile answer as on a filesystem
// without O_TMPFILE, so that the paths taken there are tested too.
var noTmpfile bool

// linkTmpfile writes data to an unnamed file in dir (same filesystem as
// final) and links it as final; hookAt, if set, is the crash point between
// the two. False, and nothing written, when the filesystem has no O_TMPFILE
// or final exists.
func (s *dirStore) linkTmpfile(dir, final string, data []byte, mode uint32, hookAt string) (bool, error) {
	fd, err := s.newTmpfile(dir, data, mode)
	if err != nil || fd < 0 {
		return false, err
	}
	defer unix.Close(fd)
	if hookAt != "" {
		s.hook(hookAt)
	}
	err = linkFd(fd, final)
	if err == unix.EEXIST {
		return false, nil
	}
	if err != nil {
		return false, pathErr("link", final, err)
	}
	return true, s.syncPlaced(final)
}

// newTmpfile writes data to an unnamed file in dir, synced when each write
// must be durable, and returns its descriptor: -1, and no error, when the
// filesystem has no O_TMPFILE. Nothing is left behind if it is closed
// without a link (linkFd), whatever kills the process.
func (s *dirStore) newTmpfile(dir string, data []byte, mode uint32) (int, error) {
	if noTmpfile {
		return -1, nil
	}
	fd, err := openRetry(dir, unix.O_TMPFILE|unix.O_WRONLY, mode)
	var errno unix.Errno
	if errors.As(err, &errno) && (errno == unix.EOPNOTSUPP || errno == unix.EISDIR || errno == unix.EINVAL) {
		return -1, nil
	}
	if err != nil {
		return -1, err
	}
	if err := writeAll(fd, dir, data, s.durability == SyncEachWrite); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// linkFd gives the unnamed file fd the name path: through AT_EMPTY_PATH
// when the process may (CAP_DAC_READ_SEARCH), else through /proc.
func linkFd(fd int, path string) error {
	err := unix.Linkat(fd, "", unix.AT_FDCWD, path, unix.AT_EMPTY_PATH)
	if err != unix.ENOENT && err != unix.EPERM {
		return err
	}
	return unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW)
}
