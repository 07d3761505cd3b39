package observe

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// DefaultMaxHeld is how many distinct observables a Set holds before it
// writes half of them out early.
const DefaultMaxHeld = 1 << 14

// Memory bounds of a Set: the observables held (estimated), the address →
// names index used to annotate ip observables with the names that resolved
// to them, and the length of a value.
const (
	MaxHeldBytes   = 48 << 20
	maxIndexBytes  = 8 << 20
	MaxValue       = 4096
	namesPerAddr   = 8
	entryOverhead  = 640 // struct, map entry, slices headers
	stringOverhead = 16
)

type key struct{ typ, value string }

// PerCycle reports whether observables of a type stand for one cycle
// (scans, a trace's processes and summary), so that those of different
// cycles are kept apart.
func PerCycle(typ string) bool {
	return typ == records.ObsScan || typ == records.ObsProcess || typ == records.ObsTrace
}

// Key is what observables of a lease are deduplicated by, with their type:
// the value, and the cycle for per-cycle types.
func Key(o *records.Observable) string {
	if PerCycle(o.Type) {
		return o.Value + " " + o.Cycle
	}
	return o.Value
}

type entry struct {
	o    *records.Observable
	tick uint64
	size int
}

// Set deduplicates observables within a run. It holds at most max distinct
// ones: beyond that, the least recently updated half is emitted early, and a later sighting of one of them starts a new
// observable (merged again by --merge in the state). Emit order at Flush is
// deterministic.
type Set struct {
	max   int
	m     map[key]*entry
	tick  uint64
	emit  func(*records.Observable) error
	err   error
	bytes int                 // estimated size of what is held
	names map[string][]string // address -> domains that resolved to it
	named map[netip.Addr]bool
	nameB int
	free  []*entry
}

// NewSet returns a Set that passes deduplicated observables to emit.
func NewSet(max int, emit func(*records.Observable) error) *Set {
	if max <= 0 {
		max = DefaultMaxHeld
	}
	return &Set{max: max, m: make(map[key]*entry), emit: emit, names: make(map[string][]string), named: make(map[netip.Addr]bool)}
}

// Add records one sighting.
func (s *Set) Add(o *records.Observable) {
	s.tick++
	if len(o.Value) > MaxValue {
		o.Value = o.Value[:MaxValue]
	}
	if o.Domain != nil {
		for _, a := range o.Domain.Addrs {
			names := s.names[a]
			if len(names) >= namesPerAddr || s.nameB >= maxIndexBytes || slices.Contains(names, o.Value) {
				continue
			}
			s.names[a] = append(names, o.Value)
			s.nameB += len(a) + len(o.Value) + 2*stringOverhead
			if ip, err := netip.ParseAddr(a); err == nil {
				s.named[ip.Unmap()] = true
			}
		}
	}
	k := key{o.Type, Key(o)}
	if e, ok := s.m[k]; ok {
		Merge(e.o, o)
		e.tick = s.tick
		size := sizeOf(e.o)
		s.bytes += size - e.size
		e.size = size
	} else {
		var e *entry
		if n := len(s.free); n > 0 {
			e, s.free = s.free[n-1], s.free[:n-1]
		} else {
			e = new(entry)
		}
		*e = entry{o: o, tick: s.tick, size: sizeOf(o)}
		s.m[k] = e
		s.bytes += e.size
	}
	if len(s.m) > s.max || s.bytes > MaxHeldBytes {
		s.evict(len(s.m) / 2)
	}
}

