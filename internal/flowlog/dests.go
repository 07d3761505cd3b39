package flowlog

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/distinct"
	"github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Bounds of what a cycle's destinations keep, so that a bot scanning
// without pause costs the state O(1) per connection (see tb-parse(1)).
const (
	// LongConn is the duration from which a connection stands out of a
	// scan (the allow-list's default long session).
	LongConn = 5 * time.Minute
	// RepeatSpan: contacts of one destination spread over this much time
	// stand out of a scan (a beacon, not a brute-force burst).
	RepeatSpan = time.Minute
	// maxTracked bounds the endpoints tracked one by one; maxOneShot the
	// scanned destinations remembered to notice a second contact.
	maxTracked = 1 << 16
	maxOneShot = 1 << 16
)

type epKey struct {
	addr  netip.Addr
	port  uint16
	proto string
}

type groupKey struct {
	proto string
	port  uint16
}

type hostKey struct {
	addr  netip.Addr
	proto string
}

// scanGroup is the connections of one (protocol, port), or of one
// address's ports.
type scanGroup struct {
	proto                             string
	port                              uint16     // a port group
	addr                              netip.Addr // a host group
	dests                             distinct.Counter
	conns, open, rejected, unanswered int64
	first, last                       int64
	sample, openSample, clients       []string
	scanning                          bool
	tracked                           int // a host group: endpoints tracked
	seen                              firstConn
}

type endpointStat struct {
	key                                      epKey
	conns, established                       int64
	origPkts, origBytes, respPkts, respBytes int64
	maxDur                                   int64
	conversations                            int64
	exchange                                 uint8 // the highest of its connections
	first, last                              int64
	states, services, clients                []string
	starts                                   []int64
	named                                    bool
	// resumed counts the connections among conns that began in the
	// previous capture (Conn.Resumed); newFirst is the first start of the
	// others, when there are any. Whether a destination stands out of a
	// scan is told from the contacts made in this cycle only.
	resumed  int64
	newFirst int64
	// The last contacts: a 5-tuple is not reused within a second
	// (TIME_WAIT), so pieces closer than that which start without a SYN are
	// one connection a sensor split (or a capture out of time order ended
	// early). A TCP piece whose history says it did not start with a SYN is
	// no new connection however late it comes, within RepeatSpan
	// (pieceSpan); nor is a SYN sent again on the same 5-tuple within a
	// second (retrySpan). Connections are logged as they end, not as they
	// start, so a piece is looked for among several contacts, not the last
	// alone.
	recent [recentContacts]contact
	next   uint8 // the slot of recent the next contact takes
	seen   firstConn
	tick   uint64
}

// recentContacts is how many of a destination's last contacts a piece or
// retry is matched against: in a scan a destination is contacted two or
// three times a cycle, and a flow table logs a connection at most a few
// contacts late.
const recentContacts = 4

// contact is one contact of a destination: its originator (origKey, 0 for
// none), its start, whether it counted as established and whether the
// destination answered it at all.
type contact struct {
	start    int64
	orig     uint32
	establ   bool
	answered bool
}

// oneShots remembers scanned destinations contacted once, to notice a
// second contact: a fixed table indexed by a hash of the destination,
// where a newer destination overwrites an older one (the cost of a
// forgotten destination is a second contact counted as a first).
type oneShots []oneShot

type oneShot struct {
	key uint64
	n   int32
	// first is the first contact; its originator only when n is 1 (else
	// 0): a retry of that contact's SYN is no second contact.
	first contact
}

// origKey is a nonzero hash of a connection's originating address and
// port.
func origKey(a netip.AddrPort) uint32 {
	return uint32(distinct.Mix64(distinct.AddrKey(a.Addr())^uint64(a.Port()))) | 1
}

// retrySpan: a connection of the same 5-tuple as the one before, started
// this soon after it, is that connection's retry. A SYN answered by a
// stale ACK (the responder still holds an older connection of the same
// ports) is reset and sent again at once, which a flow table sees as a
// second connection; a 5-tuple is not otherwise reused this soon
// (TIME_WAIT).
const retrySpan = int64(time.Second)

