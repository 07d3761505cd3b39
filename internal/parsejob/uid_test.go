package parsejob

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

var (
	uidGuest  = netip.MustParseAddr("10.13.37.5")
	uidDNS    = netip.AddrPortFrom(netip.MustParseAddr("10.13.37.1"), 53)
	uidWeb    = netip.AddrPortFrom(netip.MustParseAddr("203.0.113.80"), 80)
	uidTLS    = netip.AddrPortFrom(netip.MustParseAddr("203.0.113.44"), 443)
	uidC2     = netip.AddrPortFrom(netip.MustParseAddr("203.0.113.23"), 23)
	uidPoll   = netip.AddrPortFrom(netip.MustParseAddr("203.0.113.81"), 8080)
	uidVictim = netip.MustParseAddr("198.51.100.9")
)

// everyKindCapture writes a guest's DNS lookup, HTTP request, TLS
// handshake, ping, Mirai channel with a SYN flood order, the flood itself
// and an HTTP polling channel.
func everyKindCapture(t *testing.T, path string) {
	t.Helper()
	var buf bytes.Buffer
	g, err := pcapgen.New(&buf, pcapgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g.DNSOverUDP(netip.AddrPortFrom(uidGuest, 40053), uidDNS, pcapgen.DNSQuery(7, "c2.example.com", layers.DNSTypeA),
		pcapgen.DNSResponse(7, "c2.example.com", layers.DNSTypeA, layers.DNSResponseCodeNoErr,
			[]layers.DNSResourceRecord{pcapgen.A("c2.example.com", uidWeb.Addr(), 60)}))
	c := g.Dial(netip.AddrPortFrom(uidGuest, 40080), uidWeb, 1, 2)
	c.Send(pcapgen.HTTPGet("c2.example.com", "/gate.php", "bot/1.0"))
	c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("ok")))
	c.Close()
	c = g.Dial(netip.AddrPortFrom(uidGuest, 40443), uidTLS, 1, 2)
	c.Send(pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x1301}, SNI: "tls.example.com"}))
	c.Reply(pcapgen.ServerHelloRecord(0x0303, 0x1301))
	c.Close()
	g.ICMPEcho(uidGuest, uidWeb.Addr(), false, 1, 1, make([]byte, 56))
	g.ICMPEcho(uidWeb.Addr(), uidGuest, true, 1, 1, make([]byte, 56))
	g.MiraiSession(netip.AddrPortFrom(uidGuest, 40023), uidC2, "", 1,
		pcapgen.MiraiOrder(30, 3, []netip.Prefix{netip.PrefixFrom(uidVictim, 32)}, []pcapgen.MiraiOption{{Key: 7, Value: "80"}}), 1460)
	for i := range 1000 {
		g.TCP(netip.AddrPortFrom(uidGuest, uint16(1024+i)), netip.AddrPortFrom(uidVictim, 80), uint32(i), 0, pcapgen.SYN, nil)
	}
	g.HTTPPolls(uidGuest, uidPoll, "poll.example.com", "/tasks", 6, 30*time.Second)
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// uidConn is a flow log line's uid and 5-tuple.
type uidConn struct {
	UID   string `json:"uid"`
	OrigH string `json:"id.orig_h"`
	OrigP uint16 `json:"id.orig_p"`
	RespH string `json:"id.resp_h"`
	RespP uint16 `json:"id.resp_p"`
	Proto string `json:"proto"`
}

func (c uidConn) resp() string {
	return netip.AddrPortFrom(netip.MustParseAddr(c.RespH), c.RespP).String()
}

// parseLease is tb-parse --lease rotLease --merge on the files, returning
// the observables it printed.
func parseLease(t *testing.T, root string, paths ...string) []*records.Observable {
	t.Helper()
	var out, errb bytes.Buffer
	if err := tbParse(root, nil, Request{Inputs: paths, Lease: rotLease, Merge: true}, &out, &errb); err != nil {
		t.Fatalf("tb-parse: %v: %s", err, &errb)
	}
	var obs []*records.Observable
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if strings.Contains(line, `"kind":"observable"`) {
			var o records.Observable
			if err := json.Unmarshal([]byte(line), &o); err != nil {
				t.Fatal(err)
			}
			obs = append(obs, &o)
		}
	}
	return obs
}

// flowsByUID reads the lease's flow logs as "tb-parse flows" prints them,
// with the query's uids (all when none).
func flowsByUID(t *testing.T, root string, uids ...string) map[string]uidConn {
	t.Helper()
	var out, errb bytes.Buffer
	if err := tbFlows(root, FlowsRequest{Query: flowlog.Query{Lease: rotLease, UIDs: uids}}, &out, &errb); err != nil {
		t.Fatalf("flows: %v: %s", err, &errb)
	}
	conns := map[string]uidConn{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if line == "" {
			continue
		}
		var c uidConn
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatal(err)
		}
		if _, dup := conns[c.UID]; dup {
			t.Fatalf("uid %s names two connections", c.UID)
		}
		conns[c.UID] = c
	}
	return conns
}

