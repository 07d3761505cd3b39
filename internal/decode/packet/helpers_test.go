package packet

import (
	"bytes"
	"io"
	"net/netip"
	"os"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Documentation addresses stand in for the lab and the internet.
var (
	client  = netip.MustParseAddr("10.13.37.5")
	server  = netip.MustParseAddr("203.0.113.7")
	dnssrv  = netip.MustParseAddr("198.51.100.53")
	client6 = netip.MustParseAddr("2001:db8::5")
	server6 = netip.MustParseAddr("2001:db8:1::7")
)

func ap(a netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(a, p) }

// result is what one capture produced: the observables by "type value"
// (and each 5-tuple's connections in Flows), and the decoder's counts.
type result struct {
	*decodetest.Sink
	stats Stats
}

func (r result) get(t *testing.T, typ, value string) *records.Observable { return r.Get(t, typ, value) }

func (r result) count(typ string) int { return r.Count(typ) }

var connKey = decodetest.FlowKey

// capture writes a capture with build and returns its bytes.
func capture(t testing.TB, opt pcapgen.Options, build func(g *pcapgen.Gen)) []byte {
	t.Helper()
	var buf bytes.Buffer
	g, err := pcapgen.New(&buf, opt)
	if err != nil {
		t.Fatal(err)
	}
	build(g)
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// decodeCapture runs the decoder over a capture.
func decodeCapture(t testing.TB, data []byte, maxFlows int) result {
	t.Helper()
	origin := observe.Origin{Input: "test.pcap", Source: "pcap"}
	sink := decodetest.New(origin)
	rd, err := capfile.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	d := New(Config{MaxFlows: maxFlows, Origin: origin, Sink: sink})
	var p capfile.Packet
	for {
		err := rd.Next(&p)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		d.Packet(&p)
		if d.flows.n > d.cfg.MaxFlows {
			t.Fatalf("flow table holds %d > %d", d.flows.n, d.cfg.MaxFlows)
		}
	}
	d.Finish()
	if os.Getenv(FaultEnv) == "" {
		d.noFaults(t)
	}
	sink.Finish(t)
	return result{Sink: sink, stats: d.Stats}
}

// noFaults fails t if the decoder failed on a packet: it passes over such
// a packet (Decoder.survive), which would otherwise hide a bug from the
// tests and the fuzzers.
func (d *Decoder) noFaults(t testing.TB) {
	t.Helper()
	if d.Faults > 0 {
		t.Fatalf("the decoder failed on %d packet(s), the first at %s\n%s", d.Faults, d.Fault, d.faultStack)
	}
}

func run(t testing.TB, opt pcapgen.Options, build func(g *pcapgen.Gen)) result {
	t.Helper()
	return decodeCapture(t, capture(t, opt, build), 0)
}

// list is every flow in the table.
func (t *flowTable) list() []*flow {
	var fs []*flow
	for _, s := range t.slots {
		if s.f != nil {
			fs = append(fs, s.f)
		}
	}
	return fs
}
