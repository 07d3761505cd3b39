package behave

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// calls are a result's call counts by name.
func calls(res *Result) map[string]int64 {
	m := map[string]int64{}
	for _, c := range res.Trace.Calls {
		m[c.Name] = c.Count
	}
	return m
}

func tampered(sink *decodetest.Sink) []string {
	var seen []string
	for _, o := range sink.Obs {
		if o.Evasion != nil && o.Evasion.Technique == TechTraceTampered {
			seen = append(seen, o.Evasion.Paths...)
		}
	}
	return seen
}

// The C beacon for powerpc under qemu-ppc-static 7.2, traced by the amd64
// guest's strace (testdata/qemu-ppc.strace): the beacon renames itself,
// forks a child that execs the beacon again, drops files, listens and
// connects. With Options.Emulator, what each of the three emulator starts
// does (the sample's, the fork's, the child's exec) is gone, and what the
// program did is all there, with its names, addresses and processes.
func TestEmulatorStartDropped(t *testing.T) {
	const exe = "/root/cbeacon-powerpc"
	tracer := &Tracer{PIDs: []int{1, 2}, Dir: "/var/lib/0123456789abcdef", Ended: true}
	raw, rawRes := parseFile(t, "testdata/qemu-ppc.strace", Options{Exe: exe})
	sink, res := parseFile(t, "testdata/qemu-ppc.strace", Options{Exe: exe, Emulator: "qemu-ppc-static", Tracer: tracer})

	got, was := calls(res), calls(rawRes)
	// Unfiltered: the emulator's calls are counted as the program's.
	for name, n := range map[string]int64{"geteuid": 4, "getuid": 2, "clone3": 3, "clock_nanosleep": 3, "readlink": 8} {
		if was[name] != n {
			t.Errorf("unfiltered: %d %s, want %d (%v)", was[name], name, n, was)
		}
	}
	// Filtered: the program's own calls only. Its readlinks of /proc/self/exe
	// are QEMU's realpath of the binary: two components, three times.
	want := map[string]int64{"execve": 2, "clone": 1, "readlink": 6, "prctl": 1, "exit_group": 2,
		"openat": 14, "mkdir": 3, "chmod": 1, "socket": 7, "bind": 1, "listen": 1, "connect": 6, "sendto": 3, "unlink": 1}
	if !maps.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	if res.Trace.Threads != 0 || rawRes.Trace.Threads != 3 || res.Trace.LongestSleep != 0 || res.Trace.TotalSleep != 0 {
		t.Errorf("threads %d (unfiltered %d), sleeps %v %v", res.Trace.Threads, rawRes.Trace.Threads, res.Trace.LongestSleep, res.Trace.TotalSleep)
	}
	if seen := tampered(sink); len(seen) > 0 {
		t.Errorf("a clean emulated run seen as tampered: %q", seen)
	}
	// The processes are the beacon and its child, both the guest binary.
	root := procOf(t, sink, 187)
	child := procOf(t, sink, 189)
	if root.Exe != exe || child.Exe != exe || child.PPID != 187 || !slices.Contains(root.Names, "kworker/u:tb") ||
		len(child.Execs) != 1 || !slices.Equal(child.Execs[0].Argv, []string{"kworker/u:tb", "-behave-child"}) {
		t.Errorf("root %+v\nchild %+v", root, child)
	}
	if res.Trace.Processes != 2 {
		t.Errorf("%d processes", res.Trace.Processes)
	}
	// Nothing of the emulator's start is an observable; the program's
	// connect is, with its address.
	for _, o := range sink.Obs {
		if strings.Contains(o.Value, "mmap_min_addr") || strings.Contains(o.Value, "/proc/self/maps") || strings.Contains(o.Value, "qemu-ppc") {
			t.Errorf("the emulator's start in %s %q", o.Type, o.Value)
		}
	}
	if len(values(sink, records.ObsNetcall)) == 0 || len(values(raw, records.ObsNetcall)) != len(values(sink, records.ObsNetcall)) {
		t.Errorf("netcalls %q, unfiltered %q", values(sink, records.ObsNetcall), values(raw, records.ObsNetcall))
	}
}

