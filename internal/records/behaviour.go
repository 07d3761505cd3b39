package records

import "time"

// Behaviour observable types: what the sample and its descendants did
// inside the guest, read from their system-call trace (strace, or QEMU's
// user-mode log). Value conventions:
//
//	process     "PID EXE", one process of a cycle's trace (its last executable);
//	            one per cycle, like scans
//	path        an absolute path the sample created, wrote, deleted, renamed,
//	            linked or chmod'ed ("/tmp/.x/bot")
//	netcall     "CALL ADDR:PORT/PROTO", a network system call to one address
//	            ("connect 203.0.113.5:80/tcp", "listen 0.0.0.0:23/tcp",
//	            "connect [2001:db8::1]:443/tcp", "connect unix:/run/docker.sock"),
//	            or "CALL *:PORT/PROTO" for the calls of a scan of many addresses
//	persistence "TECHNIQUE" or "TECHNIQUE PATH" ("cron /etc/crontab",
//	            "watchdog /dev/watchdog", "kill", "firewall /usr/sbin/iptables")
//	evasion     "TECHNIQUE" ("ptrace", "tracer-check", "proc-scan", "sleep",
//	            "self-delete")
//	trace       the trace's format ("strace", "qemu-strace"): a cycle's summary;
//	            one per cycle
const (
	ObsProcess     = "process"
	ObsPath        = "path"
	ObsNetcall     = "netcall"
	ObsPersistence = "persistence"
	ObsEvasion     = "evasion"
	ObsTrace       = "trace"
)

// ProcessInfo is one process of the trace: the sample, or a descendant.
type ProcessInfo struct {
	PID int64 `json:"pid"`
	// PPID is the parent's pid, 0 for a process whose parent the trace
	// does not show (the traced root).
	PPID int64 `json:"ppid"`
	// Exe is the last executable: its last exec, or its parent's for a
	// process that never exec'd.
	Exe   string     `json:"exe,omitempty"`
	Execs []ProcExec `json:"execs,omitempty"`
	// FailedExecs counts exec attempts that failed (a shell's PATH search).
	FailedExecs int64 `json:"failed_execs,omitempty"`
	// Names are the names it gave itself: prctl(PR_SET_NAME) names, and
	// an argv[0] that is not its executable's base name.
	Names []string `json:"names,omitempty"`
	// UID is the real user id when the trace shows it (getuid, setuid,
	// inherited), or the one the caller knew.
	UID     *int64    `json:"uid,omitempty"`
	Start   time.Time `json:"start"`
	Exit    *ProcExit `json:"exit,omitempty"`
	Threads int64     `json:"threads,omitempty"`
}

// ProcExec is one successful exec.
type ProcExec struct {
	Path string    `json:"path"`
	Argv []string  `json:"argv,omitempty"`
	At   time.Time `json:"at"`
}

// ProcExit is how a process ended: Code for an exit, Signal (and Core)
// when a signal killed it.
type ProcExit struct {
	At     time.Time `json:"at"`
	Code   int64     `json:"code"`
	Signal string    `json:"signal,omitempty"`
	Core   bool      `json:"core,omitempty"`
}

// PathInfo is what the sample did to one path.
type PathInfo struct {
	// Ops: create (opened with O_CREAT, creat, mknod: the trace does not
	// show whether it existed), write (opened for writing), delete,
	// rename-from, rename-to, link (made as a hard or symbolic link),
	// chmod, chmod+x, mkdir.
	Ops []string `json:"ops,omitempty"`
	// RenamedTo and RenamedFrom are the other ends of renames.
	RenamedTo   []string `json:"renamed_to,omitempty"`
	RenamedFrom []string `json:"renamed_from,omitempty"`
	// Mode is the last mode set by chmod, in octal.
	Mode string `json:"mode,omitempty"`
	// Dropped: written or renamed into place, and still there at the end
	// of a trace (not directories, not links).
	Dropped bool `json:"dropped,omitempty"`
	// SelfDelete: a process deleted the file it was executed from.
	SelfDelete bool     `json:"self_delete,omitempty"`
	Procs      []string `json:"procs,omitempty"` // pids
}

// NetcallInfo sums up the network system calls of one kind to one address,
// or, for a scan (Dests set), to one port of many addresses.
type NetcallInfo struct {
	Call   string `json:"call"`   // connect, sendto (sendmsg too), bind, listen
	Family string `json:"family"` // inet, inet6, unix
	// Proto is the socket's: tcp, udp, raw, or empty when the trace does
	// not show the socket's creation.
	Proto string `json:"proto,omitempty"`
	Addr  string `json:"addr,omitempty"` // empty for a scan
	Port  uint16 `json:"port"`
	Calls int64  `json:"calls"`
	// Results counts the calls by result: "0" or the error name
	// (EINPROGRESS, ECONNREFUSED, ...), "?" when the call did not return.
	Results []CallCount `json:"results,omitempty"`
	// Accepted counts the connections a listener accepted; Peers are the
	// first of their addresses.
	Accepted int64    `json:"accepted,omitempty"`
	Peers    []string `json:"peers,omitempty"`
	// Dests is a scan's distinct addresses (the largest count of one trace
	// after a merge); Sample the first of them.
	Dests  int64    `json:"dests,omitempty"`
	Sample []string `json:"sample,omitempty"`
	Procs  []string `json:"procs,omitempty"` // pids
}

