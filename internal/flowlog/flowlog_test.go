package flowlog

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"net/netip"
	"strconv"
	"testing"
)

// scanConns makes n connections shaped like a Mirai-family telnet scan: one
// SYN to a random public address every ~10 ms, mostly answered by RST.
func scanConns(n int, seed int64) []Conn {
	r := rand.New(rand.NewSource(seed))
	guest := netip.MustParseAddr("10.13.37.5")
	out := make([]Conn, n)
	t := int64(1763683200e9)
	for i := range out {
		t += r.Int63n(20e6)
		var a [4]byte
		r.Read(a[:])
		a[0] = 1 + a[0]%223
		c := Conn{Start: t, End: t, Proto: "tcp", OrigH: guest, OrigP: uint16(1024 + r.Intn(64000)),
			RespH: netip.AddrFrom4(a), RespP: 23, ConnState: "S0", History: "S", OrigPkts: 1, OrigIPBytes: 40}
		if i%10 == 0 {
			c.RespP = 2323
		}
		switch x := r.Intn(100); {
		case x < 90:
			c.End += r.Int63n(300e6)
			c.ConnState, c.History, c.RespPkts, c.RespIPBytes = "REJ", "Sr", 1, 40
		case x < 98:
			c.End += r.Int63n(300e6)
			c.ConnState, c.History, c.OrigPkts, c.OrigIPBytes, c.RespPkts, c.RespIPBytes = "RSTO", "ShR", 2, 80, 1, 44
		}
		out[i] = c
	}
	return out
}

// encode writes conns as a flow log, naming those without a uid "Cx1"
// and their 1-based index in base 36, as a decoder's UIDs would.
func encode(t testing.TB, conns []Conn) []byte {
	var buf bytes.Buffer
	w, err := NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for i := range conns {
		if conns[i].UID == "" {
			conns[i].UID = "Cx1" + strconv.FormatInt(int64(i+1), 36)
		}
		if err := w.Write(&conns[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A scanning bot's connections cost at most 32 bytes each in the flow log.
func TestScanConnectionsFitIn32Bytes(t *testing.T) {
	conns := scanConns(200000, 1)
	b := encode(t, conns)
	per := float64(len(b)) / float64(len(conns))
	t.Logf("%d connections, %d bytes: %.1f bytes per connection", len(conns), len(b), per)
	if per > 32 {
		t.Fatalf("%.1f bytes per connection, want at most 32", per)
	}
}

// Lines read back are Zeek conn.log JSON with the connection's values.
func TestLinesAreZeekConnJSON(t *testing.T) {
	conns := scanConns(1000, 2)
	conns[3].Service = "ssl"
	var got []map[string]any
	err := Each(bytes.NewReader(encode(t, conns)), func(n int64, rec *Record) error {
		var m map[string]any
		if err := json.Unmarshal(rec.Line, &m); err != nil {
			t.Fatalf("line %d: %v: %s", n, err, rec.Line)
		}
		got = append(got, m)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(conns) {
		t.Fatalf("%d lines, want %d", len(got), len(conns))
	}
	c, m := conns[3], got[3]
	if m["id.resp_h"] != c.RespH.String() || m["id.resp_p"] != float64(c.RespP) || m["proto"] != "tcp" || m["service"] != "ssl" ||
		m["conn_state"] != c.ConnState || m["ts"] != float64(c.Start/1e3)/1e6 || m["uid"] == got[4]["uid"] {
		t.Fatalf("line 4: %v, from %+v", m, c)
	}
}

func BenchmarkWrite(b *testing.B) {
	conns := scanConns(100000, 1)
	uids := NewUIDs("x1")
	for i := range conns {
		conns[i].UIDs, conns[i].UIDSeq = uids, uids.Next()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		var n int
		w, _ := NewWriter(discard{&n})
		for i := range conns {
			w.Write(&conns[i])
		}
		w.Close()
		b.ReportMetric(float64(n)/float64(len(conns)), "bytes/conn")
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(conns)), "ns/conn")
}

type discard struct{ n *int }

func (d discard) Write(p []byte) (int, error) { *d.n += len(p); return len(p), nil }
