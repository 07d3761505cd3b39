package state

import (
	"errors"
	"io/fs"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// unsynced are the files and directories a SyncOnFlush store has written
// since its last Flush, which Flush fsyncs: each write names what it left
// to sync (flushLater) where SyncEachWrite would have synced it.
//
// Flush syncs these and nothing else rather than the whole file system
// (syncfs(2)): syncfs also waits for what every other writer left dirty
// there, and the state usually shares its file system with the captures
// tb-capture writes beside it (syncfs 1.1-1.2 s against 16-18 ms for the
// store's own 113 paths, after another writer's 1.5 GB;
// docs/performance.md); it also missed shared blobs on
// another file system.
type unsynced struct {
	mu    sync.Mutex
	paths map[string]struct{}
}

// flushLater notes that path (a file or directory) was written and is to
// be synced by the next Flush; under SyncEachWrite the writer synced it.
func (s *dirStore) flushLater(path string) {
	if s.durability != SyncOnFlush {
		return
	}
	u := &s.unsynced
	u.mu.Lock()
	if u.paths == nil {
		u.paths = make(map[string]struct{})
	}
	u.paths[path] = struct{}{}
	u.mu.Unlock()
}

// syncFile makes the file fd (at path) durable now under SyncEachWrite,
// at the next Flush under SyncOnFlush.
func (s *dirStore) syncFile(fd int, path string) error {
	if s.durability != SyncEachWrite {
		s.flushLater(path)
		return nil
	}
	return pathErr("fsync", path, unix.Fsync(fd))
}

// syncPlaced makes the directory entry of a file just placed at path
// durable (the file's data was written synced under SyncEachWrite), and
// under SyncOnFlush notes the file itself for the next Flush.
func (s *dirStore) syncPlaced(path string) error {
	s.flushLater(path)
	return s.syncDir(filepath.Dir(path))
}

// flushParallel is how many fsyncs Flush has in flight: on ext4 those that
// wait together share a journal commit.
const flushParallel = 8

// Flush makes every write since the last Flush durable: it fsyncs each file
// and directory written (flushLater). A path gone since was renamed or
// removed, and the directory that changed was noted then. On failure the
// paths stay noted, for the next Flush to try again. Under SyncEachWrite
// there is nothing left to do.
func (s *dirStore) Flush() error {
	u := &s.unsynced
	u.mu.Lock()
	paths := u.paths
	u.paths = nil
	u.mu.Unlock()
	if len(paths) == 0 {
		return nil
	}
	todo := make(chan string, len(paths))
	for p := range paths {
		todo <- p
	}
	close(todo)
	errs := make([]error, flushParallel)
	var wg sync.WaitGroup
	for i := range min(flushParallel, len(paths)) {
		wg.Go(func() {
			for p := range todo {
				if err := fsyncPath(p); err != nil {
					errs[i] = errors.Join(errs[i], err)
				}
			}
		})
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err != nil {
		for p := range paths {
			s.flushLater(p)
		}
	}
	return err
}

// fsyncPath fsyncs a file or directory; one that no longer exists is no
// error.
func fsyncPath(path string) error {
	fd, err := openRetry(path, unix.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	err = unix.Fsync(fd)
	unix.Close(fd)
	return pathErr("fsync", path, err)
}
