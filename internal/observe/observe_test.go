package observe

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/distinct"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

var t0 = time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)

func domain(o Origin, at time.Duration, addr string) *records.Observable {
	obs := o.New(records.ObsDomain, "c2.example", t0.Add(at), 1, 0)
	obs.Domain = &records.DomainInfo{Queries: 1, QTypes: []string{"A"}, Addrs: []string{addr},
		Answers: []records.DNSAnswer{{Name: "c2.example", Type: "A", Data: addr, TTL: 60}}}
	return obs
}

func TestMerge(t *testing.T) {
	a := domain(Origin{Cycle: "cycle_1", Input: "a.pcap"}, time.Minute, "192.0.2.1")
	b := domain(Origin{Cycle: "cycle_2", Input: "b.pcap"}, 0, "192.0.2.2")
	c := domain(Origin{Cycle: "cycle_3", Input: "c.pcap"}, 2*time.Minute, "192.0.2.1")
	Merge(a, b)
	Merge(a, c)
	if a.Count != 3 || !a.FirstSeen.Equal(t0) || !a.LastSeen.Equal(t0.Add(2*time.Minute)) || a.Cycle != "cycle_3" {
		t.Errorf("count %d first %v last %v cycle %s", a.Count, a.FirstSeen, a.LastSeen, a.Cycle)
	}
	if !slices.Equal(a.Domain.Addrs, []string{"192.0.2.1", "192.0.2.2"}) || len(a.Domain.Answers) != 2 || a.Domain.Queries != 3 {
		t.Errorf("%+v", a.Domain)
	}
	if !slices.Equal(a.Cycles, []string{"cycle_1", "cycle_2", "cycle_3"}) || len(a.Provenance) != 3 {
		t.Errorf("cycles %v provenance %v", a.Cycles, a.Provenance)
	}
}

func TestMergeBounds(t *testing.T) {
	o := Origin{Input: "x"}
	a := o.New(records.ObsIP, "192.0.2.1", t0, 1, 0)
	a.IP = &records.IPInfo{Conns: 1, Starts: []time.Time{t0}}
	for i := 1; i < 1000; i++ {
		b := Origin{Input: fmt.Sprint(i)}.New(records.ObsIP, "192.0.2.1", t0.Add(time.Duration(i)*time.Second), int64(i), 0)
		b.IP = &records.IPInfo{Conns: 1, Ports: []string{fmt.Sprintf("tcp/%d", i)}, Starts: []time.Time{b.FirstSeen}}
		Merge(a, b)
	}
	ip := a.IP
	if ip.Conns != 1000 || len(ip.Ports) != MaxList || len(ip.Starts) != MaxStarts || len(a.Provenance) != MaxProvenance {
		t.Fatalf("conns %d ports %d starts %d provenance %d", ip.Conns, len(ip.Ports), len(ip.Starts), len(a.Provenance))
	}
	// The most recent start times are kept, in order.
	if !ip.Starts[MaxStarts-1].Equal(t0.Add(999*time.Second)) || !slices.IsSortedFunc(ip.Starts, func(x, y time.Time) int { return x.Compare(y) }) {
		t.Errorf("starts end at %v", ip.Starts[MaxStarts-1])
	}
}

func TestSetDedupesAndBounds(t *testing.T) {
	var out []*records.Observable
	s := NewSet(4, func(o *records.Observable) error { out = append(out, o); return nil })
	o := Origin{Input: "x"}
	for i := 0; i < 10; i++ {
		for j := 0; j < 3; j++ {
			obs := o.New(records.ObsDomain, fmt.Sprintf("n%d.example", i), t0.Add(time.Duration(i)*time.Second), 1, 0)
			obs.Domain = &records.DomainInfo{Queries: 1}
			s.Add(obs)
			if s.Len() > 4 {
				t.Fatalf("holds %d", s.Len())
			}
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(out) != 10 {
		t.Fatalf("%d emitted, want 10", len(out))
	}
	for _, o := range out {
		if o.Count != 3 {
			t.Errorf("%s count %d", o.Value, o.Count)
		}
	}
}

func TestFlushOrderAndDomainsOfIPs(t *testing.T) {
	var out []string
	s := NewSet(0, func(o *records.Observable) error {
		out = append(out, o.Type+" "+o.Value+fmt.Sprint(o.IP != nil && len(o.IP.Domains) > 0))
		return nil
	})
	o := Origin{Input: "x"}
	ip := o.New(records.ObsIP, "192.0.2.1", t0, 1, 0)
	ip.IP = &records.IPInfo{Conns: 1}
	s.Add(ip)
	s.Add(domain(o, time.Second, "192.0.2.1"))
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out, []string{"domain c2.examplefalse", "ip 192.0.2.1true"}) {
		t.Errorf("%v", out)
	}
}

// Large observables are bounded by size as well as by number.
func TestSetByteBudget(t *testing.T) {
	emitted := 0
	s := NewSet(1<<20, func(*records.Observable) error { emitted++; return nil })
	ua := strings.Repeat("u", 512)
	for i := 0; i < 20000; i++ {
		o := Origin{Input: "x"}.New(records.ObsHTTP, fmt.Sprintf("GET http://h/%d/%s", i, strings.Repeat("p", 5000)), t0, 1, 0)
		o.HTTP = &records.HTTPInfo{Method: "GET"}
		for j := 0; j < MaxList; j++ {
			o.HTTP.UserAgents = append(o.HTTP.UserAgents, fmt.Sprint(j, ua))
		}
		s.Add(o)
		if len(o.Value) > MaxValue {
			t.Fatalf("value of %d bytes kept", len(o.Value))
		}
		if s.bytes > MaxHeldBytes+sizeOf(o) {
			t.Fatalf("holds %d bytes", s.bytes)
		}
	}
	if err := s.Flush(); err != nil || emitted != 20000 {
		t.Fatalf("%v, %d emitted", err, emitted)
	}
}

// Two cycles' sightings of one scan unite their destinations' sketches:
// the merged count and ScanDests are the union's estimate, not the sum of
// destinations both cycles reached; without sketches the larger count
// stands as a lower bound.
func TestScanSketchesUnite(t *testing.T) {
	scan := func(cycle string, from int) *records.Observable {
		var d distinct.Counter
		for i := range 10000 {
			d.Add(uint64(from + i))
		}
		n, _ := d.Count()
		obs := Origin{Cycle: cycle}.New(records.ObsScan, "tcp/23", t0, 1, 0)
		obs.Scan = &records.ScanInfo{Proto: "tcp", Port: 23, Conns: 10000, Dests: n, Estimated: true, Sketch: d.Sketch().String()}
		return obs
	}
	a, b := scan("cycle_1", 0), scan("cycle_2", 5000)
	if n := ScanDests([]*records.ScanInfo{a.Scan, b.Scan}); n < 15000*95/100 || n > 15000*105/100 {
		t.Errorf("ScanDests %d, want about 15000", n)
	}
	Merge(a, b)
	if n := a.Scan.Dests; n < 15000*95/100 || n > 15000*105/100 || a.Scan.Conns != 20000 {
		t.Errorf("merged scan: %d destinations of %d connections, want about 15000 of 20000", n, a.Scan.Conns)
	}
	c, d := scan("cycle_3", 0), scan("cycle_4", 5000)
	d.Scan.Sketch = ""
	if n, want := ScanDests([]*records.ScanInfo{c.Scan, d.Scan}), max(c.Scan.Dests, d.Scan.Dests); n != want {
		t.Errorf("ScanDests without a sketch: %d, want the larger count %d", n, want)
	}
}
