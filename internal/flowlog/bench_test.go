package flowlog

import (
	"bytes"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// BenchmarkQuery reads a flow log of 100,000 scan connections through a
// port filter, as tb-parse flows does.
func BenchmarkQuery(b *testing.B) {
	log := encode(b, scanConns(100000, 1))
	q := Query{Ports: []uint16{2323}}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		n := 0
		err := Each(bytes.NewReader(log), func(_ int64, rec *Record) error {
			if q.match(rec) {
				n++
			}
			return nil
		})
		if err != nil || n == 0 {
			b.Fatal(n, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100000), "ns/conn")
}

// BenchmarkTSV writes a flow log of 100,000 connections as Zeek's TSV.
func BenchmarkTSV(b *testing.B) {
	log := encode(b, scanConns(100000, 1))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		t, err := NewTSVWriter(io.Discard, time.Unix(0, 0))
		if err != nil {
			b.Fatal(err)
		}
		if err := Each(bytes.NewReader(log), func(_ int64, rec *Record) error { return t.Write(rec) }); err != nil {
			b.Fatal(err)
		}
		if err := t.Close(time.Unix(0, 0)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100000), "ns/conn")
}

// BenchmarkParse compares the reader's parse of a line with gjson's, the
// other fast path, reading the same fields (the TSV's): it is why the
// reader reads by layout.
func BenchmarkParse(b *testing.B) {
	conns := scanConns(10000, 1)
	var lines [][]byte
	for i := range conns {
		conns[i].UID = "Cx1" + strconv.FormatInt(int64(i+1), 36)
		lines = append(lines, AppendJSON(nil, &conns[i]))
	}
	b.Run("layout", func(b *testing.B) {
		r := &Reader{}
		b.ReportAllocs()
		for i := range b.N {
			if !r.parse(lines[i%len(lines)]) {
				b.Fatal("not read")
			}
		}
	})
	b.Run("gjson", func(b *testing.B) {
		paths := make([]string, len(zeekFields))
		for i, f := range zeekFields {
			paths[i] = strings.ReplaceAll(f.name, ".", `\.`)
		}
		b.ReportAllocs()
		for i := range b.N {
			if !gjson.GetManyBytes(lines[i%len(lines)], paths...)[0].Exists() {
				b.Fatal("not read")
			}
		}
	})
}
