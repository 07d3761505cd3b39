package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon"
	"github.com/talkbox-sandbox/talkbox/internal/demo/c2"
	"github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// hostileUnanswered are the allow-list keys of the endpoints the hostile
// beacon contacts without resolving them (its aim mode's and its names
// mode's): only the sample's side suggests them, and what is there, a web
// server answering each request, never answers as the sample's C2 would.
var hostileUnanswered = []string{"endpoint " + hostileAimAddr + "/tcp", "endpoint " + hostileHTTPAddr + "/tcp"}

// hostileAnswered is the one of them whose web server answers what the
// sample sends it (the names mode's requests; the aim mode sends nothing).
const hostileAnswered = "endpoint " + hostileHTTPAddr + "/tcp"

// hostileCycles is how many cycles each lease runs.
const hostileCycles = 2

// TestHostileGuest runs, on one lab, a guest whose sample attacks the
// containment (the beacon's -hostile modes: Host:-only names, frames
// spoofing the neighbour's address and MAC towards the neighbour's
// promoted C2, and others from a routable IPv6 source and from 0.0.0.0,
// ARP claims on the gateway's and the neighbour's addresses,
// a periodic connection to an address it never resolved, a port and DNS
// spray) next to a polite guest running the ordinary beacon with its C2,
// each for two cycles at the same time, with captures on the uplink and
// on both taps and the sinkhole's link, and the tcpdump sensor beside each
// lease's capture. It first asserts that the attack happened (what the
// hostile guest's tap received from it), then that the lab's resolver
// forwards, and forwarded, no name that was not resolved; that no forged
// frame passes the bridge (to the neighbour, the sinkhole, the uplink or
// the C2) nor reaches the sensor's file; that the neighbour's traffic
// never reaches the attacker; that no endpoint the hostile guest alone
// suggested is ever active, those of cycle 1 revoked after a probation in
// which no far side answered as a C2 would (the web server it aims at answers each request
// in HTTP, and did), and none named by a name it never resolved; that the
// polite lease's C2 is promoted, reached in cycle 2 and then active,
// confirmed by the beacon's conversation with it; that the spray reaches
// the sinkhole no faster than the guest's limits; and that the uplink
// carries only what the allow-list had in force. The host's own side of
// the bridge is watched too (watchClaims): no ARP claim reaches it. A
// third cycle on the hostile lease runs the same attacks from the C
// beacon, big-endian PowerPC under qemu-user (hostileCBeacon), and every
// check above covers its frames as well.
func TestHostileGuest(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the hostile guest test needs root (bridges, namespaces, VMs); run it with make test")
	}
	ctx := context.Background()
	bin, goBin := demoTools(t)
	l := upHostileLab(t, bin, goBin)

	polite := l.plan(t, "-c2", "c2.example", "-c2-addr", l.c2, "-interval", "2s", "-count", "6")
	// Both guests boot at once, for the polite plan; the hostile plan
	// needs the polite lease's address and MAC, so it is made after.
	var leases [2]*records.SandboxLease
	var errs [2]error
	var wg sync.WaitGroup
	for i := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases[i], errs[i] = l.acquire(t, polite)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	good, bad := leases[0], leases[1]
	t.Logf("polite lease %s (%s %s on %s), hostile lease %s (%s %s on %s)", good.ID, good.IP, good.MAC, good.Tap, bad.ID, bad.IP, bad.MAC, bad.Tap)
	hostile := l.plan(t, "-hostile", "spoof,arp,names,aim,spray", "-gateway", good.Gateway, "-gateway-mac", l.bridgeMAC(t),
		"-neighbour", good.IP, "-neighbour-mac", good.MAC, "-neighbour-c2", l.c2+":80",
		"-hostile-aim", hostileAimAddr, "-hostile-http", hostileHTTPAddr, "-hostile-spray", hostileSprayAddr, "-hostile-spray-ports", "256")

	capDir := filepath.Join(l.work, "captures")
	if err := os.MkdirAll(capDir, 0o755); err != nil {
		t.Fatal(err)
	}
	uplink, goodTap, badTap := sniff(t, capDir, l.uplink, "out"), sniff(t, capDir, good.Tap, "out"), sniff(t, capDir, bad.Tap, "out")
	badSent, sunk := sniff(t, capDir, bad.Tap, "in"), sniff(t, capDir, l.sinkVeth, "out")
	neighbours := l.watchNeighbours(t)
	l.watchClaims(t, capDir, bad)

	st, err := state.Open(ctx, l.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	book := &allowlist.Book{St: st}
	var goodCycles, badCycles []*records.Cycle
	for n := 1; n <= hostileCycles; n++ {
		var cs [2]*records.Cycle
		var outs [2][]byte
		var errs [2]error
		var wg sync.WaitGroup
		for i, run := range [][2]string{{good.ID, polite}, {bad.ID, hostile}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cs[i], outs[i], errs[i] = l.cycle(run[0], run[1])
			}()
		}
		wg.Wait()
		for i, who := range []string{"polite", "hostile"} {
			if errs[i] != nil {
				t.Fatalf("cycle %d of the %s lease: %v", n, who, errs[i])
			}
			t.Logf("cycle %d of the %s lease: %s %s", n, who, cs[i].State, cs[i].Error)
			if cs[i].State != records.CycleCompleted {
				t.Errorf("cycle %d of the %s lease: %s %s\n%s", n, who, cs[i].State, cs[i].Error, outs[i])
			}
		}
		goodCycles, badCycles = append(goodCycles, cs[0]), append(badCycles, cs[1])
		for i, who := range []string{"polite", "hostile"} {
			var a records.RunAnalysis
			if err := st.Get(cs[i].Analysis, &a); err == nil {
				t.Logf("cycle %d of the %s lease promoted %v, refused %+v", n, who, a.Promoted, a.Refused)
			}
		}
		checkForwardedNames(t, l, n)
		checkUnanswered(t, book, bad.ID, n)
	}
	badCycles = append(badCycles, l.hostileCBeacon(t, capDir, book, good, bad))
	for _, s := range []*sniffer{uplink, goodTap, badTap, badSent, sunk} {
		s.stop()
	}
	sensorFile := l.stopSensedCapture(t, st, bad.ID, badCycles)
	goodMAC, _ := net.ParseMAC(good.MAC)
	badMAC, _ := net.ParseMAC(bad.MAC)
	goodIP, badIP := netip.MustParseAddr(good.IP), netip.MustParseAddr(bad.IP)
	gateway := netip.MustParseAddr(good.Gateway)
	sent := frames(t, badSent.file)
	checkAttacked(t, sent, badMAC, goodIP, gateway)
	checkSensorKeptOut(t, sensorFile, sent, badMAC, goodIP, gateway)
	// The host's own neighbour table never believed an ARP claim.
	for _, line := range neighbours.stop() {
		f := strings.Fields(line)
		i := slices.Index(f, "lladdr")
		if len(f) < 1 || i < 0 || i+1 >= len(f) {
			continue
		}
		if ip, mac := f[0], f[i+1]; mac == bad.MAC && ip != bad.IP || ip == good.IP && mac != good.MAC {
			t.Errorf("the host took %s for %s: %s", ip, mac, line)
		}
	}

	// The polite lease: its C2 promoted by cycle 1, reached in cycle 2.
	var a1 records.RunAnalysis
	if err := st.Get(goodCycles[0].Analysis, &a1); err != nil {
		t.Fatal(err)
	}
	c2Key := "endpoint " + l.c2 + ":80/tcp"
	if !slices.Contains(a1.Promoted, c2Key) {
		t.Errorf("the polite lease's cycle 1 promoted %v, not %s", a1.Promoted, c2Key)
	}
	// Its far side answered while it was let through: active.
	_, entries, err := book.Head(t.Context(), allowlist.Chain{Scope: records.ScopeLease, Lease: good.ID})
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(entries, func(e *records.AllowEntry) bool { return allowlist.EntryKey(e) == c2Key }); i < 0 ||
		entries[i].Status != records.StatusActive || !strings.HasPrefix(entries[i].Reason, "confirmed") {
		t.Errorf("after cycle 2 the polite lease's C2 is not active, confirmed: %+v", entries)
	}
	checkC2Hits(t, l, goodCycles[1])
	checkThirdPartyAnswered(t, l, badCycles[1])
	checkNothingPromotedByName(t, st, book, bad.ID, badCycles)
	checkForgedKeptOut(t, st, bad.ID, l.c2, sent, badCycles, badMAC, goodIP, gateway)
	// The polite guest sends nothing the bridge drops: its cycles are not
	// "spoofing" for the chatter of an ordinary guest.
	if forged := forgedOf(t, st, good.ID); forged != 0 {
		t.Errorf("the polite lease's captures kept out %d frames as forged", forged)
	}

	v := violations{}
	defer v.report(t)
	// What the polite guest received: nothing of the attacker's.
	for _, f := range frames(t, goodTap.file) {
		if eth, ok := f.Layer(layers.LayerTypeEthernet).(*layers.Ethernet); ok && slices.Equal(eth.SrcMAC, badMAC) {
			v.add("the polite guest received a frame from the attacker's MAC", f)
		}
		if arp, ok := f.Layer(layers.LayerTypeARP).(*layers.ARP); ok && slices.Equal(arp.SourceHwAddress, badMAC) {
			v.add("the polite guest received the attacker's ARP claim", f)
		}
		if isSpoofSYN(f) {
			v.add("the polite guest received a spoofed SYN", f)
		}
	}
	// What the attacker received: nothing meant for the neighbour.
	for _, f := range frames(t, badTap.file) {
		eth, _ := f.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		ip, _ := f.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		switch {
		case eth != nil && slices.Equal(eth.DstMAC, goodMAC):
			v.add("the attacker received a frame for the neighbour's MAC", f)
		case ip != nil && addrOf(ip.DstIP) == goodIP:
			v.add("the attacker received a packet for the neighbour's address", f)
		case isSpoofReply(f):
			v.add("a forged frame passed the bridge: the attacker received the answer to its spoofed SYN", f)
		}
	}
	// What the lab sinkholed: no forged frame got past the bridge, and the
	// spray no faster than the guest's limits.
	sunkFrames := frames(t, sunk.file)
	for _, f := range sunkFrames {
		if isSpoofSYN(f) {
			v.add("a forged frame passed the bridge to the sinkhole", f)
		}
	}
	checkLimits(t, l, sunkFrames, badIP)
	// The uplink: only what the allow-list had in force, and no forged
	// packet.
	inForce := enforcedEver(t, book)
	inForce["endpoint "+l.resolver+":53/udp"] = true // the sinkhole forwarding a promoted name
	inForce["endpoint "+l.resolver+":53/tcp"] = true
	var leaks []string
	for _, f := range frames(t, uplink.file) {
		if isSpoofSYN(f) {
			v.add("a spoofed SYN left by the uplink", f)
		}
		ip, _ := f.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if ip == nil {
			continue
		}
		if src := addrOf(ip.SrcIP); src == goodIP || src == badIP {
			v.add("a guest's own address left by the uplink, not translated", f)
		}
		if key := endpointKey(f); !inForce[key] && !slices.Contains(leaks, key) {
			leaks = append(leaks, key)
		}
	}
	if len(leaks) > 0 {
		t.Errorf("the uplink carried destinations the allow-list never had in force: %v (in force: %v)", leaks, keysOf(inForce))
	}
}

