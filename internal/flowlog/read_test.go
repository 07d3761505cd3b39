package flowlog

import (
	"bytes"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// record is a Record with its slices copied out of the reader.
type record struct {
	ts, dur                                                  int64
	uid, origH, respH, proto, service, state, history        string
	hasService, hasHistory                                   bool
	origP, respP                                             uint16
	origBytes, respBytes, origPkts, origIP, respPkts, respIP int64
	established                                              bool
}

func copyRecord(r *Record) record {
	return record{r.TS, r.Duration, string(r.UID), string(r.OrigH), string(r.RespH), string(r.Proto), string(r.Service),
		string(r.ConnState), string(r.History), r.Service != nil, r.History != nil, r.OrigP, r.RespP, r.OrigBytes, r.RespBytes,
		r.OrigPkts, r.OrigIPBytes, r.RespPkts, r.RespIPBytes, r.Established()}
}

func readRecords(t *testing.T, log []byte) ([]record, error) {
	t.Helper()
	var out []record
	err := Each(bytes.NewReader(log), func(n int64, r *Record) error {
		if n != int64(len(out)+1) {
			t.Errorf("line %d numbered %d", len(out)+1, n)
		}
		out = append(out, copyRecord(r))
		return nil
	})
	return out, err
}

func compressed(t *testing.T, text string) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.zw.Write([]byte(text)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Every field flowlog writes is read back, by its layout and by
// encoding/json alike; lines in another order, with escapes, nested values
// or unknown fields are read too.
func TestRecordsReadBack(t *testing.T) {
	start := time.Date(2026, 11, 20, 9, 0, 0, 123456000, time.UTC).UnixNano()
	conns := []Conn{
		{Start: start, End: start + 5e8, Proto: "tcp", OrigH: netip.MustParseAddr("10.13.37.10"), OrigP: 40000,
			RespH: netip.MustParseAddr("198.51.100.18"), RespP: 80, Service: "http", ConnState: "SF", History: "ShADadFf",
			OrigPkts: 6, OrigBytes: 90, OrigIPBytes: 400, RespPkts: 5, RespBytes: 200, RespIPBytes: 500},
		{Start: start, End: start, Proto: "tcp", OrigH: netip.MustParseAddr("10.13.37.10"), OrigP: 40001,
			RespH: netip.MustParseAddr("203.0.113.9"), RespP: 23, ConnState: "S0", OrigPkts: 2},
		{Start: start, End: start + 1e6, Proto: "udp", OrigH: netip.MustParseAddr("2001:db8::10"), OrigP: 5353,
			RespH: netip.MustParseAddr("2001:db8::1"), RespP: 53, Service: "dns", ConnState: "SF", OrigPkts: 1, RespPkts: 1},
	}
	got, err := readRecords(t, encode(t, conns))
	if err != nil || len(got) != len(conns) {
		t.Fatal(len(got), err)
	}
	for i, c := range conns {
		want := record{c.Start, c.End - c.Start, "Cx1" + strconv.Itoa(i+1), c.OrigH.String(), c.RespH.String(), c.Proto, c.Service,
			c.ConnState, c.History, c.Service != "", c.History != "", c.OrigP, c.RespP, c.OrigBytes, c.RespBytes,
			c.OrigPkts, c.OrigIPBytes, c.RespPkts, c.RespIPBytes, c.Established()}
		if got[i] != want {
			t.Errorf("line %d: %+v, want %+v", i+1, got[i], want)
		}
		// The same line read by its layout (the fast path), and by
		// encoding/json.
		line := AppendJSON(nil, &c)
		if byLayout := (Record{Line: line}); !byLayout.parseLayout() || copyRecord(&byLayout) != want {
			t.Errorf("line %d not read by its layout: %s", i+1, line)
		}
		if odd := (Record{Line: bytes.Replace(line, []byte(`"proto"`), []byte(`"prot0"`), 1)}); odd.parseLayout() {
			t.Errorf("line %d read by its layout with a key changed", i+1)
		}
		r := &Reader{}
		r.rec = Record{Line: line}
		if !r.parseJSON(line) || copyRecord(&r.rec) != want {
			t.Errorf("line %d by encoding/json: %+v", i+1, copyRecord(&r.rec))
		}
	}

	foreign := `{"uid":"C1","ts":1763629200.5,"id.resp_p":23,"id.resp_h":"203.0.113.9","proto":"tcp","tunnel_parents":["a\"]b",{"x":[1]}],"conn_state":"REJ","resp_pkts":1}
{"ts":1763629200.5,"uid":"C\"1","id.orig_h":"10.13.37.10","id.orig_p":1,"id.resp_h":"203.0.113.9","id.resp_p":23,"proto":"tcp","service":"","conn_state":"REJ","resp_pkts":1}

`
	got, err = readRecords(t, compressed(t, foreign))
	if err != nil || len(got) != 2 {
		t.Fatal(len(got), err)
	}
	for _, r := range got {
		if r.ts != 1763629200500000000 || r.respH != "203.0.113.9" || r.respP != 23 || r.state != "REJ" || r.respPkts != 1 || r.hasHistory {
			t.Errorf("%+v", r)
		}
	}
	if got[1].uid != `C"1` || !got[1].hasService || got[1].service != "" || got[0].hasService {
		t.Errorf("strings: %+v", got)
	}
}

// A line that is not a connection stops the reader with its line number;
// so does a line over the bound.
func TestBadLines(t *testing.T) {
	good := string(AppendJSON(nil, &Conn{UID: "x1", Proto: "tcp", RespH: netip.MustParseAddr("192.0.2.1")}))
	for _, tc := range []struct{ text, want string }{
		{good + "\n" + `{"uid":"C1"}` + "\n", "line 2: not a conn.log connection"},
		{good + "\nnot json\n", "line 2: not a conn.log connection"},
		{`{"ts":1e9,"id.resp_h":"192.0.2.1","proto":"tcp"}`, "line 1: not a conn.log connection"},
		{good + "\n\n" + `{"ts":1,"id.resp_h":"` + strings.Repeat("1", MaxLine) + `"}` + "\n" + good, "line 3: longer than 262144 bytes"},
	} {
		_, err := readRecords(t, compressed(t, tc.text))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%.40s...: %v, want %s", tc.text, err, tc.want)
		}
	}
}

// A connection's TSV row has Zeek's columns in order, with unset and empty
// fields and escapes as Zeek writes them.
func TestTSVRow(t *testing.T) {
	lines := `{"ts":1763629200.5,"uid":"C1","id.orig_h":"10.13.37.10","id.orig_p":1,"id.resp_h":"203.0.113.9","id.resp_p":23,"proto":"tcp","service":"","duration":0.25,"orig_bytes":3,"resp_bytes":4,"conn_state":"REJ","history":"a\tb","orig_pkts":5,"orig_ip_bytes":6,"resp_pkts":7,"resp_ip_bytes":8}
` + string(AppendJSON(nil, &Conn{UID: "x2", Start: 1e9, End: 3e9, Proto: "udp", OrigH: netip.MustParseAddr("10.13.37.10"), OrigP: 9,
		RespH: netip.MustParseAddr("192.0.2.53"), RespP: 53, ConnState: "S0", OrigPkts: 1}))
	var out bytes.Buffer
	w, err := NewTSVWriter(&out, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := Each(bytes.NewReader(compressed(t, lines)), func(_ int64, r *Record) error { return w.Write(r) }); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(out.String(), "\n")
	want := []string{
		"1763629200.500000\tC1\t10.13.37.10\t1\t203.0.113.9\t23\ttcp\t(empty)\t0.250000\t3\t4\tREJ\t-\t-\t-\ta\\x09b\t5\t6\t7\t8\t-",
		"1.000000\tx2\t10.13.37.10\t9\t192.0.2.53\t53\tudp\t-\t2.000000\t0\t0\tS0\t-\t-\t-\t-\t1\t0\t0\t0\t-",
	}
	if len(rows) != 12 || rows[8] != want[0] || rows[9] != want[1] {
		t.Fatalf("%q", rows)
	}
}

// Addresses match either side, IPv4-mapped or not; ports either port.
func TestQueryMatch(t *testing.T) {
	rec := &Record{OrigH: []byte("10.13.37.10"), RespH: []byte("::ffff:192.0.2.1"), OrigP: 40000, RespP: 80}
	for _, tc := range []struct {
		q    Query
		want bool
	}{
		{Query{}, true},
		{Query{Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}, true},
		{Query{Addrs: []netip.Addr{netip.MustParseAddr("10.13.37.10")}, Ports: []uint16{80}}, true},
		{Query{Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.2")}}, false},
		{Query{Ports: []uint16{40000}}, true},
		{Query{Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, Ports: []uint16{23}}, false},
	} {
		if got := tc.q.match(rec); got != tc.want {
			t.Errorf("%+v: %v", tc.q, got)
		}
	}
}