// synRetrySpan: an unanswered connection of the same 5-tuple as an attempt
// nothing answered, started this soon after it, is that attempt's retry
// (one that was answered is told as a new contact: the flow log does not
// say whether its SYN was the same, and a new connect() on the same ports
// is a new contact). A
// connect() sends its SYN again for about a minute (Linux's
// tcp_syn_retries of 6: at 1, 3, 7, 15, 31 and 63 s), and a flow table
// makes each retry past the attempt delay (5 s) a connection of its own,
// as Zeek does. A scanner whose SYNs the lab drops (the guest's
// connection-rate limit) would otherwise make five contacts over 63 s of
// each destination it retries, each standing out of its scan.
const synRetrySpan = int64(2 * time.Minute)

// within reports whether two starts are less than span apart.
func within(a, b, span int64) bool {
	return a-b < span && b-a < span
}

// takes reports whether c, from orig (origKey), is a piece or a retry of
// the contact r rather than a contact of its own.
func (r *contact) takes(c *Conn, orig uint32) bool {
	if r.orig != orig {
		return false
	}
	noSYN := c.History == "" || c.History[0] != 'S'
	return within(c.Start, r.start, retrySpan) || noSYN && within(c.Start, r.start, pieceSpan(c)) ||
		!r.answered && c.Proto == "tcp" && c.RespPkts == 0 && within(c.Start, r.start, synRetrySpan)
}

// saw notes what c, one of its pieces, says of the contact.
func (r *contact) saw(c *Conn) {
	if c.RespPkts > 0 {
		r.answered = true
	}
}

func (k epKey) hash() uint64 {
	return distinct.AddrKey(k.addr) ^ distinct.Mix64(uint64(k.port)<<8|uint64(protoCode(k.proto)))
}

// protoCode is a protocol name's small code for hashing.
func protoCode(p string) uint8 {
	switch p {
	case "tcp":
		return 6
	case "udp":
		return 17
	case "icmp":
		return 1
	}
	return uint8(len(p))
}

// seen counts c, a connection of k, and returns the contacts before it
// and the first one; none when it is the first, or a piece or retry of the
// one contact before it (contact.takes).
func (o oneShots) seen(k epKey, c *Conn) (before int32, first contact) {
	h := k.hash()
	s := &o[h&uint64(len(o)-1)]
	orig := origKey(netip.AddrPortFrom(c.OrigH, c.OrigP))
	if s.key == h && s.n > 0 {
		if s.n == 1 && s.first.takes(c, orig) {
			s.first.saw(c)
			return 0, contact{}
		}
		before, first = s.n, s.first
		s.n = 0 // tracked from now on
		return before, first
	}
	*s = oneShot{key: h, n: 1, first: contact{start: c.Start, orig: orig}}
	s.first.saw(c)
	return 0, contact{}
}

// remember keeps a folded endpoint's contacts: n from the first, which
// started at first, the last being last.
func (o oneShots) remember(k epKey, first int64, n int32, last contact) {
	h := k.hash()
	if n != 1 || last.start != first {
		last.orig = 0
	}
	last.start = first
	o[h&uint64(len(o)-1)] = oneShot{key: h, n: n, first: last}
}

// Dests folds one cycle's connections into endpoint and scan observables.
type Dests struct {
	cycle   string
	in      *seenIn // the input of the last destination first seen
	named   func(netip.Addr) bool
	emit    func(*records.Observable)
	groups  map[groupKey]*scanGroup
	hosts   map[hostKey]*scanGroup
	eps     map[epKey]*endpointStat
	oneShot oneShots
	tick    uint64
}

// NewDests returns the destinations of one cycle. named reports whether
// DNS answers named an address so far; emit receives the observables (at
// Flush, or early when more endpoints stand out than it tracks).
func NewDests(cycle string, named func(netip.Addr) bool, emit func(*records.Observable)) *Dests {
	return &Dests{cycle: cycle, named: named, emit: emit, groups: map[groupKey]*scanGroup{}, hosts: map[hostKey]*scanGroup{},
		eps: map[epKey]*endpointStat{}}
}

