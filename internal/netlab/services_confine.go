package netlab

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// serviceUser is who dnsmasq runs as once it has bound its sockets:
// Debian's dnsmasq user (dnsmasq-base makes it), else nobody. Group is its
// primary group's name, which dnsmasq's --group takes.
type serviceUser struct {
	*user.User
	Group string
}

func dnsmasqUser() (*serviceUser, error) {
	u, err := user.Lookup("dnsmasq")
	if err != nil {
		if u, err = user.Lookup("nobody"); err != nil {
			return nil, fmt.Errorf("neither a dnsmasq nor a nobody user to run dnsmasq as: %w", err)
		}
	}
	g, err := user.LookupGroupId(u.Gid)
	if err != nil {
		return nil, fmt.Errorf("group %s of user %s: %w", u.Gid, u.Username, err)
	}
	return &serviceUser{User: u, Group: g.Name}, nil
}

// confinement is the view of the filesystem a confined service gets.
type confinement struct {
	// writable directories of the host's stay writable (by whoever
	// their modes allow).
	writable []string
	// private, when set, is a directory the service writes into: it
	// gets its own copy of it, on a tmpfs of privateSize bytes, which
	// goes with it.
	private     string
	privateSize int
}

// startConfined starts cmd in the network namespace at netnsPath and in a
// mount namespace of its own, where the host's filesystem is read-only,
// /tmp is an empty tmpfs of its own, /root and /home are empty, and only
// what c names can be written. A service that an attacker takes over,
// running as its unprivileged user, finds no scratch space shared with the
// host and can write nothing outside its own directories. (Root could undo
// the mounts: dnsmasq drops to its user once its sockets are bound, and
// INetSim's services to theirs, though its main process stays root.)
func startConfined(cmd *exec.Cmd, netnsPath string, c confinement) error {
	errc := make(chan error, 1)
	go func() {
		// The thread gets the mount namespace, and the process forked
		// from it inherits that. It is never unlocked, so the runtime
		// ends it with this goroutine instead of running other code in
		// the confined view.
		runtime.LockOSThread()
		if err := confineThread(c); err != nil {
			errc <- err
			return
		}
		errc <- netns.Do(netnsPath, cmd.Start)
	}()
	return <-errc
}

func confineThread(c confinement) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	// Nothing done here may reach the host's mounts.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	// Writable copies of the service's directories, taken before /tmp is
	// covered (a lab's directory may be under it) and before the rest
	// turns read-only.
	trees := make([]int, len(c.writable))
	for i, dir := range c.writable {
		fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.O_CLOEXEC)
		if err != nil {
			return fmt.Errorf("copy of %s: %w", dir, err)
		}
		defer unix.Close(fd)
		trees[i] = fd
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("making the filesystem read-only: %w", err)
	}
	for dir, opts := range map[string]string{"/tmp": "size=1m,mode=1777", "/root": "size=4k,mode=0700", "/home": "size=4k,mode=0755"} {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
			return fmt.Errorf("private %s: %w", dir, err)
		}
	}
	if c.private != "" {
		if err := privateCopy(c.private, c.privateSize); err != nil {
			return err
		}
	}
	for i, dir := range c.writable {
		// A directory under /tmp is gone from the new, empty /tmp: made
		// again (private, as test directories are) where its copy goes.
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err := unix.MoveMount(trees[i], "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("writable %s: %w", dir, err)
		}
	}
	return nil
}

// privateCopy covers dir with a tmpfs of size bytes holding a copy of what
// dir held (modes and owners kept), so that what the service writes there
// stays in this namespace, within size.
func privateCopy(dir string, size int) error {
	src, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.O_CLOEXEC)
	if err != nil {
		return fmt.Errorf("copy of %s: %w", dir, err)
	}
	defer unix.Close(src)
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err
	}
	// A bounded number of files too: each costs memory beyond its bytes.
	opts := fmt.Sprintf("size=%d,nr_inodes=4096,mode=%o,uid=%d,gid=%d", size, st.Mode&0o7777, st.Uid, st.Gid)
	if err := unix.Mount("talkbox-private", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("private %s: %w", dir, err)
	}
	// The detached copy is reached through its descriptor: dir itself is
	// covered now.
	from := fmt.Sprintf("/proc/self/fd/%d/", src) // the slash follows the link
	return filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil || rel == "." {
			return err
		}
		to := filepath.Join(dir, rel)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		switch {
		case d.IsDir():
			err = os.Mkdir(to, 0o700)
		case d.Type().IsRegular():
			err = copyFile(path, to)
		case d.Type()&fs.ModeSymlink != 0:
			var target string
			if target, err = os.Readlink(path); err == nil {
				err = os.Symlink(target, to)
			}
		default:
			return nil // no devices, sockets or pipes in a data directory
		}
		if err != nil {
			return err
		}
		if err := unix.Lchown(to, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		return unix.Chmod(to, st.Mode&0o7777)
	})
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s: %w", to, err)
	}
	return out.Close()
}
