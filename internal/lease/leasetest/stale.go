package leasetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// ownersDir records each lab upLab brings up with the test process that
// owns it: a test process killed (a timeout's SIGQUIT, a ^C, an OOM) runs
// no cleanup, and its lab (bridge, namespaces, nftables tables, sinkhole
// services), its guests and its capture daemons would stay on the machine
// until taken down by hand. The next upLab takes them down (reapStale).
const ownersDir = "/run/talkbox-leasetest"

// owner is a lab's record in ownersDir.
type owner struct {
	PID int `json:"pid"`
	// Start is the process's start time (/proc/PID/stat's 22nd field):
	// a PID alone may be another process's by now.
	Start string `json:"start"`
	State string `json:"state"` // the state directory the lab is recorded in
	Dir   string `json:"dir"`   // the lab's directory (netlab.Dir)
	Tag   string `json:"tag"`   // the names' suffix
}

func ownerPath(tag string) string { return filepath.Join(ownersDir, tag+".json") }

// recordOwner notes this process as the owner of the lab tagged tag,
// before any of it is made.
func recordOwner(tag, stateDir, dir string) error {
	start, err := startTime(os.Getpid())
	if err != nil {
		return err
	}
	b, err := json.Marshal(owner{PID: os.Getpid(), Start: start, State: stateDir, Dir: dir, Tag: tag})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(ownersDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(ownerPath(tag), b, 0o644)
}

// startTime is a process's start time, in clock ticks since boot.
func startTime(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing one (the state is the 3rd field).
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return f[19], nil
}

// alive reports whether o's test process still runs.
func (o *owner) alive() bool {
	start, err := startTime(o.PID)
	return err == nil && start == o.Start
}

// reapStale takes down the labs whose test process is gone, and what ran
// on them: their leases' guests, the processes started for their state
// directory (capture daemons), the lab itself (netlab.Down, then each
// name left), its uplink's namespace. The caller holds netLock. It
// returns the labs taken down.
func reapStale(ctx context.Context) []string {
	ents, _ := os.ReadDir(ownersDir)
	var reaped []string
	for _, e := range ents {
		var o owner
		b, err := os.ReadFile(filepath.Join(ownersDir, e.Name()))
		if err != nil || json.Unmarshal(b, &o) != nil || o.Tag == "" || o.alive() {
			continue
		}
		o.takeDown(ctx)
		os.Remove(filepath.Join(ownersDir, e.Name()))
		fmt.Fprintf(os.Stderr, "leasetest: took down lab lt%s of test process %d, which is gone\n", o.Tag, o.PID)
		reaped = append(reaped, "lt"+o.Tag)
	}
	return reaped
}

func (o *owner) takeDown(ctx context.Context) {
	if o.State != "" {
		killUsersOf(o.State)
		if _, err := os.Stat(o.State); err == nil {
			Cleanup(o.State)
		}
	}
	if o.Dir != "" {
		netlab.Down(ctx, o.Dir)
	}
	// What netlab.Down had no record of (a lab cut short, its state
	// directory removed): by name.
	for _, fam := range []string{"inet", "netdev", "bridge"} {
		exec.CommandContext(ctx, "nft", "delete", "table", fam, "talkboxlt"+o.Tag).Run()
	}
	for _, link := range []string{"tbltk" + o.Tag, "tbltu" + o.Tag, "tblt" + o.Tag} {
		exec.CommandContext(ctx, "ip", "link", "del", link).Run()
	}
	for _, ns := range []string{"tblts" + o.Tag, "tbltn" + o.Tag} {
		netns.Delete(ns)
	}
}

// killUsersOf kills the processes whose command line names dir: the
// capture daemons and tools a killed test left running on its state.
func killUsersOf(dir string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !names(b, dir) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err == nil && pid != os.Getpid() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// names reports whether a command line (arguments each ended by a NUL)
// names dir or a path under it.
func names(cmdline []byte, dir string) bool {
	for _, arg := range bytes.Split(cmdline, []byte{0}) {
		for i := bytes.Index(arg, []byte(dir)); i >= 0; {
			end := i + len(dir)
			if end == len(arg) || arg[end] == '/' {
				return true
			}
			j := bytes.Index(arg[end:], []byte(dir))
			if j < 0 {
				break
			}
			i = end + j
		}
	}
	return false
}
