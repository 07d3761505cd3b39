package behave

import (
	"cmp"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// proc is one process (thread group) of the trace.
type proc struct {
	pid, ppid   int
	exe         string
	execs       []records.ProcExec
	failedExecs int64
	names       []string
	uid         int64 // -1: unknown
	start, last time.Time
	exit        *records.ProcExit
	// guessed: made of its own lines before its creator's clone returned
	// (or with no creator seen); its clone's result, when it comes, is
	// its own even after its end (a child that exits at once ends before
	// its parent's clone returns).
	guessed  bool
	exitCode *int64 // exit_group's argument, until the exit line
	threads  int64
	line     int64
	cwd      string
	fds      *fdTable
	kept     bool // has an observable of its own
	// Under Options.Emulator (emulator.go): emuExec, the process has just
	// executed a program, which its next call shows to be emulated or
	// not; emulated, it runs under the emulator; emuNext, what the
	// emulator has still to do before the program's first call.
	emuExec  bool
	emulated bool
	emuNext  []emuCall
}

// fdTable is a process's open files and sockets, as far as the trace
// shows them (threads share one).
type fdTable struct{ m map[int]*fdInfo }

type fdInfo struct {
	path   string
	sock   bool
	family string // inet, inet6, unix
	proto  string // tcp, udp, raw, sctp
	bound  *sockAddr
	listen *ncKey // the listener's netcall
}

// pending is a call whose result is on a later line (strace's
// "<unfinished ...>" and "<... resumed>").
type pending struct {
	name string
	body string
	ts   time.Time
	line int64
}

// trace is the state of one trace being read.
type trace struct {
	format  string
	qemu    bool
	origin  observe.Origin
	opts    Options
	res     *Result
	procs   map[int]*proc
	tids    map[int]int // thread id -> thread group
	root    *proc
	nprocs  int64
	kept    []*proc
	pending map[int]*pending
	// unresolved is the last QEMU clone whose child pid the log lost.
	unresolved *proc
	qlex       qemuLexer
	emuThreads map[int]bool // the threads the emulator starts for itself
	first      time.Time
	lastTS     time.Time
	fdCount    int
	calls      map[string]int64
	exes       map[string]bool // paths traced processes were executed from
	paths      map[string]*pathStat
	pathOrder  []string
	dests      map[ncKey]*ncStat
	destOrder  []ncKey
	groups     map[ncKey]*ncGroup
	groupOrder []ncKey
	techs      map[string]*techStat
	techOrder  []string
	procScan   procScan
	sleepMax   float64
	sleepTotal float64
	omitted    struct{ procs, paths, netcalls int64 }
}

func newTrace(format string, origin observe.Origin, opts Options) *trace {
	return &trace{format: format, qemu: format == FormatQEMU, origin: origin, opts: opts, res: &Result{Format: format},
		procs: map[int]*proc{}, tids: map[int]int{}, emuThreads: map[int]bool{}, pending: map[int]*pending{}, calls: map[string]int64{},
		exes: map[string]bool{}, paths: map[string]*pathStat{}, dests: map[ncKey]*ncStat{}, groups: map[ncKey]*ncGroup{},
		techs: map[string]*techStat{}, procScan: procScan{pids: map[int]bool{}}}
}

// line reads one line; complete is false for a last line without its end.
func (t *trace) line(b []byte, n int64, complete bool) {
	if t.qemu {
		garbled := t.qlex.line(b, func(l line) {
			t.event(l, t.opts.Start, n)
		})
		if !complete && (garbled || t.qlex.partial != "") {
			t.res.Trace.Truncated, t.qlex.partial = true, ""
		} else if garbled {
			t.res.Trace.Garbled++
		}
		return
	}
	l := lexStrace(b)
	ts := l.ts
	if ts.IsZero() {
		ts = t.opts.Start
	}
	switch l.kind {
	case lineBad:
		if !complete {
			t.res.Trace.Truncated = true
			return
		}
		t.res.Stats.AddBad(n, errBadLine)
	case lineUnfinished:
		t.pending[l.pid] = &pending{name: l.name, body: l.body, ts: ts, line: n}
		t.touch(l.pid, ts, n)
	case lineResumed:
		p := t.pending[l.pid]
		if p == nil || p.name != l.name {
			t.res.Stats.AddBad(n, errResumed)
			return
		}
		delete(t.pending, l.pid)
		t.event(line{kind: lineCall, pid: l.pid, ts: p.ts, name: p.name, body: p.body + l.body}, p.ts, p.line)
		t.touch(l.pid, ts, n)
	case lineCall:
		if !complete && !parseCall(l.body, false).ok {
			// A call cut short: what it says so far, as if it never returned.
			t.res.Trace.Truncated = true
			t.pending[l.pid] = &pending{name: l.name, body: l.body, ts: ts, line: n}
			return
		}
		t.event(l, ts, n)
	default:
		t.event(l, ts, n)
	}
}

// touch notes a process's activity at ts.
func (t *trace) touch(pid int, ts time.Time, n int64) {
	p := t.proc(pid, ts, n)
	t.seen(p, ts)
}

func (t *trace) seen(p *proc, ts time.Time) {
	if ts.IsZero() {
		return
	}
	if t.first.IsZero() || ts.Before(t.first) {
		t.first = ts
	}
	if ts.After(t.lastTS) {
		t.lastTS = ts
	}
	if ts.After(p.last) {
		p.last = ts
	}
}

// event handles one call or exit.
func (t *trace) event(l line, ts time.Time, n int64) {
	p := t.proc(l.pid, ts, n)
	t.seen(p, ts)
	switch l.kind {
	case lineExited, lineKilled:
		t.exited(l, p, ts)
		return
	case lineCall:
	default:
		return
	}
	c := parseCall(l.body, t.qemu)
	if !c.ok {
		t.res.Stats.AddBad(n, errBadLine)
		return
	}
	name := strings.TrimSuffix(l.name, "32") // getuid32 and others on 32-bit ABIs
	if strings.HasPrefix(c.errno, "ERESTART") && !strings.Contains(name, "sleep") {
		return // interrupted by a signal: the call is made again on a line of its own
	}
	e := &ev{t: t, p: p, pid: l.pid, name: name, c: &c, ts: ts, line: n}
	if t.opts.Emulator != "" && e.emulatorCall() {
		return
	}
	if len(t.calls) < 512 || t.calls[name] > 0 {
		t.calls[name]++
	}
	if c.ret == "?" && c.errno == "" && !t.qemu && name != "exit" && name != "exit_group" && !strings.HasPrefix(name, "execve") {
		t.res.Trace.Unfinished++ // exits and execs that succeed print "= ?" too
	}
	e.dispatch()
}

// ev is one call being handled.
type ev struct {
	t    *trace
	p    *proc
	pid  int
	name string
	c    *call
	ts   time.Time
	line int64
}

func (e *ev) arg(i int) string {
	if i < len(e.c.args) {
		return e.c.args[i]
	}
	return ""
}

func (e *ev) str(i int) string {
	v, _ := unquote(e.arg(i), e.t.qemu)
	return v
}

// proc is the process of a pid, created when new: the traced root, a
// child whose creating call has not returned yet (its parent's clone is
// unfinished), or a process whose parent the trace did not show.
func (t *trace) proc(pid int, ts time.Time, n int64) *proc {
	if tg, ok := t.tids[pid]; ok {
		if p := t.procs[tg]; p != nil {
			return p
		}
	}
	if p := t.procs[pid]; p != nil {
		if p.exit == nil || !t.cloneInFlight(pid) {
			return p
		}
		// The pid is used again by a task being created: the process
		// that had it ended (strace writes nothing of a process after
		// its end).
		delete(t.procs, pid)
	}
	if t.root == nil {
		p := t.newProc(pid, 0, ts, n)
		p.exe, p.cwd, p.uid = t.opts.Exe, t.opts.Cwd, -1
		if t.opts.UID != nil {
			p.uid = *t.opts.UID
		}
		if p.exe != "" {
			t.exes[p.exe] = true
		}
		t.root = p
		t.res.Trace.Root = int64(pid)
		return p
	}
	if parent, thread, files := t.cloning(pid); parent != nil {
		if thread {
			if parent.awaitsThread() {
				t.emulatorThread(parent, pid)
			} else {
				t.tids[pid] = parent.pid
				parent.threads++
				t.res.Trace.Threads++
			}
			return parent
		}
		c := t.child(parent, pid, files, ts, n)
		c.guessed = true
		return c
	}
	p := t.newProc(pid, 0, ts, n)
	p.uid, p.guessed = -1, true
	return p
}

// cloneInFlight reports whether a task other than pid is in a clone that
// has not returned.
func (t *trace) cloneInFlight(pid int) bool {
	for cpid, pc := range t.pending {
		if cpid != pid && isClone(pc.name) {
			return true
		}
	}
	return false
}

// cloning finds the process whose clone is creating pid: the latest
// unfinished clone (strace), or the QEMU clone whose result was lost.
// While a clone that makes a process is in flight, the latest of those is
// taken even if a thread's clone came later: when two are in flight (a Go
// sample's runtime starting a thread as it forks) the first lines do not
// say which task is which, and a process taken wrongly is dropped when the
// clone returns (unguess), while a process taken for a thread would have
// run its calls, its execve and its closes among its parent's.
func (t *trace) cloning(pid int) (parent *proc, thread, files bool) {
	var best, forking *pending
	bestPID, forkingPID := 0, 0
	for cpid, pc := range t.pending {
		if cpid == pid || !isClone(pc.name) {
			continue
		}
		if best == nil || pc.line > best.line {
			best, bestPID = pc, cpid
		}
		if !strings.Contains(cloneFlags(pc.name, pc.body), "CLONE_THREAD") && (forking == nil || pc.line > forking.line) {
			forking, forkingPID = pc, cpid
		}
	}
	if forking != nil {
		best, bestPID = forking, forkingPID
	}
	if best != nil {
		flags := cloneFlags(best.name, best.body)
		return t.proc(bestPID, best.ts, best.line), strings.Contains(flags, "CLONE_THREAD"), strings.Contains(flags, "CLONE_FILES")
	}
	if p := t.unresolved; p != nil {
		t.unresolved = nil
		return p, false, false
	}
	return nil, false, false
}

func isClone(name string) bool {
	switch name {
	case "clone", "clone2", "clone3", "fork", "vfork":
		return true
	}
	return false
}

// cloneFlags is the flags argument's text of a clone call.
func cloneFlags(name, body string) string {
	switch name {
	case "fork", "vfork":
		return ""
	}
	if i := strings.Index(body, "flags="); i >= 0 {
		v := body[i+len("flags="):]
		if j := strings.IndexAny(v, ",}"); j >= 0 {
			v = v[:j]
		}
		return v
	}
	// QEMU: the flags come first.
	v, _, _ := strings.Cut(body, ",")
	return v
}

func (t *trace) newProc(pid, ppid int, ts time.Time, n int64) *proc {
	p := &proc{pid: pid, ppid: ppid, start: ts, last: ts, line: n, fds: &fdTable{m: map[int]*fdInfo{}}}
	t.procs[pid] = p
	t.nprocs++
	if len(t.kept) < MaxProcesses {
		p.kept = true
		t.kept = append(t.kept, p)
	} else {
		t.omitted.procs++
	}
	return p
}

// child creates (or completes) a forked process: it inherits its parent's
// executable, directory, user and open files.
func (t *trace) child(parent *proc, pid int, shareFiles bool, ts time.Time, n int64) *proc {
	c := t.procs[pid]
	switch {
	case c == t.root && c != nil, c != nil && c.ppid == parent.pid:
		return c
	case c != nil:
		// Its lines came first, and no (or another) parent was guessed:
		// the call's result says whose child it is.
		c.ppid = parent.pid
		c.exe = cmp.Or(c.exe, parent.exe)
		c.cwd = cmp.Or(c.cwd, parent.cwd)
		if c.uid < 0 {
			c.uid = parent.uid
		}
		return c
	}
	c = t.newProc(pid, parent.pid, ts, n)
	c.exe, c.cwd, c.uid = parent.exe, parent.cwd, parent.uid
	if parent.emulated {
		c.emulated, c.emuNext = true, qemuFork
	}
	if shareFiles {
		c.fds = parent.fds
	} else {
		for fd, f := range parent.fds.m {
			if t.fdCount >= maxFDs {
				break
			}
			g := *f
			c.fds.m[fd] = &g
			t.fdCount++
		}
	}
	return c
}

// exited records a process's end (strace's "+++ exited with" and "+++
// killed by" lines); a thread's is only forgotten.
func (t *trace) exited(l line, p *proc, ts time.Time) {
	// A call the exit cut short never returns; strace need not say so.
	// Taken now, while the pid is still known as what it was (a thread
	// whose pid was forgotten would come back as a stranger).
	t.unreturned(l.pid)
	if _, ok := t.tids[l.pid]; ok {
		delete(t.tids, l.pid)
		return
	}
	x := &records.ProcExit{At: ts.UTC(), Code: int64(l.code)}
	if l.kind == lineKilled {
		x.Signal, x.Core, x.Code = l.sig, l.core, 0
	}
	p.exit = x
	t.closeAll(p)
	if !p.kept {
		delete(t.procs, p.pid)
	}
}

// closeAll forgets a process's files (unless other processes share them).
func (t *trace) closeAll(p *proc) {
	for _, q := range t.procs {
		if q != p && q.fds == p.fds && q.exit == nil {
			return
		}
	}
	t.fdCount -= len(p.fds.m)
	p.fds.m = map[int]*fdInfo{}
}

// ours reports whether pid is a process or thread of the trace.
func (t *trace) ours(pid int) bool {
	if _, ok := t.tids[pid]; ok {
		return true
	}
	_, ok := t.procs[pid]
	return ok
}

// resolve makes a path absolute against a directory file descriptor
// argument (AT_FDCWD, QEMU's -100, a number, strace -y's "3</dir>") or the
// process's directory; it stays relative when that is unknown.
func (e *ev) resolve(dirfd, p string) string {
	if p == "" {
		return ""
	}
	if strings.HasPrefix(p, "/") {
		return path.Clean(p)
	}
	base := e.p.cwd
	if cwd, ok := strings.CutPrefix(dirfd, "AT_FDCWD<"); ok && strings.HasPrefix(cwd, "/") {
		base = strings.TrimSuffix(cwd, ">") // strace -y
	} else if dirfd != "" && dirfd != "AT_FDCWD" && dirfd != "-100" {
		base = ""
		if fd, annot, ok := fdArg(dirfd); ok {
			if annot != "" {
				base = annot
			} else if f := e.p.fds.m[fd]; f != nil && !f.sock {
				base = f.path
			}
		}
	}
	if base == "" {
		return path.Clean(p)
	}
	return path.Join(base, p)
}

// fdArg reads a file descriptor argument, with strace -y's path.
func fdArg(s string) (fd int, annot string, ok bool) {
	num, rest, _ := strings.Cut(s, "<")
	fd, err := strconv.Atoi(strings.TrimSpace(num))
	if err != nil {
		return 0, "", false
	}
	if rest != "" && strings.HasSuffix(rest, ">") && strings.HasPrefix(rest, "/") {
		annot = strings.TrimSuffix(rest, ">")
		annot = strings.TrimSuffix(annot, " (deleted)")
	}
	return fd, annot, true
}

// setFD records what a new file descriptor is.
func (e *ev) setFD(fd int, f *fdInfo) {
	t := e.t
	if _, ok := e.p.fds.m[fd]; !ok {
		if t.fdCount >= maxFDs {
			return
		}
		t.fdCount++
	}
	e.p.fds.m[fd] = f
}

func (e *ev) fd(i int) *fdInfo {
	fd, annot, ok := fdArg(e.arg(i))
	if !ok {
		return nil
	}
	if f := e.p.fds.m[fd]; f != nil {
		return f
	}
	if annot != "" {
		return &fdInfo{path: annot}
	}
	return nil
}

// id is the process's pid as observables list it.
func (p *proc) id() string { return strconv.Itoa(p.pid) }

// dispatch handles the calls the observables are made of.
func (e *ev) dispatch() {
	if e.t.opts.Tracer != nil {
		e.tamper()
	}
	switch e.name {
	case "execve", "execveat":
		e.execve()
	case "clone", "clone2", "clone3", "fork", "vfork":
		e.clone()
	case "exit", "exit_group":
		e.exit()
	case "kill", "tkill", "tgkill":
		e.kill()
	case "prctl":
		e.prctl()
	case "ptrace":
		e.ptrace()
	case "open", "openat", "openat2", "creat":
		e.open()
	case "unlink", "unlinkat":
		e.unlink()
	case "rename", "renameat", "renameat2":
		e.rename()
	case "link", "linkat", "symlink", "symlinkat":
		e.link()
	case "chmod", "fchmod", "fchmodat", "fchmodat2":
		e.chmod()
	case "mkdir", "mkdirat":
		e.mkdir()
	case "chdir", "fchdir":
		e.chdir()
	case "readlink", "readlinkat":
		e.readlink()
	case "socket":
		e.socket()
	case "connect", "bind", "sendto", "sendmsg":
		e.netcall()
	case "listen":
		e.listen()
	case "accept", "accept4":
		e.accept()
	case "nanosleep", "clock_nanosleep", "clock_nanosleep_time64":
		e.sleep()
	case "getuid", "geteuid":
		e.getuid()
	case "setuid", "setreuid", "setresuid":
		e.setuid()
	case "io_uring_setup":
		e.ioUring()
	case "settimeofday", "clock_settime", "clock_settime64", "stime", "adjtimex", "clock_adjtime", "clock_adjtime64":
		e.setClock()
	}
}

func (e *ev) execve() {
	pathArg, argvArg := 0, 1
	if e.name == "execveat" {
		pathArg, argvArg = 1, 2
	}
	p := e.str(pathArg)
	if e.name == "execveat" {
		if p == "" { // AT_EMPTY_PATH: the file descriptor itself
			if f := e.fd(0); f != nil {
				p = f.path
			}
		} else {
			p = e.resolve(e.arg(0), p)
		}
	} else {
		p = e.resolve("", p)
	}
	// strace: "= 0"; QEMU prints no result for an exec that succeeded.
	ok := e.c.ret == "0" || e.t.qemu && !e.c.failed()
	if !ok {
		if e.c.failed() {
			e.p.failedExecs++
			e.t.res.Trace.FailedExecs++
		}
		return
	}
	argv := parseList(e.arg(argvArg), e.t.qemu)
	pr := e.p
	pr.exe = p
	pr.emuExec, pr.emulated, pr.emuNext = e.t.opts.Emulator != "", false, nil
	if len(e.t.exes) < MaxPaths {
		e.t.exes[p] = true
	}
	e.t.res.Trace.Execs++
	if pr.kept && len(pr.execs) < observe.MaxExecs {
		pr.execs = append(pr.execs, records.ProcExec{Path: p, Argv: argv, At: e.ts.UTC()})
	}
	if len(argv) > 0 && argv[0] != "" && path.Base(argv[0]) != path.Base(p) {
		pr.addName(argv[0])
	}
	if isFirewallTool(path.Base(p)) {
		e.t.tech(records.ObsPersistence, "firewall", "firewall "+p, e.ts, e.line, pr).add(strings.Join(argv, " "), "", pr)
	}
}

func (p *proc) addName(n string) {
	if p.kept && len(p.names) < observe.MaxList && !slices.Contains(p.names, n) {
		p.names = append(p.names, n)
	}
}

// parseList reads an argument vector: strace's ["a", "b"] (with "..."
// when cut), QEMU's {"a","b",NULL}.
func parseList(s string, qemu bool) []string {
	s = strings.TrimSpace(s)
	if len(s) < 2 || (s[0] != '[' && s[0] != '{') {
		return nil
	}
	var out []string
	for _, a := range splitArgs(s[1:len(s)-1], qemu) {
		if len(out) >= maxArgv {
			break
		}
		v, ok := unquote(a, qemu)
		if !ok {
			continue // NULL, "...", a pointer
		}
		if len(v) > maxArgLen {
			v = v[:maxArgLen]
		}
		out = append(out, v)
	}
	return out
}

func (e *ev) clone() {
	flags := cloneFlags(e.name, strings.Join(e.c.args, ", "))
	pid, ok := e.c.retInt()
	if !ok || pid <= 0 {
		if e.t.qemu && !e.c.failed() && !strings.Contains(flags, "CLONE_THREAD") {
			// The child's " = 0" took the place of the parent's result: the
			// next new pid is the child.
			e.t.unresolved = e.p
		}
		return
	}
	t := e.t
	if strings.Contains(flags, "CLONE_THREAD") {
		if c := t.procs[pid]; c != nil && c != e.p {
			// Its lines came before the call returned: it was taken for a
			// process.
			t.unguess(c)
		}
		if _, ok := t.tids[pid]; !ok {
			t.tids[pid] = e.p.pid
			e.p.threads++
			t.res.Trace.Threads++
		}
		return
	}
	if c := t.procs[pid]; c != nil && c.exit != nil && !c.guessed {
		delete(t.procs, pid) // an ended process's pid, used again
	}
	t.child(e.p, pid, strings.Contains(flags, "CLONE_FILES"), e.ts, e.line).guessed = false
}

// unguess drops c, a process made of a task's lines that came before its
// creator's clone returned, once the clone says the task is a thread.
// A process of that pid which ended (a pid used again) or the trace's
// root is no guess, and stays.
func (t *trace) unguess(c *proc) {
	if c == t.root || c.exit != nil {
		return
	}
	delete(t.procs, c.pid)
	t.nprocs--
	if !c.kept {
		t.omitted.procs--
		return
	}
	c.kept = false
	t.kept = slices.DeleteFunc(t.kept, func(q *proc) bool { return q == c })
}

func (e *ev) exit() {
	code, err := strconv.ParseInt(strings.TrimSpace(e.arg(0)), 0, 64)
	if err != nil {
		return
	}
	if e.name == "exit" {
		if _, thread := e.t.tids[e.pid]; thread {
			return
		}
	}
	e.p.exitCode = &code // the exit line's, or the only one (QEMU logs none)
}

func (e *ev) kill() {
	target, sigArg := e.arg(0), 1
	if e.name == "tgkill" {
		sigArg = 2
	}
	sig := e.arg(sigArg)
	if sig == "0" || sig == "" {
		return // probing a pid, not signalling it
	}
	pid, err := strconv.Atoi(strings.TrimSpace(target))
	if err != nil {
		return
	}
	switch {
	case pid == 0:
		return // its own process group
	case pid == -1:
	case pid < -1 && e.t.ours(-pid), pid > 0 && e.t.ours(pid):
		return
	}
	tg := target + " " + sig
	e.t.tech(records.ObsPersistence, "kill", "kill", e.ts, e.line, e.p).add("", withErr(tg, e.c), e.p)
}

// withErr adds a failed call's error to what it names.
func withErr(s string, c *call) string {
	if c.failed() {
		return s + " (" + c.result() + ")"
	}
	return s
}

func (e *ev) prctl() {
	switch e.arg(0) {
	case "PR_SET_NAME", "15":
	default:
		return
	}
	if !e.c.succeeded() && !e.t.qemu {
		return
	}
	name, ok := unquote(e.arg(1), e.t.qemu)
	if !ok {
		name = "?" // QEMU does not print the name
	}
	e.p.addName(name)
}

func (e *ev) ptrace() {
	var req string
	switch e.arg(0) {
	case "PTRACE_TRACEME", "0":
		e.t.tech(records.ObsEvasion, "ptrace", "ptrace", e.ts, e.line, e.p).add("", withErr("PTRACE_TRACEME", e.c), e.p)
		return
	case "PTRACE_ATTACH", "16", "0x10":
		req = "PTRACE_ATTACH"
	case "PTRACE_SEIZE", "16902", "0x4206":
		req = "PTRACE_SEIZE"
	default:
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(e.arg(1)))
	if err != nil {
		return
	}
	target := withErr(req+" "+strconv.Itoa(pid), e.c)
	if e.t.ours(pid) {
		e.t.tech(records.ObsEvasion, "ptrace", "ptrace", e.ts, e.line, e.p).add("", target, e.p)
	} else {
		e.t.tech(records.ObsPersistence, "inject", "inject", e.ts, e.line, e.p).add("", target, e.p)
	}
}

// writeFlags reads open flags: opened for writing, O_CREAT, O_TMPFILE.
func writeFlags(flags string) (write, create, tmpfile bool) {
	for _, f := range strings.Split(flags, "|") {
		switch strings.TrimSpace(f) {
		case "O_WRONLY", "O_RDWR", "O_TRUNC":
			write = true
		case "O_CREAT":
			write, create = true, true
		case "O_TMPFILE":
			tmpfile = true
		}
	}
	return write, create, tmpfile
}

func (e *ev) open() {
	var p, flags string
	switch e.name {
	case "open":
		p, flags = e.resolve("", e.str(0)), e.arg(1)
	case "creat":
		p, flags = e.resolve("", e.str(0)), "O_WRONLY|O_CREAT|O_TRUNC"
	case "openat2":
		p, flags = e.resolve(e.arg(0), e.str(1)), field(e.arg(2), "flags=")
	default:
		p, flags = e.resolve(e.arg(0), e.str(1)), e.arg(2)
	}
	if p == "" {
		return
	}
	write, create, tmpfile := writeFlags(flags)
	if tmpfile {
		return // an unnamed file in a directory
	}
	t := e.t
	t.classifyOpen(e, p, write)
	fd, ok := e.c.retInt()
	if !ok || !e.c.succeeded() {
		return
	}
	e.setFD(fd, &fdInfo{path: p})
	if !write {
		return
	}
	if ps := t.path(p, e.ts, e.line, e.p); ps != nil {
		if create {
			ps.op("create")
		}
		ps.op("write")
		ps.wrote(e)
	}
}

// classifyOpen notes the persistence and evasion an open may be.
func (t *trace) classifyOpen(e *ev, p string, write bool) {
	if isWatchdog(p) {
		t.tech(records.ObsPersistence, "watchdog", "watchdog "+p, e.ts, e.line, e.p).add(withErr(p, e.c), "", e.p)
	}
	if write {
		t.persist(e, p)
		if cgroupMove(p) {
			t.tech(records.ObsEvasion, "cgroup", "cgroup", e.ts, e.line, e.p).add(withErr(p, e.c), "", e.p)
		}
	}
	if tech := evasionRead(p, t.ours); tech != "" {
		t.tech(records.ObsEvasion, tech, tech, e.ts, e.line, e.p).add(withErr(p, e.c), "", e.p)
	}
	if pid, ok := procPID(p); ok && !t.ours(pid) {
		t.procScan.add(pid, p, e)
	}
}

// persist notes a write to a persistence location.
func (t *trace) persist(e *ev, p string) {
	if kind := persistenceKind(p); kind != "" {
		t.tech(records.ObsPersistence, kind, kind+" "+p, e.ts, e.line, e.p).add(withErr(p, e.c), "", e.p)
	}
}

func (e *ev) unlink() {
	var p string
	if e.name == "unlinkat" {
		p = e.resolve(e.arg(0), e.str(1))
	} else {
		p = e.resolve("", e.str(0))
	}
	if p == "" || !e.c.succeeded() {
		return
	}
	t := e.t
	self := t.exes[p]
	if self {
		t.tech(records.ObsEvasion, "self-delete", "self-delete", e.ts, e.line, e.p).add(p, "", e.p)
	}
	if ps := t.path(p, e.ts, e.line, e.p); ps != nil {
		ps.op("delete")
		ps.present = false
		ps.selfDelete = ps.selfDelete || self
	}
}

func (e *ev) rename() {
	var from, to string
	if e.name == "rename" {
		from, to = e.resolve("", e.str(0)), e.resolve("", e.str(1))
	} else {
		from, to = e.resolve(e.arg(0), e.str(1)), e.resolve(e.arg(2), e.str(3))
	}
	if from == "" || to == "" {
		return
	}
	t := e.t
	t.persist(e, to)
	if !e.c.succeeded() {
		return
	}
	if ps := t.path(from, e.ts, e.line, e.p); ps != nil {
		ps.op("rename-from")
		ps.present = false
		ps.renamedTo = addBounded(ps.renamedTo, to)
	}
	if ps := t.path(to, e.ts, e.line, e.p); ps != nil {
		ps.op("rename-to")
		ps.renamedFrom = addBounded(ps.renamedFrom, from)
		ps.wrote(e)
	}
}

func (e *ev) link() {
	var to string
	switch e.name {
	case "link", "symlink":
		to = e.resolve("", e.str(1))
	case "symlinkat":
		to = e.resolve(e.arg(1), e.str(2))
	default: // linkat
		to = e.resolve(e.arg(2), e.str(3))
	}
	if to == "" {
		return
	}
	e.t.persist(e, to)
	if !e.c.succeeded() {
		return
	}
	if ps := e.t.path(to, e.ts, e.line, e.p); ps != nil {
		ps.op("link")
		ps.present = true
	}
}

func (e *ev) chmod() {
	var p, mode string
	switch e.name {
	case "chmod":
		p, mode = e.resolve("", e.str(0)), e.arg(1)
	case "fchmod":
		if f := e.fd(0); f != nil && !f.sock {
			p = f.path
		}
		mode = e.arg(1)
	default:
		p, mode = e.resolve(e.arg(0), e.str(1)), e.arg(2)
	}
	if p == "" || !e.c.succeeded() {
		return
	}
	m, err := strconv.ParseUint(strings.TrimPrefix(mode, "0o"), 8, 32)
	if err != nil {
		return
	}
	if ps := e.t.path(p, e.ts, e.line, e.p); ps != nil {
		if m&0o111 != 0 {
			ps.op("chmod+x")
		} else {
			ps.op("chmod")
		}
		ps.mode = "0" + strconv.FormatUint(m, 8)
	}
}

func (e *ev) mkdir() {
	var p string
	if e.name == "mkdirat" {
		p = e.resolve(e.arg(0), e.str(1))
	} else {
		p = e.resolve("", e.str(0))
	}
	if p == "" || !e.c.succeeded() {
		return
	}
	if ps := e.t.path(p, e.ts, e.line, e.p); ps != nil {
		ps.op("mkdir")
		ps.dir, ps.present = true, true
	}
}

func (e *ev) chdir() {
	if !e.c.succeeded() {
		return
	}
	if e.name == "chdir" {
		e.p.cwd = e.resolve("", e.str(0))
	} else if f := e.fd(0); f != nil && !f.sock {
		e.p.cwd = f.path
	}
}

func (e *ev) readlink() {
	var p string
	if e.name == "readlinkat" {
		p = e.resolve(e.arg(0), e.str(1))
	} else {
		p = e.resolve("", e.str(0))
	}
	if pid, ok := procPID(p); ok && !e.t.ours(pid) {
		e.t.procScan.add(pid, p, e)
	}
}

func (e *ev) getuid() {
	if v, err := strconv.ParseInt(e.c.ret, 10, 64); err == nil && v >= 0 && !e.c.failed() {
		if e.name == "getuid" || e.p.uid < 0 {
			e.p.uid = v
		}
	}
}

func (e *ev) setuid() {
	if !e.c.succeeded() {
		return
	}
	if v, err := strconv.ParseInt(strings.TrimSpace(e.arg(0)), 10, 64); err == nil && v >= 0 {
		e.p.uid = v
	}
}

func (e *ev) ioUring() {
	e.t.tech(records.ObsEvasion, "io-uring", "io-uring", e.ts, e.line, e.p).add("", withErr("io_uring_setup", e.c), e.p)
}

// setClock notes a try to set a clock (evasion "clock"): a time bomb
// brought forward or a date check dodged, and, for the host, a guest
// timeline the sample wrote (tb-run sets the guest's clock to the host's
// before each cycle, and records what it found). A read (adjtimex or
// clock_adjtime without modes, settimeofday of the time zone alone) is
// none. The target is the call and the time it set, when the trace shows
// it.
func (e *ev) setClock() {
	call := e.name
	var arg string
	switch e.name {
	case "settimeofday", "stime":
		arg = e.arg(0)
	case "clock_settime", "clock_settime64":
		arg = e.arg(1)
	default: // adjtimex, clock_adjtime
		a := e.arg(0)
		if e.name != "adjtimex" {
			a = e.arg(1)
		}
		modes := field(a, "modes=")
		if modes == "" || modes == "0" {
			return
		}
		call += " " + modes
	}
	if arg == "NULL" || arg == "0" {
		return
	}
	sec := field(arg, "tv_sec=")
	if e.name == "stime" {
		sec = strings.Trim(arg, "[] ")
	}
	if v, err := strconv.ParseInt(sec, 10, 64); err == nil {
		call += " " + time.Unix(v, 0).UTC().Format(time.RFC3339)
	}
	e.t.tech(records.ObsEvasion, "clock", "clock", e.ts, e.line, e.p).add("", withErr(call, e.c), e.p)
}

// sleep counts a nanosleep or clock_nanosleep: the requested duration
// (relative, or absolute on CLOCK_REALTIME against the line's time), or
// the time it took (-T) when longer or the only one known.
func (e *ev) sleep() {
	req := e.arg(0)
	abs, realtime := false, false
	if e.name != "nanosleep" {
		req = e.arg(2)
		abs = strings.Contains(e.arg(1), "TIMER_ABSTIME") || e.arg(1) == "1"
		realtime = e.arg(0) == "CLOCK_REALTIME" || e.arg(0) == "0"
	}
	secs, ok := timespec(req)
	if ok && abs {
		ok = realtime && !e.ts.IsZero() && !e.t.qemu
		secs -= float64(e.ts.UnixNano()) / 1e9
	}
	if !ok || secs < 0 {
		secs = 0
	}
	took := e.c.dur
	if e.c.ret == "?" && !e.t.qemu {
		// Still sleeping when the trace ended: at least until its end.
		took = e.t.lastTS.Sub(e.ts).Seconds()
	}
	longest := max(secs, took)
	total := took
	if total < 0 {
		total = secs
	}
	t := e.t
	t.sleepMax = max(t.sleepMax, longest)
	t.sleepTotal += max(total, 0)
	if w := t.opts.Window.Seconds(); w > 0 && longest > w {
		if s := t.tech(records.ObsEvasion, "sleep", "sleep", e.ts, e.line, e.p); s != nil {
			s.longest = max(s.longest, longest)
			s.total += max(total, 0)
			s.add("", "", e.p)
		}
	}
}

// timespec reads {tv_sec=N, tv_nsec=N} (QEMU: {tv_sec = N,tv_nsec = N}).
func timespec(s string) (float64, bool) {
	s = strings.ReplaceAll(s, " ", "")
	sec := field(s, "tv_sec=")
	nsec := field(s, "tv_nsec=")
	a, err1 := strconv.ParseInt(sec, 10, 64)
	b, err2 := strconv.ParseInt(nsec, 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return float64(a) + float64(b)/1e9, true
}

func addBounded(list []string, v string) []string {
	if len(list) < observe.MaxList && !slices.Contains(list, v) {
		list = append(list, v)
	}
	return list
}

// socket records a socket's family and protocol.
func (e *ev) socket() {
	fd, ok := e.c.retInt()
	if !ok || !e.c.succeeded() {
		return
	}
	f := &fdInfo{sock: true}
	switch e.arg(0) {
	case "AF_INET", "PF_INET", "2":
		f.family = "inet"
	case "AF_INET6", "PF_INET6", "10":
		f.family = "inet6"
	case "AF_UNIX", "AF_LOCAL", "PF_UNIX", "PF_LOCAL", "1":
		f.family = "unix"
	}
	typ := e.arg(1)
	proto := e.arg(2)
	switch {
	case strings.HasPrefix(typ, "SOCK_RAW"):
		f.proto = "raw"
	case f.family == "unix":
	case strings.HasPrefix(typ, "SOCK_STREAM"):
		f.proto = "tcp"
		if proto == "IPPROTO_SCTP" {
			f.proto = "sctp"
		}
	case strings.HasPrefix(typ, "SOCK_DGRAM"):
		f.proto = "udp"
	}
	e.setFD(fd, f)
}

// netcall records a connect, bind, sendto or sendmsg with its address.
func (e *ev) netcall() {
	f := e.fd(0)
	raw := sockaddrArg(e.name, e.c.args)
	sa, ok := parseSockaddr(raw)
	if !ok {
		if e.name != "connect" || !strings.HasPrefix(strings.TrimSpace(raw), "0x") {
			return // no address: a connected socket's send
		}
		// QEMU prints connect's address as a pointer.
		sa = sockAddr{}
		if f != nil {
			sa.family = f.family
		}
	}
	if sa.family == "" {
		return // netlink, packet and other families
	}
	call := e.name
	if call == "sendmsg" {
		call = "sendto"
	}
	proto := ""
	if f != nil {
		proto = f.proto
	}
	if call == "bind" {
		if f != nil && e.c.succeeded() {
			b := sa
			f.bound = &b
		}
		if sa.family != "unix" && sa.port == 0 {
			return // an ephemeral port: a client's, unless it listens
		}
	}
	e.t.netcall(e, ncKeyOf(call, proto, sa), sa, e.c.result())
}

func (e *ev) listen() {
	f := e.fd(0)
	if f == nil {
		f = &fdInfo{sock: true}
	}
	sa := sockAddr{family: f.family}
	if f.bound != nil {
		sa = *f.bound
	}
	sa.family = cmp.Or(sa.family, "inet")
	k := ncKeyOf("listen", f.proto, sa)
	if e.c.succeeded() {
		f.listen = &k
	}
	e.t.netcall(e, k, sa, e.c.result())
}

// accept counts a connection a listener accepted, and its peer.
func (e *ev) accept() {
	f := e.fd(0)
	if f == nil || f.listen == nil || !e.c.succeeded() {
		return
	}
	st := e.t.dests[*f.listen]
	if st == nil {
		return
	}
	st.accepted++
	if sa, ok := parseSockaddr(sockaddrArg(e.name, e.c.args)); ok && sa.known {
		st.peers = addBounded(st.peers, addrText(sa))
	}
	if fd, ok := e.c.retInt(); ok {
		e.setFD(fd, &fdInfo{sock: true, family: f.family, proto: f.proto})
	}
}

// addrText is an address as netcall values write it.
func addrText(sa sockAddr) string {
	switch {
	case sa.family == "unix":
		return "unix:" + sa.path
	case !sa.known:
		return "?"
	}
	return netip.AddrPortFrom(sa.addr, sa.port).String()
}
