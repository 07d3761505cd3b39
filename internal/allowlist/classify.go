package allowlist

import (
	"cmp"
	"fmt"
	endpt "github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"maps"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/dnsname"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Classes of destination.
const (
	ClassC2    = "c2"             // C2 evidence; its score decides candidate or active
	ClassScan  = "scan"           // many destinations on one port, or a sweep
	ClassAbuse = "abuse"          // floods, SMTP, exploitation
	ClassInfra = "infrastructure" // DNS, NTP, connectivity checks
	ClassOther = "other"          // too little evidence for anything
)

// Score weights of the C2 evidence (documented in tb-allow(1)).
const (
	wRepeated    = 0.3
	wPeriodic    = 0.4
	wNamed       = 0.2
	wLongLived   = 0.3
	wReconnected = 0.1
	wFew         = 0.1
	// wChannel is a recognised bot command channel that was kept alive
	// or came back: enough alone to promote (on probation when only the
	// sample's side of it was seen).
	wChannel = 0.6
)

// Dest is the classification of one destination: an endpoint
// ("45.13.7.9:443/tcp") or a DNS name.
type Dest struct {
	Lease  string          `json:"lease,omitempty"`
	Type   string          `json:"type"`
	Value  string          `json:"value"`
	Class  string          `json:"class"`
	Score  float64         `json:"score"`
	Reason string          `json:"reason"`
	Beacon *records.Beacon `json:"beacon,omitempty"`
	// Names are the names the sample resolved (through the lab's
	// resolver) to an endpoint; Claimed those its requests called the
	// endpoint by (HTTP Host, TLS server name) that it never resolved to
	// it: evidence about the endpoint, never a DNS forward.
	Names   []string `json:"names,omitempty"`
	Claimed []string `json:"claimed,omitempty"`
	Conns   int64    `json:"conns"`
	// Observable is the ID of the observable that is the main evidence.
	Observable string `json:"observable,omitempty"`
	// UIDs name connections the evidence rests on, at most MaxUIDs, from
	// the provenance of its observables (tb-parse flows --uid shows them).
	UIDs     []string  `json:"uids,omitempty"`
	LastSeen time.Time `json:"last_seen"`
	// Dests and Sample are, for a scan, the distinct destinations it
	// stands for (beyond the endpoints classified one by one) and some of
	// them.
	Dests  int64    `json:"dests,omitempty"`
	Sample []string `json:"sample,omitempty"`

	addr  netip.Addr
	proto string
	port  uint16
	// heard is what the endpoint's far side was heard doing, for its
	// probation.
	heard heard
	group string // the scanned port or sweep a scan belongs to
	// invalid is why a resolved name may not be forwarded (its Value is
	// then the name as dnsname.Display shows it).
	invalid string
}

// endpoint accumulates the evidence for one (address, protocol, port).
type endpoint struct {
	addr        netip.Addr
	proto       string
	port        uint16
	conns       int64
	established int64
	pkts        int64
	maxDur      float64
	starts      []time.Time
	names       map[string]bool // resolved to it
	claimed     map[string]bool // Host or server name of its requests
	obs         string
	uids        []string // of the connections its observables were seen on
	first, last time.Time
	attack      string
	heard       heard
	// channel is the bot command channel recognised on it (c2-channel),
	// "" for none; channelLive says it was kept alive or came back.
	channel     string
	channelLive bool
}

// heard is what an endpoint's far side was seen doing, each list holding,
// per observable, the cycles it was seen in: whether each cycle let the
// endpoint through decides whether it was the far side or the sinkhole.
// answered: it sent payload; spoke: its first answer on a connection was
// in the protocol the sample spoke; conversed: besides, the sample sent
// new payload after it on that connection (records.EndpointInfo).
// offlineConversed is a conversation in an offline capture (no lease, no
// cycle: a live run, no sinkhole).
type heard struct {
	answered, spoke, conversed [][]string
	offlineConversed           bool
}

// add records what an endpoint observable says: a list of cycles written
// by tb-parse counts cycle by cycle (a merged observable says which of its
// cycles each was seen in); without one, when seen (an observable of
// older tb-parse that only counted bytes), the observable's cycles
// together.
func (h *heard) add(o *records.Observable) {
	p := o.Endpoint
	h.answered = appendHeard(h.answered, p.AnsweredIn, o, p.RespBytes > 0)
	h.spoke = appendHeard(h.spoke, p.SpokeIn, o, false)
	h.conversed = appendHeard(h.conversed, p.ConfirmedIn, o, false)
	if p.Conversations > 0 && o.Lease == "" && o.Cycle == "" && len(o.Cycles) == 0 {
		h.offlineConversed = true
	}
}

func appendHeard(lists [][]string, in []string, o *records.Observable, seen bool) [][]string {
	for _, c := range in {
		lists = append(lists, []string{c})
	}
	if len(in) > 0 || !seen {
		return lists
	}
	if cycles := obsCycles(o); len(cycles) > 0 {
		lists = append(lists, cycles)
	}
	return lists
}

// obsCycles are the cycles an observable was seen in.
func obsCycles(o *records.Observable) []string {
	var cycles []string
	for _, c := range append([]string{o.Cycle}, o.Cycles...) {
		if c != "" && !slices.Contains(cycles, c) {
			cycles = append(cycles, c)
		}
	}
	return cycles
}

func (e *endpoint) key() string { return endpt.New(e.addr, e.port, e.proto).String() }

// Classify classifies every destination the observables of one lease
// show: collect gathers the evidence per endpoint and per name, score
// classifies the endpoints, and propagate gives each name the class of the
// destinations it led to. The result is sorted by type, then value; it
// depends only on the observables and the policy.
func Classify(obs []*records.Observable, pol *Policy) []Dest {
	ev := collect(obs, pol)
	list, res := ev.score(pol)
	out := make([]Dest, 0, len(list)+len(ev.names))
	for _, e := range list {
		out = append(out, *res[e.key()])
	}
	out = append(out, tried(ev.lease, ev.netcalls, ev.eps, pol)...)
	for _, k := range slices.Sorted(maps.Keys(ev.scanObs)) {
		if d, ok := scanDest(ev.lease, k, ev.scanObs[k], len(byPortOf(list, k)), pol); ok {
			out = append(out, d)
		}
	}
	out = append(out, ev.propagate(list, res, pol)...)
	for _, a := range ev.icmpFloods {
		out = append(out, Dest{Lease: ev.lease, Type: "icmp", Value: a, Class: ClassAbuse, Reason: "ICMP flood"})
	}
	return out
}

// evidence is what one lease's observables say about its destinations.
type evidence struct {
	lease  string
	eps    map[string]*endpoint // by endpointValue
	byAddr map[netip.Addr][]*endpoint
	names  map[string]*dnsName // resolved names, lower-case, without the final dot
	// badNames are resolved names that may not be forwarded, by their
	// dnsname.Display, with the reason.
	badNames map[string]badName
	// netcalls are the behaviour trace's network calls (see tried).
	netcalls []*records.Observable
	// scanObs are the scans tb-parse summarised, by "proto/port" (the
	// distinct destinations of all their observables, one per cycle).
	scanObs    map[string][]*records.Observable
	icmpFloods []string
	// attacked are the targets of the floods the bot sent (attack
	// observables), with what was sent: never promoted.
	attacked map[netip.Addr]attack
}

// attack is a flood the bot sent: what, and on which connections.
type attack struct {
	why  string
	uids []string
}

type badName struct {
	o   *records.Observable
	why string
}

// dnsName is one resolved name: its observable, the addresses it resolved
// to, and whether it was looked up as a mail domain.
type dnsName struct {
	o     *records.Observable
	addrs []string
	mx    bool
}

// collect gathers the evidence: per endpoint its connections, starts,
// names and any attack on it; per name its resolution.
func collect(obs []*records.Observable, pol *Policy) *evidence {
	ev := &evidence{eps: map[string]*endpoint{}, byAddr: map[netip.Addr][]*endpoint{},
		names: map[string]*dnsName{}, badNames: map[string]badName{}, scanObs: map[string][]*records.Observable{},
		attacked: map[netip.Addr]attack{}}
	var alerts, https, tlss, ipObs, channels, attacks []*records.Observable
	seenEndpointIP := map[netip.Addr]bool{}
	for _, o := range obs {
		if ev.lease == "" {
			ev.lease = o.Lease
		}
		switch {
		case o.C2Channel != nil:
			channels = append(channels, o)
		case o.Attack != nil:
			attacks = append(attacks, o)
		case o.Endpoint != nil:
			p := o.Endpoint
			a, err := netip.ParseAddr(p.Addr)
			if err != nil || (p.Proto != "tcp" && p.Proto != "udp") {
				continue
			}
			a = a.Unmap()
			seenEndpointIP[a] = true
			e := ev.endpoint(a, p.Proto, p.Port)
			e.conns += p.Conns
			e.established += p.Established
			e.pkts += p.OrigPkts
			e.maxDur = math.Max(e.maxDur, p.MaxDuration)
			e.starts = append(e.starts, p.Starts...)
			e.heard.add(o)
			e.touch(o)
		case o.Scan != nil:
			if o.Scan.Addr == "" && (o.Scan.Proto == "tcp" || o.Scan.Proto == "udp") {
				k := o.Scan.Proto + "/" + strconv.Itoa(int(o.Scan.Port))
				ev.scanObs[k] = append(ev.scanObs[k], o)
			}
		case o.IP != nil:
			ipObs = append(ipObs, o)
		case o.Netcall != nil:
			ev.netcalls = append(ev.netcalls, o)
		case o.Domain != nil:
			name, err := dnsname.Forwardable(o.Value)
			if err != nil {
				ev.badNames[dnsname.Display(o.Value)] = badName{o: o, why: err.Error()}
				continue
			}
			mx := slices.ContainsFunc(o.Domain.QTypes, func(q string) bool { return strings.EqualFold(q, "MX") })
			ev.names[name] = &dnsName{o: o, addrs: o.Domain.Addrs, mx: mx}
		case o.HTTP != nil:
			https = append(https, o)
		case o.TLS != nil:
			tlss = append(tlss, o)
		case o.Alert != nil:
			alerts = append(alerts, o)
		case o.ICMP != nil:
			if o.ICMP.Packets >= pol.FloodPackets {
				ev.icmpFloods = append(ev.icmpFloods, o.ICMP.RespH)
			}
		}
	}
	// Addresses known only from ip observables (a sensor without
	// connection logs): one endpoint per port, with the address's starts.
	for _, o := range ipObs {
		a, err := netip.ParseAddr(o.Value)
		if err != nil || seenEndpointIP[a.Unmap()] {
			continue
		}
		for _, ps := range o.IP.Ports {
			proto, port, ok := parseService(ps)
			if !ok || (proto != "tcp" && proto != "udp") {
				continue
			}
			e := ev.endpoint(a.Unmap(), proto, port)
			e.conns += o.IP.Conns
			e.starts = append(e.starts, o.IP.Starts...)
			e.touch(o)
		}
	}
	ev.resolvedNames()
	ev.requests(https, tlss, pol)
	ev.alerted(alerts)
	ev.bot(channels, attacks)
	return ev
}

// bot notes the recognised command channels on their servers' endpoints
// and the targets of the bot's floods: a channel kept alive (two
// keep-alives or more, or orders), seen in two cycles, or on which the bot
// registered (announced its identity: Mirai's hello, IRC's NICK and USER,
// Gafgyt's BUILD) is strong C2 evidence; an address the bot flooded is
// never promoted. A Gafgyt or IRC bot registers and then waits for its
// C2's PING, so a sinkholed cycle shows it registering and nothing more;
// that is the bot's side alone, which earns probation like any other, and
// only its C2 answering in the protocol while let through confirms it.
func (ev *evidence) bot(channels, attacks []*records.Observable) {
	for _, o := range channels {
		c := o.C2Channel
		ap, err := netip.ParseAddrPort(c.Server)
		if err != nil {
			continue
		}
		e := ev.endpoint(ap.Addr().Unmap(), "tcp", ap.Port())
		registered := len(c.Identities) > 0
		live := c.KeepAlives >= 2 || c.Commands > 0 || len(obsCycles(o)) >= 2 || registered
		if e.channel == "" || live && !e.channelLive {
			what := fmt.Sprintf("a %s command channel (%s", cmp.Or(c.Family, c.Protocol), c.Protocol)
			switch {
			case c.KeepAlives > 0:
				what += fmt.Sprintf(", %d keep-alives", c.KeepAlives)
			case c.Commands > 0:
				what += fmt.Sprintf(", %d orders", c.Commands)
			case registered:
				what += ", the bot registered"
			}
			e.channel, e.channelLive = what+")", live
		}
		e.touch(o)
	}
	for _, o := range attacks {
		a := o.Attack
		t, err := netip.ParseAddr(a.Target)
		if err != nil {
			continue
		}
		if _, ok := ev.attacked[t.Unmap()]; !ok {
			ev.attacked[t.Unmap()] = attack{why: fmt.Sprintf("the target of a %s flood the bot sent (%d packets)", a.Vector, a.Packets),
				uids: addUIDs(nil, o)}
		}
	}
}

// endpoint returns the evidence of one endpoint, new if there is none yet.
func (ev *evidence) endpoint(a netip.Addr, proto string, port uint16) *endpoint {
	k := endpt.New(a, port, proto).String()
	e := ev.eps[k]
	if e == nil {
		e = &endpoint{addr: a, proto: proto, port: port, names: map[string]bool{}, claimed: map[string]bool{}}
		ev.eps[k] = e
		ev.byAddr[a] = append(ev.byAddr[a], e)
	}
	return e
}

// resolvedNames names endpoints from DNS answers: an address only when no
// other name shares it (in the lab every sinkholed name resolves to the
// sinkhole). Only names that may be forwarded are in ev.names, and only
// the answers tb-parse matched to a query of the same flow are in their
// addresses.
func (ev *evidence) resolvedNames() {
	addrNames := map[netip.Addr][]string{}
	for name, d := range ev.names {
		for _, s := range d.addrs {
			if a, err := netip.ParseAddr(s); err == nil {
				addrNames[a.Unmap()] = append(addrNames[a.Unmap()], name)
			}
		}
	}
	for a, ns := range addrNames {
		if len(ns) == 1 {
			for _, e := range ev.byAddr[a] {
				e.names[ns[0]] = true
			}
		}
	}
}

// requests names endpoints from HTTP Host and TLS server names, which name
// their server exactly, and marks the servers of exploit requests.
func (ev *evidence) requests(https, tlss []*records.Observable, pol *Policy) {
	for _, o := range https {
		h := o.HTTP
		host := h.Host
		if i := strings.LastIndexByte(host, ':'); i > 0 && !strings.Contains(host[i:], "]") {
			host = host[:i]
		}
		req := strings.ToLower(h.Method + " " + h.URI)
		for _, ua := range h.UserAgents {
			req += " " + strings.ToLower(ua)
		}
		attack := ""
		for _, p := range pol.AttackPatterns {
			if strings.Contains(req, strings.ToLower(p)) {
				attack = p
				break
			}
		}
		for _, s := range h.Servers {
			e := ev.serverName(s, host)
			if e != nil {
				e.uids = addUIDs(e.uids, o)
			}
			if e != nil && attack != "" && e.attack == "" {
				e.attack = fmt.Sprintf("exploit request %q (matches %q)", truncate(h.Method+" "+h.URI, 80), attack)
			}
		}
	}
	for _, o := range tlss {
		for _, s := range o.TLS.Servers {
			if e := ev.serverName(s, o.TLS.ServerName); e != nil {
				e.uids = addUIDs(e.uids, o)
			}
		}
	}
}

// serverName gives the TCP endpoint server ("ADDR:PORT"), if it was
// contacted, the name a request called it by, and returns it. The sample
// writes that name as it likes, so it is only a claim about the endpoint
// (its class, the policy's name lists) unless the sample also resolved
// the name to the endpoint's address: then it names the endpoint, which
// tells apart the names that all resolved to the sinkhole. A name that
// may not be forwarded (an address, "com", "a/b#c") is no evidence.
func (ev *evidence) serverName(server, name string) *endpoint {
	ap, err := netip.ParseAddrPort(server)
	if err != nil {
		return nil
	}
	e := ev.eps[endpt.New(ap.Addr(), ap.Port(), "tcp").String()]
	if e == nil {
		return nil
	}
	n, err := dnsname.Forwardable(name)
	if err != nil {
		return e
	}
	if d := ev.names[n]; d != nil && slices.ContainsFunc(d.addrs, func(s string) bool {
		a, err := netip.ParseAddr(s)
		return err == nil && a.Unmap() == e.addr
	}) {
		e.names[n] = true
	} else {
		e.claimed[n] = true
	}
	return e
}

// alerted marks every endpoint of an address an IDS alert names.
func (ev *evidence) alerted(alerts []*records.Observable) {
	for _, o := range alerts {
		for _, d := range o.Alert.Dst {
			a, err := netip.ParseAddr(d)
			if err != nil {
				continue
			}
			for _, e := range ev.byAddr[a.Unmap()] {
				if e.attack == "" {
					e.attack = fmt.Sprintf("IDS alert %q", truncate(o.Alert.Signature, 80))
				}
			}
		}
	}
}

// score classifies every endpoint: infrastructure and abuse first (they
// never count as destinations), then scans, then the C2 evidence of the
// rest. It returns the endpoints in value order and their classification
// by value.
func (ev *evidence) score(pol *Policy) ([]*endpoint, map[string]*Dest) {
	list := slices.SortedFunc(maps.Values(ev.eps), func(a, b *endpoint) int { return strings.Compare(a.key(), b.key()) })
	res := make(map[string]*Dest, len(list))
	scanGroups := scans(list, ev.scanObs, pol)
	few := 0
	for _, e := range list {
		d := &Dest{Lease: ev.lease, Type: records.AllowEndpoint, Value: e.key(), Conns: e.conns, Observable: e.obs, UIDs: e.uids,
			LastSeen: e.last, Names: slices.Sorted(maps.Keys(e.names)), Claimed: e.claimedOnly(), addr: e.addr, proto: e.proto, port: e.port,
			heard: e.heard}
		res[d.Value] = d
		switch {
		case pol.isInfraService(e.proto, e.port):
			d.Class, d.Reason = ClassInfra, fmt.Sprintf("%s/%d is a service the lab provides", e.proto, e.port)
		case infraNamed(e, pol) != "":
			d.Class, d.Reason = ClassInfra, fmt.Sprintf("known infrastructure name %s", infraNamed(e, pol))
		case pol.isSMTP(e.proto, e.port):
			d.Class, d.Reason = ClassAbuse, fmt.Sprintf("SMTP on %s/%d (spam)", e.proto, e.port)
		case e.attack != "":
			d.Class, d.Reason = ClassAbuse, e.attack
		case ev.attacked[e.addr].why != "":
			// The flood's connections are the evidence, before the
			// endpoint's own.
			a := ev.attacked[e.addr]
			d.Class, d.Reason, d.UIDs = ClassAbuse, a.why, unionUIDs(a.uids, e.uids)
		case e.flood(pol):
			d.Class, d.Reason = ClassAbuse, fmt.Sprintf("flood: %d connections, %d packets", e.conns, e.pkts)
		default:
			if g, ok := scanGroups[e.key()]; ok {
				d.Class, d.Reason, d.group = ClassScan, g.reason, g.group
			} else {
				few++
			}
		}
	}
	fewDests := few <= pol.FewDestinations
	for _, e := range list {
		d := res[e.key()]
		if d.Class != "" && d.Class != ClassScan {
			continue
		}
		score, why, beacon := c2Evidence(e, pol, fewDests, few)
		if d.Class == ClassScan {
			// A destination on a scanned port stands out from the scan
			// only with a name and a beacon or a long session, or as a
			// live command channel: Mirai's C2 listens on the telnet port
			// its bots scan. (A channel the sample speaks to a scanned
			// address still goes through probation: its far side must
			// answer as a C2.) A channel's bytes crossed an established
			// connection even when tb-parse folded it into the scan's
			// summary and no endpoint counts it.
			named := len(e.names)+len(e.claimed) > 0 && (beacon != nil || e.maxDur >= pol.LongSession.D().Seconds())
			if !named && !e.channelLive || e.established == 0 && e.channel == "" {
				continue
			}
			why = append(why, "stands out from the "+d.group)
		}
		d.Score, d.Beacon = score, beacon
		if score == 0 {
			d.Class, d.Reason = ClassOther, "contacted once, no C2 evidence"
			continue
		}
		d.Class, d.Reason = ClassC2, strings.Join(why, "; ")
	}
	return list, res
}

// propagate classifies every name the sample resolved, in name order: a
// name takes the class of the destinations it resolved to (list,
// classified as res), the worst of them by classRank. A name only claimed
// by requests is no destination of its own. Resolved names that may not be
// forwarded come last, each with why not.
func (ev *evidence) propagate(list []*endpoint, res map[string]*Dest, pol *Policy) []Dest {
	nameEps := map[string][]*Dest{}
	for _, e := range list {
		for n := range e.names {
			nameEps[n] = append(nameEps[n], res[e.key()])
		}
	}
	allNames := map[string]bool{}
	for n := range ev.names {
		allNames[n] = true
	}
	for n := range nameEps {
		allNames[n] = true
	}
	out := make([]Dest, 0, len(allNames))
	for _, n := range slices.Sorted(maps.Keys(allNames)) {
		d := Dest{Lease: ev.lease, Type: records.AllowDomain, Value: n}
		if dn := ev.names[n]; dn != nil {
			d.Observable, d.LastSeen, d.Conns, d.UIDs = obsID(dn.o), dn.o.LastSeen, dn.o.Count, addUIDs(nil, dn.o)
		}
		led := nameEps[n]
		sort.Slice(led, func(i, j int) bool {
			return led[i].Score > led[j].Score || led[i].Score == led[j].Score && led[i].Value < led[j].Value
		})
		var best *Dest
		for _, e := range led {
			if e.LastSeen.After(d.LastSeen) {
				d.LastSeen = e.LastSeen
			}
			if best == nil || classRank(e.Class) > classRank(best.Class) {
				best = e
			}
		}
		switch {
		case matchAny(pol.InfraNames, n) != "":
			d.Class, d.Reason = ClassInfra, "known infrastructure name ("+matchAny(pol.InfraNames, n)+")"
		case ev.names[n] != nil && ev.names[n].mx:
			d.Class, d.Reason = ClassAbuse, "MX lookup (mail delivery: spam)"
		case best == nil:
			d.Class, d.Reason = ClassOther, "resolved, never contacted"
		case best.Class == ClassC2:
			d.Class, d.Score, d.Beacon = ClassC2, best.Score, best.Beacon
			d.Reason = fmt.Sprintf("resolved, then %s contacted: %s", best.Value, best.Reason)
		default:
			d.Class, d.Reason = best.Class, fmt.Sprintf("led to %s (%s: %s)", best.Value, best.Class, best.Reason)
		}
		out = append(out, d)
	}
	for _, n := range slices.Sorted(maps.Keys(ev.badNames)) {
		b := ev.badNames[n]
		out = append(out, Dest{Lease: ev.lease, Type: records.AllowDomain, Value: n, Class: ClassOther, Observable: obsID(b.o), UIDs: addUIDs(nil, b.o),
			LastSeen: b.o.LastSeen, Conns: b.o.Count, Reason: "resolved, but " + b.why, invalid: b.why})
	}
	return out
}

// obsID is an observable's ID when it is one: observables on stdin are
// any JSON.
func obsID(o *records.Observable) string {
	if records.CheckID(o.ID) != nil {
		return ""
	}
	return o.ID
}

// claimedOnly are the names requests called the endpoint by that were not
// resolved to it.
func (e *endpoint) claimedOnly() []string {
	var out []string
	for n := range e.claimed {
		if !e.names[n] {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Rates below which many connections or packets are not a flood: a beacon
// merged over days of cycles adds up to thousands of connections too.
const (
	floodConnRate = 1.0   // connections per second
	floodPktRate  = 100.0 // packets per second
)

// flood reports many connections or packets to one destination, fast.
func (e *endpoint) flood(pol *Policy) bool {
	span := max(e.last.Sub(e.first).Seconds(), 1)
	return e.conns >= pol.FloodConns && float64(e.conns)/span >= floodConnRate ||
		e.pkts >= pol.FloodPackets && float64(e.pkts)/span >= floodPktRate
}

func (e *endpoint) touch(o *records.Observable) {
	if o.LastSeen.After(e.last) {
		e.last = o.LastSeen
	}
	if e.first.IsZero() || !o.FirstSeen.IsZero() && o.FirstSeen.Before(e.first) {
		e.first = o.FirstSeen
	}
	if id := obsID(o); e.obs == "" || id != "" && id < e.obs {
		e.obs = id
	}
	e.uids = addUIDs(e.uids, o)
}

// unionUIDs is a's uids, then b's, up to MaxUIDs.
func unionUIDs(a, b []string) []string {
	out := slices.Clone(a)
	for _, u := range b {
		if len(out) < MaxUIDs && !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return out
}

// MaxUIDs bounds the connections a destination's evidence names.
const MaxUIDs = 8

// addUIDs adds the connections an observable was seen on to uids, up to
// MaxUIDs. Observables on stdin are any JSON: a uid that could not be a
// flow log's names no connection and is left out.
func addUIDs(uids []string, o *records.Observable) []string {
	for _, p := range o.Provenance {
		if len(uids) >= MaxUIDs {
			break
		}
		if flowlog.ValidUID(p.UID) && !slices.Contains(uids, p.UID) {
			uids = append(uids, p.UID)
		}
	}
	return uids
}

// classRank orders what a name's destinations say about it: abuse and scans
// win over C2 evidence, which wins over nothing.
func classRank(c string) int {
	switch c {
	case ClassAbuse:
		return 4
	case ClassScan:
		return 3
	case ClassC2:
		return 2
	case ClassInfra:
		return 1
	}
	return 0
}

// infraNamed is the least of an endpoint's names when every name it was
// resolved from or called by is known infrastructure.
func infraNamed(e *endpoint, pol *Policy) string {
	all := slices.Concat(slices.Collect(maps.Keys(e.names)), slices.Collect(maps.Keys(e.claimed)))
	if len(all) == 0 {
		return ""
	}
	for _, n := range all {
		if matchAny(pol.InfraNames, n) == "" {
			return ""
		}
	}
	return slices.Min(all)
}

// c2Evidence scores one endpoint and says why.
func c2Evidence(e *endpoint, pol *Policy, fewDests bool, few int) (float64, []string, *records.Beacon) {
	var score float64
	var why []string
	if e.conns >= int64(pol.MinConns) {
		score += wRepeated
		why = append(why, fmt.Sprintf("contacted %d times", e.conns))
	}
	b := beacon(e.starts, pol)
	if b != nil {
		score += wPeriodic
		why = append(why, fmt.Sprintf("periodic every %s (jitter %.0f%%, %d samples)", b.Interval, b.Jitter*100, b.Samples))
	}
	switch {
	case len(e.names) > 0:
		score += wNamed
		why = append(why, "named "+strings.Join(slices.Sorted(maps.Keys(e.names)), ", "))
	case len(e.claimed) > 0:
		score += wNamed
		why = append(why, "called "+strings.Join(slices.Sorted(maps.Keys(e.claimed)), ", ")+" by its requests (never resolved to it)")
	}
	if e.maxDur >= pol.LongSession.D().Seconds() {
		score += wLongLived
		why = append(why, fmt.Sprintf("session of %s", (time.Duration(e.maxDur*float64(time.Second))).Round(time.Second)))
	}
	if e.established >= 2 {
		score += wReconnected
		why = append(why, fmt.Sprintf("re-established %d times", e.established))
	}
	if e.channel != "" && e.channelLive {
		score += wChannel
		why = append(why, e.channel)
	}
	if score > 0 && fewDests {
		score += wFew
		why = append(why, fmt.Sprintf("one of %d destinations", few))
	}
	return math.Round(math.Min(score, 1)*100) / 100, why, b
}

// beacon estimates a contact period: the median interval between
// connection starts, and the jitter as the median absolute deviation of
// the intervals relative to it.
func beacon(starts []time.Time, pol *Policy) *records.Beacon {
	if len(starts) < pol.MinBeacons {
		return nil
	}
	ts := slices.SortedFunc(slices.Values(starts), time.Time.Compare)
	iv := make([]float64, 0, len(ts)-1)
	for i := 1; i < len(ts); i++ {
		if d := ts[i].Sub(ts[i-1]).Seconds(); d > 0.001 {
			iv = append(iv, d)
		}
	}
	if len(iv) < pol.MinBeacons-1 {
		return nil
	}
	med := median(iv)
	if med < 1 {
		return nil // bursts, not beacons
	}
	dev := make([]float64, len(iv))
	for i, v := range iv {
		dev[i] = math.Abs(v - med)
	}
	jitter := median(dev) / med
	if jitter > pol.MaxJitter {
		return nil
	}
	return &records.Beacon{Interval: records.Duration(time.Duration(med * float64(time.Second)).Round(time.Millisecond)),
		Jitter: math.Round(jitter*1000) / 1000, Samples: len(ts)}
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

type scanGroup struct{ group, reason string }

// scanDest is the destination a port's scan observables stand for (the
// scanned addresses tb-parse summarised), when they make a scan.
func scanDest(lease, port string, obs []*records.Observable, endpoints int, pol *Policy) (Dest, bool) {
	proto, p, _ := parseService(port)
	if pol.isInfraService(proto, p) {
		return Dest{}, false
	}
	d := Dest{Lease: lease, Type: records.ObsScan, Value: port, Class: ClassScan, group: "scan of " + port}
	infos := make([]*records.ScanInfo, len(obs))
	for i, o := range obs {
		infos[i] = o.Scan
		d.Conns += o.Scan.Conns
		if o.LastSeen.After(d.LastSeen) {
			d.LastSeen = o.LastSeen
		}
		if id := obsID(o); d.Observable == "" || id != "" && id < d.Observable {
			d.Observable = id
		}
		d.UIDs = addUIDs(d.UIDs, o)
		for _, s := range o.Scan.Sample {
			if len(d.Sample) < 8 && !slices.Contains(d.Sample, s) {
				d.Sample = append(d.Sample, s)
			}
		}
	}
	d.Dests = observe.ScanDests(infos)
	n := max(d.Dests, int64(endpoints))
	if n < int64(scanMin(pol, p)) {
		return Dest{}, false
	}
	d.Reason = fmt.Sprintf("scan: %d distinct destinations on %s", n, port)
	// The endpoints of the port are destinations of their own.
	d.Dests = max(n-int64(endpoints), 1)
	return d, true
}

func byPortOf(list []*endpoint, port string) []*endpoint {
	var out []*endpoint
	for _, e := range list {
		if e.proto+"/"+strconv.Itoa(int(e.port)) == port {
			out = append(out, e)
		}
	}
	return out
}

func scanMin(pol *Policy, port uint16) int {
	if pol.isScanPort(port) {
		return pol.ScanPortMinTargets
	}
	return pol.ScanMinTargets
}

// scans finds the endpoints that belong to a scan: one port contacted on
// many addresses (counting those tb-parse summarised in scan
// observables), or a run of consecutive addresses.
func scans(list []*endpoint, scanObs map[string][]*records.Observable, pol *Policy) map[string]scanGroup {
	out := map[string]scanGroup{}
	byPort := map[string][]*endpoint{}
	for _, e := range list {
		if pol.isInfraService(e.proto, e.port) {
			continue
		}
		k := e.proto + "/" + strconv.Itoa(int(e.port))
		byPort[k] = append(byPort[k], e)
	}
	for k, es := range byPort {
		n := len(es)
		infos := make([]*records.ScanInfo, len(scanObs[k]))
		for i, o := range scanObs[k] {
			infos[i] = o.Scan
		}
		n = max(n, int(observe.ScanDests(infos)))
		_, port, _ := parseService(k)
		if n >= scanMin(pol, port) {
			g := scanGroup{group: "scan of " + k, reason: fmt.Sprintf("scan: %d distinct destinations on %s", n, k)}
			for _, e := range es {
				out[e.key()] = g
			}
		}
	}
	// Sweeps: runs of consecutive IPv4 addresses, whatever the ports.
	addrs := map[netip.Addr][]*endpoint{}
	for _, e := range list {
		if e.addr.Is4() && !pol.isInfraService(e.proto, e.port) {
			addrs[e.addr] = append(addrs[e.addr], e)
		}
	}
	sorted := slices.SortedFunc(maps.Keys(addrs), netip.Addr.Compare)
	for i := 0; i < len(sorted); {
		j := i + 1
		for j < len(sorted) && sorted[j-1].Next() == sorted[j] {
			j++
		}
		if j-i >= pol.SweepMinRun {
			g := scanGroup{group: fmt.Sprintf("sweep of %s-%s", sorted[i], sorted[j-1]),
				reason: fmt.Sprintf("sweep: %d consecutive addresses %s-%s", j-i, sorted[i], sorted[j-1])}
			for _, a := range sorted[i:j] {
				for _, e := range addrs[a] {
					if _, ok := out[e.key()]; !ok {
						out[e.key()] = g
					}
				}
			}
		}
		i = j
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// tried are the destinations the sample connected to, or sent a datagram
// to, by system call (its behaviour trace) without any of its traffic
// being captured: each a C2 candidate at the candidate score, never more,
// since the sample chooses what it calls (a decoy costs it one connect).
// Destinations the capture saw are classified from the capture alone.
func tried(lease string, netcalls []*records.Observable, eps map[string]*endpoint, pol *Policy) []Dest {
	byKey := map[string]*Dest{}
	for _, o := range netcalls {
		n := o.Netcall
		if (n.Call != "connect" && n.Call != "sendto") || (n.Family != "inet" && n.Family != "inet6") || n.Port == 0 {
			continue
		}
		a, err := netip.ParseAddr(n.Addr)
		if err != nil {
			continue
		}
		proto := n.Proto
		if proto == "" {
			proto = map[string]string{"connect": "tcp", "sendto": "udp"}[n.Call]
		}
		if proto != "tcp" && proto != "udp" {
			continue
		}
		key := endpt.New(a, n.Port, proto).String()
		if eps[key] != nil {
			continue
		}
		d := byKey[key]
		if d == nil {
			d = &Dest{Lease: lease, Type: records.AllowEndpoint, Value: key, Observable: obsID(o), addr: a.Unmap(), proto: proto, port: n.Port}
			byKey[key] = d
		}
		d.Conns += n.Calls
		if o.LastSeen.After(d.LastSeen) {
			d.LastSeen = o.LastSeen
		}
	}
	out := make([]Dest, 0, len(byKey))
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		d := byKey[k]
		if pol.isInfraService(d.proto, d.port) {
			d.Class, d.Reason = ClassInfra, fmt.Sprintf("%s/%d is a service the lab provides", d.proto, d.port)
		} else {
			// Below the promotion score whatever the policy says.
			d.Class, d.Score = ClassC2, math.Min(pol.CandidateScore, pol.PromoteScore-0.01)
			d.Reason = fmt.Sprintf("tried by system call (%d calls in the behaviour trace), no traffic captured: a candidate only", d.Conns)
		}
		out = append(out, *d)
	}
	return out
}
