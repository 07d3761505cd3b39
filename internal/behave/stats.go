package behave

import (
	"encoding/binary"
	"errors"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/distinct"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

var (
	errBadLine = errors.New("not a line of strace's output")
	errResumed = errors.New("a resumed call whose start the trace does not show")
)

// pathStat is what the trace did to one path.
type pathStat struct {
	ops                    []string
	renamedTo, renamedFrom []string
	mode                   string
	present, written, dir  bool
	selfDelete             bool
	procs                  []string
	first, last            time.Time
	line                   int64
	count                  int64
	writer                 *proc
	writeAt                time.Time
	writeLine              int64
}

// path is the stats of a path the trace changed, nil beyond MaxPaths (then
// counted) and for the pseudo-files of /dev, /proc and /sys.
func (t *trace) path(p string, ts time.Time, n int64, pr *proc) *pathStat {
	if strings.HasPrefix(p, "/dev/") || strings.HasPrefix(p, "/proc/") || strings.HasPrefix(p, "/sys/") {
		return nil
	}
	ps := t.paths[p]
	if ps == nil {
		if len(t.paths) >= MaxPaths {
			t.omitted.paths++
			return nil
		}
		ps = &pathStat{first: ts, line: n}
		t.paths[p] = ps
		t.pathOrder = append(t.pathOrder, p)
	}
	ps.count++
	if ts.After(ps.last) {
		ps.last = ts
	}
	ps.procs = addBounded(ps.procs, pr.id())
	return ps
}

func (ps *pathStat) op(o string) {
	if !slices.Contains(ps.ops, o) {
		ps.ops = append(ps.ops, o)
	}
}

// wrote notes the path written (or renamed into place) and there.
func (ps *pathStat) wrote(e *ev) {
	ps.present, ps.written, ps.dir = true, true, false
	ps.writer, ps.writeAt, ps.writeLine = e.p, e.ts, e.line
}

// ncKey is a netcall observable: a call to one address, or (addr "*")
// a scan group's summary.
type ncKey struct {
	call, family, proto, addr string
	port                      uint16
}

func ncKeyOf(call, proto string, sa sockAddr) ncKey {
	k := ncKey{call: call, family: sa.family, proto: proto, port: sa.port}
	switch {
	case sa.family == "unix":
		k.addr, k.port = sa.path, 0
	case sa.known:
		k.addr = sa.addr.String()
	}
	return k
}

// value is the observable's value.
func (k ncKey) value() string {
	var b strings.Builder
	b.WriteString(k.call)
	b.WriteByte(' ')
	switch {
	case k.family == "unix":
		b.WriteString("unix:")
		b.WriteString(k.addr)
		return b.String()
	case k.addr == "" && k.port == 0:
		b.WriteByte('?')
	case k.addr == "":
		b.WriteString("?:" + strconv.Itoa(int(k.port)))
	default:
		if k.family == "inet6" && k.addr != "*" {
			b.WriteString("[" + k.addr + "]")
		} else {
			b.WriteString(k.addr)
		}
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(int(k.port)))
	}
	if k.proto != "" {
		b.WriteByte('/')
		b.WriteString(k.proto)
	}
	return b.String()
}

type ncStat struct {
	key         ncKey
	calls       int64
	results     []records.CallCount
	accepted    int64
	peers       []string
	procs       []string
	first, last time.Time
	line        int64
}

func (s *ncStat) add(result string, ts time.Time, pr *proc) {
	s.calls++
	if i := slices.IndexFunc(s.results, func(c records.CallCount) bool { return c.Name == result }); i >= 0 {
		s.results[i].Count++
	} else if len(s.results) < observe.MaxList {
		s.results = append(s.results, records.CallCount{Name: result, Count: 1})
	}
	if ts.After(s.last) {
		s.last = ts
	}
	s.procs = addBounded(s.procs, pr.id())
}

// ncGroup counts the calls of one kind to one port of many addresses.
type ncGroup struct {
	stat      ncStat
	dests     distinct.Counter
	sample    []string
	untracked int64 // calls to destinations without a stat of their own
}

func (t *trace) netcall(e *ev, k ncKey, sa sockAddr, result string) {
	var g *ncGroup
	if (k.call == "connect" || k.call == "sendto") && sa.known && k.family != "unix" {
		gk := k
		gk.addr = "*"
		if g = t.groups[gk]; g == nil && len(t.groups) < MaxNetGroups {
			g = &ncGroup{stat: ncStat{key: gk, first: e.ts, line: e.line}}
			t.groups[gk] = g
			t.groupOrder = append(t.groupOrder, gk)
		}
		if g != nil {
			g.stat.add(result, e.ts, e.p)
			if g.dests.Add(addrHash(sa)) && len(g.sample) < observe.MaxSample {
				g.sample = append(g.sample, k.addr)
			}
		}
	}
	s := t.dests[k]
	if s == nil {
		if len(t.dests) >= MaxNetDests {
			if g != nil {
				g.untracked++
			} else {
				t.omitted.netcalls++
			}
			return
		}
		s = &ncStat{key: k, first: e.ts, line: e.line}
		t.dests[k] = s
		t.destOrder = append(t.destOrder, k)
	}
	s.add(result, e.ts, e.p)
}

func addrHash(sa sockAddr) uint64 {
	if sa.addr.Is4() {
		b := sa.addr.As4()
		return uint64(binary.BigEndian.Uint32(b[:]))
	}
	h := fnv.New64a()
	b := sa.addr.As16()
	h.Write(b[:])
	return h.Sum64()
}

// techStat is a persistence or evasion observable being gathered.
type techStat struct {
	typ, tech, value string
	paths, targets   []string
	procs            []string
	count            int64
	first, last      time.Time
	line             int64
	longest, total   float64
}

// tech is the stats of a technique's observable, nil beyond MaxTechniques.
func (t *trace) tech(typ, tech, value string, ts time.Time, n int64, pr *proc) *techStat {
	k := typ + "\x00" + value
	s := t.techs[k]
	if s == nil {
		if len(t.techs) >= MaxTechniques {
			return nil
		}
		s = &techStat{typ: typ, tech: tech, value: value, first: ts, line: n}
		t.techs[k] = s
		t.techOrder = append(t.techOrder, k)
	}
	s.count++
	if ts.After(s.last) {
		s.last = ts
	}
	return s
}

// add lists a path and a target (either may be empty) and the process.
func (s *techStat) add(p, target string, pr *proc) {
	if s == nil {
		return
	}
	if p != "" {
		s.paths = addBounded(s.paths, p)
	}
	if target != "" {
		s.targets = addBounded(s.targets, target)
	}
	s.procs = addBounded(s.procs, pr.id())
}

// procScan counts the /proc/PID entries of other processes the trace
// opened or read links of: a bot looking for competitors or analysis
// tools to kill.
type procScan struct {
	pids        map[int]bool
	opens       int64
	paths       []string
	procs       []string
	first, last time.Time
	line        int64
}

func (s *procScan) add(pid int, p string, e *ev) {
	if s.opens == 0 {
		s.first, s.line = e.ts, e.line
	}
	s.opens++
	if e.ts.After(s.last) {
		s.last = e.ts
	}
	if len(s.pids) < distinct.Exact {
		s.pids[pid] = true
	}
	s.paths = addBounded(s.paths, p)
	s.procs = addBounded(s.procs, e.p.id())
}
