package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/files"
)

// A .deb cache is shared by builds of one release and architecture, which
// may run at once (two tb-build processes, parallel test packages). A build
// copies the whole cache into its root filesystem when it starts, without
// a lock: every .deb enters the cache by rename, whole, so a copy never
// holds half of one. What the build downloaded it copies out to a
// directory of its own; only adding those to the cache (addToDebCache)
// takes the cache's lock, for the moments that takes rather than for the
// whole build.

// addToDebCache moves the .debs in fetched that the cache lacks into it.
func addToDebCache(ctx context.Context, fetched, cacheDir string) error {
	debs, err := filepath.Glob(filepath.Join(fetched, "*.deb"))
	if err != nil || len(debs) == 0 {
		return err
	}
	unlock, err := lockCache(ctx, cacheDir)
	if err != nil {
		return err
	}
	defer unlock()
	for _, d := range debs {
		dst := filepath.Join(cacheDir, filepath.Base(d))
		if _, err := os.Stat(dst); err == nil {
			continue
		}
		// The build's directory may be on another filesystem than the
		// cache; a rename from there is not atomic, so the .deb is
		// copied next to its place first.
		tmp, err := os.CreateTemp(cacheDir, ".incoming-*")
		if err != nil {
			return err
		}
		tmp.Close()
		if err := os.Rename(d, tmp.Name()); err != nil {
			var le *os.LinkError
			if !errors.As(err, &le) || !errors.Is(le.Err, syscall.EXDEV) {
				os.Remove(tmp.Name())
				return err
			}
			if err := files.Copy(d, tmp.Name()); err != nil {
				os.Remove(tmp.Name())
				return fmt.Errorf("adding %s to the package cache: %w", filepath.Base(d), err)
			}
		}
		if err := os.Rename(tmp.Name(), dst); err != nil {
			os.Remove(tmp.Name())
			return err
		}
	}
	return nil
}

// lockCache takes an exclusive flock(2) on the cache directory's lock file,
// waiting while another build holds it, until ctx ends.
func lockCache(ctx context.Context, cacheDir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(cacheDir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if err != syscall.EWOULDBLOCK && err != syscall.EINTR {
			f.Close()
			return nil, fmt.Errorf("locking the package cache %s: %w", cacheDir, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}
