package allowlist

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// aimed are the destinations a sample would aim promotion at, each
// beaconed to six times a minute apart under a made-up name, and the
// rule that must refuse it.
func aimed() map[string]string {
	return map[string]string{
		"168.63.129.16:80":                  "cloud host-service address (Azure WireServer) 168.63.129.16/32 (built-in)",
		"169.254.169.254:80":                "cloud metadata address (AWS, Azure, Google Cloud, OpenStack) 169.254.169.254/32 (built-in)",
		"100.100.100.200:80":                "cloud metadata address (Alibaba Cloud) 100.100.100.200/32 (built-in)",
		"[fd00:ec2::254]:80":                "cloud metadata address (AWS, IPv6) fd00:ec2::254/128 (built-in)",
		"169.254.10.10:443":                 "link-local network 169.254.0.0/16 (built-in)",
		labtest.UplinkNet.String() + ":443": "(built-in)", // the host's gateway, on its uplink network
		"203.0.113.77:443":                  "a network of the host 203.0.113.0/24 (built-in)",
		labtest.Resolver.String() + ":443":  "the lab's upstream resolver 198.51.100.53/32 (built-in)",
		"198.51.100.60:5432":                "the fleet's database server 198.51.100.60/32 (built-in)",
		"198.51.100.61:8080":                "a fleet worker's blob server 198.51.100.61/32 (built-in)",
	}
}

// aimedObs beacons to every aimed destination (with the made-up name
// www.fresh-name.example.org in its requests), to one named
// metadata.google.internal, to one named www.nasa.gov, and to the real C2.
func aimedObs() []*records.Observable {
	var obs []*records.Observable
	for ap := range aimed() {
		a := netip.MustParseAddrPort(ap)
		obs = append(obs, beaconTo(a.Addr().String(), a.Port(), "www.fresh-name.example.org")...)
	}
	obs = append(obs, beaconTo("198.51.100.70", 443, "metadata.google.internal")...)
	obs = append(obs, beaconTo("198.51.100.80", 443, "www.nasa.gov")...)
	return append(obs, beaconTo(labtest.C2.String(), 443, "c2.example.org")...)
}

// TestPromotionCannotBeAimed: whatever the evidence, promotion refuses
// the cloud's host-service and metadata addresses, link-local networks,
// the host's networks and gateway (read from a real namespace), the lab's
// upstream resolver and the fleet's own servers, each saying which rule
// refused it, and applies never_allow_names to the names an endpoint was
// called by. The real C2 is still promoted.
func TestPromotionCannotBeAimed(t *testing.T) {
	l := labtest.New(t)
	g, err := guardFor(context.Background(), netns.Path(l.Config.HostNS), labtest.Resolver,
		"postgres://talkbox@198.51.100.60:5432/talkbox?sslmode=disable", []string{"http://198.51.100.61:8080"})
	if err != nil {
		t.Fatal(err)
	}
	pol := DefaultPolicy()
	pol.Documentation = true
	pol.MaxPerCycle = 0 // the cap would hide what the guard lets through
	pol.compile()
	v := pubValidator()
	v.Documentation = true
	p := Promotion{Chain: Chain{Scope: records.ScopeLease, Lease: testLease}, Dests: Classify(aimedObs(), &pol), Policy: &pol,
		Validator: v, Guard: g, Now: pcapgen.Start.Add(time.Hour)}
	next, refusals := Next(p, nil)
	var active []string
	for _, e := range next {
		if enforced(e.Status) {
			active = append(active, e.Value)
		}
	}
	if want := labtest.C2.String() + ":443/tcp"; strings.Join(active, ",") != want {
		t.Errorf("active: %v, want only %s", active, want)
	}
	why := map[string]string{}
	for _, r := range refusals {
		why[r.Target] = r.Reason
	}
	for ap, rule := range aimed() {
		target := ap + "/tcp"
		if !strings.Contains(why[target], "never_allow: ") || !strings.Contains(why[target], rule) {
			t.Errorf("%s: refused %q, want the rule %q", target, why[target], rule)
		}
	}
	if r := why["198.51.100.70:443/tcp"]; !strings.Contains(r, "metadata.google.internal: never_allow: cloud metadata or local name") {
		t.Errorf("an endpoint called metadata.google.internal: %q", r)
	}
	if r := why["198.51.100.80:443/tcp"]; !strings.Contains(r, "never_allow_names: its name www.nasa.gov matches *.gov") {
		t.Errorf("an endpoint called www.nasa.gov: %q", r)
	}
}

// TestMaxPerCycle: one promotion activates at most max_per_cycle entries,
// the best-scored; the rest stay candidates, each refusal naming the cap.
func TestMaxPerCycle(t *testing.T) {
	pol := DefaultPolicy()
	pol.Documentation = true
	pol.FewDestinations = 100
	pol.compile()
	v := pubValidator()
	v.Documentation = true
	var obs []*records.Observable
	for i := 0; i < 7; i++ {
		obs = append(obs, beaconTo(fmt.Sprintf("198.51.100.%d", 100+i), 443, "")...)
	}
	p := Promotion{Chain: Chain{Scope: records.ScopeLease, Lease: testLease}, Dests: Classify(obs, &pol), Policy: &pol,
		Validator: v, Now: pcapgen.Start.Add(time.Hour)}
	next, refusals := Next(p, nil)
	n := map[string]int{}
	for _, e := range next {
		n[e.Status]++
	}
	capped := 0
	for _, r := range refusals {
		if r.Class == "cap" && strings.Contains(r.Reason, "max_per_cycle (4)") {
			capped++
		}
	}
	if n[records.StatusProbation] != 4 || n[records.StatusCandidate] != 3 || capped != 3 {
		t.Errorf("statuses %v, %d capped: %+v", n, capped, refusals)
	}
}
