package observe

import (
	"cmp"
	"slices"
	"sort"

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

type entry struct {
	o    *records.Observable
	tick uint64
	size int
}

// Set deduplicates observables within a run. It holds at most max distinct
// ones: beyond that, half are emitted early (flows first, then the least
// recently updated), and a later sighting of one of them starts a new
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
	nameB int
	free  []*entry
}

// NewSet returns a Set that passes deduplicated observables to emit.
func NewSet(max int, emit func(*records.Observable) error) *Set {
	if max <= 0 {
		max = DefaultMaxHeld
	}
	return &Set{max: max, m: make(map[key]*entry), emit: emit, names: make(map[string][]string)}
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
		}
	}
	k := key{o.Type, o.Value}
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
	if f := o.Flow; f != nil {
		n += 256 + len(f.OrigH) + len(f.RespH) + 24*len(f.Starts)
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
	return n
}

func strs(ss []string) int {
	n := 0
	for _, s := range ss {
		n += len(s) + stringOverhead
	}
	return n
}

// Len is the number of observables held.
func (s *Set) Len() int { return len(s.m) }

func (s *Set) evict(n int) {
	all := make([]*entry, 0, len(s.m))
	for _, e := range s.m {
		all = append(all, e)
	}
	// Flows go first: a connection is rarely seen again, while names and
	// addresses are; then the least recently updated.
	slices.SortFunc(all, func(a, b *entry) int {
		fa, fb := a.o.Type == records.ObsFlow, b.o.Type == records.ObsFlow
		if fa != fb {
			if fa {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.tick, b.tick)
	})
	for _, e := range all[:max(n, 1)] {
		delete(s.m, key{e.o.Type, e.o.Value})
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
	if s.err != nil {
		return
	}
	s.err = s.emit(o)
}

var typeOrder = map[string]int{
	records.ObsDomain: 0, records.ObsIP: 1, records.ObsFlow: 2, records.ObsHTTP: 3, records.ObsTLS: 4,
	records.ObsICMP: 5, records.ObsFile: 6, records.ObsNotice: 7, records.ObsAlert: 8,
}

// Flush emits everything held, by type (domain, ip, flow, http, tls, icmp,
// file, notice, alert), then first sighting, then value; it returns the
// first error emit returned.
func (s *Set) Flush() error {
	all := make([]*records.Observable, 0, len(s.m))
	for _, e := range s.m {
		all = append(all, e.o)
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i], all[j]
		if ta, tb := typeOrder[a.Type], typeOrder[b.Type]; ta != tb {
			return ta < tb
		}
		if !a.FirstSeen.Equal(b.FirstSeen) {
			return a.FirstSeen.Before(b.FirstSeen)
		}
		return a.Value < b.Value
	})
	for _, o := range all {
		s.out(o)
	}
	clear(s.m)
	s.bytes = 0
	return s.err
}