// The Go beacon for big-endian MIPS under qemu-mips-static 7.2
// (testdata/qemu-mips.strace, its Go runtime's own sleeps and signals taken
// out, cut where the run was killed): many threads of the program, and a
// child the Go runtime forks (clone with CLONE_VM|CLONE_VFORK, which QEMU
// makes a fork) that execs the beacon, whose emulator's start is
// interleaved with the parent's threads and split into unfinished and
// resumed lines.
func TestEmulatorStartInterleaved(t *testing.T) {
	const exe = "/root/beacon-mips"
	sink, res := parseFile(t, "testdata/qemu-mips.strace", Options{Exe: exe, Emulator: "/usr/bin/qemu-mips-static",
		Tracer: &Tracer{PIDs: []int{1, 2}, Dir: "/var/lib/0123456789abcdef"}})
	got := calls(res)
	for _, name := range []string{"geteuid", "getuid", "clock_nanosleep"} {
		if got[name] != 0 {
			t.Errorf("%d %s: the emulator's (%v)", got[name], name, got)
		}
	}
	// The program's: the Go runtime's threads (clone3) and the fork.
	if got["clone3"] != 9 || got["clone"] != 1 || got["execve"] != 2 || got["prctl"] != 1 {
		t.Errorf("calls %v", got)
	}
	if seen := tampered(sink); len(seen) > 0 {
		t.Errorf("seen as tampered: %q", seen)
	}
	child := procOf(t, sink, 172)
	if child.Exe != exe || child.PPID != 165 {
		t.Errorf("child %+v", child)
	}
	if res.Trace.Processes != 2 || res.Trace.Threads != 9 {
		t.Errorf("%d processes, %d threads", res.Trace.Processes, res.Trace.Threads)
	}
}

// Only a readlink naming the emulator right after an exec starts the
// emulator's list, only calls matching it in order are dropped, and in
// its thread only sleeps: a native program that imitates the start hides
// nothing else, and one that does not hides nothing.
func TestEmulatorStartImitated(t *testing.T) {
	const trace = `10 1.0 execve("/tmp/s", ["/tmp/s"], 0x1 /* 1 var */) = 0 <0.1>
10 1.1 readlink("/proc/self/exe", "/usr/bin/qemu-mips-static", 4096) = 25 <0.1>
10 1.2 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM, exit_signal=0} => {parent_tid=[11]}, 88) = 11 <0.1>
11 1.3 clock_nanosleep(CLOCK_REALTIME, 0, {tv_sec=0, tv_nsec=10000000}, 0x1) = 0 <0.01>
11 1.31 openat(AT_FDCWD, "/etc/cron.d/x", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3 <0.1>
10 1.4 openat(AT_FDCWD, "/proc/sys/vm/mmap_min_addr", O_RDONLY) = 4 <0.1>
10 1.5 openat(AT_FDCWD, "/etc/rc.local", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3 <0.1>
10 1.6 geteuid() = 0 <0.1>
10 1.7 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x1) = 12 <0.1>
12 1.8 execve("/bin/sh", ["sh"], 0x1 /* 1 var */) = 0 <0.1>
12 1.9 openat(AT_FDCWD, "/proc/sys/vm/mmap_min_addr", O_RDONLY) = 3 <0.1>
12 2.0 readlink("/proc/self/exe", "/usr/bin/qemu-mips-static", 4096) = 25 <0.1>
12 2.1 exit_group(0) = ?
12 2.2 +++ exited with 0 +++
11 2.3 +++ exited with 0 +++
10 2.4 exit_group(0) = ?
10 2.5 +++ exited with 0 +++
`
	sink, res := parse(t, trace, Options{Exe: "/tmp/s", Emulator: "qemu-mips-static", Tracer: &Tracer{PIDs: []int{1, 2}, Ended: true}})
	got := calls(res)
	want := map[string]int64{"execve": 2, "openat": 3, "geteuid": 1, "clone": 1, "readlink": 1, "exit_group": 2}
	if !maps.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	if p := values(sink, records.ObsPersistence); len(p) != 2 {
		t.Errorf("persistence %q: the thread's cron file and the rc.local written after the list broke", p)
	}
	if seen := tampered(sink); len(seen) > 0 {
		t.Errorf("seen as tampered: %q", seen)
	}
	// Without Options.Emulator nothing is dropped.
	_, res = parse(t, trace, Options{Exe: "/tmp/s"})
	if n := calls(res); n["readlink"] != 2 || n["clone3"] != 1 || n["clock_nanosleep"] != 1 || n["openat"] != 4 {
		t.Errorf("unfiltered calls %v", n)
	}
}
