package eve

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
	"github.com/talkbox-sandbox/talkbox/internal/lines"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
)

func read(t *testing.T, data []byte) (*decodetest.Sink, lines.Stats) {
	t.Helper()
	return decodetest.ReadLog(t, Read, observe.Origin{Input: "eve.json", Source: "eve"}, data)
}

func TestEvents(t *testing.T) {
	data, err := os.ReadFile("testdata/eve.json")
	if err != nil {
		t.Fatal(err)
	}
	s, st := read(t, data)
	if st.Bad != 0 || st.Lines != 11 {
		t.Fatalf("lines %d bad %d: %v", st.Lines, st.Bad, st.FirstBad)
	}
	www := s.Get(t, "domain", "www.example.com")
	d := www.Domain
	if www.Count != 1 || d.Queries != 1 || d.Responses != 1 || !slices.Equal(d.Addrs, []string{"203.0.113.9"}) ||
		!slices.Equal(d.CNAMEs, []string{"edge.cdn.example"}) || !slices.Equal(d.Resolvers, []string{"198.51.100.53"}) ||
		!slices.Equal(d.Clients, []string{"10.13.37.5"}) || !slices.Equal(d.RCodes, []string{"NOERROR"}) {
		t.Errorf("count %d %+v", www.Count, d)
	}
	if d := s.Get(t, "domain", "v3.example").Domain; !slices.Equal(d.Addrs, []string{"2001:db8::9"}) || !slices.Equal(d.QTypes, []string{"AAAA"}) {
		t.Errorf("%+v", d)
	}
	if h := s.Get(t, "http", "GET http://c2.example.com/gate.php?id=42").HTTP; !slices.Equal(h.Statuses, []int{200}) || h.Host != "C2.Example.com" {
		t.Errorf("%+v", h)
	}
	if tl := s.Get(t, "tls", "beacon.example.org").TLS; !slices.Equal(tl.Versions, []string{"TLSv13"}) ||
		tl.JA3[0] != "98487aa16281980e7d1120d399efb6a4" || tl.JA4[0] != "t13d1516h2_8daaf6152771_d8a2da3f94cd" {
		t.Errorf("%+v", tl)
	}
	f := s.Flow(t, "tcp 10.13.37.5:49152>203.0.113.7:80")
	if fl := f; fl.OrigPkts != 6 || fl.RespIPBytes != 869 || fl.Outcome != "established" || fl.Duration != 1.5 || fl.Service != "http" {
		t.Errorf("%+v", fl)
	}
	if fl := s.Flow(t, "tcp 10.13.37.5:49153>203.0.113.8:4444"); fl.ConnState != "S0" || fl.Outcome != "attempted" {
		t.Errorf("%+v", fl)
	}
	if a := s.Get(t, "alert", "ET POLICY curl User-Agent Outbound").Alert; a.SignatureID != 2013028 || a.Severity != 2 {
		t.Errorf("%+v", a)
	}
	if fi := s.Get(t, "file", "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb").File; fi.Size != 3000 ||
		!slices.Equal(fi.Hosts, []string{"203.0.113.7"}) {
		t.Errorf("%+v", fi)
	}
	if p := s.Get(t, "alert", "ET POLICY curl User-Agent Outbound").Provenance; p[0].Line != 9 {
		t.Errorf("%+v", p)
	}
}

func TestGarbage(t *testing.T) {
	data, _ := os.ReadFile("testdata/eve.json")
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	in := append([]string{"\x00\x01binary\xff", `{"event_type":"dns"`, `{"timestamp":"nope","event_type":"dns"}`, `{"no":"type"}`,
		`{"timestamp":"2026-11-21T00:00:02.000000+0000","event_type":"dns","src_ip":"x","dest_ip":"y","dns":{}}`}, lines...)
	s, st := read(t, []byte(strings.Join(in, "\n")))
	if st.Bad != 5 || !strings.Contains(st.FirstBad.Error(), "line 1:") {
		t.Fatalf("bad %d first %v", st.Bad, st.FirstBad)
	}
	s.Get(t, "domain", "www.example.com")
}

func FuzzEVE(f *testing.F) {
	data, err := os.ReadFile("testdata/eve.json")
	if err != nil {
		f.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f.Add([]byte(l))
	}
	f.Add(data)
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := Read(context.Background(), bufio.NewReader(bytes.NewReader(b)), observe.Origin{Source: "eve"}, decodetest.New(observe.Origin{}))
		if err != nil {
			t.Fatal(err)
		}
		if st.Bad > st.Lines {
			t.Fatalf("%d bad of %d lines", st.Bad, st.Lines)
		}
	})
}

// Each observable names its connection by Suricata's flow_id, as the flow
// log does.
func TestFlowIDsCarriedThrough(t *testing.T) {
	data, err := os.ReadFile("testdata/eve.json")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := read(t, data)
	for _, c := range []struct{ typ, value, uid string }{
		{"http", "GET http://c2.example.com/gate.php?id=42", "3"},
		{"endpoint", "203.0.113.7:80/tcp", "3"},
		{"domain", "www.example.com", "1"},
		{"tls", "beacon.example.org", "4"},
		{"alert", "ET POLICY curl User-Agent Outbound", "5"},
	} {
		if p := s.Get(t, c.typ, c.value).Provenance; len(p) == 0 || p[0].UID != c.uid {
			t.Errorf("%s %s: provenance %+v, want uid %s", c.typ, c.value, p, c.uid)
		}
	}
	var uids []string
	for _, c := range s.Conns {
		uids = append(uids, c.UID)
	}
	if !slices.Equal(uids, []string{"3", "5"}) {
		t.Errorf("connections' uids %q, want the flow events' flow_ids", uids)
	}
}
