package allowlist

import (
	"bytes"
	"context"
	"io"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/parsejob"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

const probed = "198.51.100.7"

// sessions parses, as tb-parse reads a cycle's capture (no lease, no
// cycle: an offline capture), six connections a minute apart from the
// guest to probed:443, each written by session.
func sessions(t *testing.T, lease, cycle string, session func(c *pcapgen.Conn)) []*records.Observable {
	t.Helper()
	path := writeCapture(t, func(g *pcapgen.Gen) {
		for i := 0; i < 6; i++ {
			g.T = pcapgen.Start.Add(time.Duration(i) * time.Minute)
			session(g.Dial(netip.AddrPortFrom(guest, uint16(40000+i)), netip.MustParseAddrPort(probed+":443"), uint32(1000*i), 7000))
		}
	})
	return tbParse(t, parsejob.Request{Inputs: []string{path}, Lease: lease, Cycle: cycle, NoStore: true})
}

// What the far side of probed:443 does on each connection.
var (
	request = pcapgen.HTTPGet("c2.example", "/gate", "tb-beacon")
	hello   = pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x1301}, SNI: "c2.example"})
	// answersOnce: the sinkhole's fake web server, or a C2 that answers
	// one request a connection.
	answersOnce = func(c *pcapgen.Conn) {
		c.Send(request)
		c.Reply(pcapgen.HTTPResponse(200, "OK", []byte(`{"task":"sleep"}`)))
		c.Close()
	}
	// webServer: any web server a sample aims at.
	webServer = func(c *pcapgen.Conn) {
		c.Send(request)
		c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("<html>welcome</html>")))
		c.CloseByServer()
	}
	// garbage: a server answering HTTP with something else, the sample
	// going on.
	garbage = func(c *pcapgen.Conn) {
		c.Send(request)
		c.Reply([]byte("\x00\x01\x02 not http\r\n"))
		c.Send(request)
		c.Close()
	}
	silent = func(c *pcapgen.Conn) {
		c.Send(request)
		c.Close()
	}
	// conversation: the C2's task, and the sample's report of it.
	conversation = func(c *pcapgen.Conn) {
		c.Send(request)
		c.Reply(pcapgen.HTTPResponse(200, "OK", []byte(`{"task":"sleep"}`)))
		c.Send(pcapgen.HTTPGet("c2.example", "/gate?done=sleep", "tb-beacon"))
		c.Reply(pcapgen.HTTPResponse(200, "OK", nil))
		c.Close()
	}
	// tlsSession: a ClientHello, the ServerHello, the client going on.
	tlsSession = func(c *pcapgen.Conn) {
		c.Send(hello)
		c.Reply(pcapgen.ServerHelloRecord(0x0303, 0x1301))
		c.Send(append(pcapgen.Record(20, []byte{1}), pcapgen.Record(23, []byte("finished"))...))
		c.Close()
	}
	// mirai: a bot's hello, its C2's order, the bot's keep-alive.
	mirai = func(c *pcapgen.Conn) {
		c.Send(pcapgen.MiraiHello("telnet.x86"))
		c.Reply(pcapgen.MiraiOrder(30, 3, []netip.Prefix{netip.MustParsePrefix("198.51.100.9/32")}, nil))
		c.Send(pcapgen.MiraiKeepAlive())
		c.Close()
	}
)

// jsonl is observables as tb-parse prints them, of a lease ("" for an
// offline capture).
func jsonl(lease string, obs []*records.Observable) io.Reader {
	var b bytes.Buffer
	for i, o := range obs {
		records.Init(o, records.KindObservable, pcapgen.Start.Add(time.Duration(i)*time.Millisecond))
		o.Lease = lease
		data, _ := records.Marshal(o)
		b.Write(append(data, '\n'))
	}
	return &b
}

