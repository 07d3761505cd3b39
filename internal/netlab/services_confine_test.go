package netlab_test

import (
	"context"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
)

// procUIDs is the real, effective, saved and filesystem uids of a process.
func procUIDs(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			return strings.Fields(rest)
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return nil
}

// mountOptions is the per-mount options of the mount at path as process pid
// sees it.
func mountOptions(t *testing.T, pid int, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "mountinfo"))
	if err != nil {
		t.Fatal(err)
	}
	opts := ""
	for _, line := range strings.Split(string(b), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ...; the last mount on
		// a point is the one seen.
		if f := strings.Fields(line); len(f) > 5 && f[4] == path {
			opts = f[5]
		}
	}
	return opts
}

// TestSinkholeServicesConfined: the dnsmasq instances every guest reaches
// (the DNS sinkhole and its answerer, DHCP on the bridge) and the multilog
// reading their logs run as an unprivileged user; they and INetSim run in
// a mount namespace where the host's filesystem is read-only and /tmp is
// their own; INetSim's log directory is not world-writable.
func TestSinkholeServicesConfined(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	cfg.DNS, cfg.DHCP, cfg.INetSim = true, true, true
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	// What the host has in /tmp, a confined service must not see.
	marker, err := os.CreateTemp("", "talkbox-host-tmp-")
	if err != nil {
		t.Fatal(err)
	}
	marker.Close()
	t.Cleanup(func() { os.Remove(marker.Name()) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	st, err := netlab.Inspect(ctx, cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]int{}
	for _, s := range st.Services {
		pids[s.Name] = s.PID
	}
	// multilog has no pid file: found by the directory it writes.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		for _, svc := range []string{"dns", "dhcp"} {
			if args[0] == "multilog" && args[len(args)-1] == netlab.LogDir(&cfg, svc) {
				pids["multilog "+svc], _ = strconv.Atoi(filepath.Base(filepath.Dir(p)))
			}
		}
	}
	for _, name := range []string{"dns", "dns-answer", "dhcp", "multilog dns", "multilog dhcp", "inetsim"} {
		pid := pids[name]
		if pid == 0 {
			t.Fatalf("%s is not running (services: %+v)", name, st.Services)
		}
		// INetSim's main process stays root; each of its services drops
		// to the inetsim user.
		if uids := procUIDs(t, pid); name != "inetsim" && slices.Contains(uids, "0") {
			t.Errorf("%s (pid %d) runs with uid 0 (real, effective, saved, fs: %v)", name, pid, uids)
		}
		if strings.HasPrefix(name, "multilog") {
			continue // it reads a pipe and writes its own directory
		}
		if opts := mountOptions(t, pid, "/"); !strings.HasPrefix(opts, "ro") {
			t.Errorf("%s (pid %d) sees / mounted %q, want read-only", name, pid, opts)
		}
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid), "root", marker.Name())); err == nil {
			t.Errorf("%s (pid %d) sees the host's %s: its /tmp is not its own", name, pid, marker.Name())
		}
	}

	// Every INetSim service starts in its confinement.
	out, err := os.ReadFile(filepath.Join(cfg.Dir, "inetsim.out"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "failed") {
			t.Errorf("INetSim: %s", line)
		}
	}

	inetsim, err := user.Lookup("inetsim")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct {
		dir   string
		owner string
	}{
		{netlab.RunDir(&cfg), "0"},
		{filepath.Dir(netlab.LogDir(&cfg, "inetsim")), "0"},
		{netlab.LogDir(&cfg, "inetsim"), inetsim.Uid},
	} {
		fi, err := os.Stat(d.dir)
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode(); m&0o002 != 0 && m&os.ModeSticky == 0 {
			t.Errorf("%s is %v: world-writable without the sticky bit", d.dir, m)
		}
		if uid := strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)); uid != d.owner {
			t.Errorf("%s is owned by uid %s, want %s", d.dir, uid, d.owner)
		}
	}
	if fi, err := os.Stat(netlab.LogDir(&cfg, "inetsim")); err == nil && fi.Mode().Perm() != 0o700 {
		t.Errorf("INetSim's log directory is %v, want 0700", fi.Mode().Perm())
	}
}
