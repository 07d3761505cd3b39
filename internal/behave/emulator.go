package behave

import (
	"path"
	"strings"
)

// A sample under user-mode emulation (qemu-user, started by binfmt_misc
// for each exec of a foreign binary) is traced as a native one is: strace
// in the guest sees the host calls QEMU makes for the emulated program,
// with their paths and addresses, and each exec of the sample or of its
// descendants is an exec of the foreign binary. What strace also sees is
// QEMU's own work before the emulated program's first instruction, which
// Options.Emulator has dropped here, and nothing else.
//
// How it was found: the beacons (the Go one for big-endian MIPS, the C one
// for powerpc, m68k, sparc64 and sh4) run under strace with StraceOptions
// in the amd64 guest, under Debian bookworm's qemu-user-static 7.2
// (testdata/qemu-*.strace): every emulator instance, the sample's and
// each exec'd child's, starts with the same seven calls of the trace set,
// which QEMU 7.2's linux-user code explains: readlink of /proc/self/exe
// naming the emulator (qemu_init_exec_dir), the RCU thread (rcu.c's
// call_rcu thread, which then sleeps 10 ms at a time), mmap_min_addr
// (main), geteuid (prepare_binprm), /proc/self/maps (the guest base
// probe), getuid and geteuid (the AT_UID and AT_EUID of
// create_elf_tables). The program's own calls follow. A fork of an
// emulated process starts in the child with the RCU thread again (rcu.c's
// atfork handler), before the emulated program goes on.
//
// The readlink naming the emulator is the marker: a process that starts
// otherwise after an exec is native (a shell the sample runs) and nothing
// of it is dropped. Only calls matching the list, in order, are dropped,
// and in the emulator's threads only their sleeps, so a sample that
// imitates the marker hides at most reads of those two /proc files, two
// uid queries and a thread's sleeps.

// emuCall is one call of the emulator's start.
type emuCall struct {
	name string
	path string // the file it opens; "" for none
}

// qemuStart is what follows the marker in a new emulator.
var qemuStart = []emuCall{
	{name: "clone"}, // the RCU thread
	{name: "openat", path: "/proc/sys/vm/mmap_min_addr"},
	{name: "geteuid"},
	{name: "openat", path: "/proc/self/maps"},
	{name: "getuid"},
	{name: "geteuid"},
}

// qemuFork is what a forked emulator does before the program goes on.
var qemuFork = qemuStart[:1]

// emulatorCall reports whether the call is the emulator's own, as the
// comment above says, and takes it: a thread it starts is the emulator's,
// and no call it makes counts as the program's.
func (e *ev) emulatorCall() bool {
	t, p := e.t, e.p
	if e.pid != p.pid {
		return t.emuThreads[e.pid] && isSleep(e.name)
	}
	if p.emuExec {
		p.emuExec = false
		if e.isMarker() {
			p.emulated, p.emuNext = true, qemuStart
			return true
		}
		p.emulated = false
		return false
	}
	if len(p.emuNext) == 0 {
		return false
	}
	want := p.emuNext[0]
	p.emuNext = p.emuNext[1:]
	switch {
	case want.name == "clone" && isClone(e.name) && strings.Contains(cloneFlags(e.name, strings.Join(e.c.args, ", ")), "CLONE_THREAD"):
		if tid, ok := e.c.retInt(); ok && tid > 0 {
			t.emulatorThread(p, tid)
		}
		return true
	case want.name == e.name && want.path == "":
		return true
	case want.name == e.name && e.str(1) == want.path:
		return true
	}
	p.emuNext = nil // the program's own call: the start is over
	return false
}

// isMarker: a readlink of /proc/self/exe that names the emulator.
func (e *ev) isMarker() bool {
	i := 0
	switch e.name {
	case "readlinkat":
		i = 1
	case "readlink":
	default:
		return false
	}
	return e.str(i) == "/proc/self/exe" && e.c.succeeded() && path.Base(e.str(i+1)) == path.Base(e.t.opts.Emulator)
}

// awaitsThread reports whether the emulator of p is about to start its
// RCU thread: the next new thread of p is the emulator's.
func (p *proc) awaitsThread() bool {
	return len(p.emuNext) > 0 && p.emuNext[0].name == "clone"
}

// emulatorThread notes tid as the emulator's own thread of p: not one of
// the program's (if its lines came before the clone returned, it was
// counted as one).
func (t *trace) emulatorThread(p *proc, tid int) {
	if t.emuThreads[tid] {
		return
	}
	if tg, ok := t.tids[tid]; ok && tg == p.pid {
		p.threads--
		t.res.Trace.Threads--
	} else if c := t.procs[tid]; c != nil && c != p {
		t.unguess(c) // its lines came first, taken for a process's
	}
	t.tids[tid] = p.pid
	t.emuThreads[tid] = true
}

func isSleep(name string) bool {
	switch name {
	case "nanosleep", "clock_nanosleep", "clock_nanosleep_time64":
		return true
	}
	return false
}
