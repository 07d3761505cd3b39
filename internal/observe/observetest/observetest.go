// Package observetest is the decoders' test sink: it keeps what a decoder
// found as the tests of each decoder look it up, connections included.
package observetest

import (
	"net/netip"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Sink collects observables by "type value", merged as a Set merges them,
// and every connection. Finish folds the connections into the endpoint,
// ip and scan observables tb-parse writes, and sums each 5-tuple's
// connections into a "flow" entry (FlowInfo) for the tests of the
// decoders' Zeek-like accounting.
type Sink struct {
	Obs   map[string]*records.Observable
	Conns []observe.Conn
	set   *observe.Set
	dests *observe.Dests
	o     observe.Origin
}

// New returns an empty Sink for connections seen in origin.
func New(origin observe.Origin) *Sink {
	s := &Sink{Obs: map[string]*records.Observable{}, o: origin}
	s.set = observe.NewSet(0, func(o *records.Observable) error {
		k := o.Type + " " + o.Value
		if prev := s.Obs[k]; prev != nil {
			observe.Merge(prev, o)
		} else {
			s.Obs[k] = o
		}
		return nil
	})
	s.dests = observe.NewDests(origin.Cycle, s.set.Named, s.set.Add)
	return s
}

func (s *Sink) Add(o *records.Observable) { s.set.Add(o) }

func (s *Sink) Conn(c *observe.Conn) {
	s.Conns = append(s.Conns, *c)
	s.dests.Conn(c, &s.o)
}

// Finish emits what the set and the destinations hold.
func (s *Sink) Finish(t testing.TB) {
	t.Helper()
	s.dests.Flush()
	if err := s.set.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, c := range s.Conns {
		v := c.Proto + " " + netip.AddrPortFrom(c.OrigH, c.OrigP).String() + ">" + netip.AddrPortFrom(c.RespH, c.RespP).String()
		start := time.Unix(0, c.Start).UTC()
		f := &records.Observable{Type: records.ObsFlow, Value: v, Count: 1, FirstSeen: start, LastSeen: time.Unix(0, c.End).UTC(),
			Provenance: []records.Provenance{s.o.Prov(c.Packet, c.Line)},
			Flow: &records.FlowInfo{Proto: c.Proto, OrigH: c.OrigH.String(), OrigP: c.OrigP, RespH: c.RespH.String(), RespP: c.RespP,
				Service: c.Service, ConnState: c.ConnState, Outcome: Outcome(c.Proto, c.ConnState, c.RespPkts),
				OrigPkts: c.OrigPkts, OrigBytes: c.OrigBytes, OrigIPBytes: c.OrigIPBytes, RespPkts: c.RespPkts,
				RespBytes: c.RespBytes, RespIPBytes: c.RespIPBytes, Duration: float64(c.End-c.Start) / 1e9,
				Starts: []time.Time{start}}}
		prev := s.Obs["flow "+v]
		if prev == nil {
			s.Obs["flow "+v] = f
			continue
		}
		d := prev.Flow
		prev.Count++
		prev.LastSeen = f.LastSeen
		d.ConnState, d.Outcome = f.Flow.ConnState, f.Flow.Outcome
		d.Service = cmpOr(d.Service, f.Flow.Service)
		d.OrigPkts += c.OrigPkts
		d.OrigBytes += c.OrigBytes
		d.OrigIPBytes += c.OrigIPBytes
		d.RespPkts += c.RespPkts
		d.RespBytes += c.RespBytes
		d.RespIPBytes += c.RespIPBytes
		d.Duration += f.Flow.Duration
		d.Starts = append(d.Starts, start)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Get is the observable of a type and value, or a test failure.
func (s *Sink) Get(t testing.TB, typ, value string) *records.Observable {
	t.Helper()
	o := s.Obs[typ+" "+value]
	if o == nil {
		var keys []string
		for k := range s.Obs {
			keys = append(keys, k)
		}
		t.Fatalf("no %s observable %q; have %q", typ, value, keys)
	}
	return o
}

// Count is the number of observables of a type.
func (s *Sink) Count(typ string) int {
	n := 0
	for _, o := range s.Obs {
		if o.Type == typ {
			n++
		}
	}
	return n
}

// Outcome summarises a conn_state as tb-allow reads a flow observable.
func Outcome(proto, state string, respPkts int64) string {
	if proto != "tcp" {
		if respPkts > 0 {
			return "answered"
		}
		return "unanswered"
	}
	switch state {
	case "S0", "SH":
		return "attempted"
	case "REJ":
		return "rejected"
	case "RSTO", "RSTR", "RSTOS0", "RSTRH":
		return "reset"
	case "S1", "S2", "S3", "SF", "SHR":
		return "established"
	}
	return "partial"
}