// Every observable of a capture names, in its provenance, the uid of a
// connection of the flow log written in the same run, and that
// connection's 5-tuple is the one the observable was seen on; the flow
// query selects that connection by its uid.
func TestEveryObservableJoinsItsConnection(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	path := filepath.Join(dir, "every.pcap")
	everyKindCapture(t, path)
	obs := parseLease(t, root, path)
	conns := flowsByUID(t, root)
	guest := uidGuest.String()
	seen := map[string]int{}
	for _, o := range obs {
		if len(o.Provenance) == 0 {
			t.Fatalf("%s %q: no provenance", o.Type, o.Value)
		}
		for _, p := range o.Provenance {
			c, ok := conns[p.UID]
			if !ok {
				t.Fatalf("%s %q: uid %q is in no flow log", o.Type, o.Value, p.UID)
			}
			if got, want := joined(o, c), seenOn(o, guest); !slices.Equal(got, want) {
				t.Errorf("%s %q: uid %s is %v, the observable's connection %v", o.Type, o.Value, p.UID, got, want)
			}
		}
		seen[o.Type]++
	}
	for _, typ := range []string{records.ObsDomain, records.ObsHTTP, records.ObsTLS, records.ObsICMP, records.ObsEndpoint,
		records.ObsC2Channel, records.ObsC2Command, records.ObsAttack} {
		if seen[typ] == 0 {
			t.Errorf("no %s observable: %v", typ, seen)
		}
	}
	if seen[records.ObsC2Channel] != 2 {
		t.Errorf("%d c2-channels, want mirai's and the HTTP poll's", seen[records.ObsC2Channel])
	}

	// The query by uid selects that connection alone.
	var tlsUID string
	for _, o := range obs {
		if o.Type == records.ObsTLS {
			tlsUID = o.Provenance[0].UID
		}
	}
	if one := flowsByUID(t, root, tlsUID); len(one) != 1 || one[tlsUID].resp() != uidTLS.String() {
		t.Fatalf("--uid %s: %v", tlsUID, one)
	}
}

// joined is what of the connection c an observable of o's type tells.
func joined(o *records.Observable, c uidConn) []string {
	switch o.Type {
	case records.ObsICMP, records.ObsAttack:
		return []string{c.OrigH, c.RespH, c.Proto}
	case records.ObsIP:
		return []string{c.OrigH, c.RespH}
	}
	return []string{c.OrigH, c.resp(), c.Proto}
}

// seenOn is what o says of the connection it was seen on, in joined's
// order: the client, the server (and its port), the protocol.
func seenOn(o *records.Observable, guest string) []string {
	switch o.Type {
	case records.ObsDomain:
		return []string{o.Domain.Clients[0], o.Domain.Resolvers[0] + ":53", o.Domain.Transports[0]}
	case records.ObsHTTP:
		return []string{o.HTTP.Clients[0], o.HTTP.Servers[0], "tcp"}
	case records.ObsTLS:
		return []string{o.TLS.Clients[0], o.TLS.Servers[0], "tcp"}
	case records.ObsICMP:
		return []string{o.ICMP.OrigH, o.ICMP.RespH, "icmp"}
	case records.ObsEndpoint:
		return []string{guest, o.Value[:strings.LastIndexByte(o.Value, '/')], o.Endpoint.Proto}
	case records.ObsIP:
		return []string{guest, o.Value}
	case records.ObsC2Channel:
		return []string{o.C2Channel.Clients[0], o.C2Channel.Server, "tcp"}
	case records.ObsC2Command:
		return []string{o.C2Command.Clients[0], o.C2Command.Servers[0], "tcp"}
	case records.ObsAttack:
		return []string{o.Attack.Sources[0], o.Attack.Target, "tcp"}
	}
	return []string{"a type this capture should not yield"}
}

// The uids of a capture are the same each time it is parsed, so merging
// it again adds no provenance; merging many captures keeps at most
// observe.MaxProvenance entries, none twice. (A cycle's endpoint, ip and
// scan observables sum its connections up and name the first: one entry
// for the run.)
func TestMergedProvenanceIsStableAndBounded(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	path := filepath.Join(dir, "every.pcap")
	everyKindCapture(t, path)
	first := parseLease(t, root, path)
	again := parseLease(t, root, path)
	byKey := func(obs []*records.Observable) map[string]*records.Observable {
		m := map[string]*records.Observable{}
		for _, o := range obs {
			m[o.Type+" "+o.Value] = o
		}
		return m
	}
	before := byKey(first)
	for k, o := range byKey(again) {
		if b := before[k]; b == nil || !slices.Equal(o.Provenance, b.Provenance) || o.Count != 2*b.Count {
			t.Fatalf("%s merged with itself: provenance %+v (count %d), was %+v", k, o.Provenance, o.Count, b)
		}
	}
	var paths []string
	for i := range observe.MaxProvenance + 4 {
		p := filepath.Join(dir, "copy-"+strconv.Itoa(i)+".pcap")
		if err := os.Link(path, p); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	for k, o := range byKey(parseLease(t, root, paths...)) {
		for i, p := range o.Provenance {
			if p.UID == "" || slices.Contains(o.Provenance[:i], p) {
				t.Fatalf("%s: provenance %+v: a uid empty or an entry twice", k, o.Provenance)
			}
		}
		perSighting := o.Type != records.ObsEndpoint && o.Type != records.ObsIP
		if perSighting && len(o.Provenance) != observe.MaxProvenance || len(o.Provenance) > observe.MaxProvenance {
			t.Fatalf("%s: %d provenance entries after %d captures, want %d", k, len(o.Provenance), len(paths)+1, observe.MaxProvenance)
		}
	}
}
