//go:build talkboxtest

package packet

import (
	"bytes"
	"io"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode"
	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// faultCapture is a DNS lookup (packets 1 and 2), then an HTTP request on
// a connection of its own.
func faultCapture(t *testing.T) []byte {
	return capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.DNSOverUDP(ap(client, 40000), ap(dnssrv, 53), pcapgen.DNSQuery(1, "c2.example", layers.DNSTypeA),
			pcapgen.DNSResponse(1, "c2.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{
				pcapgen.A("c2.example", netip.MustParseAddr("203.0.113.7"), 60)}))
		c := g.Dial(ap(client, 40001), ap(server, 80), 100, 200)
		c.Send([]byte("GET /bins/x86 HTTP/1.1\r\nHost: c2.example\r\n\r\n"))
		c.Reply([]byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
		c.Close()
	})
}

// TestFaultedFramePassedOver: a frame the decoder fails on (a panic, here
// crashhook's, where a bug reached by a sample's bytes would be) is counted
// and passed over, and the frames after it are decoded: one packet's bug
// must not cost a sample's whole capture.
func TestFaultedFramePassedOver(t *testing.T) {
	data := faultCapture(t)
	whole := decodeCapture(t, data, 0)
	if whole.stats.Faults != 0 || whole.count(records.ObsDomain) != 1 || whole.count(records.ObsHTTP) != 1 {
		t.Fatalf("without a fault: %d faults, %d domains, %d requests", whole.stats.Faults, whole.count(records.ObsDomain), whole.count(records.ObsHTTP))
	}
	t.Setenv(FaultEnv, "2") // the DNS response
	r := decodeCapture(t, data, 0)
	if r.stats.Faults != 1 || !strings.HasPrefix(r.stats.Fault, "packet 2: crashhook: ") {
		t.Errorf("faults %d, first %q; want 1 at packet 2", r.stats.Faults, r.stats.Fault)
	}
	if d := r.get(t, records.ObsDomain, "c2.example").Domain; d.Responses != 0 || d.Queries != 1 {
		t.Errorf("c2.example: %d queries, %d responses; want the query alone", d.Queries, d.Responses)
	}
	h := r.get(t, records.ObsHTTP, "GET http://c2.example/bins/x86")
	if len(h.HTTP.Statuses) != 1 || h.HTTP.Statuses[0] != 200 {
		t.Errorf("the request after the fault: statuses %v", h.HTTP.Statuses)
	}
	if r.stats.Packets != whole.stats.Packets {
		t.Errorf("%d packets counted, want %d", r.stats.Packets, whole.stats.Packets)
	}
}

// panickySink fails in its Add, as a bug of the caller's would.
type panickySink struct{ decode.Sink }

func (panickySink) Add(*records.Observable) { panic("the sink's own bug") }

// TestSinkPanicGoesOnUp: a panic in the sink is not the decoder's to pass
// over: the caller's sets and store may be left half changed.
func TestSinkPanicGoesOnUp(t *testing.T) {
	rd, err := capfile.NewReader(bytes.NewReader(faultCapture(t)))
	if err != nil {
		t.Fatal(err)
	}
	d := New(Config{Sink: panickySink{}})
	defer func() {
		if r := recover(); r != "the sink's own bug" {
			t.Errorf("recovered %v, want the sink's panic", r)
		}
	}()
	var p capfile.Packet
	for rd.Next(&p) != io.EOF {
		d.Packet(&p)
	}
	d.Finish()
	t.Errorf("no panic: %d faults (%s)", d.Faults, d.Fault)
}