// sizeOf estimates the memory an observable holds.
func sizeOf(o *records.Observable) int {
	n := entryOverhead + len(o.Value) + 2*len(o.Type) + strs(o.Cycles) + strs(o.Sources) + len(o.Provenance)*96
	for _, p := range o.Provenance {
		n += len(p.Input)
	}
	if d := o.Domain; d != nil {
		n += strs(d.QTypes) + strs(d.RCodes) + strs(d.Addrs) + strs(d.CNAMEs) + strs(d.Resolvers) + strs(d.Clients) + strs(d.Transports)
		for _, a := range d.Answers {
			n += 64 + len(a.Name) + len(a.Data)
		}
	}
	if ip := o.IP; ip != nil {
		n += strs(ip.Ports) + strs(ip.Clients) + strs(ip.Domains) + 24*len(ip.Starts)
	}
	if e := o.Endpoint; e != nil {
		n += 256 + len(e.Addr) + strs(e.ConnStates) + strs(e.Services) + strs(e.Clients) + strs(e.Domains) + 24*len(e.Starts)
	}
	if c := o.Scan; c != nil {
		n += 256 + len(c.Addr) + len(c.Sketch) + strs(c.Sample) + strs(c.OpenSample) + strs(c.Clients)
	}
	if h := o.HTTP; h != nil {
		n += len(h.Host) + len(h.URI) + strs(h.UserAgents) + 8*len(h.Statuses) + strs(h.Servers) + strs(h.Clients)
	}
	if t := o.TLS; t != nil {
		n += len(t.ServerName) + strs(t.Versions) + strs(t.JA3) + strs(t.JA4) + strs(t.ALPN) + strs(t.Servers) + strs(t.Clients)
	}
	if f := o.File; f != nil {
		n += 256 + strs(f.Filenames) + strs(f.Hosts)
	}
	if x := o.Notice; x != nil {
		n += len(x.Note) + strs(x.Msgs) + strs(x.Src) + strs(x.Dst)
	}
	if a := o.Alert; a != nil {
		n += len(a.Signature) + len(a.Category) + strs(a.Src) + strs(a.Dst)
	}
	return n + sizeOfBehaviour(o) + sizeOfC2(o)
}

func strs(ss []string) int {
	n := 0
	for _, s := range ss {
		n += len(s) + stringOverhead
	}
	return n
}

// Named reports whether a DNS answer seen so far carried the address.
func (s *Set) Named(a netip.Addr) bool { return s.named[a.Unmap()] }

// Len is the number of observables held.
func (s *Set) Len() int { return len(s.m) }

func (s *Set) evict(n int) {
	all := make([]*entry, 0, len(s.m))
	for _, e := range s.m {
		all = append(all, e)
	}
	slices.SortFunc(all, func(a, b *entry) int { return cmp.Compare(a.tick, b.tick) })
	for _, e := range all[:max(n, 1)] {
		delete(s.m, key{e.o.Type, Key(e.o)})
		s.bytes -= e.size
		s.out(e.o)
		*e = entry{}
		s.free = append(s.free, e)
	}
}

func (s *Set) out(o *records.Observable) {
	if o.IP != nil {
		o.IP.Domains = union(o.IP.Domains, s.names[o.Value], MaxList)
	}
	if e := o.Endpoint; e != nil {
		e.Domains = union(e.Domains, s.names[e.Addr], MaxList)
	}
	if s.err != nil {
		return
	}
	s.err = s.emit(o)
}

var typeOrder = map[string]int{
	records.ObsDomain: 0, records.ObsIP: 1, records.ObsEndpoint: 2, records.ObsScan: 3, records.ObsHTTP: 4, records.ObsTLS: 5,
	records.ObsICMP: 6, records.ObsFile: 7, records.ObsNotice: 8, records.ObsAlert: 9,
	records.ObsTrace: 10, records.ObsProcess: 11, records.ObsPath: 12, records.ObsNetcall: 13, records.ObsPersistence: 14,
	records.ObsEvasion: 15, records.ObsC2Channel: 16, records.ObsC2Command: 17,
	records.ObsAttack: 18,
}

// Flush emits everything held, by type (domain, ip, endpoint, scan, http,
// tls, icmp, file, notice, alert, trace, process, path, netcall,
// persistence, evasion, c2-channel, c2-command, attack), then first
// sighting, then value; it returns the first error emit returned.
func (s *Set) Flush() error {
	// The type's rank is looked up once per observable, not twice per
	// comparison.
	type ranked struct {
		rank int
		o    *records.Observable
	}
	all := make([]ranked, 0, len(s.m))
	for _, e := range s.m {
		all = append(all, ranked{typeOrder[e.o.Type], e.o})
	}
	slices.SortFunc(all, func(a, b ranked) int {
		if c := cmp.Compare(a.rank, b.rank); c != 0 {
			return c
		}
		if c := a.o.FirstSeen.Compare(b.o.FirstSeen); c != 0 {
			return c
		}
		if c := strings.Compare(a.o.Value, b.o.Value); c != 0 {
			return c
		}
		return strings.Compare(a.o.Cycle, b.o.Cycle)
	})
	for _, r := range all {
		s.out(r.o)
	}
	clear(s.m)
	s.bytes = 0
	return s.err
}
