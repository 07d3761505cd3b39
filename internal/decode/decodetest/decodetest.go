// Package decodetest is the decoders' test sink: it keeps what a decoder
// found as the tests of each decoder look it up, connections included.
package decodetest

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"maps"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode"
	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/lines"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Sink collects observables by "type value", merged as a Set merges them,
// and every connection. Finish folds the connections into the endpoint,
// ip and scan observables tb-parse writes, and sums each 5-tuple's
// connections into Flows for the tests of the decoders' Zeek-like
// accounting (tb-parse writes each connection to its flow log instead).
type Sink struct {
	Obs   map[string]*records.Observable
	Conns []flowlog.Conn
	// Flows are the connections by 5-tuple (FlowKey), summed by Finish.
	Flows map[string]*Flow
	set   *observe.Set
	dests *flowlog.Dests
	o     observe.Origin
}

// Flow is the connections of one 5-tuple, summed as Zeek's conn.log would
// count them one after the other.
type Flow struct {
	Count                            int64 // connections
	Service, ConnState, Outcome      string
	OrigPkts, OrigBytes, OrigIPBytes int64
	RespPkts, RespBytes, RespIPBytes int64
	Duration                         float64     // seconds, summed
	Starts                           []time.Time // one per connection
	FirstSeen, LastSeen              time.Time
	// Packet or Line is where the first connection was seen in its input.
	Packet, Line int64
}

// FlowKey is a 5-tuple's key in Flows: "proto orig_h:orig_p>resp_h:resp_p".
func FlowKey(proto string, oh netip.Addr, op uint16, rh netip.Addr, rp uint16) string {
	return proto + " " + netip.AddrPortFrom(oh, op).String() + ">" + netip.AddrPortFrom(rh, rp).String()
}

// New returns an empty Sink for connections seen in origin.
func New(origin observe.Origin) *Sink {
	s := &Sink{Obs: map[string]*records.Observable{}, Flows: map[string]*Flow{}, o: origin}
	s.set = observe.NewSet(0, func(o *records.Observable) error {
		k := o.Type + " " + o.Value
		if prev := s.Obs[k]; prev != nil {
			observe.Merge(prev, o)
		} else {
			s.Obs[k] = o
		}
		return nil
	})
	s.dests = flowlog.NewDests(origin.Cycle, s.set.Named, s.set.Add)
	return s
}

func (s *Sink) Add(o *records.Observable) { s.set.Add(o) }

func (s *Sink) Conn(c *flowlog.Conn) {
	s.Conns = append(s.Conns, *c)
	s.dests.Conn(c, &s.o)
}

// ReadLog runs a sensor log's reader (zeek.Read, eve.Read) over data with
// origin, and returns its findings, finished, and the reader's line counts.
func ReadLog(t testing.TB, read func(context.Context, *bufio.Reader, observe.Origin, decode.Sink) (lines.Stats, error),
	origin observe.Origin, data []byte) (*Sink, lines.Stats) {
	t.Helper()
	s := New(observe.Origin{})
	st, err := read(context.Background(), bufio.NewReader(bytes.NewReader(data)), origin, s)
	if err != nil {
		t.Fatal(err)
	}
	s.Finish(t)
	return s, st
}

// Finish emits what the set and the destinations hold, and sums the
// connections into Flows.
func (s *Sink) Finish(t testing.TB) {
	t.Helper()
	s.dests.Flush()
	if err := s.set.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, c := range s.Conns {
		k := FlowKey(c.Proto, c.OrigH, c.OrigP, c.RespH, c.RespP)
		f := s.Flows[k]
		if f == nil {
			f = &Flow{FirstSeen: time.Unix(0, c.Start).UTC(), Packet: c.Packet, Line: c.Line}
			s.Flows[k] = f
		}
		f.LastSeen = time.Unix(0, c.End).UTC()
		f.Count++
		f.ConnState, f.Outcome = c.ConnState, Outcome(c.Proto, c.ConnState, c.RespPkts)
		f.Service = cmp.Or(f.Service, c.Service)
		f.OrigPkts += c.OrigPkts
		f.OrigBytes += c.OrigBytes
		f.OrigIPBytes += c.OrigIPBytes
		f.RespPkts += c.RespPkts
		f.RespBytes += c.RespBytes
		f.RespIPBytes += c.RespIPBytes
		f.Duration += float64(c.End-c.Start) / 1e9
		f.Starts = append(f.Starts, time.Unix(0, c.Start).UTC())
	}
}

// Flow is the connections of a 5-tuple (FlowKey), or a test failure.
func (s *Sink) Flow(t testing.TB, key string) *Flow {
	t.Helper()
	f := s.Flows[key]
	if f == nil {
		t.Fatalf("no connection %q; have %q", key, slices.Sorted(maps.Keys(s.Flows)))
	}
	return f
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

// Outcome summarises a conn_state: attempted, rejected, reset,
// established, partial (TCP); answered or unanswered (others).
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

// MapFile maps the capture file at path (capfile.Map) for the rest of the
// test, and fails the test if it cannot.
func MapFile(t testing.TB, path string) *capfile.Mapped {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m := capfile.Map(f, fi.Size())
	if m == nil {
		t.Fatalf("%s: not mapped", path)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
