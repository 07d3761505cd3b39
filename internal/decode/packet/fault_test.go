//go:build talkboxtest

package packet

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode"
	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
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

// TestMemoryFaultGoesOnUp: a memory fault in a frame (its bytes in a mapped
// capture cut short as it is read, with faults made panics as
// capfile.Mapped.Guard makes them) is not a decoder bug to count and pass
// over: it goes on up to the Guard, which names the file.
func TestMemoryFaultGoesOnUp(t *testing.T) {
	data := faultCapture(t)
	// A frame that is not IP, of a length that puts the next record's
	// data at the start of the file's third page.
	const page = 4096
	filler := make([]byte, 2*page-24-16-16)
	var file bytes.Buffer
	file.Write(data[:24])
	binary.Write(&file, binary.LittleEndian, []uint32{1700000000, 0, uint32(len(filler)), uint32(len(filler))})
	file.Write(filler)
	file.Write(data[24:])
	path := filepath.Join(t.TempDir(), "c.pcap")
	if err := os.WriteFile(path, file.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	m := decodetest.MapFile(t, path)
	rd, err := m.Reader()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 2*page); err != nil {
		t.Fatal(err)
	}
	d := New(Config{Sink: discard{}})
	var p capfile.Packet
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if _, ok := r.(interface{ Addr() uintptr }); !ok || p.N != 2 || d.Faults != 0 {
			t.Errorf("recovered %v at packet %d with %d faults counted (%s); want a memory fault at packet 2, none counted", r, p.N, d.Faults, d.Fault)
		}
	}()
	for rd.Next(&p) == nil {
		d.Packet(&p)
	}
	t.Errorf("no panic: %d packets, %d faults (%s)", p.N, d.Faults, d.Fault)
}
