package leasereport

import (
	"bytes"
	"github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"net/netip"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
)

// The layout reader and the field reader agree on every line flowlog
// writes; lines in another order, with nested values or escapes, are read
// too.
func TestConnParse(t *testing.T) {
	start := time.Date(2026, 11, 20, 9, 0, 0, 123456000, time.UTC).UnixNano()
	conns := []observe.Conn{
		{Start: start, End: start + 5e8, Proto: "tcp", OrigH: netip.MustParseAddr("10.13.37.10"), OrigP: 40000,
			RespH: netip.MustParseAddr("198.51.100.18"), RespP: 80, Service: "http", ConnState: "SF", History: "ShADadFf",
			OrigPkts: 6, OrigBytes: 90, RespPkts: 5, RespBytes: 200},
		{Start: start, End: start, Proto: "tcp", OrigH: netip.MustParseAddr("10.13.37.10"), OrigP: 40001,
			RespH: netip.MustParseAddr("203.0.113.9"), RespP: 23, ConnState: "S0", OrigPkts: 2},
		{Start: start, End: start + 1e6, Proto: "udp", OrigH: netip.MustParseAddr("2001:db8::10"), OrigP: 5353,
			RespH: netip.MustParseAddr("2001:db8::1"), RespP: 53, Service: "dns", ConnState: "SF", OrigPkts: 1, RespPkts: 1},
	}
	var buf bytes.Buffer
	w, err := flowlog.NewWriter(&buf, "t")
	if err != nil {
		t.Fatal(err)
	}
	for i := range conns {
		if err := w.Write(&conns[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	fr, err := newFlowReader()
	if err != nil {
		t.Fatal(err)
	}
	var got []conn
	err = fr.each(bytes.NewReader(buf.Bytes()), func(n int64, c *conn) error {
		line := flowlog.AppendJSON(nil, &conns[n-1], "t", n)
		var byLayout, byFields conn
		if !byLayout.parseLayout(line) || !byFields.parseFields(line) {
			t.Fatalf("line %d not read: %s", n, line)
		}
		if !same(&byLayout, &byFields) || !same(&byLayout, c) {
			t.Errorf("line %d: layout %+v, fields %+v, read %+v", n, byLayout, byFields, *c)
		}
		got = append(got, conn{ns: c.ns, host: bytes.Clone(c.host), proto: bytes.Clone(c.proto), stat: bytes.Clone(c.stat), port: c.port,
			respPkts: c.respPkts})
		return nil
	})
	if err != nil || len(got) != 3 {
		t.Fatal(len(got), err)
	}
	if got[0].ns != start || string(got[0].host) != "198.51.100.18" || got[0].port != 80 || !got[0].established() ||
		got[1].established() || string(got[2].host) != "2001:db8::1" || !got[2].established() {
		t.Errorf("read %+v", got)
	}
	if k := endpoint.Append(nil, got[2].host, got[2].port, got[2].proto); string(k) != "[2001:db8::1]:53/udp" {
		t.Errorf("endpoint %s", k)
	}

	for i, line := range []string{
		`{"uid":"C1","ts":1763629200.5,"id.resp_p":23,"id.resp_h":"203.0.113.9","proto":"tcp","tunnel_parents":["a\"]b",{"x":[1]}],"conn_state":"REJ","resp_pkts":1}`,
		`{"ts":1763629200.5,"uid":"C\"1","id.orig_h":"10.13.37.10","id.orig_p":1,"id.resp_h":"203.0.113.9","id.resp_p":23,"proto":"tcp","conn_state":"REJ","resp_pkts":1}`,
	} {
		var c conn
		if i == 0 && c.parseLayout([]byte(line)) {
			t.Errorf("read by layout: %s", line)
		}
		if !c.parse([]byte(line)) || c.ns != 1763629200500000000 || string(c.host) != "203.0.113.9" || c.port != 23 ||
			string(c.stat) != "REJ" || c.respPkts != 1 {
			t.Errorf("%s: %+v", line, c)
		}
	}
	var c conn
	if c.parse([]byte(`{"uid":"C1"}`)) || c.parse([]byte(`not json`)) {
		t.Error("a line without ts read")
	}
}

func same(a, b *conn) bool {
	return a.ns == b.ns && bytes.Equal(a.host, b.host) && bytes.Equal(a.proto, b.proto) && bytes.Equal(a.stat, b.stat) &&
		a.port == b.port && a.respPkts == b.respPkts
}
