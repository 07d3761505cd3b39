package behave

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Tracer is what tb-run, which launched the tracer, knows of it: with it,
// Parse looks for signs that the traced processes tampered with their
// trace, and emits them as one evasion observable, "trace tampered"
// (technique TechTraceTampered), listing what was seen.
type Tracer struct {
	// PIDs are the launcher's and the tracer's processes.
	PIDs []int
	// Dir is the guest directory of the trace and its end record.
	Dir string
	// Ended: the tracer exited and the launcher's end record is genuine,
	// so every traced process must have ended in the trace (strace
	// writes each one's exit, and the kill of each when tb-run kills
	// them).
	Ended bool
	// Continued: the trace goes on from where an earlier cycle's read
	// stopped (a detached sample's); its first process is not the root.
	Continued bool
	// Findings are what the caller saw itself: an end record missing or
	// not the launcher's.
	Findings []string
}

// TechTraceTampered is the technique of the evasion observable of a
// tampered trace; its value is "trace tampered".
const TechTraceTampered = "trace-tampered"

// tamper notes a call that reaches for the tracer: a signal or ptrace to
// the launcher or the tracer, or a path in the trace's directory or in
// their /proc entries that hold their files (fd, fdinfo, mem, map_files,
// root, cwd).
func (e *ev) tamper() {
	tr := e.t.opts.Tracer
	what := ""
	switch e.name {
	case "kill", "tkill", "tgkill", "ptrace":
		i := 0
		if e.name == "ptrace" {
			i = 1
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(e.arg(i))); err == nil && slices.Contains(tr.PIDs, pid) {
			what = e.name + "(" + strings.Join(e.c.args, ", ") + ")"
		}
	case "open", "openat", "openat2":
		// Under QEMU the log is a file of the emulated process itself:
		// writing to one of its own descriptors through /proc reaches it.
		if p, flags, fd, ok := e.ownFD(); ok && e.t.qemu && fd > 2 {
			if write, _, _ := writeFlags(flags); write {
				what = e.name + " " + p + " for writing"
				break
			}
		}
		fallthrough
	default:
		for i := range e.c.args {
			s, ok := unquote(e.arg(i), e.t.qemu)
			if !ok || s == "" {
				continue
			}
			if p := e.resolve("", s); tr.reaches(p) {
				what = e.name + " " + p
				break
			}
		}
	}
	if what != "" {
		e.t.tampered(fmt.Sprintf("pid %d %s (line %d)", e.pid, what, e.line), e.p)
	}
}

// ownFD is the descriptor an open's path names through the process's own
// /proc/self/fd (or thread-self, or its pid's), with the open's flags.
func (e *ev) ownFD() (p, flags string, fd int, ok bool) {
	switch e.name {
	case "open":
		p, flags = e.str(0), e.arg(1)
	case "openat2":
		p, flags = e.str(1), field(e.arg(2), "flags=")
	default:
		p, flags = e.str(1), e.arg(2)
	}
	rest, found := strings.CutPrefix(p, "/proc/")
	if !found {
		return "", "", 0, false
	}
	who, num, _ := strings.Cut(rest, "/fd/")
	if who != "self" && who != "thread-self" && who != strconv.Itoa(e.pid) && who != e.p.id() {
		return "", "", 0, false
	}
	fd, err := strconv.Atoi(num)
	return p, flags, fd, err == nil
}

// reaches reports whether p is in the trace's directory or in the /proc
// entries of the launcher's or the tracer's files.
func (tr *Tracer) reaches(p string) bool {
	if tr.Dir != "" && (p == tr.Dir || strings.HasPrefix(p, tr.Dir+"/")) {
		return true
	}
	pid, ok := procPID(p)
	if !ok || !slices.Contains(tr.PIDs, pid) {
		return false
	}
	_, rest, _ := strings.Cut(strings.TrimPrefix(p, "/proc/"), "/")
	entry, _, _ := strings.Cut(rest, "/")
	switch entry {
	case "fd", "fdinfo", "mem", "map_files", "root", "cwd":
		return true
	}
	return false
}

func (t *trace) tampered(what string, pr *proc) {
	t.tech(records.ObsEvasion, TechTraceTampered, "trace tampered", t.lastTS, 1, pr).add(what, "", pr)
}

// tamperEnd adds what the whole trace shows: processes the tracer left
// before they ended, processes no traced one started, lines that are no
// trace lines, and the caller's findings.
func (t *trace) tamperEnd() {
	tr := t.opts.Tracer
	root := cmp.Or(t.root, &proc{})
	for _, f := range tr.Findings {
		t.tampered(f, root)
	}
	if t.qemu {
		// QEMU logs no process's end, and may lose a clone's result.
		return
	}
	var live, strangers []string
	for _, pid := range slices.Sorted(maps.Keys(t.procs)) {
		p := t.procs[pid]
		if tr.Ended && p.exit == nil {
			live = append(live, p.id())
		}
		if !tr.Continued && p != t.root && p.ppid == 0 {
			strangers = append(strangers, p.id())
		}
	}
	if len(live) > 0 {
		t.tampered("the tracer ended before these traced processes did: "+list(live), root)
	}
	if len(strangers) > 0 {
		t.tampered("lines of processes no traced process started: "+list(strangers), root)
	}
	if s := t.res.Stats; s.Bad > 0 {
		t.tampered(fmt.Sprintf("lines that are no trace lines: %d (the first: %v)", s.Bad, s.FirstBad), root)
	}
}

// list joins the first 16 of a list, saying how many more there are.
func list(l []string) string {
	if len(l) <= 16 {
		return strings.Join(l, " ")
	}
	return strings.Join(l[:16], " ") + fmt.Sprintf(" and %d more", len(l)-16)
}
