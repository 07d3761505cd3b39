package labtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// ownersDir records each lab a test helper brings up (New here, leasetest's
// UpLab) with the test process that owns it: a test process killed (a
// timeout, a ^C, an OOM) runs no cleanup, and its lab (namespaces, bridge,
// nftables tables, sinkhole services), its guests and daemons would stay on
// the machine until taken down by hand. The helper's next lab takes down
// those whose process is gone (ReapStale).
const ownersDir = "/run/talkbox-testlabs"

// Owner is a lab's record in ownersDir.
type Owner struct {
	Kind string `json:"kind"` // the helper that made it: "labtest", "leasetest"
	PID  int    `json:"pid"`
	// Start is the process's start time (/proc/PID/stat's 22nd field):
	// a PID alone may be another process's by now.
	Start string `json:"start"`
	State string `json:"state,omitempty"` // the state directory the lab is recorded in
	Dir   string `json:"dir"`             // the lab's directory
	Tag   string `json:"tag"`             // what its names start or end with
}

// OwnerPath is the record of the lab tagged tag.
func OwnerPath(tag string) string { return filepath.Join(ownersDir, tag+".json") }

// Own records this process as the owner of o's lab, before any of it is
// made.
func Own(o Owner) error {
	o.PID = os.Getpid()
	start, ok := netlab.ProcStart(o.PID)
	if !ok {
		return fmt.Errorf("/proc/%d/stat: unreadable", o.PID)
	}
	o.Start = start
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(ownersDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(OwnerPath(o.Tag), b, 0o644)
}

// Disown removes the record of a lab taken down.
func Disown(tag string) { os.Remove(OwnerPath(tag)) }

// alive reports whether o's test process still runs.
func (o *Owner) alive() bool {
	start, ok := netlab.ProcStart(o.PID)
	return ok && start == o.Start
}

// ReapStale takes down, with takeDown, the labs of kind whose test process
// is gone, and returns their tags. Each record is claimed (renamed) first,
// so that two test processes reaping at once take a lab down once.
func ReapStale(ctx context.Context, kind string, takeDown func(context.Context, Owner)) []string {
	ents, _ := os.ReadDir(ownersDir)
	var reaped []string
	for _, e := range ents {
		path := filepath.Join(ownersDir, e.Name())
		var o Owner
		b, err := os.ReadFile(path)
		if err != nil || !strings.HasSuffix(path, ".json") || json.Unmarshal(b, &o) != nil || o.Kind != kind || o.Tag == "" || o.alive() {
			continue
		}
		claimed := strings.TrimSuffix(path, ".json") + ".reaping"
		if os.Rename(path, claimed) != nil {
			continue // another process took it
		}
		takeDown(ctx, o)
		os.Remove(claimed)
		fmt.Fprintf(os.Stderr, "%s: took down lab %s of test process %d, which is gone\n", kind, o.Tag, o.PID)
		reaped = append(reaped, o.Tag)
	}
	return reaped
}

// KillUsersOf kills the processes whose command line names dir or a path
// under it (the daemons and tools a killed test left running on it), and
// waits, a few seconds at most, until each has ended.
func KillUsersOf(dir string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var killed []int
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !names(b, dir) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		// Through a pidfd: the PID cannot be another process's by the
		// time the signal goes, and the pidfd says when it has ended.
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // ended already
		}
		if unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) != nil {
			unix.Close(fd)
			continue
		}
		killed = append(killed, fd)
	}
	for _, fd := range killed {
		unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 5000)
		unix.Close(fd)
	}
}

// names reports whether a command line (arguments each ended by a NUL)
// names dir or a path under it.
func names(cmdline []byte, dir string) bool {
	for _, arg := range bytes.Split(cmdline, []byte{0}) {
		for rest := arg; ; {
			i := bytes.Index(rest, []byte(dir))
			if i < 0 {
				break
			}
			end := i + len(dir)
			if end == len(rest) || rest[end] == '/' {
				return true
			}
			rest = rest[end:]
		}
	}
	return false
}

// takeDown takes down a lab New made: the processes naming its directory,
// the lab (netlab.Down), then every namespace its ID starts (the host,
// internet, sinkhole and guest namespaces, and what is in them).
func takeDown(ctx context.Context, o Owner) {
	KillUsersOf(o.Dir)
	netlab.Down(ctx, o.Dir)
	left, _ := filepath.Glob(netns.Path(o.Tag + "*"))
	for _, p := range left {
		netns.Delete(filepath.Base(p))
	}
}
