package allowlist

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/observe/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// hostileNames are Host: and server-name values a sample chooses: a
// top-level domain, characters that break a dnsmasq line or a record's
// enforced list, quotes, a newline, a semicolon, bytes that are not UTF-8.
var hostileNames = []string{"com", "gov", "co.uk", "a/b#c", "x y", "x y.example.com", `q"uote.example.com`,
	"evil.example.com\nserver=/com/198.51.100.53", "semi;colon.example.com", "bad\xff\xfe.example.com", "evil.example.org"}

// beaconTo is six connections to an endpoint, a minute apart, each with an
// HTTP request (port 80) or a TLS ClientHello (443) calling it by name.
func beaconTo(addr string, port uint16, name string) []*records.Observable {
	t0 := pcapgen.Start
	var obs []*records.Observable
	for i := 0; i < 6; i++ {
		obs = append(obs, obsFlow(addr, port, "tcp", "established", t0.Add(time.Duration(i)*time.Minute), 1))
	}
	srv := []string{addr + ":" + strconv.Itoa(int(port))}
	if port == 443 {
		return append(obs, &records.Observable{Type: records.ObsTLS, Value: name, Lease: testLease, FirstSeen: t0, LastSeen: t0, Count: 6,
			TLS: &records.TLSInfo{ServerName: name, Servers: srv}})
	}
	return append(obs, &records.Observable{Type: records.ObsHTTP, Value: "GET http://" + name + "/", Lease: testLease, FirstSeen: t0,
		LastSeen: t0, Count: 6, HTTP: &records.HTTPInfo{Method: "GET", Host: name, URI: "/", Servers: srv}})
}

// hostileObs: every hostile name as the Host of requests to one endpoint
// and as the server name of ClientHellos to another; none resolved.
func hostileObs() []*records.Observable {
	var obs []*records.Observable
	for _, n := range hostileNames {
		obs = append(obs, beaconTo("45.155.205.17", 80, n)...)
		obs = append(obs, beaconTo("91.92.240.11", 443, n)...)
	}
	return obs
}

// TestNamesOnlyFromResolutions: names a sample only writes into requests
// (Host:, SNI) never become DNS forwards, whatever they are; a name it
// resolved, through the lab's resolver, to the endpoint it then beaconed
// to does.
func TestNamesOnlyFromResolutions(t *testing.T) {
	pol := DefaultPolicy()
	pol.Documentation = true
	pol.compile()
	now := pcapgen.Start.Add(time.Hour)
	promote := func(obs []*records.Observable) ([]*records.AllowEntry, []records.Refusal) {
		p := Promotion{Chain: Chain{Scope: records.ScopeLease, Lease: testLease}, Dests: Classify(obs, &pol), Policy: &pol,
			Validator: pubValidator(), Now: now}
		return Next(p, nil)
	}
	next, _ := promote(hostileObs())
	for _, e := range next {
		if e.Type == records.AllowDomain {
			t.Errorf("a name only seen in requests became a DNS forward: %q (%s)", e.Value, e.Reason)
		}
		for _, n := range e.Names {
			t.Errorf("endpoint %s is named %q, which it was never resolved from", e.Value, n)
		}
	}
	obs := append(hostileObs(), obsDomain("Real.Example.org.", pcapgen.Start, "45.155.205.17"))
	next, _ = promote(obs)
	var domains []string
	for _, e := range next {
		if e.Type == records.AllowDomain {
			domains = append(domains, e.Value+" "+e.Status)
		}
	}
	if strings.Join(domains, ",") != "real.example.org active" {
		t.Errorf("with a resolution, the domain entries are %v, want real.example.org active", domains)
	}
}

// TestHostileNamesNeverFailAWrite: resolved names that may not be
// forwarded are refused with their reason; the revision holding the rest
// is written, verifies, and applies, and the forward list never sees them.
func TestHostileNamesNeverFailAWrite(t *testing.T) {
	ctx := context.Background()
	pol := DefaultPolicy()
	pol.compile()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	var obs []*records.Observable
	for i, n := range hostileNames {
		// Each name is the only one resolved to its own address, then
		// beaconed to: the strongest evidence a name can have.
		addr := "45.155.205." + strconv.Itoa(10+i)
		obs = append(obs, obsDomain(n, pcapgen.Start, addr))
		obs = append(obs, beaconTo(addr, 80, n)...)
	}
	c := Chain{Scope: records.ScopeLease, Lease: testLease}
	rev, _, err := b.Promote(ctx, Promotion{Chain: c, Dests: Classify(obs, &pol), Policy: &pol, Validator: pubValidator(), Now: now})
	if err != nil {
		t.Fatalf("promote: %v", err)
	}
	if _, err := b.Verify(c); err != nil {
		t.Fatalf("verify: %v", err)
	}
	_, entries, err := b.Head(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type == records.AllowDomain && e.Value != "evil.example.org" {
			t.Errorf("domain entry %q", e.Value)
		}
	}
	refused := 0
	for _, r := range rev.Refusals {
		for _, x := range r.Examples {
			if strings.ContainsAny(x, "\n\xff") {
				t.Errorf("refusal example %q is not quoted", x)
			}
		}
		if r.Target == "names that may not be forwarded" {
			refused = r.Count
		}
		if r.Target == "gov" || strings.Contains(r.Reason, "never_allow") {
			refused++
		}
	}
	// Everything but evil.example.org: com and gov are single labels,
	// co.uk a public suffix, the rest not letters, digits and hyphens.
	if refused != len(hostileNames)-1 {
		t.Errorf("refused %d names, want %d: %+v", refused, len(hostileNames)-1, rev.Refusals)
	}
	names, err := b.LeaseNames(testLease, now, func(f string, a ...any) { t.Errorf(f, a...) })
	if err != nil || strings.Join(names, ",") != "evil.example.org" {
		t.Errorf("forward list %v, %v", names, err)
	}
}
