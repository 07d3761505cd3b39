package state

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// lockWaitHook, when set (by tests only), is called when a wait for a busy
// lock begins.
var lockWaitHook func(path string)

// flockRetry is flock(2) restarted after EINTR.
func flockRetry(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if err != unix.EINTR {
			return err
		}
	}
}

// lockFile takes an exclusive flock(2) on path, creating it. Lock files are
// never removed: removing one would let two processes lock different inodes
// under the same name. The kernel drops the lock when its holder dies.
//
// Each call opens its own descriptor, so the lock also excludes other
// goroutines of this process. A wait for a busy lock ends early when ctx is
// cancelled.
func lockFile(ctx context.Context, path string, wait bool) (unlock func(), ok bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, false, err
		}
		if f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640); err != nil {
			return nil, false, err
		}
	}
	fd := int(f.Fd())
	err = flockRetry(fd, unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return func() { f.Close() }, true, nil
	}
	if err != unix.EWOULDBLOCK {
		f.Close()
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	if !wait {
		f.Close()
		return nil, false, nil
	}
	if ctx.Done() == nil {
		if err := flockRetry(fd, unix.LOCK_EX); err != nil {
			f.Close()
			return nil, false, fmt.Errorf("lock %s: %w", path, err)
		}
		return func() { f.Close() }, true, nil
	}
	// flock(2) cannot be interrupted from Go: wait in a goroutine, and if
	// ctx ends first, let that goroutine drop the lock when it gets it.
	if lockWaitHook != nil {
		lockWaitHook(path)
	}
	got := make(chan error, 1)
	go func() { got <- flockRetry(fd, unix.LOCK_EX) }()
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
		}()
		return nil, false, ctx.Err()
	}
}

func (s *Store) lockRecord(ctx context.Context, kind, id string) (func(), error) {
	unlock, _, err := lockFile(ctx, s.recordLockPath(kind, id), true)
	return unlock, err
}

func (s *Store) namedLockPath(name string) (string, error) {
	clean := filepath.Clean("/" + name)
	if clean == "/" || strings.TrimSpace(name) == "" {
		return "", fmt.Errorf("invalid lock name %q", name)
	}
	return filepath.Join(s.root, "locks", "named", clean), nil
}

// Lock takes a named advisory lock in the state directory (for tool-level
// critical sections such as "one build of this spec at a time"). The name may
// contain slashes; it cannot leave the lock directory.
func (s *Store) Lock(ctx context.Context, name string) (unlock func(), err error) {
	path, err := s.namedLockPath(name)
	if err != nil {
		return nil, err
	}
	unlock, _, err = lockFile(ctx, path, true)
	return unlock, err
}

// TryLock is Lock without waiting; ok is false when another holder has it.
func (s *Store) TryLock(ctx context.Context, name string) (unlock func(), ok bool, err error) {
	path, err := s.namedLockPath(name)
	if err != nil {
		return nil, false, err
	}
	return lockFile(ctx, path, false)
}
