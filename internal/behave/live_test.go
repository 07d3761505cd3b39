package behave

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// The traced helper: this test binary, run under strace with
// TB_BEHAVE_HELPER set, does on the host (loopback and a scratch
// directory only) what the observables are about.
func TestMain(m *testing.M) {
	if os.Getenv("TB_BEHAVE_HELPER") != "" {
		if err := helper(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helper() error {
	dir := os.Getenv("TB_BEHAVE_DIR")
	name := []byte("kworker/u8:2\x00")
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0); e != 0 {
		return e
	}
	// Under strace this fails (EPERM): what a sample checks.
	syscall.RawSyscall(syscall.SYS_PTRACE, syscall.PTRACE_TRACEME, 0, 0)
	// What a sample reads to find its tracer.
	if pid, err := tracerPid(); err != nil || pid == 0 {
		return fmt.Errorf("TracerPid %d under strace: %v", pid, err)
	}
	if _, err := os.ReadFile("/proc/cpuinfo"); err != nil {
		return err
	}
	os.Getuid()
	// /proc of the processes the test started for us to look at.
	for _, pid := range strings.Fields(os.Getenv("TB_BEHAVE_PIDS")) {
		os.ReadFile("/proc/" + pid + "/cmdline")
	}
	if pid, err := strconv.Atoi(os.Getenv("TB_BEHAVE_VICTIM")); err == nil {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			return err
		}
	}
	if err := helperNet(); err != nil {
		return err
	}
	// Files: dropped, renamed and made executable, deleted, a directory,
	// and one by a relative path after chdir.
	if err := os.WriteFile(filepath.Join(dir, "drop"), []byte("x"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tmp"), []byte("x"), 0o644); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dir, "tmp"), filepath.Join(dir, "moved")); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(dir, "moved"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "gone"), []byte("x"), 0o644); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, "gone")); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		return err
	}
	if err := syscall.Chdir(filepath.Join(dir, "sub")); err != nil {
		return err
	}
	if err := os.WriteFile("rel", []byte("x"), 0o644); err != nil {
		return err
	}
	// A sleep longer than the test's window.
	ts := syscall.NsecToTimespec(int64(20 * time.Millisecond))
	syscall.Nanosleep(&ts, nil)
	// A child under another name that exits with 3, and a copy of sh that
	// deletes its own binary through its child rm.
	sh, err := os.ReadFile("/bin/sh")
	if err != nil {
		return err
	}
	self := filepath.Join(dir, "selfdel")
	if err := os.WriteFile(self, sh, 0o755); err != nil {
		return err
	}
	cmd := exec.Command("/bin/sh", "-c", "exit 3")
	cmd.Args[0] = "[kthreadd]"
	if err := cmd.Run(); err == nil || cmd.ProcessState.ExitCode() != 3 {
		return fmt.Errorf("child: %v", err)
	}
	return exec.Command(self, "-c", `rm "$1"`, "sh", self).Run()
}

// tracerPid is the TracerPid of /proc/self/status.
func tracerPid() (int, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "TracerPid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("no TracerPid")
}

func helperNet() error {
	// A port nothing listens on, held (bound) so that no listener gets it.
	hold, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(hold)
	if err := syscall.Bind(hold, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return err
	}
	sa, err := syscall.Getsockname(hold)
	if err != nil {
		return err
	}
	to := &syscall.SockaddrInet4{Port: sa.(*syscall.SockaddrInet4).Port, Addr: [4]byte{127, 0, 0, 1}}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	if err := syscall.Connect(fd, to); err != syscall.ECONNREFUSED {
		return fmt.Errorf("blocking connect: %v", err)
	}
	syscall.Close(fd)
	fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		return err
	}
	if err := syscall.Connect(fd, to); err != syscall.EINPROGRESS {
		return fmt.Errorf("non-blocking connect: %v", err)
	}
	syscall.Close(fd)
	fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	if err := syscall.Sendto(fd, []byte("x"), 0, to); err != nil {
		return err
	}
	syscall.Close(fd)
	// A listener that accepts one connection.
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		c, err := net.Dial("tcp4", l.Addr().String())
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	c, err := l.Accept()
	if err != nil {
		return err
	}
	c.Close()
	return <-done
}

func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is needed (scripts/deps.sh installs it): %v", name, err)
	}
	return p
}

// startSleeps starts n processes outside the trace, for the traced helper
// to look at in /proc or kill.
func startSleeps(t *testing.T, n int) []*exec.Cmd {
	t.Helper()
	var cmds []*exec.Cmd
	for i := 0; i < n; i++ {
		c := exec.Command("sleep", "3600")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	}
	return cmds
}

