package behave

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// unreturned takes pid's pending call, if any, as never returning.
func (t *trace) unreturned(pid int) {
	p := t.pending[pid]
	if p == nil {
		return
	}
	delete(t.pending, pid)
	body := p.body + ") = ?"
	if !parseCall(body, false).ok {
		return // cut inside a string: nothing to read
	}
	t.event(line{kind: lineCall, pid: pid, name: p.name, body: body}, p.ts, p.line)
}

// finish ends the trace — the calls still running are taken as never
// returning — and emits its observables.
func (t *trace) finish(sink Sink) {
	pids := slices.Collect(maps.Keys(t.pending))
	slices.SortFunc(pids, func(a, b int) int { return cmp.Compare(t.pending[a].line, t.pending[b].line) })
	for _, pid := range pids {
		t.unreturned(pid)
	}
	if t.qlex.partial != "" {
		t.res.Trace.Garbled++ // a call cut that nothing completed
	}
	for _, p := range t.kept {
		if p.exit == nil && p.exitCode != nil {
			p.exit = &records.ProcExit{At: p.last.UTC(), Code: *p.exitCode}
		}
	}
	res := t.res
	tr := &res.Trace
	tr.Format, tr.Lines = t.format, res.Stats.Lines
	tr.Processes = t.nprocs
	tr.OmittedProcesses, tr.OmittedPaths = t.omitted.procs, t.omitted.paths
	tr.LongestSleep, tr.TotalSleep = round6(t.sleepMax), round6(t.sleepTotal)
	tr.Calls = t.callCounts()

	for _, p := range t.kept {
		res.Processes = append(res.Processes, t.processInfo(p))
	}
	var out []*records.Observable
	for _, k := range t.pathOrder {
		ps := t.paths[k]
		if ps.written && ps.present && !ps.dir {
			res.Dropped = append(res.Dropped, Dropped{Path: k, PID: int64(ps.writer.pid), Exe: ps.writer.exe, At: ps.writeAt.UTC(), Line: ps.writeLine})
			if len(tr.Dropped) < observe.MaxDropped {
				tr.Dropped = append(tr.Dropped, k)
			}
		}
		o := t.origin.New(records.ObsPath, k, ps.first, 0, ps.line)
		o.LastSeen, o.Count = maxTime(ps.first, ps.last).UTC(), ps.count
		o.Path = &records.PathInfo{Ops: ps.ops, RenamedTo: ps.renamedTo, RenamedFrom: ps.renamedFrom, Mode: ps.mode,
			Dropped: ps.written && ps.present && !ps.dir, SelfDelete: ps.selfDelete, Procs: ps.procs}
		out = append(out, o)
	}
	out = append(out, t.netcalls()...)
	if t.opts.Tracer != nil {
		t.tamperEnd()
	}
	out = append(out, t.techniques()...)

	o := t.origin.New(records.ObsTrace, t.format, t.first, 0, 1)
	o.LastSeen = maxTime(t.first, t.lastTS).UTC()
	info := *tr
	// The sink merges into what it is given: the result keeps its own.
	info.Calls, info.Dropped = slices.Clone(tr.Calls), slices.Clone(tr.Dropped)
	o.Trace = &info
	sink.Add(o)
	for i, p := range t.kept {
		info := res.Processes[i]
		exe := cmp.Or(p.exe, "?")
		o := t.origin.New(records.ObsProcess, strconv.Itoa(p.pid)+" "+exe, p.start, 0, p.line)
		o.LastSeen = maxTime(p.start, p.last).UTC()
		if p.exit != nil {
			o.LastSeen = maxTime(p.start, p.exit.At).UTC()
		}
		o.Process = &info
		sink.Add(o)
	}
	for _, o := range out {
		sink.Add(o)
	}
}

func (t *trace) processInfo(p *proc) records.ProcessInfo {
	info := records.ProcessInfo{PID: int64(p.pid), PPID: int64(p.ppid), Exe: p.exe, Execs: p.execs, FailedExecs: p.failedExecs,
		Names: p.names, Start: p.start.UTC(), Exit: p.exit, Threads: p.threads}
	if p.uid >= 0 {
		uid := p.uid
		info.UID = &uid
	}
	return info
}

// callCounts are the calls read, most frequent first (the first 64).
func (t *trace) callCounts() []records.CallCount {
	var cs []records.CallCount
	for n, c := range t.calls {
		cs = append(cs, records.CallCount{Name: n, Count: c})
	}
	slices.SortFunc(cs, func(a, b records.CallCount) int {
		if a.Count != b.Count {
			return cmp.Compare(b.Count, a.Count)
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return cs[:min(len(cs), 2*observe.MaxList)]
}

// netcalls are the destinations with an observable of their own and the
// scans: a group of calls to one port reaching observe.ScanMinDests
// addresses is one observable, and its destinations keep their own only
// when called more than once or a call succeeded.
func (t *trace) netcalls() []*records.Observable {
	var out []*records.Observable
	scanning := map[ncKey]bool{}
	for _, gk := range t.groupOrder {
		g := t.groups[gk]
		n, _ := g.dests.Count()
		if n < observe.ScanMinDests {
			t.omitted.netcalls += g.untracked
			continue
		}
		scanning[gk] = true
		o := t.ncObservable(&g.stat)
		o.Netcall.Addr = ""
		o.Netcall.Dests, o.Netcall.Sample = n, g.sample
		out = append(out, o)
	}
	for _, k := range t.destOrder {
		s := t.dests[k]
		gk := k
		gk.addr = "*"
		if scanning[gk] && s.calls < 2 && !slices.ContainsFunc(s.results, func(c records.CallCount) bool { return c.Name == "0" }) {
			continue
		}
		out = append(out, t.ncObservable(s))
	}
	t.res.Trace.OmittedNetcalls = t.omitted.netcalls
	return out
}

func (t *trace) ncObservable(s *ncStat) *records.Observable {
	k := s.key
	o := t.origin.New(records.ObsNetcall, k.value(), s.first, 0, s.line)
	o.LastSeen, o.Count = maxTime(s.first, s.last).UTC(), s.calls
	o.Netcall = &records.NetcallInfo{Call: k.call, Family: k.family, Proto: k.proto, Addr: k.addr, Port: k.port, Calls: s.calls,
		Results: s.results, Accepted: s.accepted, Peers: s.peers, Procs: s.procs}
	return o
}

// techniques are the persistence and evasion observables.
func (t *trace) techniques() []*records.Observable {
	var out []*records.Observable
	mk := func(typ, tech, value string, first, last time.Time, line, count int64, info *records.TechniqueInfo) {
		o := t.origin.New(typ, value, first, 0, line)
		o.LastSeen, o.Count = maxTime(first, last).UTC(), count
		info.Technique = tech
		if typ == records.ObsPersistence {
			o.Persistence = info
		} else {
			o.Evasion = info
		}
		out = append(out, o)
	}
	for _, k := range t.techOrder {
		s := t.techs[k]
		mk(s.typ, s.tech, s.value, s.first, s.last, s.line, s.count,
			&records.TechniqueInfo{Paths: s.paths, Targets: s.targets, Procs: s.procs, Longest: round6(s.longest), Total: round6(s.total)})
	}
	if s := &t.procScan; len(s.pids) >= ProcScanMin {
		mk(records.ObsEvasion, "proc-scan", "proc-scan", s.first, s.last, s.line, s.opens,
			&records.TechniqueInfo{Paths: s.paths, Procs: s.procs})
	}
	return out
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// round6 rounds seconds to microseconds, strace's resolution.
func round6(f float64) float64 { return float64(int64(f*1e6+0.5)) / 1e6 }