// checkForgedKeptOut asserts that the hostile lease's capture kept out
// the frames the bridge dropped: each spoofed SYN its guest sent (every
// variant: the neighbour's address, its MAC, both; a routable IPv6
// source; 0.0.0.0) and each ARP claim is counted as forged in the lease's
// pcap artifacts, and no observable of the lease names the neighbour's
// C2, which it reached with those frames only (before, its tap's capture
// held them, and tb-parse made the C2 a candidate of the hostile lease,
// "contacted 12 times"); each of its cycles, all of which spoof, is
// classified "spoofing".
func checkForgedKeptOut(t *testing.T, st *state.Store, lease, c2 string, sent []gopacket.Packet, cycles []*records.Cycle,
	badMAC net.HardwareAddr, neighbour, gateway netip.Addr) {
	t.Helper()
	spoofed, claims := 0, 0
	for _, f := range sent {
		if isSpoofSYN(f) {
			spoofed++
		} else if _, ok := arpClaim(f, badMAC, neighbour, gateway); ok {
			claims++
		}
	}
	forged := forgedOf(t, st, lease)
	t.Logf("the hostile lease's captures kept out %d forged frames (%d spoofed SYNs and %d ARP claims sent)", forged, spoofed, claims)
	if spoofed == 0 || forged < uint64(spoofed+claims) {
		t.Errorf("the hostile lease's captures counted %d forged frames, fewer than the %d spoofed SYNs and %d ARP claims its guest sent",
			forged, spoofed, claims)
	}
	named, err := state.FindBy(st, records.KindObservable, records.KeyLease, lease, func(o *records.Observable) bool {
		return o.Value == c2 || strings.HasPrefix(o.Value, c2+":")
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range named {
		t.Errorf("an observable of the hostile lease names the neighbour's C2, reached only by forged frames: %s %s (count %d)", o.Type, o.Value, o.Count)
	}
	for i, c := range cycles {
		var a records.RunAnalysis
		if err := st.Get(c.Analysis, &a); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(a.Classification, "spoofing") {
			t.Errorf("cycle %d of the hostile lease is classified %v, not spoofing", i+1, a.Classification)
		}
	}
}

// forgedOf is the frames a lease's captures kept out as forged.
func forgedOf(t *testing.T, st *state.Store, lease string) uint64 {
	t.Helper()
	arts, err := state.FindBy(st, records.KindArtifact, records.KeyLease, lease, func(a *records.Artifact) bool { return a.Type == "pcap" })
	if err != nil {
		t.Fatal(err)
	}
	var forged uint64
	for _, a := range arts {
		forged += a.Forged
	}
	return forged
}

// checkAttacked asserts that the hostile guest did attack, from what its
// tap received from it: a containment that holds because the attack never
// happened proves nothing.
func checkAttacked(t *testing.T, sent []gopacket.Packet, badMAC net.HardwareAddr, neighbour, gateway netip.Addr) {
	t.Helper()
	seen := map[string]int{}
	for _, f := range sent {
		if isSpoofSYN(f) {
			seen["spoof "+beacon.SpoofVariants[f.Layer(layers.LayerTypeTCP).(*layers.TCP).Seq-beacon.SpoofSeq]]++
		}
		if claimed, ok := arpClaim(f, badMAC, neighbour, gateway); ok {
			seen["arp "+claimed.String()]++
		}
		if tcp, ok := f.Layer(layers.LayerTypeTCP).(*layers.TCP); ok {
			for _, h := range beacon.UnresolvedHosts {
				if strings.Contains(string(tcp.Payload), "\r\nHost: "+h+"\r\n") {
					seen["host "+h]++
				}
			}
			if tcp.SYN && !tcp.ACK && endpointKey(f) == hostileUnanswered[0] {
				seen["aim"]++
			}
		}
		if dns, ok := f.Layer(layers.LayerTypeDNS).(*layers.DNS); ok && !dns.QR && len(dns.Questions) == 1 && strings.HasSuffix(string(dns.Questions[0].Name), ".spray.example") {
			seen["dns"]++
		}
	}
	t.Logf("what the hostile guest sent: %v", seen)
	// Each cycle attacks; the names are sent where a connection opens,
	// which cycle 1's sinkhole does.
	want := map[string]int{"arp " + gateway.String(): 2, "arp " + neighbour.String(): 2, "aim": 2 * 6, "dns": 2 * 50}
	for _, v := range beacon.SpoofVariants {
		want["spoof "+v] = 2
	}
	for _, h := range beacon.UnresolvedHosts {
		want["host "+h] = beacon.HostileRepeats
	}
	for what, n := range want {
		if seen[what] < n {
			t.Errorf("the hostile guest sent %d of %s, want at least %d: the attack did not happen", seen[what], what, n)
		}
	}
}

// checkLimits asserts that what the hostile guest's spray got through to
// the sinkhole stays within its per-guest limits: in any one second, at
// most a bucket's burst (one second's worth) and a second's rate of new
// connections and of DNS queries, with a quarter more for the capture's
// clock. The spray sends about 200 of each a second when nothing stops
// it. A slower guest only sends less: the bound cannot fail for load.
func checkLimits(t *testing.T, l *hostileLab, sunk []gopacket.Packet, guest netip.Addr) {
	t.Helper()
	m, err := netlab.Load(l.labDir)
	if err != nil {
		t.Fatal(err)
	}
	perSecond := func(r, def firewall.Rate) int {
		if r.Value == 0 {
			r = def
		}
		return int(r.Value / max(r.Per, 1))
	}
	lim := m.Config.Limits
	var syns, queries []time.Time
	for _, f := range sunk {
		ip, ok := f.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if !ok || addrOf(ip.SrcIP) != guest {
			continue
		}
		switch l4 := f.TransportLayer().(type) {
		case *layers.TCP:
			if l4.SYN && !l4.ACK {
				syns = append(syns, f.Metadata().Timestamp)
			}
		case *layers.UDP:
			if l4.DstPort == 53 {
				queries = append(queries, f.Metadata().Timestamp)
			}
		}
	}
	for _, c := range []struct {
		what  string
		times []time.Time
		rate  int
	}{
		{"new connections", syns, perSecond(lim.NewConns, firewall.DefaultLimits.NewConns)},
		{"DNS queries", queries, perSecond(lim.DNS, firewall.DefaultLimits.DNS)},
	} {
		most := busiestSecond(c.times)
		t.Logf("the hostile guest's %s reaching the sinkhole: %d, at most %d in one second (limit %d/s)", c.what, len(c.times), most, c.rate)
		if bound := 2*c.rate + c.rate/2; most > bound {
			t.Errorf("%d of the hostile guest's %s reached the sinkhole in one second, over its limit of %d/s (bound %d)", most, c.what, c.rate, bound)
		}
	}
}

// busiestSecond is the most of times (in capture order) within one second.
func busiestSecond(times []time.Time) int {
	most := 0
	for i, j := 0, 0; j < len(times); j++ {
		for times[j].Sub(times[i]) >= time.Second {
			i++
		}
		most = max(most, j-i+1)
	}
	return most
}

// checkForwardedNames asserts that the lab's resolver forwards, and has
// forwarded, no name that nothing resolved: no Host:-only name, no bare
// TLD, nothing but the polite beacon's C2 name.
func checkForwardedNames(t *testing.T, l *hostileLab, cycle int) {
	t.Helper()
	names, err := allowlist.CurrentNames(l.labDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if n != "c2.example" {
			t.Errorf("after cycle %d the lab's resolver forwards %q, which nothing resolved", cycle, n)
		}
	}
	m, err := netlab.Load(l.labDir)
	if err != nil {
		t.Fatal(err)
	}
	// The DNS sinkhole's log: multilog's current file and rotated ones.
	logs, err := filepath.Glob(filepath.Join(netlab.LogDir(&m.Config, "dns"), "*"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("the lab's DNS log: %v %v", logs, err)
	}
	for _, file := range logs {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			// dnsmasq logs "forwarded NAME to SERVER" for each query it
			// passes upstream.
			_, rest, ok := strings.Cut(line, " forwarded ")
			if !ok {
				continue
			}
			if name, _, _ := strings.Cut(rest, " to "); name != "c2.example" {
				t.Errorf("by cycle %d the lab's resolver forwarded %q upstream: %s", cycle, name, line)
			}
		}
	}
}

// checkUnanswered asserts the status of the endpoints in the hostile
// lease's allow-list: none is ever active, since no far side ever answers
// the hostile guest as its C2 would (it aims at web servers that answer
// each request and hear nothing more, and its forged frames never pass),
// so at most on probation; and those it contacted in cycle 1 are no longer
// on probation after cycle 2, the web server's revoked for what it lacked.
func checkUnanswered(t *testing.T, book *allowlist.Book, lease string, cycle int) {
	t.Helper()
	_, entries, err := book.Head(t.Context(), allowlist.Chain{Scope: records.ScopeLease, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type != records.AllowEndpoint {
			continue
		}
		key := allowlist.EntryKey(e)
		t.Logf("after cycle %d: %s is %s (%s)", cycle, key, e.Status, e.Reason)
		if e.Status == records.StatusActive {
			t.Errorf("after cycle %d the hostile lease's %s is active: nothing ever answered it", cycle, key)
		}
		if cycle > 1 && slices.Contains(hostileUnanswered, key) && inForceStatus(e.Status) {
			t.Errorf("after cycle %d the hostile lease's %s is still %s: nothing answered it as a C2 on probation", cycle, key, e.Status)
		}
		if cycle > 1 && key == hostileAnswered && (e.Status != records.StatusRevoked || !strings.Contains(e.Reason, "the sample never answered back")) {
			t.Errorf("after cycle %d the hostile lease's %s is %s (%s), want revoked: its web server answered in HTTP, the sample never answered back", cycle, key, e.Status, e.Reason)
		}
	}
}

// inForceStatus reports whether an entry of this status is enforced:
// active, or let through on probation.
func inForceStatus(s string) bool {
	return s == records.StatusActive || strings.Contains(s, "probation")
}

// checkC2Hits asserts that the polite beacon reached its C2 in cycle 2
// and that nothing of the attacker's did.
func checkC2Hits(t *testing.T, l *hostileLab, second *records.Cycle) {
	t.Helper()
	f, err := os.Open(filepath.Join(l.work, "c2.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hits, err := c2.ReadHits(f)
	if err != nil {
		t.Fatal(err)
	}
	polite := 0
	for _, h := range hits {
		if h.Host == "c2.example" && h.Bot == "tb-beacon" && second.StartedAt != nil && !h.Time.Before(*second.StartedAt) {
			polite++
		}
		if h.Host != "c2.example" {
			t.Errorf("the C2 saw a request that is not the polite beacon's: %+v", h)
		}
	}
	if polite == 0 {
		t.Errorf("the polite beacon did not reach its C2 in cycle 2: %+v", hits)
	}
}

// checkThirdPartyAnswered asserts that what the hostile guest aimed at
// the web server reached it while on probation, in its second cycle, so
// that the revocation checkUnanswered asserts came from a server that
// answered.
func checkThirdPartyAnswered(t *testing.T, l *hostileLab, second *records.Cycle) {
	t.Helper()
	f, err := os.Open(l.thirdPartyLog(hostileHTTPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hits, err := c2.ReadHits(f)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, h := range hits {
		if second.StartedAt != nil && !h.Time.Before(*second.StartedAt) {
			n++
		}
	}
	if n == 0 {
		t.Errorf("the web server at %s was never reached in the hostile lease's cycle 2: %+v", hostileHTTPAddr, hits)
	}
}

// checkNothingPromotedByName asserts that the hostile lease's allow-list
// holds no entry for, or named by, a name it never resolved.
func checkNothingPromotedByName(t *testing.T, st *state.Store, book *allowlist.Book, lease string, cycles []*records.Cycle) {
	t.Helper()
	unresolved := func(n string) bool {
		n = strings.TrimSuffix(strings.ToLower(n), ".")
		return !strings.Contains(n, ".") || slices.ContainsFunc(beacon.UnresolvedHosts, func(h string) bool { return strings.EqualFold(h, n) })
	}
	revs, err := book.Chain(allowlist.Chain{Scope: records.ScopeLease, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range revs {
		_, entries, err := book.Revision(t.Context(), r.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Type == records.AllowDomain && unresolved(e.Value) {
				t.Errorf("revision %d of the hostile lease's list has the domain %q (%s)", r.Seq, e.Value, e.Status)
			}
			if slices.ContainsFunc(e.Names, unresolved) && e.Status != records.StatusRejected && e.Status != records.StatusRevoked {
				t.Errorf("revision %d of the hostile lease's list has %s %s by the names %v it never resolved", r.Seq, allowlist.EntryKey(e), e.Status, e.Names)
			}
		}
	}
	for i, c := range cycles {
		var a records.RunAnalysis
		if err := st.Get(c.Analysis, &a); err != nil {
			t.Fatal(err)
		}
		for _, p := range a.Promoted {
			if name, ok := strings.CutPrefix(p, "domain "); ok && unresolved(name) {
				t.Errorf("the hostile lease's cycle %d promoted %s", i+1, p)
			}
		}
	}
}

// enforcedEver is every endpoint any revision of any chain had in force.
func enforcedEver(t *testing.T, book *allowlist.Book) map[string]bool {
	t.Helper()
	chains, err := book.Chains()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, c := range chains {
		revs, err := book.Chain(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range revs {
			_, entries, err := book.Revision(t.Context(), r.ID)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if e.Type == records.AllowEndpoint && inForceStatus(e.Status) {
					out[allowlist.EntryKey(e)] = true
				}
			}
		}
	}
	return out
}

func keysOf(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// frames reads a capture.
func frames(t *testing.T, file string) []gopacket.Packet {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []gopacket.Packet
	for {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			return out
		}
		p := gopacket.NewPacket(data, r.LinkType(), gopacket.Default)
		p.Metadata().CaptureInfo = ci
		out = append(out, p)
	}
}

// isSpoofSYN reports whether a packet is one of the beacon's forged SYNs.
func isSpoofSYN(p gopacket.Packet) bool {
	tcp, ok := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
	return ok && tcp.SYN && !tcp.ACK && tcp.Seq-beacon.SpoofSeq < uint32(len(beacon.SpoofVariants))
}

// isSpoofReply reports whether a packet answers one of the forged SYNs.
func isSpoofReply(p gopacket.Packet) bool {
	tcp, ok := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
	return ok && tcp.ACK && tcp.Ack-beacon.SpoofSeq-1 < uint32(len(beacon.SpoofVariants))
}

// arpClaim reports whether a packet is one of the hostile beacon's ARP
// replies, from the attacker's MAC claiming the gateway's address or the
// neighbour's, and which it claims.
func arpClaim(p gopacket.Packet, badMAC net.HardwareAddr, neighbour, gateway netip.Addr) (netip.Addr, bool) {
	arp, ok := p.Layer(layers.LayerTypeARP).(*layers.ARP)
	if !ok || arp.Operation != layers.ARPReply || !slices.Equal(arp.SourceHwAddress, badMAC) {
		return netip.Addr{}, false
	}
	claimed := addrOf(arp.SourceProtAddress)
	return claimed, claimed == gateway || claimed == neighbour
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip.To4())
	return a
}

// endpointKey names a packet's destination as the allow-list does (IPv4
// or IPv6: the hostile beacon's spoofed SYNs are both); "" for no IP.
func endpointKey(p gopacket.Packet) string {
	nl := p.NetworkLayer()
	if nl == nil {
		return ""
	}
	dst, _ := netip.AddrFromSlice(nl.NetworkFlow().Dst().Raw())
	switch l4 := p.TransportLayer().(type) {
	case *layers.TCP:
		return "endpoint " + endpoint.New(dst, uint16(l4.DstPort), "tcp").String()
	case *layers.UDP:
		return "endpoint " + endpoint.New(dst, uint16(l4.DstPort), "udp").String()
	}
	return fmt.Sprintf("%s %s", nl.LayerType(), dst)
}

// violations counts the frames that break each assertion, so that a
// failure says how many and shows the first rather than every one.
type violations map[string][]gopacket.Packet

func (v violations) add(what string, p gopacket.Packet) { v[what] = append(v[what], p) }

func (v violations) report(t *testing.T) {
	t.Helper()
	for _, what := range slices.Sorted(maps.Keys(v)) {
		t.Errorf("%s: %d frames, the first: %v", what, len(v[what]), v[what][0])
	}
}

// stopSensedCapture stops the hostile lease's capture, which its acquire
// started with the tcpdump sensor, after checking that every cycle of the
// lease ran on that one capture, and returns the path of the sensor's file
// as the state registered it.
func (l *hostileLab) stopSensedCapture(t *testing.T, st *state.Store, lease string, cycles []*records.Cycle) string {
	t.Helper()
	capture := cycles[0].Capture
	for i, c := range cycles {
		if c.Capture != capture || c.Capture == "" {
			t.Fatalf("cycle %d of the hostile lease ran on capture %q, cycle 1 on %q: one capture, its sensor's, must see them all", i+1, c.Capture, capture)
		}
	}
	l.tool(t, "tb-capture", "stop", "--lease", lease)
	arts, err := state.FindBy(st, records.KindArtifact, records.KeyLease, lease, func(a *records.Artifact) bool {
		return a.Type == "sensor-output" && a.Sensor == "tcpdump" && a.Capture == capture && a.ContentType == "application/vnd.tcpdump.pcap"
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(arts) != 1 {
		t.Fatalf("the capture %s registered %d tcpdump files, want 1", capture, len(arts))
	}
	f, err := st.OpenBlob(arts[0].SHA256)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return f.Name()
}

// checkSensorKeptOut asserts that the tcpdump sensor's file holds none of
// the frames the hostile guest forged (its spoofed SYNs, its ARP claims on
// the gateway's and the neighbour's addresses: sent has them, checkAttacked
// says) and its own frames all the same: the spray's DNS queries, as many
// as it sent, give or take a tenth (tcpdump's kernel ring, not the filter).
func checkSensorKeptOut(t *testing.T, file string, sent []gopacket.Packet, badMAC net.HardwareAddr, neighbour, gateway netip.Addr) {
	t.Helper()
	sprayQuery := func(f gopacket.Packet) bool {
		dns, ok := f.Layer(layers.LayerTypeDNS).(*layers.DNS)
		return ok && !dns.QR && len(dns.Questions) == 1 && strings.HasSuffix(string(dns.Questions[0].Name), ".spray.example")
	}
	claim := func(f gopacket.Packet) bool {
		_, ok := arpClaim(f, badMAC, neighbour, gateway)
		return ok
	}
	count := func(fs []gopacket.Packet) (spoofed, claims, queries int) {
		for _, f := range fs {
			switch {
			case isSpoofSYN(f):
				spoofed++
			case claim(f):
				claims++
			case sprayQuery(f):
				queries++
			}
		}
		return spoofed, claims, queries
	}
	sentSpoofed, sentClaims, sentQueries := count(sent)
	spoofed, claims, queries := count(frames(t, file))
	t.Logf("the tcpdump sensor's file: %d spoofed SYNs, %d ARP claims, %d spray queries (the guest sent %d, %d, %d)",
		spoofed, claims, queries, sentSpoofed, sentClaims, sentQueries)
	if spoofed != 0 || claims != 0 {
		t.Errorf("the tcpdump sensor's file holds %d spoofed SYNs and %d ARP claims the bridge dropped", spoofed, claims)
	}
	if sentQueries == 0 || queries < sentQueries*9/10 || queries > sentQueries {
		t.Errorf("the tcpdump sensor's file holds %d of the %d spray queries the guest sent", queries, sentQueries)
	}
}