// Conn folds one connection seen in origin.
func (t *Dests) Conn(c *Conn, origin *observe.Origin) {
	t.tick++
	g := t.groups[groupKey{c.Proto, c.RespP}]
	if g == nil {
		g = &scanGroup{proto: c.Proto, port: c.RespP}
		t.groups[groupKey{c.Proto, c.RespP}] = g
	}
	g.add(c, t, origin)
	if !g.scanning && g.dests.AtLeast(observe.ScanMinDests) {
		t.startScan(g)
	}
	hk := hostKey{c.RespH, c.Proto}
	h := t.hosts[hk]
	if h != nil && h.scanning {
		h.add(c, t, origin)
	}
	k := epKey{c.RespH, c.RespP, c.Proto}
	e := t.eps[k]
	if e == nil {
		named := c.Service != "" || t.named(c.RespH)
		if (g.scanning || h != nil && h.scanning) && !named && c.End-c.Start < int64(LongConn) {
			if c.Resumed {
				return // a contact of the previous cycle's
			}
			if t.oneShot == nil {
				t.oneShot = make(oneShots, maxOneShot)
			}
			n, first := t.oneShot.seen(k, c)
			if n == 0 {
				return
			}
			// A second contact: track it from here, with the first.
			e = t.track(k, c, origin)
			e.conns = int64(n)
			e.starts = append(e.starts, first.start)
			e.first = min(e.first, first.start)
			e.newFirst = first.start
			e.recent[0] = first
			e.next = 1
		} else {
			e = t.track(k, c, origin)
		}
		if h == nil {
			h = &scanGroup{proto: c.Proto, addr: c.RespH}
			t.hosts[hk] = h
		}
		h.tracked++
		e.add(c, t.tick)
		if !h.scanning && h.tracked >= observe.ScanMinDests {
			t.startHostScan(h)
		}
	} else {
		e.add(c, t.tick)
	}
	if len(t.eps) > maxTracked {
		t.shed()
	}
}

func (t *Dests) track(k epKey, c *Conn, origin *observe.Origin) *endpointStat {
	e := &endpointStat{key: k, first: c.Start, last: c.End, seen: t.firstSeen(c, origin)}
	t.eps[k] = e
	return e
}

// firstConn is the connection a destination was first seen on, for its
// observable's provenance: its input, shared by the destinations of one
// input (not its four strings in each), its packet or line, and its uid,
// made into a string only when the observable is (tracked destinations are
// most of tb-parse's live heap on a capture of many small conversations).
type firstConn struct {
	in           *seenIn
	packet, line int64
	uidSeq       int64  // the uid is in.uids' uidSeq-th when uid is ""
	uid          string // a sensor's, or one the decoder had made
}

type seenIn struct {
	origin observe.Origin
	uids   *UIDs
}

// firstSeen is the provenance of c, seen in origin, kept by a destination.
func (t *Dests) firstSeen(c *Conn, origin *observe.Origin) firstConn {
	if t.in == nil || t.in.origin != *origin || t.in.uids != c.UIDs {
		t.in = &seenIn{origin: *origin, uids: c.UIDs}
	}
	return firstConn{in: t.in, packet: c.Packet, line: c.Line, uidSeq: c.UIDSeq, uid: c.UID}
}

// origin is the origin of the observables of a destination first seen on
// f in cycle.
func (f *firstConn) origin(cycle string) observe.Origin {
	o := f.in.origin
	o.Cycle, o.UID = cycle, f.uid
	if o.UID == "" && f.in.uids != nil {
		o.UID = f.in.uids.At(f.uidSeq)
	}
	return o
}

// add counts one connection of t seen in origin; for a host group the
// destination is the port.
func (g *scanGroup) add(c *Conn, t *Dests, origin *observe.Origin) {
	if g.conns == 0 {
		g.first, g.last, g.seen = c.Start, c.End, t.firstSeen(c, origin)
	}
	accepted := c.Accepted()
	switch {
	case accepted:
		g.count(1, 1, 0, 0, c.Start, c.End)
	case c.Rejected():
		g.count(1, 0, 1, 0, c.Start, c.End)
	default:
		g.count(1, 0, 0, 1, c.Start, c.End)
	}
	g.dest(c.RespH, c.RespP, accepted)
	g.clients = addClient(g.clients, c.OrigH)
}