// CallCount is a count by name: a call's result, a system call.
type CallCount struct {
	Name  string `json:"name"`
	Count int64  `json:"count"`
}

// TechniqueInfo is a persistence, tampering or evasion technique seen in
// the trace.
type TechniqueInfo struct {
	Technique string `json:"technique"`
	// Paths are the files written or opened, or the commands run.
	Paths []string `json:"paths,omitempty"`
	// Targets are a kill's or a ptrace's targets ("PID SIGNAL", "PID").
	Targets []string `json:"targets,omitempty"`
	Procs   []string `json:"procs,omitempty"` // pids
	// Longest is the longest single sleep, Total all sleeps, in seconds.
	Longest float64 `json:"longest,omitempty"`
	Total   float64 `json:"total,omitempty"`
}

// TraceInfo sums up one trace: the counts a report shows, the dropped
// files, and what was left out to stay bounded.
type TraceInfo struct {
	Format string `json:"format"`
	Lines  int64  `json:"lines"`
	// Root is the pid of the first process.
	Root        int64 `json:"root"`
	Processes   int64 `json:"processes"`
	Threads     int64 `json:"threads"`
	Execs       int64 `json:"execs"`
	FailedExecs int64 `json:"failed_execs"`
	// Calls counts the system calls read, by name.
	Calls []CallCount `json:"calls,omitempty"`
	// Dropped are the paths written and left at the end (the first 256).
	Dropped []string `json:"dropped,omitempty"`
	// Unfinished counts calls that had not returned when the trace ended.
	Unfinished int64 `json:"unfinished"`
	// Truncated: the last line was cut short.
	Truncated bool `json:"truncated,omitempty"`
	// Garbled counts lines of a QEMU log that no call could be read from
	// (pieces of calls that processes wrote at the same time).
	Garbled int64 `json:"garbled,omitempty"`
	// Omitted* count what went beyond the bounds: processes, paths and
	// netcall destinations without an observable of their own.
	OmittedProcesses int64 `json:"omitted_processes,omitempty"`
	OmittedPaths     int64 `json:"omitted_paths,omitempty"`
	OmittedNetcalls  int64 `json:"omitted_netcalls,omitempty"`
	// LongestSleep and TotalSleep are in seconds.
	LongestSleep float64 `json:"longest_sleep,omitempty"`
	TotalSleep   float64 `json:"total_sleep,omitempty"`
}

// behaviour appends the behaviour types' context objects, for AppendJSON.
func (e *jsonAppender) behaviour(o *Observable) {
	if p := o.Process; p != nil {
		e.key("process")
		e.open()
		e.int("pid", p.PID, false)
		e.int("ppid", p.PPID, false)
		e.str("exe", p.Exe, true)
		if len(p.Execs) > 0 {
			e.key("execs")
			e.b = append(e.b, '[')
			for i, x := range p.Execs {
				if i > 0 {
					e.b = append(e.b, ',')
				}
				e.open()
				e.str("path", x.Path, false)
				e.strs("argv", x.Argv)
				e.time("at", x.At)
				e.close()
			}
			e.b = append(e.b, ']')
		}
		e.int("failed_execs", p.FailedExecs, true)
		e.strs("names", p.Names)
		if p.UID != nil {
			e.int("uid", *p.UID, false)
		}
		e.time("start", p.Start)
		if x := p.Exit; x != nil {
			e.key("exit")
			e.open()
			e.time("at", x.At)
			e.int("code", x.Code, false)
			e.str("signal", x.Signal, true)
			e.bool("core", x.Core)
			e.close()
		}
		e.int("threads", p.Threads, true)
		e.close()
	}
	if p := o.Path; p != nil {
		e.key("path")
		e.open()
		e.strs("ops", p.Ops)
		e.strs("renamed_to", p.RenamedTo)
		e.strs("renamed_from", p.RenamedFrom)
		e.str("mode", p.Mode, true)
		e.bool("dropped", p.Dropped)
		e.bool("self_delete", p.SelfDelete)
		e.strs("procs", p.Procs)
		e.close()
	}
	if n := o.Netcall; n != nil {
		e.key("netcall")
		e.open()
		e.str("call", n.Call, false)
		e.str("family", n.Family, false)
		e.str("proto", n.Proto, true)
		e.str("addr", n.Addr, true)
		e.int("port", int64(n.Port), false)
		e.int("calls", n.Calls, false)
		e.counts("results", n.Results)
		e.int("accepted", n.Accepted, true)
		e.strs("peers", n.Peers)
		e.int("dests", n.Dests, true)
		e.strs("sample", n.Sample)
		e.strs("procs", n.Procs)
		e.close()
	}
	e.technique("persistence", o.Persistence)
	e.technique("evasion", o.Evasion)
	if t := o.Trace; t != nil {
		e.key("trace")
		e.open()
		e.str("format", t.Format, false)
		e.int("lines", t.Lines, false)
		e.int("root", t.Root, false)
		e.int("processes", t.Processes, false)
		e.int("threads", t.Threads, false)
		e.int("execs", t.Execs, false)
		e.int("failed_execs", t.FailedExecs, false)
		e.counts("calls", t.Calls)
		e.strs("dropped", t.Dropped)
		e.int("unfinished", t.Unfinished, false)
		e.bool("truncated", t.Truncated)
		e.int("garbled", t.Garbled, true)
		e.int("omitted_processes", t.OmittedProcesses, true)
		e.int("omitted_paths", t.OmittedPaths, true)
		e.int("omitted_netcalls", t.OmittedNetcalls, true)
		e.float("longest_sleep", t.LongestSleep, true)
		e.float("total_sleep", t.TotalSleep, true)
		e.close()
	}
}