// A real strace run, with the command line the guest runs, of a process
// that does one of each thing the observables are about.
func TestStraceLive(t *testing.T) {
	needTool(t, "strace")
	dir := t.TempDir()
	out := filepath.Join(dir, "trace")
	scratch := filepath.Join(dir, "scratch")
	if err := os.Mkdir(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	sleeps := startSleeps(t, ProcScanMin+1)
	victim := sleeps[0]
	var pids []string
	for _, c := range sleeps[1:] {
		pids = append(pids, strconv.Itoa(c.Process.Pid))
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := append(straceArgs(out), self)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "TB_BEHAVE_HELPER=1", "TB_BEHAVE_DIR="+scratch, "TB_BEHAVE_PIDS="+strings.Join(pids, " "),
		"TB_BEHAVE_VICTIM="+strconv.Itoa(victim.Process.Pid))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, stderr.String())
	}
	victim.Wait() // it was killed by the helper: no longer ours to kill

	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sink := decodetest.New(observe.Origin{})
	res, err := Parse(context.Background(), f, observe.Origin{Input: out, Cycle: "c1"}, sink,
		Options{Window: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sink.Finish(t)
	if res.Format != FormatStrace || res.Stats.Bad != 0 {
		b, _ := os.ReadFile(out)
		t.Fatalf("format %s, stats %+v\n%s", res.Format, res.Stats, b)
	}
	if t.Failed() {
		return
	}
	checkLive(t, sink, res, self, scratch, victim.Process.Pid)
}

func checkLive(t *testing.T, sink *decodetest.Sink, res *Result, self, scratch string, victim int) {
	t.Helper()
	// The process tree: the helper, its child under another name that
	// exited with 3, the copy of sh and its rm.
	root := findProc(t, sink, func(p *records.ProcessInfo) bool { return p.Exe == self && p.PPID == 0 })
	if root.PPID != 0 || root.UID == nil || *root.UID != int64(os.Getuid()) || !slices.Contains(root.Names, "kworker/u8:2") ||
		root.Threads == 0 || root.Exit == nil || root.Exit.Code != 0 {
		t.Errorf("root process %+v", root)
	}
	kid := findProc(t, sink, func(p *records.ProcessInfo) bool { return p.Exe == "/bin/sh" && p.PPID == root.PID })
	if !slices.Contains(kid.Names, "[kthreadd]") || kid.Exit == nil || kid.Exit.Code != 3 || len(kid.Execs) != 1 ||
		!slices.Equal(kid.Execs[0].Argv, []string{"[kthreadd]", "-c", "exit 3"}) {
		t.Errorf("renamed child %+v", kid)
	}
	sh := findProc(t, sink, func(p *records.ProcessInfo) bool {
		return p.Exe == filepath.Join(scratch, "selfdel") && p.PPID == root.PID
	})
	rm := findProc(t, sink, func(p *records.ProcessInfo) bool { return p.PPID == sh.PID })
	if filepath.Base(rm.Exe) != "rm" {
		t.Errorf("rm %+v", rm)
	}
	tr := sink.Get(t, records.ObsTrace, "strace").Trace
	if tr.Root != root.PID || tr.Processes < 4 || tr.Threads == 0 || tr.Execs < 4 || tr.Truncated || tr.Garbled != 0 {
		t.Errorf("trace %+v", tr)
	}

	// Files.
	for p, want := range map[string][]string{
		"drop":    {"create", "write"},
		"tmp":     {"create", "write", "rename-from"},
		"moved":   {"rename-to", "chmod+x"},
		"gone":    {"create", "write", "delete"},
		"sub":     {"mkdir"},
		"sub/rel": {"create", "write"},
		"selfdel": {"create", "write", "delete"},
	} {
		o := sink.Get(t, records.ObsPath, filepath.Join(scratch, p))
		if !slices.Equal(o.Path.Ops, want) {
			t.Errorf("%s: ops %q, want %q", p, o.Path.Ops, want)
		}
	}
	if o := sink.Get(t, records.ObsPath, filepath.Join(scratch, "moved")); o.Path.Mode != "0755" ||
		!slices.Equal(o.Path.RenamedFrom, []string{filepath.Join(scratch, "tmp")}) {
		t.Errorf("moved: %+v", o.Path)
	}
	if o := sink.Get(t, records.ObsPath, filepath.Join(scratch, "selfdel")); !o.Path.SelfDelete || o.Path.Dropped {
		t.Errorf("selfdel: %+v", o.Path)
	}
	var dropped []string
	for _, d := range res.Dropped {
		dropped = append(dropped, strings.TrimPrefix(d.Path, scratch+"/"))
		if d.Path == filepath.Join(scratch, "drop") && (d.PID != root.PID || d.Exe != self) {
			t.Errorf("dropped %+v", d)
		}
	}
	if want := []string{"drop", "moved", "sub/rel"}; !slices.Equal(dropped, want) {
		t.Errorf("dropped %q, want %q", dropped, want)
	}
	if !slices.Equal(tr.Dropped, []string{filepath.Join(scratch, "drop"), filepath.Join(scratch, "moved"), filepath.Join(scratch, "sub/rel")}) {
		t.Errorf("trace dropped %q", tr.Dropped)
	}

	// Network calls: refused then in progress to one closed port, a
	// datagram to it, a listener (bound to port 0) that accepted one
	// connection.
	var connects, sends, listens []*records.Observable
	for _, o := range sink.Obs {
		switch n := o.Netcall; {
		case n == nil || n.Addr != "127.0.0.1":
		case n.Call == "connect" && hasResult(n, "ECONNREFUSED"):
			connects = append(connects, o)
		case n.Call == "sendto":
			sends = append(sends, o)
		case n.Call == "listen":
			listens = append(listens, o)
		}
	}
	if len(connects) != 1 || len(sends) != 1 || len(listens) != 1 {
		t.Fatalf("netcalls %v", values(sink, records.ObsNetcall))
	}
	port := strconv.Itoa(int(connects[0].Netcall.Port))
	if c := connects[0]; c.Value != "connect 127.0.0.1:"+port+"/tcp" || c.Netcall.Calls != 2 || !hasResult(c.Netcall, "EINPROGRESS") {
		t.Errorf("refused and in-progress connects: %+v", c.Netcall)
	}
	if u := sends[0]; u.Value != "sendto 127.0.0.1:"+port+"/udp" || !hasResult(u.Netcall, "0") {
		t.Errorf("sendto: %+v", u.Netcall)
	}
	if l := listens[0]; l.Value != "listen 127.0.0.1:0/tcp" || l.Netcall.Accepted != 1 || len(l.Netcall.Peers) != 1 ||
		!strings.HasPrefix(l.Netcall.Peers[0], "127.0.0.1:") {
		t.Errorf("listener: %+v", l.Netcall)
	}

	// Tampering and evasion.
	kill := sink.Get(t, records.ObsPersistence, "kill").Persistence
	if !slices.Equal(kill.Targets, []string{strconv.Itoa(victim) + " SIGTERM"}) {
		t.Errorf("kill %+v", kill)
	}
	if p := sink.Get(t, records.ObsEvasion, "ptrace").Evasion; !slices.Equal(p.Targets, []string{"PTRACE_TRACEME (EPERM)"}) {
		t.Errorf("ptrace %+v", p)
	}
	if p := sink.Get(t, records.ObsEvasion, "tracer-check").Evasion; !slices.Equal(p.Paths, []string{"/proc/self/status"}) {
		t.Errorf("tracer-check %+v", p)
	}
	sink.Get(t, records.ObsEvasion, "cpuinfo")
	if p := sink.Get(t, records.ObsEvasion, "self-delete").Evasion; !slices.Equal(p.Paths, []string{filepath.Join(scratch, "selfdel")}) ||
		!slices.Equal(p.Procs, []string{strconv.Itoa(int(rm.PID))}) {
		t.Errorf("self-delete %+v", p)
	}
	if o := sink.Get(t, records.ObsEvasion, "proc-scan"); o.Count < ProcScanMin {
		t.Errorf("proc-scan %+v", o)
	}
	if s := sink.Get(t, records.ObsEvasion, "sleep").Evasion; s.Longest < 0.02 {
		t.Errorf("sleep %+v", s)
	}
}

func hasResult(n *records.NetcallInfo, r string) bool {
	return slices.ContainsFunc(n.Results, func(c records.CallCount) bool { return c.Name == r })
}

func findProc(t *testing.T, sink *decodetest.Sink, match func(*records.ProcessInfo) bool) *records.ProcessInfo {
	t.Helper()
	var all []string
	for _, o := range sink.Obs {
		if o.Process != nil {
			if match(o.Process) {
				return o.Process
			}
			all = append(all, fmt.Sprintf("%+v", *o.Process))
		}
	}
	t.Fatalf("no such process among\n%s", strings.Join(all, "\n"))
	return nil
}

// A real QEMU user-mode log (QEMU_LOG=strace into a file, as the guest
// writes it) of a shell run under qemu-x86_64. One process only, so that
// nothing interleaves: TestQEMUInterleaved reads saved logs of a shell
// with children.
func TestQEMULive(t *testing.T) {
	qemu := needTool(t, "qemu-x86_64-static")
	dir := t.TempDir()
	out := filepath.Join(dir, "qemu.log")
	victim := startSleeps(t, 1)[0]
	cmd := exec.Command(qemu, "/bin/sh", "-c", `cd "$1" && echo x > drop && kill -TERM "$2"; exit 3`, "sh", dir, strconv.Itoa(victim.Process.Pid))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "QEMU_LOG=strace", "QEMU_LOG_FILENAME=" + out}
	if err := cmd.Run(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 3 {
		t.Fatalf("%v: %v", cmd.Args, err)
	}
	victim.Wait()
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sink := decodetest.New(observe.Origin{})
	start := time.Now()
	res, err := Parse(context.Background(), f, observe.Origin{Input: out}, sink, Options{Exe: "/bin/sh", Start: start})
	if err != nil {
		t.Fatal(err)
	}
	sink.Finish(t)
	if res.Format != FormatQEMU || res.Stats.Bad != 0 || res.Trace.Garbled != 0 || res.Trace.Processes != 1 {
		t.Fatalf("%s %+v %+v", res.Format, res.Stats, res.Trace)
	}
	root := findProc(t, sink, func(p *records.ProcessInfo) bool { return p.PPID == 0 })
	if root.Exe != "/bin/sh" || root.Exit == nil || root.Exit.Code != 3 || !root.Start.Equal(start.UTC()) {
		t.Errorf("root %+v", root)
	}
	if o := sink.Get(t, records.ObsPath, filepath.Join(dir, "drop")); !o.Path.Dropped || !slices.Equal(o.Path.Ops, []string{"create", "write"}) {
		t.Errorf("drop %+v", o.Path)
	}
	if k := sink.Get(t, records.ObsPersistence, "kill").Persistence; !slices.Equal(k.Targets, []string{strconv.Itoa(victim.Process.Pid) + " SIGTERM"}) {
		t.Errorf("kill %+v", k)
	}
}

// A sample that kills its tracer (the TracerPid it read, here a shell's):
// the trace ends with the kill, cut; with --seccomp-bpf the calls strace
// traced now fail (ENOSYS) for want of a tracer.
func TestTracerKilled(t *testing.T) {
	needTool(t, "strace")
	dir := t.TempDir()
	out := filepath.Join(dir, "trace")
	args := append(straceArgs(out), "/bin/sh", "-c",
		`while read k v; do [ "$k" = TracerPid: ] && kill -9 "$v"; done < /proc/self/status; : > "$1/after"`, "sh", dir)
	cmd := exec.Command(args[0], args[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// strace dies by the signal; Wait returns once the shell, holding
	// stderr, has ended too.
	if err := cmd.Run(); err == nil {
		t.Fatal("strace was not killed")
	}
	if !strings.Contains(stderr.String(), "after: Function not implemented") {
		t.Errorf("the shell's open after the kill: %q", stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "after")); !os.IsNotExist(err) {
		t.Errorf("the file opened after the kill: %v", err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sink := decodetest.New(observe.Origin{})
	res, err := Parse(context.Background(), f, observe.Origin{Input: out}, sink, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sink.Finish(t)
	if res.Stats.Bad != 0 || !res.Trace.Truncated || res.Trace.Unfinished != 1 {
		t.Errorf("%+v %+v", res.Stats, res.Trace)
	}
	if k := sink.Get(t, records.ObsPersistence, "kill").Persistence; !slices.Equal(k.Targets, []string{strconv.Itoa(cmd.Process.Pid) + " SIGKILL"}) {
		t.Errorf("kill %+v (strace was %d)", k, cmd.Process.Pid)
	}
	sink.Get(t, records.ObsEvasion, "tracer-check")
	root := findProc(t, sink, func(p *records.ProcessInfo) bool { return p.PPID == 0 })
	if root.Exit != nil || root.Exe != "/bin/sh" {
		t.Errorf("%+v", root)
	}
}

// straceArgs is the tracer's command line writing to out, with the
// options tb-run's guest launcher gives it, to which the traced command's
// is appended.
func straceArgs(out string) []string {
	return append(append([]string{"strace"}, strings.Fields(StraceOptions)...), "-o", out, "--")
}