// addClient adds a client's address to a bounded list, stringifying it
// only when it is new (scans come from one or two clients).
func addClient(clients []string, a netip.Addr) []string {
	if len(clients) >= observe.MaxList {
		return clients
	}
	var buf [64]byte
	b := a.AppendTo(buf[:0])
	for _, c := range clients {
		if c == string(b) {
			return clients
		}
	}
	return append(clients, string(b))
}

func (g *scanGroup) count(conns, open, rejected, unanswered, first, last int64) {
	if g.conns == 0 {
		g.first, g.last = first, last
	}
	g.conns += conns
	g.open += open
	g.rejected += rejected
	g.unanswered += unanswered
	g.first, g.last = min(g.first, first), max(g.last, last)
}

func (g *scanGroup) dest(a netip.Addr, port uint16, accepted bool) {
	host := g.addr.IsValid()
	key := uint64(port)
	if !host {
		key = distinct.AddrKey(a)
	}
	text := func() string {
		if host {
			return strconv.Itoa(int(port))
		}
		return a.String()
	}
	if g.dests.Add(key) && len(g.sample) < observe.MaxSample {
		g.sample = append(g.sample, text())
	}
	if accepted && len(g.openSample) < observe.MaxSample {
		if s := text(); !slices.Contains(g.openSample, s) {
			g.openSample = append(g.openSample, s)
		}
	}
}

func (e *endpointStat) add(c *Conn, tick uint64) {
	e.tick = tick
	at := e.contactOf(c)
	if at == nil {
		if c.Resumed {
			e.resumed++
		} else if e.conns == e.resumed || c.Start < e.newFirst {
			e.newFirst = c.Start
		}
		e.conns++
		at = &e.recent[e.next]
		*at = contact{start: c.Start, orig: origKey(netip.AddrPortFrom(c.OrigH, c.OrigP))}
		e.next = (e.next + 1) % recentContacts
		e.starts = append(e.starts, c.Start)
	}
	if c.Established() && !at.establ {
		e.established++
		at.establ = true
	}
	at.saw(c)
	e.origPkts += c.OrigPkts
	e.origBytes += c.OrigBytes
	e.respPkts += c.RespPkts
	e.respBytes += c.RespBytes
	e.maxDur = max(e.maxDur, c.End-c.Start)
	e.exchange = max(e.exchange, c.Exchange)
	if c.Exchange == ExchangeConversed {
		e.conversations++
	}
	e.first, e.last = min(e.first, c.Start), max(e.last, c.End)
	if !slices.Contains(e.states, c.ConnState) && len(e.states) < observe.MaxList {
		e.states = append(e.states, c.ConnState)
	}
	if c.Service != "" {
		if !slices.Contains(e.services, c.Service) && len(e.services) < observe.MaxList {
			e.services = append(e.services, c.Service)
		}
		e.named = true
	}
	e.clients = addClient(e.clients, c.OrigH)
	if len(e.starts) >= 2*observe.MaxStarts {
		slices.Sort(e.starts)
		e.starts = e.starts[:copy(e.starts, e.starts[len(e.starts)-observe.MaxStarts:])]
	}
}

// contactOf returns the recent contact c is a piece or a retry of, or nil
// when c is a contact of its own.
func (e *endpointStat) contactOf(c *Conn) *contact {
	if e.conns == 0 {
		return nil
	}
	orig := origKey(netip.AddrPortFrom(c.OrigH, c.OrigP))
	for i := range e.recent {
		if r := &e.recent[i]; r.takes(c, orig) {
			return r
		}
	}
	return nil
}

// latest is the last contact of e.
func (e *endpointStat) latest() contact {
	return e.recent[(e.next+recentContacts-1)%recentContacts]
}

// pieceSpan is how far from the last connection of its 5-tuple a piece
// without a SYN may start and still be part of it. A second, unless the
// piece is TCP with a history that says it started without a SYN: a
// connection's late packets after its flow expired (a probed sinkhole's
// FIN when the sinkhole forked its responder seconds late), which counted
// as a contact of their own would make a destination probed twice a minute
// apart stand out of its scan as a beacon does.
func pieceSpan(c *Conn) int64 {
	if c.Proto == "tcp" && c.History != "" {
		return int64(RepeatSpan)
	}
	return int64(time.Second)
}