func (e *jsonAppender) technique(k string, t *TechniqueInfo) {
	if t == nil {
		return
	}
	e.key(k)
	e.open()
	e.str("technique", t.Technique, false)
	e.strs("paths", t.Paths)
	e.strs("targets", t.Targets)
	e.strs("procs", t.Procs)
	e.float("longest", t.Longest, true)
	e.float("total", t.Total, true)
	e.close()
}

func (e *jsonAppender) counts(k string, cs []CallCount) {
	if len(cs) == 0 {
		return
	}
	e.key(k)
	e.b = append(e.b, '[')
	for i, c := range cs {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.open()
		e.str("name", c.Name, false)
		e.int("count", c.Count, false)
		e.close()
	}
	e.b = append(e.b, ']')
}

// bool writes a true flag; false is omitted, as omitempty does.
func (e *jsonAppender) bool(k string, v bool) {
	if v {
		e.key(k)
		e.b = append(e.b, "true"...)
	}
}

func (e *jsonAppender) float(k string, v float64, omitEmpty bool) {
	if omitEmpty && v == 0 {
		return
	}
	e.key(k)
	e.b = appendFloat(e.b, v)
}

// BehaviourSummary is what a cycle's analysis says of its behaviour trace:
// the process tree, and the values of its dropped files, persistence and
// tampering, evasion, the destinations the sample tried by system call and
// the listeners it opened.
type BehaviourSummary struct {
	Processes   []ProcessNode `json:"processes,omitempty"`
	Dropped     []string      `json:"dropped,omitempty"`
	Persistence []string      `json:"persistence,omitempty"`
	Evasion     []string      `json:"evasion,omitempty"`
	Tried       []string      `json:"tried,omitempty"`
	Listening   []string      `json:"listening,omitempty"`
	// DroppedSamples are the samples tb-run planned from the dropped files.
	DroppedSamples []string `json:"dropped_samples,omitempty"`
}

// ProcessNode is one process of the tree.
type ProcessNode struct {
	PID   int64    `json:"pid"`
	PPID  int64    `json:"ppid"`
	Exe   string   `json:"exe,omitempty"`
	Argv  []string `json:"argv,omitempty"`
	Names []string `json:"names,omitempty"`
	Exit  string   `json:"exit,omitempty"` // "0", "SIGKILL", "" while running
}

// Tree calls fn for each process, parents before their children (in pid
// order), with its depth in the tree: processes whose parent is not listed
// are roots.
func (b *BehaviourSummary) Tree(fn func(depth int, n ProcessNode)) {
	listed := map[int64]bool{}
	children := map[int64][]ProcessNode{}
	for _, n := range b.Processes {
		listed[n.PID] = true
	}
	var roots []ProcessNode
	for _, n := range b.Processes {
		if listed[n.PPID] && n.PPID != n.PID {
			children[n.PPID] = append(children[n.PPID], n)
		} else {
			roots = append(roots, n)
		}
	}
	var walk func(depth int, n ProcessNode)
	walk = func(depth int, n ProcessNode) {
		fn(depth, n)
		for _, c := range children[n.PID] {
			walk(depth+1, c)
		}
	}
	for _, r := range roots {
		walk(0, r)
	}
}
