package behave

import (
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// tamperedTrace is a sample (500) whose child (501) reaches for its tracer
// (pid 499; the launcher is 498): it reads the link of the tracer's
// trace descriptor, opens it to append, and kills the tracer, which
// therefore writes neither the child's exit nor its own lines any more;
// then pid 777, which no traced process started, "writes" a forged line.
const tamperedTrace = `500 1795500000.000001 execve("/tmp/bot", ["/tmp/bot"], 0x7ffd4e0c7f30 /* 10 vars */) = 0 <0.000200>
500 1795500000.000100 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f0000000a10) = 501 <0.000100>
501 1795500000.000200 readlinkat(AT_FDCWD, "/proc/499/fd/3", "/var/lib/0123456789abcdef/t", 4096) = 27 <0.000020>
501 1795500000.000300 openat(AT_FDCWD, "/proc/499/fd/3", O_WRONLY|O_APPEND) = 4 <0.000020>
501 1795500000.000350 openat(AT_FDCWD, "/proc/499/status", O_RDONLY) = 5 <0.000020>
501 1795500000.000400 kill(499, SIGKILL) = 0 <0.000020>
500 1795500000.000500 exit_group(0) = ?
500 1795500000.000600 +++ exited with 0 +++
777 1795500000.000700 openat(AT_FDCWD, "/etc/forged", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3 <0.000020>
`

// TestTamperedTrace: with what tb-run knows of the tracer, the trace's
// reaches for it, the processes left running when it ended and the lines
// of a process no traced one started are one "trace tampered" evasion.
func TestTamperedTrace(t *testing.T) {
	tr := &Tracer{PIDs: []int{498, 499}, Dir: "/var/lib/0123456789abcdef", Ended: true, Findings: []string{"the end record is not the launcher's"}}
	sink, _ := parse(t, tamperedTrace, Options{Tracer: tr})
	o := sink.Get(t, records.ObsEvasion, "trace tampered")
	if o.Evasion.Technique != TechTraceTampered {
		t.Fatalf("technique %q", o.Evasion.Technique)
	}
	want := []string{
		"pid 501 readlinkat /proc/499/fd/3 (line 3)",
		"pid 501 openat /proc/499/fd/3 (line 4)",
		"pid 501 kill(499, SIGKILL) (line 6)",
		"the end record is not the launcher's",
		"the tracer ended before these traced processes did: 501 777",
		"lines of processes no traced process started: 777",
	}
	if !slices.Equal(o.Evasion.Paths, want) {
		t.Fatalf("seen\n%s\nwant\n%s", strings.Join(o.Evasion.Paths, "\n"), strings.Join(want, "\n"))
	}
	// Without what tb-run knows (tb-parse), no such observable.
	sink, _ = parse(t, tamperedTrace, Options{})
	if values(sink, records.ObsEvasion) != nil && slices.Contains(values(sink, records.ObsEvasion), "trace tampered") {
		t.Fatal("tampering seen without the tracer's details")
	}
}

// TestCleanTraceNotTampered: a real trace (python3 and its children, every
// exit written) whose tracer ended is not tampered with.
func TestCleanTraceNotTampered(t *testing.T) {
	sink, _ := parseFile(t, "testdata/python.strace", Options{Tracer: &Tracer{PIDs: []int{2, 3}, Dir: "/var/lib/0123456789abcdef", Ended: true}})
	if slices.Contains(values(sink, records.ObsEvasion), "trace tampered") {
		o := sink.Get(t, records.ObsEvasion, "trace tampered")
		t.Fatalf("clean trace seen as tampered: %q", o.Evasion.Paths)
	}
}

// TestTamperedQEMULog: under QEMU the log is the emulated process's own
// file, so its writing to one of its own descriptors (beyond 0-2) through
// /proc is tampering; reading one, or writing stdout so, is not.
func TestTamperedQEMULog(t *testing.T) {
	log := `300 openat(AT_FDCWD,"/proc/self/fd/1",O_WRONLY|O_APPEND) = 4
300 openat(AT_FDCWD,"/proc/self/fd/5",O_RDONLY) = 4
300 openat(AT_FDCWD,"/proc/self/fd/5",O_WRONLY|O_APPEND) = 4
300 openat(AT_FDCWD,"/proc/300/fd/6",O_RDWR) = 4
300 exit_group(0)
`
	sink, _ := parse(t, log, Options{Format: FormatQEMU, Tracer: &Tracer{PIDs: []int{298}, Dir: "/var/lib/0123456789abcdef", Ended: true}})
	o := sink.Get(t, records.ObsEvasion, "trace tampered")
	want := []string{"pid 300 openat /proc/self/fd/5 for writing (line 3)", "pid 300 openat /proc/300/fd/6 for writing (line 4)"}
	if !slices.Equal(o.Evasion.Paths, want) {
		t.Fatalf("seen %q", o.Evasion.Paths)
	}
}

// TestTruncatedTrace: a sample that truncates the trace under strace
// leaves a hole of NUL bytes where strace goes on writing at its own
// offset: lines that are no trace lines, so the trace was tampered with.
func TestTruncatedTrace(t *testing.T) {
	trace := `500 1795500000.000001 execve("/tmp/bot", ["/tmp/bot"], 0x7ffd4e0c7f30 /* 10 vars */) = 0 <0.000200>
` + strings.Repeat("\x00", 40) + `500 1795500000.000500 exit_group(0) = ?
500 1795500000.000600 +++ exited with 0 +++
`
	sink, _ := parse(t, trace, Options{Tracer: &Tracer{PIDs: []int{498, 499}, Ended: true}})
	o := sink.Get(t, records.ObsEvasion, "trace tampered")
	if len(o.Evasion.Paths) != 1 || !strings.HasPrefix(o.Evasion.Paths[0], "lines that are no trace lines: 1 (the first: line 2") {
		t.Fatalf("seen %q", o.Evasion.Paths)
	}
}

// TestThreadEndingInACallNotTampered: a Go program's exit_group ends a
// thread inside a call strace never finishes (its "+++ exited" comes
// next, with no "resumed" line). Seen in 3% of a Go program's runs under
// strace, and once in CI, where the beacon's clean run counted as
// tampered: the thread came back, after its exit, as a process no traced
// process started that never ended.
func TestThreadEndingInACallNotTampered(t *testing.T) {
	trace := `20138 1795876160.732342 execve("/tmp/stx/hello", ["/tmp/stx/hello"], 0x7ffca533c7a0 /* 35 vars */) = 0 <0.000175>
20138 1795876160.734039 clone(child_stack=0x143388242000, flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM|CLONE_SETTLS, tls=0x143388256090) = 20139 <0.000086>
20138 1795876160.741474 exit_group(0 <unfinished ...>
20139 1795876160.741517 nanosleep({tv_sec=0, tv_nsec=20000},  <unfinished ...>
20138 1795876160.741541 <... exit_group resumed>) = ?
20139 1795876160.741590 +++ exited with 0 +++
20138 1795876160.741843 +++ exited with 0 +++
`
	sink, _ := parse(t, trace, Options{Tracer: &Tracer{PIDs: []int{2, 3}, Dir: "/var/lib/0123456789abcdef", Ended: true}})
	if slices.Contains(values(sink, records.ObsEvasion), "trace tampered") {
		t.Fatalf("seen as tampered: %q", sink.Get(t, records.ObsEvasion, "trace tampered").Evasion.Paths)
	}
}

// crossedClones is a Go sample's trace under load, as strace 6.1 writes
// it: two clones are in flight at once, and each new task's first line
// comes before its creator's clone returns. 502 is a thread of 500 whose
// first line follows 501's fork (the latest clone in flight); 504 is the
// fork's child whose first line follows 500's next thread clone. Each
// task's own clone result says what it is: a thread, forgotten at its
// exit, or a process, which ends.
const crossedClones = `500 1795500000.000001 execve("/tmp/bot", ["/tmp/bot", "-behave-child"], 0x7ffd4e0c7f30 /* 10 vars */) = 0 <0.000200>
500 1795500000.000100 clone(child_stack=0xc000060000, flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_SYSVSEM|CLONE_THREAD|CLONE_SETTLS, tls=0xc000048098) = 501 <0.000100>
500 1795500000.000200 clone(child_stack=0xc000070000, flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_SYSVSEM|CLONE_THREAD|CLONE_SETTLS, tls=0xc000049098 <unfinished ...>
501 1795500000.000300 clone(child_stack=NULL, flags=CLONE_VM|CLONE_VFORK|SIGCHLD <unfinished ...>
502 1795500000.000400 futex(0xc000049148, FUTEX_WAIT_PRIVATE, 0, NULL) = 0 <0.000010>
500 1795500000.000500 <... clone resumed>) = 502 <0.000300>
500 1795500000.000600 clone(child_stack=0xc000080000, flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_SYSVSEM|CLONE_THREAD|CLONE_SETTLS, tls=0xc00004a098 <unfinished ...>
504 1795500000.000700 execve("/bin/sleep", ["sleep", "0"], 0xc000100000 /* 10 vars */) = 0 <0.000100>
501 1795500000.000800 <... clone resumed>) = 504 <0.000500>
500 1795500000.000900 <... clone resumed>) = 503 <0.000300>
503 1795500000.001000 futex(0xc00004a148, FUTEX_WAIT_PRIVATE, 0, NULL) = 0 <0.000010>
504 1795500000.001100 openat(AT_FDCWD, "/etc/ld.so.cache", O_RDONLY|O_CLOEXEC) = 3 <0.000010>
504 1795500000.001200 exit_group(0) = ?
504 1795500000.001300 +++ exited with 0 +++
502 1795500000.001400 exit(0) = ?
502 1795500000.001500 +++ exited with 0 +++
500 1795500000.001600 exit_group(0) = ?
503 1795500000.001700 +++ exited with 0 +++
501 1795500000.001800 +++ exited with 0 +++
500 1795500000.001900 +++ exited with 0 +++
`

// TestCrossedClonesNotTampered: tasks whose first lines came before their
// clones returned, under a clone of another kind, are what their clone
// results say (two processes, three threads), and every one ended: no
// "trace tampered" ("the tracer ended before these traced processes did")
// for a clean run whose tracer ended.
func TestCrossedClonesNotTampered(t *testing.T) {
	sink, _ := parse(t, crossedClones, Options{Tracer: &Tracer{PIDs: []int{498, 499}, Dir: "/var/lib/0123456789abcdef", Ended: true}})
	if slices.Contains(values(sink, records.ObsEvasion), "trace tampered") {
		o := sink.Get(t, records.ObsEvasion, "trace tampered")
		t.Errorf("clean trace seen as tampered: %q", o.Evasion.Paths)
	}
	ti := sink.Get(t, records.ObsTrace, "strace").Trace
	if ti.Processes != 2 || ti.Threads != 3 {
		t.Errorf("%d processes, %d threads; want 2 and 3", ti.Processes, ti.Threads)
	}
	if root := procOf(t, sink, 500); root.Exe != "/tmp/bot" || root.Exit == nil {
		t.Errorf("the sample: %+v", root)
	}
	child := procOf(t, sink, 504)
	if child.PPID != 500 || len(child.Execs) == 0 || child.Execs[len(child.Execs)-1].Path != "/bin/sleep" {
		t.Errorf("the fork's child: %+v", child)
	}
}

// reusedPID is a sample (500) whose first child (501) ends, and whose
// later child is given pid 501 again (a bot that forks without pause wraps
// the pids) and kills the tracer: strace never writes the second 501's end.
const reusedPID = `500 1795500000.000001 execve("/tmp/bot", ["/tmp/bot"], 0x7ffd4e0c7f30 /* 10 vars */) = 0 <0.000200>
500 1795500000.000100 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f0000000a10) = 501 <0.000100>
501 1795500000.000200 exit_group(0) = ?
501 1795500000.000300 +++ exited with 0 +++
500 1795500000.000400 wait4(-1, NULL, 0, NULL) = 501 <0.000100>
500 1795500000.000500 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f0000000a10) = 501 <0.000100>
501 1795500000.000600 execve("/bin/sleep", ["sleep", "9"], 0x7ffd4e0c8000 /* 10 vars */) = 0 <0.000100>
500 1795500000.000700 exit_group(0) = ?
500 1795500000.000800 +++ exited with 0 +++
`

// TestReusedPIDStillEnds: a process given the pid of one that ended is a
// process of its own, which must end too, whether its first line comes
// after its clone returned or before.
func TestReusedPIDStillEnds(t *testing.T) {
	// The second child's first line before its clone returns.
	linesFirst := strings.Replace(reusedPID, "child_tidptr=0x7f0000000a10) = 501 <0.000100>\n501 1795500000.000600 ",
		"child_tidptr=0x7f0000000a10 <unfinished ...>\n501 1795500000.000600 ", 1)
	linesFirst = strings.Replace(linesFirst, "500 1795500000.000700 ", "500 1795500000.000650 <... clone resumed>) = 501 <0.000100>\n500 1795500000.000700 ", 1)
	if strings.Count(linesFirst, "resumed") != 1 || strings.Count(linesFirst, "unfinished") != 1 {
		t.Fatal("the variant is not as meant")
	}
	for name, trace := range map[string]string{"clone first": reusedPID, "lines first": linesFirst} {
		t.Run(name, func(t *testing.T) {
			sink, _ := parse(t, trace, Options{Tracer: &Tracer{PIDs: []int{498, 499}, Dir: "/var/lib/0123456789abcdef", Ended: true}})
			o := sink.Get(t, records.ObsEvasion, "trace tampered")
			if want := []string{"the tracer ended before these traced processes did: 501"}; !slices.Equal(o.Evasion.Paths, want) {
				t.Fatalf("seen %q, want %q", o.Evasion.Paths, want)
			}
			if ti := sink.Get(t, records.ObsTrace, "strace").Trace; ti.Processes != 3 {
				t.Errorf("%d processes, want 3", ti.Processes)
			}
			// The exec is the second 501's, not the first's.
			ended := findProc(t, sink, func(p *records.ProcessInfo) bool { return p.PID == 501 && p.Exit != nil })
			live := findProc(t, sink, func(p *records.ProcessInfo) bool { return p.PID == 501 && p.Exit == nil })
			if len(ended.Execs) != 0 || len(live.Execs) != 1 || live.Execs[0].Path != "/bin/sleep" {
				t.Errorf("the ended 501 exec'd %+v, the live one %+v", ended.Execs, live.Execs)
			}
		})
	}
}

// childEndedFirst is a Go sample's pidfd probe as strace 6.1 wrote it in a
// real guest (TestBehaviourEndToEnd, amd64): a vfork'd child that exits at
// once ends before its parent's clone returns.
const childEndedFirst = `147   1796123306.711923 execve("/tmp/bot", ["/tmp/bot", "-behave"], 0x7ffd4e0c7f30 /* 7 vars */) = 0 <0.001000>
147   1796123307.000100 clone(child_stack=0xc000060000, flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_SYSVSEM|CLONE_THREAD|CLONE_SETTLS, tls=0xc000048098) = 152 <0.000100>
152   1796123307.410292 clone(child_stack=NULL, flags=CLONE_VM|CLONE_PIDFD|CLONE_VFORK <unfinished ...>
154   1796123307.414403 exit_group(0)   = ?
154   1796123307.416913 +++ exited with 0 +++
152   1796123307.417750 <... clone resumed>, parent_tid=[9]) = 154 <0.007000>
152   1796123321.553725 +++ exited with 0 +++
147   1796123321.594614 +++ exited with 0 +++
`

// TestChildEndedBeforeItsCloneReturned: the clone's late result names the
// child that ended, not a new process with its pid (which, never ending,
// made a clean run "trace tampered").
func TestChildEndedBeforeItsCloneReturned(t *testing.T) {
	sink, _ := parse(t, childEndedFirst, Options{Tracer: &Tracer{PIDs: []int{145, 146}, Dir: "/var/lib/0123456789abcdef", Ended: true}})
	if slices.Contains(values(sink, records.ObsEvasion), "trace tampered") {
		o := sink.Get(t, records.ObsEvasion, "trace tampered")
		t.Errorf("clean trace seen as tampered: %q", o.Evasion.Paths)
	}
	if ti := sink.Get(t, records.ObsTrace, "strace").Trace; ti.Processes != 2 {
		t.Errorf("%d processes, want 2", ti.Processes)
	}
	if child := procOf(t, sink, 154); child.PPID != 147 || child.Exit == nil {
		t.Errorf("the child: %+v", child)
	}
}

// TestLinesAfterAnEndWithNoCloneAreNoNewProcess: lines of an ended pid
// while no clone is in flight are not a new task (a pid is used again only
// by a task being created): they stay the ended process's, as before pids
// could be used again, rather than make a process no traced one started.
func TestLinesAfterAnEndWithNoCloneAreNoNewProcess(t *testing.T) {
	trace := strings.Replace(reusedPID, "500 1795500000.000400 wait4(", "501 1795500000.000350 rt_sigreturn({mask=[]}) = 0 <0.000010>\n500 1795500000.000400 wait4(", 1)
	trace = trace[:strings.Index(trace, "500 1795500000.000500 clone(")] + "500 1795500000.000700 exit_group(0) = ?\n500 1795500000.000800 +++ exited with 0 +++\n"
	sink, _ := parse(t, trace, Options{Tracer: &Tracer{PIDs: []int{498, 499}, Dir: "/var/lib/0123456789abcdef", Ended: true}})
	if slices.Contains(values(sink, records.ObsEvasion), "trace tampered") {
		o := sink.Get(t, records.ObsEvasion, "trace tampered")
		t.Errorf("seen as tampered: %q", o.Evasion.Paths)
	}
	if ti := sink.Get(t, records.ObsTrace, "strace").Trace; ti.Processes != 2 {
		t.Errorf("%d processes, want 2", ti.Processes)
	}
}