// standsOut reports whether an endpoint of a scanned port or host says more
// than the scan: named, long, or contacted repeatedly over a span.
func (t *Dests) standsOut(e *endpointStat) bool {
	return e.named || t.named(e.key.addr) || e.maxDur >= int64(LongConn) ||
		e.conns-e.resumed >= 3 && e.last-e.newFirst >= int64(RepeatSpan)
}

// scanned reports whether an endpoint belongs to a scan.
func (t *Dests) scanned(e *endpointStat) bool {
	if g := t.groups[groupKey{e.key.proto, e.key.port}]; g != nil && g.scanning {
		return true
	}
	h := t.hosts[hostKey{e.key.addr, e.key.proto}]
	return h != nil && h.scanning
}

// startScan turns a port group into a scan: its tracked destinations seen
// once are folded into it, remembered only to notice a second contact.
func (t *Dests) startScan(g *scanGroup) {
	g.scanning = true
	g.dests.StartSketch()
	for k, e := range t.eps {
		if k.proto == g.proto && k.port == g.port && e.conns == 1 && !t.standsOut(e) {
			t.fold(k, e)
		}
	}
}

// startHostScan turns a host into a scan of its ports, with what its
// tracked endpoints saw so far.
func (t *Dests) startHostScan(h *scanGroup) {
	h.scanning = true
	for k, e := range t.eps {
		if k.addr != h.addr || k.proto != h.proto {
			continue
		}
		if h.conns == 0 {
			h.seen = e.seen
		}
		open := e.established
		h.count(e.conns, open, 0, e.conns-open, e.first, e.last)
		h.dest(k.addr, k.port, open > 0)
		for _, c := range e.clients {
			if len(h.clients) < observe.MaxList && !slices.Contains(h.clients, c) {
				h.clients = append(h.clients, c)
			}
		}
		if e.conns == 1 && !t.standsOut(e) {
			t.fold(k, e)
		}
	}
	h.dests.StartSketch()
}

func (t *Dests) fold(k epKey, e *endpointStat) {
	delete(t.eps, k)
	if h := t.hosts[hostKey{k.addr, k.proto}]; h != nil {
		h.tracked--
	}
	if t.oneShot == nil {
		t.oneShot = make(oneShots, maxOneShot)
	}
	if n := e.conns - e.resumed; n > 0 {
		t.oneShot.remember(k, e.newFirst, int32(n), e.latest())
	}
}

// shed keeps the tracked endpoints bounded: first it folds scanned ones
// that do not stand out, then it writes out the least recently active half.
func (t *Dests) shed() {
	for k, e := range t.eps {
		if t.scanned(e) && !t.standsOut(e) {
			t.fold(k, e)
		}
	}
	if len(t.eps) <= maxTracked*3/4 {
		return
	}
	all := make([]*endpointStat, 0, len(t.eps))
	for _, e := range t.eps {
		all = append(all, e)
	}
	slices.SortFunc(all, func(a, b *endpointStat) int { return int(a.tick - b.tick) })
	for _, e := range all[:len(all)/2] {
		t.out(e)
		delete(t.eps, e.key)
	}
}

// Flush emits the endpoints with something to say and the scans, and
// empties the tracker.
func (t *Dests) Flush() {
	keys := slices.SortedFunc(maps.Keys(t.eps), func(a, b epKey) int {
		return cmp.Or(a.addr.Compare(b.addr), cmp.Compare(a.port, b.port), strings.Compare(a.proto, b.proto))
	})
	for _, k := range keys {
		e := t.eps[k]
		if t.scanned(e) && !t.standsOut(e) {
			continue
		}
		t.out(e)
	}
	gkeys := make([]groupKey, 0, len(t.groups))
	for k, g := range t.groups {
		if g.scanning {
			gkeys = append(gkeys, k)
		}
	}
	slices.SortFunc(gkeys, func(a, b groupKey) int {
		return cmp.Or(strings.Compare(a.proto, b.proto), cmp.Compare(a.port, b.port))
	})
	for _, k := range gkeys {
		t.emit(t.scanObservable(t.groups[k], k.proto+"/"+strconv.Itoa(int(k.port))))
	}
	hkeys := make([]hostKey, 0)
	for k, h := range t.hosts {
		if h.scanning {
			hkeys = append(hkeys, k)
		}
	}
	slices.SortFunc(hkeys, func(a, b hostKey) int {
		return cmp.Or(a.addr.Compare(b.addr), strings.Compare(a.proto, b.proto))
	})
	for _, k := range hkeys {
		t.emit(t.scanObservable(t.hosts[k], k.addr.String()+"/"+k.proto))
	}
	clear(t.eps)
	clear(t.groups)
	clear(t.hosts)
	t.oneShot = nil
}

