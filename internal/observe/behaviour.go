package observe

import (
	"cmp"
	"slices"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// MaxExecs bounds the execs a process observable lists.
const MaxExecs = 8

// mergeBehaviour folds the behaviour types' context objects (see
// internal/behave) into dst.
func mergeBehaviour(dst, src *records.Observable) {
	if s := src.Process; s != nil {
		if dst.Process == nil {
			dst.Process = &records.ProcessInfo{PID: s.PID, PPID: s.PPID, Start: s.Start}
		}
		d := dst.Process
		d.Exe = cmp.Or(s.Exe, d.Exe)
		for _, x := range s.Execs {
			if len(d.Execs) >= MaxExecs {
				break
			}
			if !slices.ContainsFunc(d.Execs, func(y records.ProcExec) bool { return y.Path == x.Path && y.At.Equal(x.At) }) {
				d.Execs = append(d.Execs, x)
			}
		}
		d.FailedExecs += s.FailedExecs
		d.Names = union(d.Names, s.Names, MaxList)
		if d.UID == nil {
			d.UID = s.UID
		}
		if s.Start.Before(d.Start) {
			d.Start = s.Start
		}
		if d.Exit == nil || s.Exit != nil && s.Exit.At.After(d.Exit.At) {
			d.Exit = s.Exit
		}
		d.Threads += s.Threads
	}
	if s := src.Path; s != nil {
		if dst.Path == nil {
			dst.Path = &records.PathInfo{}
		}
		d := dst.Path
		d.Ops = union(d.Ops, s.Ops, MaxList)
		d.RenamedTo = union(d.RenamedTo, s.RenamedTo, MaxList)
		d.RenamedFrom = union(d.RenamedFrom, s.RenamedFrom, MaxList)
		d.Mode = cmp.Or(s.Mode, d.Mode)
		d.Dropped = d.Dropped || s.Dropped
		d.SelfDelete = d.SelfDelete || s.SelfDelete
		d.Procs = union(d.Procs, s.Procs, MaxList)
	}
	if s := src.Netcall; s != nil {
		if dst.Netcall == nil {
			dst.Netcall = &records.NetcallInfo{Call: s.Call, Family: s.Family, Proto: s.Proto, Addr: s.Addr, Port: s.Port}
		}
		d := dst.Netcall
		d.Calls += s.Calls
		d.Results = mergeCounts(d.Results, s.Results)
		d.Accepted += s.Accepted
		d.Peers = union(d.Peers, s.Peers, MaxList)
		d.Dests = max(d.Dests, s.Dests)
		d.Sample = union(d.Sample, s.Sample, MaxSample)
		d.Procs = union(d.Procs, s.Procs, MaxList)
	}
	mergeTechnique(&dst.Persistence, src.Persistence)
	mergeTechnique(&dst.Evasion, src.Evasion)
	if s := src.Trace; s != nil {
		if dst.Trace == nil {
			dst.Trace = &records.TraceInfo{Format: s.Format, Root: s.Root}
		}
		d := dst.Trace
		d.Lines += s.Lines
		d.Processes += s.Processes
		d.Threads += s.Threads
		d.Execs += s.Execs
		d.FailedExecs += s.FailedExecs
		d.Calls = mergeCounts(d.Calls, s.Calls)
		d.Dropped = union(d.Dropped, s.Dropped, MaxDropped)
		d.Unfinished += s.Unfinished
		d.Truncated = d.Truncated || s.Truncated
		d.Garbled += s.Garbled
		d.OmittedProcesses += s.OmittedProcesses
		d.OmittedPaths += s.OmittedPaths
		d.OmittedNetcalls += s.OmittedNetcalls
		d.LongestSleep = max(d.LongestSleep, s.LongestSleep)
		d.TotalSleep += s.TotalSleep
	}
}

// MaxDropped bounds the dropped paths a trace observable lists.
const MaxDropped = 256

func mergeTechnique(dp **records.TechniqueInfo, s *records.TechniqueInfo) {
	if s == nil {
		return
	}
	if *dp == nil {
		*dp = &records.TechniqueInfo{Technique: s.Technique}
	}
	d := *dp
	d.Paths = union(d.Paths, s.Paths, MaxList)
	d.Targets = union(d.Targets, s.Targets, MaxList)
	d.Procs = union(d.Procs, s.Procs, MaxList)
	d.Longest = max(d.Longest, s.Longest)
	d.Total += s.Total
}

// mergeCounts adds b's counts to a's, by name (bounded).
func mergeCounts(a, b []records.CallCount) []records.CallCount {
	for _, c := range b {
		if i := slices.IndexFunc(a, func(x records.CallCount) bool { return x.Name == c.Name }); i >= 0 {
			a[i].Count += c.Count
		} else if len(a) < MaxList*2 {
			a = append(a, c)
		}
	}
	return a
}

// sizeOfBehaviour estimates the memory of the behaviour context objects.
func sizeOfBehaviour(o *records.Observable) int {
	n := 0
	if p := o.Process; p != nil {
		n += 256 + len(p.Exe) + strs(p.Names)
		for _, x := range p.Execs {
			n += 64 + len(x.Path) + strs(x.Argv)
		}
	}
	if p := o.Path; p != nil {
		n += 128 + strs(p.Ops) + strs(p.RenamedTo) + strs(p.RenamedFrom) + strs(p.Procs)
	}
	if c := o.Netcall; c != nil {
		n += 256 + len(c.Addr) + 48*len(c.Results) + strs(c.Peers) + strs(c.Sample) + strs(c.Procs)
	}
	for _, t := range []*records.TechniqueInfo{o.Persistence, o.Evasion} {
		if t != nil {
			n += 128 + strs(t.Paths) + strs(t.Targets) + strs(t.Procs)
		}
	}
	if t := o.Trace; t != nil {
		n += 256 + 48*len(t.Calls) + strs(t.Dropped)
	}
	return n
}
