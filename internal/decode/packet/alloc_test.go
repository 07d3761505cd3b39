package packet

import (
	"bytes"
	"io"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

type discard struct{}

func (discard) Add(*records.Observable) {}
func (discard) Conn(*flowlog.Conn)      {}

func origin() observe.Origin { return observe.Origin{Input: "test", Source: "pcap"} }

// readAll copies every packet of a capture.
func readAll(t testing.TB, data []byte) []capfile.Packet {
	rd, err := capfile.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var out []capfile.Packet
	for {
		var p capfile.Packet
		err := rd.Next(&p)
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		p.Data = append([]byte(nil), p.Data...)
		out = append(out, p)
	}
}