func nsTime(ns int64) time.Time { return time.Unix(0, ns).UTC() }

// out emits an endpoint and the ip observable of its address.
func (t *Dests) out(e *endpointStat) {
	k := e.key
	slices.Sort(e.starts)
	if n := len(e.starts) - observe.MaxStarts; n > 0 {
		e.starts = e.starts[n:]
	}
	starts := make([]time.Time, len(e.starts))
	for i, s := range e.starts {
		starts[i] = nsTime(s)
	}
	addr := k.addr.String()
	first, last := nsTime(e.first), nsTime(e.last)
	origin := e.seen.origin(t.cycle)
	o := origin.New(records.ObsEndpoint, endpoint.New(k.addr, k.port, k.proto).String(), first, e.seen.packet, e.seen.line)
	o.LastSeen, o.Count = last, e.conns
	o.Endpoint = &records.EndpointInfo{Proto: k.proto, Addr: addr, Port: k.port, Conns: e.conns, Established: e.established,
		ConnStates: e.states, Services: e.services, OrigPkts: e.origPkts, OrigBytes: e.origBytes, RespPkts: e.respPkts,
		RespBytes: e.respBytes, MaxDuration: float64(e.maxDur) / 1e9, Clients: e.clients, Starts: starts,
		Conversations: e.conversations}
	if t.cycle != "" {
		if e.respBytes > 0 {
			o.Endpoint.AnsweredIn = []string{t.cycle}
		}
		if e.exchange >= ExchangeProtocol {
			o.Endpoint.SpokeIn = []string{t.cycle}
		}
		if e.exchange >= ExchangeConversed {
			o.Endpoint.ConfirmedIn = []string{t.cycle}
		}
	}
	t.emit(o)
	ip := origin.New(records.ObsIP, addr, first, e.seen.packet, e.seen.line)
	ip.LastSeen, ip.Count = last, e.conns
	ip.IP = &records.IPInfo{Conns: e.conns, Ports: []string{k.proto + "/" + strconv.Itoa(int(k.port))}, Clients: slices.Clone(e.clients),
		OrigBytes: e.origBytes, RespBytes: e.respBytes, Starts: slices.Clone(starts)}
	t.emit(ip)
}

func (t *Dests) scanObservable(g *scanGroup, value string) *records.Observable {
	origin := g.seen.origin(t.cycle)
	first, last := nsTime(g.first), nsTime(g.last)
	o := origin.New(records.ObsScan, value, first, g.seen.packet, g.seen.line)
	o.LastSeen, o.Count = last, g.conns
	n, est := g.dests.Count()
	info := &records.ScanInfo{Proto: g.proto, Conns: g.conns, Open: g.open, Rejected: g.rejected, Unanswered: g.unanswered,
		Dests: n, Estimated: est, Rate: rate(g.conns, last.Sub(first)), Sample: g.sample, OpenSample: g.openSample, Clients: g.clients}
	if sk := g.dests.Sketch(); sk != nil {
		info.Sketch = sk.String()
	}
	if g.addr.IsValid() {
		info.Addr = g.addr.String()
	} else {
		info.Port = g.port
	}
	o.Scan = info
	return o
}

// rate is connections per second over a span, rounded to 0.01.
func rate(n int64, span time.Duration) float64 {
	if span <= 0 {
		return float64(n)
	}
	r := float64(n) / span.Seconds()
	return float64(int64(r*100+0.5)) / 100
}
