package netlab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
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

// startConfined starts cmd in the network namespace at netnsPath and in a
// mount namespace of its own, where the host's filesystem is read-only,
// /tmp is an empty tmpfs of its own, /root and /home are empty, and only
// the writable directories can be written (by whoever their modes allow).
// A service that an attacker takes over finds no scratch space shared with
// the host and can change no file outside its own directories, whatever
// user it runs as.
func startConfined(cmd *exec.Cmd, netnsPath string, writable []string) error {
	errc := make(chan error, 1)
	go func() {
		// The thread gets the mount namespace, and the process forked
		// from it inherits that. It is never unlocked, so the runtime
		// ends it with this goroutine instead of running other code in
		// the confined view.
		runtime.LockOSThread()
		if err := confineThread(writable); err != nil {
			errc <- err
			return
		}
		errc <- netns.Do(netnsPath, cmd.Start)
	}()
	return <-errc
}

func confineThread(writable []string) error {
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
	trees := make([]int, len(writable))
	for i, dir := range writable {
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
	for i, dir := range writable {
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
