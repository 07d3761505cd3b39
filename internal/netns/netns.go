// Package netns runs code inside a network namespace and manages named
// namespaces (/run/netns/NAME, as ip-netns(8) makes them).
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is where named namespaces are bind-mounted.
const Dir = "/run/netns"

// Path is the file of a named namespace; a name containing a slash is
// already a path.
func Path(name string) string {
	if name == "" || strings.Contains(name, "/") {
		return name
	}
	return filepath.Join(Dir, name)
}

// Do runs fn on an OS thread switched into the namespace at path ("" runs
// fn as is). Sockets fn opens stay in that namespace; processes fn starts
// inherit it. If the thread cannot be switched back it is discarded.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	target, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer target.Close()
	runtime.LockOSThread()
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering network namespace %s: %w", path, err)
	}
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: the runtime ends it with the goroutine.
		return errors.Join(ferr, fmt.Errorf("leaving network namespace %s: %w", path, err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// Exists reports whether a named namespace is there.
func Exists(name string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(Path(name), &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// Create makes a named network namespace (idempotent).
func Create(name string) error {
	if Exists(name) {
		return nil
	}
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return err
	}
	// /run/netns must be a shared mount point so the namespaces' bind
	// mounts propagate, as ip-netns does it.
	if err := unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		if err := unix.Mount(Dir, Dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s: %w", Dir, err)
		}
		if err := unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("making %s shared: %w", Dir, err)
		}
	}
	p := Path(name)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if f != nil {
		f.Close()
	}
	errc := make(chan error, 1)
	// A fresh thread unshares and is thrown away: the caller's threads keep
	// their namespace.
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		errc <- unix.Mount(src, p, "none", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		os.Remove(p)
		return fmt.Errorf("creating network namespace %s: %w", name, err)
	}
	return nil
}

// Delete unmounts and removes a named namespace (idempotent). Processes
// still inside keep it alive until they exit.
func Delete(name string) error {
	p := Path(name)
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmounting %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
