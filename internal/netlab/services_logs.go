package netlab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// What the sinkhole's services log grows with what guests send them, so
// every log is capped.
const (
	// A dnsmasq log (the DNS sinkhole's queries, DHCP) goes through
	// multilog(8), which starts a new file at LogFileSize bytes and keeps
	// LogFilesKept old ones: the newest lines are kept, the oldest dropped.
	LogFileSize  = 1 << 20
	LogFilesKept = 4
	// INetSimLogSize caps INetSim's log directory, a tmpfs of that size.
	// INetSim opens its logs by name for every line and cannot be told to
	// rotate; once the directory is full, further lines are lost.
	INetSimLogSize = 8 << 20
	// INetSimDataSize caps what a lab's INetSim stores of what guests send
	// it (its own copy of the data directory, a tmpfs of that size that
	// goes when INetSim stops).
	INetSimDataSize = 16 << 20
)

// inetsimData is INetSim's data directory (Debian's): the pages and files
// it serves, and where it stores uploads.
const inetsimData = "/var/lib/inetsim"

// LogDir is where a sinkhole service (dns, dhcp, inetsim) logs: for
// dnsmasq, multilog's current file and the rotated ones.
func LogDir(cfg *Config, service string) string { return filepath.Join(RunDir(cfg), "log", service) }

// makeLogDir makes a service's log directory, private to the user who
// writes it, in a parent every such user can pass through.
func makeLogDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// cappedLog starts multilog writing what arrives on the returned pipe into
// dir, with a TAI64N stamp on each line. It ends by itself once every
// writer has closed the pipe (the service and its children have exited),
// after writing what they wrote; done is closed then. What multilog itself
// says goes to errs. It runs as owner, who owns dir: it parses what guests
// made the service log.
func cappedLog(dir string, errs io.Writer, owner *serviceUser) (w *os.File, done <-chan struct{}, err error) {
	if err := makeLogDir(dir); err != nil {
		return nil, nil, err
	}
	uid, err := strconv.ParseUint(owner.Uid, 10, 32)
	if err != nil {
		return nil, nil, fmt.Errorf("user %s: uid %q: %w", owner.Username, owner.Uid, err)
	}
	gid, err := strconv.ParseUint(owner.Gid, 10, 32)
	if err != nil {
		return nil, nil, fmt.Errorf("user %s: gid %q: %w", owner.Username, owner.Gid, err)
	}
	if err := os.Chown(dir, int(uid), int(gid)); err != nil {
		return nil, nil, err
	}
	if _, err := exec.LookPath("multilog"); err != nil {
		return nil, nil, &MissingError{Program: "multilog"}
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	cmd := exec.Command("multilog", "t", "s"+strconv.Itoa(LogFileSize), "n"+strconv.Itoa(LogFilesKept), dir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, errs, errs
	// Its own session, apart from the service's process group: stopping
	// the service leaves it to write the service's last lines.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true,
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("starting multilog for %s: %w", dir, err)
	}
	ended := make(chan struct{})
	go func() {
		cmd.Wait()
		close(ended)
	}()
	return w, ended, nil
}

// mountCappedLogs makes dir a tmpfs of size bytes owned by the user who
// writes into it (mode 0700), unless it is a mount point already.
func mountCappedLogs(dir string, size int, owner *user.User) error {
	if err := makeLogDir(dir); err != nil {
		return err
	}
	if mounted, err := isMountPoint(dir); err != nil || mounted {
		return err
	}
	// A few inodes are enough for the logs; without a limit, a service
	// could fill memory with empty files.
	opts := fmt.Sprintf("size=%d,nr_inodes=64,mode=0700,uid=%s,gid=%s", size, owner.Uid, owner.Gid)
	if err := unix.Mount("talkbox-logs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mounting a tmpfs of %d bytes on %s: %w", size, dir, err)
	}
	return nil
}

// unmountCappedLogs undoes mountCappedLogs; a directory that is not
// mounted (INetSim never started) is left as it is.
func unmountCappedLogs(dir string) {
	_ = unix.Unmount(dir, unix.MNT_DETACH)
}

func isMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, err
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}
