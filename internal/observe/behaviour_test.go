package observe

import (
	"slices"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Two sightings of the behaviour types merge as the other types do; a
// trace's processes and summary stay one per cycle.
func TestMergeBehaviour(t *testing.T) {
	t0 := time.Unix(1795500000, 0).UTC()
	var out []*records.Observable
	s := NewSet(0, func(o *records.Observable) error { out = append(out, o); return nil })
	c1 := Origin{Cycle: "c1", Input: "a", Source: "strace"}
	c2 := Origin{Cycle: "c2", Input: "b", Source: "strace"}
	uid := int64(0)
	for i, o := range []Origin{c1, c1, c2} {
		p := o.New(records.ObsProcess, "10 /tmp/x", t0.Add(time.Duration(i)*time.Second), 0, 1)
		p.Process = &records.ProcessInfo{PID: 10, Exe: "/tmp/x", Names: []string{"n" + o.Cycle}, Threads: 1, Start: p.FirstSeen}
		if i == 1 {
			p.Process.UID = &uid
			p.Process.Exit = &records.ProcExit{At: p.FirstSeen, Code: 3}
		}
		s.Add(p)
		n := o.New(records.ObsNetcall, "connect 203.0.113.5:80/tcp", p.FirstSeen, 0, 2)
		n.Count = 2
		n.Netcall = &records.NetcallInfo{Call: "connect", Family: "inet", Proto: "tcp", Addr: "203.0.113.5", Port: 80, Calls: 2, Dests: int64(i),
			Results: []records.CallCount{{Name: "ECONNREFUSED", Count: 1}, {Name: []string{"0", "EINPROGRESS", "0"}[i], Count: 1}}}
		s.Add(n)
		f := o.New(records.ObsPath, "/tmp/x", p.FirstSeen, 0, 3)
		f.Path = &records.PathInfo{Ops: []string{[]string{"write", "delete", "write"}[i]}, Dropped: i == 0}
		s.Add(f)
		tr := o.New(records.ObsTrace, "strace", p.FirstSeen, 0, 1)
		tr.Trace = &records.TraceInfo{Format: "strace", Lines: 5, Processes: 1, Dropped: []string{"/tmp/" + o.Cycle}, LongestSleep: float64(i)}
		s.Add(tr)
		e := o.New(records.ObsEvasion, "sleep", p.FirstSeen, 0, 4)
		e.Evasion = &records.TechniqueInfo{Technique: "sleep", Longest: float64(i), Total: 1, Procs: []string{"10"}}
		s.Add(e)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	byKey := map[string]*records.Observable{}
	var types []string
	for _, o := range out {
		byKey[o.Type+" "+o.Value+" "+o.Cycle] = o
		types = append(types, o.Type)
	}
	// One per cycle for processes and traces; ordered after the network's
	// types, behaviour summary first.
	if want := []string{"trace", "trace", "process", "process", "path", "netcall", "evasion"}; !slices.Equal(types, want) {
		t.Fatalf("types %q", types)
	}
	p := byKey["process 10 /tmp/x c1"].Process
	if !slices.Equal(p.Names, []string{"nc1"}) || p.UID == nil || p.Exit == nil || p.Exit.Code != 3 || p.Threads != 2 {
		t.Errorf("process %+v", p)
	}
	if p := byKey["process 10 /tmp/x c2"].Process; p.Threads != 1 || p.Exit != nil {
		t.Errorf("other cycle's process %+v", p)
	}
	n := byKey["netcall connect 203.0.113.5:80/tcp c2"]
	if n.Count != 6 || n.Netcall.Calls != 6 || n.Netcall.Dests != 2 ||
		!slices.Equal(n.Netcall.Results, []records.CallCount{{Name: "ECONNREFUSED", Count: 3}, {Name: "0", Count: 2}, {Name: "EINPROGRESS", Count: 1}}) {
		t.Errorf("netcall %+v", n.Netcall)
	}
	if f := byKey["path /tmp/x c2"].Path; !slices.Equal(f.Ops, []string{"write", "delete"}) || !f.Dropped {
		t.Errorf("path %+v", f)
	}
	if tr := byKey["trace strace c1"].Trace; tr.Lines != 10 || tr.Processes != 2 || !slices.Equal(tr.Dropped, []string{"/tmp/c1"}) || tr.LongestSleep != 1 {
		t.Errorf("trace %+v", tr)
	}
	if e := byKey["evasion sleep c2"].Evasion; e.Longest != 2 || e.Total != 3 || !slices.Equal(e.Procs, []string{"10"}) {
		t.Errorf("evasion %+v", e)
	}
}
