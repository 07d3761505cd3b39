package state

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// lockWaitHook, when set (by tests only), is called when a wait for a busy
// lock begins.
var lockWaitHook func(path string)

// lockAbandonedHook, when set (by tests only), is called once a wait that
// its context ended has got the lock and let it go again: until then the
// abandoned wait may hold the lock for a moment.
var lockAbandonedHook func(path string)

// lockFile locks byte off of path (created if needed) with an
// open-file-description lock (fcntl F_OFD_SETLKW): the kernel drops it when
// the holder's descriptor closes, and so when its process dies. Lock files are
// never removed: removing one would let two processes lock different inodes
// under the same name.
//
// Record and index locks are single bytes, at a 62-bit hash of their name, in
// one of lockShards files per kind (or index) picked by the same hash:
// per-record locking without creating a file per record (file creation is the
// dominant cost of a write on ext4), and without the self-deadlock lock
// stripes would risk when one record's lock is taken while another's is held.
// The shards keep each file's list of locks short: the kernel walks the whole
// list to place each lock, so a batch's hundreds of locks in one file cost it
// time quadratic in their number.
//
// Each call opens its own descriptor, so the lock also excludes other
// goroutines of this process. A wait for a busy lock ends early when ctx is
// cancelled.
func lockFile(ctx context.Context, path string, off int64, wait bool) (unlock func(), ok bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	fd, err := openLockFile(path)
	if err != nil {
		return nil, false, err
	}
	f := fdCloser(fd)
	err = ofdLock(fd, off, false)
	if err == nil {
		return func() { f.Close() }, true, nil
	}
	if err != unix.EAGAIN && err != unix.EACCES {
		f.Close()
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	if !wait {
		f.Close()
		return nil, false, nil
	}
	if ctx.Done() == nil {
		if err := ofdLock(fd, off, true); err != nil {
			f.Close()
			return nil, false, fmt.Errorf("lock %s: %w", path, err)
		}
		return func() { f.Close() }, true, nil
	}
	// A blocking fcntl cannot be interrupted from Go: wait in a goroutine,
	// and if ctx ends first, let that goroutine drop the lock when it gets it.
	if lockWaitHook != nil {
		lockWaitHook(path)
	}
	got := make(chan error, 1)
	go func() { got <- ofdLock(fd, off, true) }()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return nil, false, fmt.Errorf("lock %s: %w", path, err)
		}
		return func() { f.Close() }, true, nil
	case <-ctx.Done():
		go func() {
			<-got
			f.Close()
			if lockAbandonedHook != nil {
				lockAbandonedHook(path)
			}
		}()
		return nil, false, ctx.Err()
	}
}

// fdCloser closes a lock's descriptor, which releases the lock.
type fdCloser int

func (fd fdCloser) Close() error { return unix.Close(int(fd)) }

// ofdLock takes an exclusive lock on one byte, restarting after EINTR.
func ofdLock(fd int, off int64, wait bool) error { return ofdLockRange(fd, off, 1, wait) }

// ofdLockRange takes an exclusive lock on n bytes from off (n 0: to the
// end of any file), restarting after EINTR.
func ofdLockRange(fd int, off, n int64, wait bool) error {
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: off, Len: n}
	for {
		err := unix.FcntlFlock(uintptr(fd), cmd, &lk)
		if err != unix.EINTR {
			return err
		}
	}
}

// flockRetry is flock(2) restarted after EINTR (the journal's lock).
func flockRetry(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if err != unix.EINTR {
			return err
		}
	}
}

// lockOffset places a name's lock byte: FNV-1a, kept below 2^62 so that
// every offset is a valid off_t.
func lockOffset(name string) int64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return int64(h >> 2)
}

func (s *dirStore) lockRecord(ctx context.Context, kind, id string) (func(), error) {
	unlock, _, err := lockFile(ctx, s.recordLockPath(kind, id), lockOffset(id), true)
	return unlock, err
}

func (s *dirStore) namedLockPath(name string) (string, error) {
	clean := filepath.Clean("/" + name)
	if clean == "/" || strings.TrimSpace(name) == "" {
		return "", fmt.Errorf("invalid lock name %q", name)
	}
	return filepath.Join(s.root, "locks", "named", clean), nil
}

// Lock takes a named advisory lock in the state directory (for tool-level
// critical sections such as "one build of this spec at a time"). The name may
// contain slashes; it cannot leave the lock directory.
func (s *dirStore) Lock(ctx context.Context, name string) (unlock func(), err error) {
	path, err := s.namedLockPath(name)
	if err != nil {
		return nil, err
	}
	unlock, _, err = lockFile(ctx, path, 0, true)
	return unlock, err
}

// TryLock is Lock without waiting; ok is false when another holder has it.
func (s *dirStore) TryLock(ctx context.Context, name string) (unlock func(), ok bool, err error) {
	path, err := s.namedLockPath(name)
	if err != nil {
		return nil, false, err
	}
	return lockFile(ctx, path, 0, false)
}

// openLockFile opens a lock file, creating it (and its directory) if
// needed.
func openLockFile(path string) (int, error) {
	fd, err := openRetry(path, unix.O_RDWR|unix.O_CREAT, 0o640)
	if err == nil {
		return fd, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return -1, err
	}
	return openRetry(path, unix.O_RDWR|unix.O_CREAT, 0o640)
}

// lockFilePath is the lock file of key among the shards of a kind's
// records (of "records") or an index's keys (of "index").
func (s *dirStore) lockFilePath(of, name, key string) string {
	return lockShardPath(filepath.Join(s.root, "locks", of, name), key)
}

// lockShards is how many files a kind's (or an index's) locks are spread
// over.
const lockShards = 16

// lockShardPath is the lock file of name among base's shards.
func lockShardPath(base, name string) string {
	return base + "." + strconv.Itoa(lockShard(name))
}

func lockShard(name string) int { return int(uint64(lockOffset(name)) % lockShards) }

// lockFDs keeps descriptors of lock files open between the batches that
// lock through them: a batch's locks are spread over its kinds' and
// indexes' shards, and opening each shard for every commit cost more than
// the locks. A descriptor is used by one batch at a time (an OFD lock
// belongs to its open file description, so two batches sharing one would
// not exclude each other), and comes back holding no lock.
type lockFDs struct {
	mu   sync.Mutex
	free map[string][]int
	n    int // descriptors in free
}

// lockFDsMax bounds the descriptors kept.
const lockFDsMax = 512

// get returns a descriptor of path, kept or newly opened (path and its
// directory are created if needed).
func (p *lockFDs) get(path string) (int, error) {
	p.mu.Lock()
	if fds := p.free[path]; len(fds) > 0 {
		fd := fds[len(fds)-1]
		p.free[path] = fds[:len(fds)-1]
		p.n--
		p.mu.Unlock()
		return fd, nil
	}
	p.mu.Unlock()
	return openLockFile(path)
}

// put drops every lock fd holds and keeps it for the next get of path
// (closes it if it cannot be unlocked, or enough are kept).
func (p *lockFDs) put(path string, fd int) {
	unlock := unix.Flock_t{Type: unix.F_UNLCK, Whence: 0, Start: 0, Len: 0}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &unlock); err != nil {
		unix.Close(fd)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n >= lockFDsMax {
		unix.Close(fd)
		return
	}
	if p.free == nil {
		p.free = make(map[string][]int)
	}
	p.free[path] = append(p.free[path], fd)
	p.n++
}

// close closes the kept descriptors.
func (p *lockFDs) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for path, fds := range p.free {
		for _, fd := range fds {
			unix.Close(fd)
		}
		delete(p.free, path)
	}
	p.n = 0
}
