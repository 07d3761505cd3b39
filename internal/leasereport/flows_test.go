package leasereport

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
)

// BenchmarkFlowRead reads a flow log of 100,000 scan connections as the
// report does, endpoint key included.
func BenchmarkFlowRead(b *testing.B) {
	var buf bytes.Buffer
	w, err := flowlog.NewWriter(&buf)
	uids := flowlog.NewUIDs("b")
	if err != nil {
		b.Fatal(err)
	}
	start := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC).UnixNano()
	for i := range 100000 {
		c := flowlog.Conn{UIDs: uids, UIDSeq: uids.Next(), Start: start + int64(i)*1e7, End: start + int64(i)*1e7 + 3e8, Proto: "tcp",
			OrigH: netip.MustParseAddr("10.13.37.5"), OrigP: uint16(1024 + i%60000),
			RespH: netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), RespP: 23, ConnState: "REJ", History: "Sr",
			OrigPkts: 1, OrigIPBytes: 40, RespPkts: 1, RespIPBytes: 40}
		if err := w.Write(&c); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	fr, err := flowlog.NewReader()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		var key []byte
		est := 0
		err := fr.Each(bytes.NewReader(buf.Bytes()), func(_ int64, rec *flowlog.Record) error {
			key = endpoint.Append(key[:0], rec.RespH, rec.RespP, rec.Proto)
			if rec.Established() {
				est++
			}
			return nil
		})
		if err != nil || len(key) == 0 {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100000), "ns/conn")
}