// TestProbation: an endpoint whose evidence is only what the sample sent
// in a sinkholed cycle (the sinkhole answered) is let through on
// probation, rate-limited, for one cycle. It becomes active with the
// policy's verdict only if, in the cycle that let it through, its far side
// answered as the sample's C2 would: in the protocol the sample spoke, on
// a session it kept, with the sample answering back (an HTTP C2 whose
// task the sample reports on the same connection, a TLS session going on
// after the ServerHello, a Mirai C2's order followed by the bot's
// keep-alive). Otherwise it is revoked for the lease with what was
// missing — a web server that answers each request, a server answering
// in another protocol, silence, no contact — and the same evidence does
// not promote it again. A conversation in an observable that also spans a
// sinkholed cycle confirms nothing; one in an offline capture of a live
// run does, an answer alone there does not.
func TestProbation(t *testing.T) {
	ctx := context.Background()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	pol := DefaultPolicy()
	pol.Documentation, pol.Verdict = true, string(firewall.Forward)
	if err := pol.compile(); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	sink := cmdout.New("tb-allow", io.Discard, &stderr, nil)
	cycle := func(lease, revision string) string {
		c := &records.Cycle{Lease: lease, Revision: revision}
		records.Init(c, records.KindCycle, now)
		if err := b.St.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Minute)
		return c.ID
	}
	promote := func(lease, cycle string, obs []*records.Observable) (*records.AllowRevision, *records.AllowEntry) {
		t.Helper()
		// Without a cycle, an offline capture: its observables have no lease.
		obsLease := lease
		if cycle == "" {
			obsLease = ""
		}
		err := Promote(ctx, b, PromoteRequest{Input: Input{Stdin: jsonl(obsLease, obs), Lease: lease, Cycle: cycle},
			Scope: records.ScopeLease, Policy: pol, NoApply: true}, sink)
		if err != nil {
			t.Fatalf("promote: %v\n%s", err, stderr.String())
		}
		rev, entries, err := b.Head(ctx, Chain{Scope: records.ScopeLease, Lease: lease})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Value == probed+":443/tcp" {
				return rev, e
			}
		}
		return rev, nil
	}
	verdictNow := func(lease string) firewall.Verdict {
		l, err := b.Desired(ctx, lease, now)
		if err != nil || len(l.Elements) > 1 {
			t.Fatalf("live set of %s: %+v %v", lease, l, err)
		}
		if len(l.Elements) == 0 {
			return ""
		}
		return l.Elements[0].Verdict
	}
	// sinkholed promotes a sinkholed cycle's beacon (the sinkhole
	// answered every connection) for a new lease: probation.
	sinkholed := func() (string, *records.AllowRevision) {
		t.Helper()
		lease := records.NewID("lease", now)
		c1 := cycle(lease, "")
		r1, e := promote(lease, c1, sessions(t, lease, c1, conversation))
		if e == nil || e.Status != records.StatusProbation || e.Verdict != string(firewall.RateLimit) || r1.Active != 1 {
			t.Fatalf("after a sinkholed cycle: %+v (revision active %d)", e, r1.Active)
		}
		if v := verdictNow(lease); v != firewall.RateLimit {
			t.Fatalf("on probation the live set has %q, want rate-limit", v)
		}
		return lease, r1
	}

	// The far side answers as a C2 in the cycle that let it through:
	// active.
	for name, session := range map[string]func(*pcapgen.Conn){"http": conversation, "tls": tlsSession, "mirai": mirai} {
		lease, r1 := sinkholed()
		c2 := cycle(lease, r1.ID)
		if _, e := promote(lease, c2, sessions(t, lease, c2, session)); e.Status != records.StatusActive || !strings.HasPrefix(e.Reason, "confirmed") {
			t.Errorf("%s: a C2 answered while let through: %+v", name, e)
		}
		if v := verdictNow(lease); v != firewall.Forward {
			t.Errorf("%s: confirmed: the live set has %q, want the policy's forward", name, v)
		}
	}

	// Anything less while let through: revoked, saying what was missing,
	// and the same evidence again does not bring it back.
	for _, tc := range []struct {
		name    string
		session func(*pcapgen.Conn)
		why     string
	}{
		{"a web server answering each request", webServer, "the far side answered in the sample's protocol, but the sample never answered back"},
		{"a C2 that answers one request a connection", answersOnce, "the sample never answered back"},
		{"a server answering in another protocol", garbage, "the far side answered, but not in the protocol the sample spoke"},
		{"silence", silent, "the far side sent nothing"},
	} {
		lease, r1 := sinkholed()
		c2 := cycle(lease, r1.ID)
		obs := sessions(t, lease, c2, tc.session)
		_, e := promote(lease, c2, obs)
		if e.Status != records.StatusRevoked || !strings.Contains(e.Reason, "probation failed in "+c2) || !strings.Contains(e.Reason, tc.why) {
			t.Errorf("%s while let through: %+v", tc.name, e)
		}
		if _, e := promote(lease, c2, obs); e.Status != records.StatusRevoked || verdictNow(lease) != "" {
			t.Errorf("%s: promoted again on the same evidence: %+v", tc.name, e)
		}
	}

	// Not contacted at all while let through: revoked too.
	lease, r1 := sinkholed()
	c2 := cycle(lease, r1.ID)
	other := obsEndpoint("198.51.100.99", 80, 1, pcapgen.Start, pcapgen.Start)
	other.Cycle = c2
	if _, e := promote(lease, c2, []*records.Observable{other}); e.Status != records.StatusRevoked || !strings.Contains(e.Reason, "never contacted") {
		t.Errorf("not contacted while let through: %+v", e)
	}

	// One observable over a sinkholed cycle and the one that let it
	// through, without saying which had the conversation: it may have
	// been the sinkhole's, so it confirms nothing.
	lease, r1 = sinkholed()
	c1 := r1.Cycle
	c2 = cycle(lease, r1.ID)
	merged := sessions(t, lease, c2, conversation)
	for _, o := range merged {
		o.Cycles = []string{c1, c2}
		if o.Endpoint != nil {
			o.Endpoint.AnsweredIn, o.Endpoint.SpokeIn, o.Endpoint.ConfirmedIn = nil, nil, nil
		}
	}
	if _, e := promote(lease, c2, merged); e.Status == records.StatusActive {
		t.Errorf("a merged observable confirmed the endpoint: %+v", e)
	}

	// What tb-parse --merge writes: one endpoint observable over both
	// cycles, saying in which of them the far side conversed. A
	// conversation in the cycle that let it through confirms; one only in
	// the sinkholed cycle does not.
	for _, in := range []int{2, 1} {
		lease, r1 = sinkholed()
		c1, c2 = r1.Cycle, cycle(lease, r1.ID)
		ep := obsEndpoint(probed, 443, 12, pcapgen.Start, pcapgen.Start.Add(11*time.Minute))
		ep.Cycle, ep.Cycles = c2, []string{c1, c2}
		ep.Endpoint.RespBytes, ep.Endpoint.AnsweredIn, ep.Endpoint.SpokeIn = 800, []string{c1, c2}, []string{c1, c2}
		ep.Endpoint.ConfirmedIn = []string{[]string{c1, c2}[in-1]}
		_, e := promote(lease, c2, []*records.Observable{ep})
		if confirmed := e.Status == records.StatusActive; confirmed != (in == 2) {
			t.Errorf("merged endpoint conversed in cycle %d of 2: %+v", in, e)
		}
	}

	// An offline capture of a live run (no lease, no cycle): a
	// conversation makes it active at once; answers alone do not.
	lease = records.NewID("lease", now)
	if _, e := promote(lease, "", sessions(t, "", "", conversation)); e == nil || e.Status != records.StatusActive {
		t.Errorf("offline capture with a conversation: %+v", e)
	}
	if _, err := b.Verify(ctx, Chain{Scope: records.ScopeLease, Lease: lease}); err != nil {
		t.Fatal(err)
	}
	lease = records.NewID("lease", now)
	if _, e := promote(lease, "", sessions(t, "", "", webServer)); e == nil || e.Status != records.StatusProbation {
		t.Errorf("offline capture of a web server answering: %+v", e)
	}
	// The operator may vouch for an endpoint on probation.
	lease, _ = sinkholed()
	if err := ChangeEntries(ctx, b, "approve", ChangeRequest{Selector: Selector{Lease: lease, Scope: records.ScopeLease},
		Targets: []string{probed + ":443/tcp"}, Policy: pol, NoApply: true}, sink); err != nil {
		t.Fatalf("approve: %v", err)
	}
	if v := verdictNow(lease); v != firewall.Forward {
		t.Errorf("approved off probation: the live set has %q, want the policy's forward", v)
	}
	// A C2 that answers one request a connection fails probation; the
	// operator who knows it may still approve it, but not an entry an
	// operator revoked.
	lease, r1 = sinkholed()
	c2 = cycle(lease, r1.ID)
	if _, e := promote(lease, c2, sessions(t, lease, c2, answersOnce)); e.Status != records.StatusRevoked {
		t.Fatalf("a C2 that answers once a connection: %+v", e)
	}
	approve := func(op string) error {
		return ChangeEntries(ctx, b, op, ChangeRequest{Selector: Selector{Lease: lease, Scope: records.ScopeLease},
			Targets: []string{probed + ":443/tcp"}, Policy: pol, NoApply: true}, cmdout.New("tb-allow", io.Discard, io.Discard, nil))
	}
	if err := approve("approve"); err != nil || verdictNow(lease) != firewall.Forward {
		t.Errorf("approved after a failed probation: %v, the live set has %q", err, verdictNow(lease))
	}
	if err := approve("revoke"); err != nil {
		t.Fatal(err)
	}
	if err := approve("approve"); err == nil || verdictNow(lease) != "" {
		t.Errorf("approved after the operator revoked it: %v, the live set has %q", err, verdictNow(lease))
	}
	if stderr.Len() > 0 {
		os.Stderr.Write(stderr.Bytes())
	}
}
