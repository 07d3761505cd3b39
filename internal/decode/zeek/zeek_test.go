package zeek

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/lines"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
)

func read(t *testing.T, data []byte) (*decodetest.Sink, lines.Stats) {
	t.Helper()
	return decodetest.ReadLog(t, Read, observe.Origin{Input: "zeek", Source: "zeek"}, data)
}

func readFiles(t *testing.T, names ...string) *decodetest.Sink {
	var all []byte
	for _, n := range names {
		b, err := os.ReadFile("testdata/" + n)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	s, st := read(t, all)
	if st.Bad != 0 {
		t.Fatalf("%d bad lines: %v", st.Bad, st.FirstBad)
	}
	return s
}

func TestTSVLogs(t *testing.T) {
	s := readFiles(t, "conn.log", "dns.log", "http.log", "ssl.log", "files.log", "notice.log")
	f := s.Flow(t, "tcp 10.13.37.5:49152>203.0.113.7:80")
	if fl := f; fl.OrigBytes != 81 || fl.RespBytes != 465 || fl.ConnState != "SF" || fl.Outcome != "established" ||
		fl.OrigPkts != 6 || fl.RespIPBytes != 785 || fl.Duration != 1.5 || fl.Service != "http" {
		t.Errorf("%+v", fl)
	}
	if f.Line != 9 {
		t.Errorf("line %d", f.Line)
	}
	if got := f.LastSeen.Sub(f.FirstSeen).Seconds(); got != 1.5 {
		t.Errorf("span %v", got)
	}
	if fl := s.Flow(t, "tcp 10.13.37.5:49153>203.0.113.8:4444"); fl.Outcome != "attempted" || fl.OrigBytes != 0 {
		t.Errorf("%+v", fl)
	}
	if fl := s.Flow(t, "tcp [2001:db8::5]:49200>[2001:db8:1::7]:443"); fl.Outcome != "reset" {
		t.Errorf("%+v", fl)
	}
	s.Get(t, "icmp", "10.13.37.5>192.0.2.1 8/0")
	d := s.Get(t, "domain", "www.example.com").Domain
	if !slices.Equal(d.Addrs, []string{"203.0.113.9"}) || !slices.Equal(d.CNAMEs, []string{"edge.cdn.example"}) ||
		d.Answers[0].TTL != 300 || d.Answers[1].Type != "A" || !slices.Equal(d.RCodes, []string{"NOERROR"}) {
		t.Errorf("%+v", d)
	}
	if d := s.Get(t, "domain", "nope.example").Domain; !slices.Equal(d.RCodes, []string{"NXDOMAIN"}) {
		t.Errorf("%+v", d)
	}
	if a := s.Get(t, "domain", "t.example").Domain.Answers; len(a) != 1 || a[0].Type != "TXT" || a[0].Data != "v=spf1\t-all" {
		t.Errorf("%+v", a)
	}
	h := s.Get(t, "http", "GET http://c2.example.com/gate.php?id=42").HTTP
	if h.Host != "C2.Example.com" || !slices.Equal(h.Statuses, []int{200}) || !slices.Equal(h.UserAgents, []string{"Mozilla/5.0 (tb)"}) {
		t.Errorf("%+v", h)
	}
	tl := s.Get(t, "tls", "beacon.example.org").TLS
	if !slices.Equal(tl.Versions, []string{"TLSv13"}) || tl.JA4[0] != "t13d1516h2_8daaf6152771_d8a2da3f94cd" || !slices.Equal(tl.ALPN, []string{"h2"}) {
		t.Errorf("%+v", tl)
	}
	s.Get(t, "tls", "203.0.113.7:8443")
	if f := s.Get(t, "file", "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb").File; f.MIMEType != "application/x-executable" ||
		!slices.Equal(f.Filenames, []string{"stage2.bin"}) || !slices.Equal(f.Hosts, []string{"203.0.113.7"}) || f.Size != 3000 {
		t.Errorf("%+v", f)
	}
	if n := s.Get(t, "notice", "Scan::Port_Scan").Notice; !slices.Equal(n.Src, []string{"10.13.37.5"}) || !strings.Contains(n.Msgs[0], "scanned") {
		t.Errorf("%+v", n)
	}
	if ip := s.Get(t, "ip", "203.0.113.7").IP; ip.Conns != 1 || !slices.Equal(ip.Ports, []string{"tcp/80"}) {
		t.Errorf("%+v", ip)
	}
}

// The JSON form of the same entries gives the same observables.
func TestJSONLogs(t *testing.T) {
	s := readFiles(t, "conn.json")
	tsv := readFiles(t, "conn.log", "dns.log", "http.log")
	for _, k := range []string{"domain www.example.com", "http GET http://c2.example.com/gate.php?id=42"} {
		a, b := s.Obs[k], tsv.Obs[k]
		if a == nil || b == nil {
			t.Fatalf("%s missing (json %v, tsv %v)", k, a != nil, b != nil)
		}
		if !a.FirstSeen.Equal(b.FirstSeen) || a.Count != b.Count {
			t.Errorf("%s: json %v/%d tsv %v/%d", k, a.FirstSeen, a.Count, b.FirstSeen, b.Count)
		}
	}
	k := "tcp 10.13.37.5:49152>203.0.113.7:80"
	if fl, tf := s.Flow(t, k), tsv.Flow(t, k); fl.RespBytes != 465 || fl.ConnState != "SF" || !fl.FirstSeen.Equal(tf.FirstSeen) || fl.Count != tf.Count {
		t.Errorf("json %+v, tsv %+v", fl, tf)
	}
	if d := s.Get(t, "domain", "www.example.com").Domain; !slices.Equal(d.Addrs, []string{"203.0.113.9"}) {
		t.Errorf("%+v", d)
	}
	s.Flow(t, "tcp 10.13.37.5:49153>203.0.113.8:4444")
	s.Get(t, "tls", "beacon.example.org")
	s.Get(t, "notice", "Scan::Port_Scan")
}

func TestGarbage(t *testing.T) {
	conn, _ := os.ReadFile("testdata/conn.log")
	rows := strings.Split(string(conn), "\n")
	// Binary garbage, a short row and broken JSON among good rows.
	bad := append([]string{}, rows[:9]...)
	bad = append(bad, "\x00\xff\xfe garbage \x01", "1.0\tonly\ttwo", `{"ts":1,"id.orig_h":`, strings.Repeat("x", lines.MaxLogLine+10))
	bad = append(bad, rows[9:]...)
	s, st := read(t, []byte(strings.Join(bad, "\n")))
	if st.Bad != 4 || st.FirstBad == nil || !strings.Contains(st.FirstBad.Error(), "line 10") {
		t.Fatalf("bad %d first %v", st.Bad, st.FirstBad)
	}
	s.Flow(t, "tcp 10.13.37.5:49152>203.0.113.7:80")
	s.Flow(t, "tcp 10.13.37.5:49153>203.0.113.8:4444")
	// Rows before any header are bad too.
	if _, st := read(t, []byte("1\t2\t3\n")); st.Bad != 1 {
		t.Errorf("headerless: %d bad", st.Bad)
	}
	// Bad addresses, ports and times.
	for _, row := range []string{
		`{"ts":1,"id.orig_h":"nope","id.orig_p":1,"id.resp_h":"192.0.2.1","id.resp_p":2,"conn_state":"S0"}`,
		`{"ts":1,"id.orig_h":"192.0.2.2","id.orig_p":70000,"id.resp_h":"192.0.2.1","id.resp_p":2,"conn_state":"S0"}`,
		`{"ts":"yesterday","id.orig_h":"192.0.2.2","id.orig_p":1,"id.resp_h":"192.0.2.1","id.resp_p":2,"conn_state":"S0"}`,
		`{"ts":1e300,"id.orig_h":"192.0.2.2","id.orig_p":1,"id.resp_h":"192.0.2.1","id.resp_p":2,"conn_state":"S0"}`,
	} {
		if _, st := read(t, []byte(row)); st.Bad != 1 {
			t.Errorf("%s: accepted", row)
		}
	}
}

func FuzzZeek(f *testing.F) {
	for _, n := range []string{"conn.log", "dns.log", "http.log", "ssl.log", "files.log", "notice.log", "conn.json"} {
		b, err := os.ReadFile("testdata/" + n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := Read(context.Background(), bufio.NewReader(bytes.NewReader(b)), observe.Origin{Source: "zeek"}, decodetest.New(observe.Origin{}))
		if err != nil {
			t.Fatal(err)
		}
		if st.Bad > st.Lines {
			t.Fatalf("%d bad of %d lines", st.Bad, st.Lines)
		}
	})
}

// Each observable names its connection by Zeek's own uid, as the flow log
// does; a conn.log line whose uid is missing or could not stand in a flow
// log (it must need no escaping) gets one of tb-parse's, from its line.
func TestUIDsCarriedThrough(t *testing.T) {
	s := readFiles(t, "conn.log", "dns.log", "http.log", "ssl.log")
	for _, c := range []struct{ typ, value, uid string }{
		{"http", "GET http://c2.example.com/gate.php?id=42", "CHhAvVGS1DHFjwGM9"},
		{"endpoint", "203.0.113.7:80/tcp", "CHhAvVGS1DHFjwGM9"},
		{"domain", "www.example.com", "CUM0KZ3MLUfNB0cl11"},
		{"tls", "beacon.example.org", "Cxyz"},
		{"icmp", "10.13.37.5>192.0.2.1 8/0", "CmES5u32sYpV7JYN"},
	} {
		if p := s.Get(t, c.typ, c.value).Provenance; len(p) != 1 || p[0].UID != c.uid {
			t.Errorf("%s %s: provenance %+v, want uid %s", c.typ, c.value, p, c.uid)
		}
	}
	uids := map[string]bool{}
	for _, c := range s.Conns {
		uids[c.UID] = true
	}
	for _, u := range []string{"CHhAvVGS1DHFjwGM9", "C4J4Th3PJpwUYZZ6gc", "CUM0KZ3MLUfNB0cl11", "CmES5u32sYpV7JYN", "Cxyz"} {
		if !uids[u] {
			t.Errorf("no connection %s: %v", u, uids)
		}
	}

	odd, _ := read(t, []byte(`{"ts":1763683200.1,"uid":"C\"},{\"x","id.orig_h":"10.13.37.5","id.orig_p":1,"id.resp_h":"192.0.2.7","id.resp_p":80,"proto":"tcp","conn_state":"S0"}
{"ts":1763683200.2,"id.orig_h":"10.13.37.5","id.orig_p":2,"id.resp_h":"192.0.2.7","id.resp_p":80,"proto":"tcp","conn_state":"S0"}
`))
	if len(odd.Conns) != 2 || odd.Conns[0].UID == odd.Conns[1].UID || !flowlog.ValidUID(odd.Conns[0].UID) || !flowlog.ValidUID(odd.Conns[1].UID) {
		t.Fatalf("uids of lines without a usable one: %q", []string{odd.Conns[0].UID, odd.Conns[1].UID})
	}
}
