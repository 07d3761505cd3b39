package packet

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/decode/botproto"
)

type addr [16]byte

func (a addr) netip(v6 bool) netip.Addr {
	if v6 {
		return netip.AddrFrom16(a)
	}
	return netip.AddrFrom4([4]byte(a[:4]))
}

// flowKey is a 5-tuple in canonical order (lower endpoint first), so that
// both directions find the same flow with one map lookup.
type flowKey struct {
	a, b   addr
	pa, pb uint16
	proto  uint8
	v6     bool
}

func makeKey(src, dst addr, sp, dp uint16, proto uint8, v6 bool) (flowKey, bool) {
	if c := compare(src, dst); c < 0 || (c == 0 && sp <= dp) {
		return flowKey{a: src, b: dst, pa: sp, pb: dp, proto: proto, v6: v6}, true
	}
	return flowKey{a: dst, b: src, pa: dp, pb: sp, proto: proto, v6: v6}, false
}

func compare(x, y addr) int {
	for i := range x {
		if x[i] != y[i] {
			if x[i] < y[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// Flow lists, each ordered by last activity and expired at its own idle
// timeout (Zeek's defaults).
const (
	listShort = iota // TCP attempts and closed connections: 5 s
	listTCP          // other TCP: tcp_inactivity_timeout, 5 min
	listOther        // UDP, ICMP, other: udp/icmp_inactivity_timeout, 1 min
	nLists
)

var listTimeout = [nLists]int64{5e9, 300e9, 60e9}

const attemptDelay = 5e9 // tcp_attempt_delay

// Application protocols recognised in a flow.
const (
	appUnknown = iota
	appNone
	appTLS
	appHTTP
	appDNS
)

// flow is one connection. Its fields are ordered so that it packs into
// Go's 512-byte size class (the flow table is most of tb-parse's live
// heap): the small ones fill the padding after key and after the
// endpoints.
type flow struct {
	key                flowKey
	origIsA            bool // the originator is key.a
	hash               uint64
	start, last        int64
	attemptAt          int64
	bothClosedAt       int64
	firstPkt           int64
	seq                int64       // its number among the input's: its uid is made from it (uidOf)
	ep                 [2]endpoint // originator, responder
	icmpType, icmpCode uint8
	list               uint8
	app                uint8
	talk, exch         uint8 // the turns of its payload (converse)
	botOff             bool  // no channel recognised here: not read
	resumeBotDir       uint8
	prev, next         *flow
	half               [2]half
	pend               *pending
	bot                *botConv // the bot-channel recogniser, while it reads
	dnsQ               dnsQueries
	resumeBot          botproto.Protocol // the channel a carried connection had
	dnsSeen            bool
	carried            bool   // continued from the previous capture (Seed)
	svc                uint8  // the service a carried connection had (svcNone when none)
	histSeen           uint16 // history letters recorded, a bit per letter and side
	histN              uint8
	hist               [13]byte
}

// dnsQuery is a DNS query the flow's originator sent, until its response.
type dnsQuery struct {
	id, qtype uint16
	name      uint64 // hash of the first question's name, lower case
	open      bool
}

// dnsQueries are the last queries of a flow, kept field by field: 50
// bytes, where four dnsQuery would take 96 (or 64 reordered).
type dnsQueries struct {
	names       [4]uint64
	ids, qtypes [4]uint16
	open        uint8 // a bit a query: not answered yet
	n           uint8 // queries kept so far; the slots are reused in turn
}

// len is the number of queries kept.
func (q *dnsQueries) len() int { return min(int(q.n), len(q.names)) }

func (q *dnsQueries) at(i int) dnsQuery {
	return dnsQuery{id: q.ids[i], qtype: q.qtypes[i], name: q.names[i], open: q.open&(1<<i) != 0}
}

func (q *dnsQueries) set(i int, x dnsQuery) {
	q.ids[i], q.qtypes[i], q.names[i] = x.id, x.qtype, x.name
	q.open &^= 1 << i
	if x.open {
		q.open |= 1 << i
	}
}

// pending holds what the application parsers found until the flow ends.
type pending struct {
	reqs     []httpReq
	statusAt int
	tls      *tlsSeen
}

func (f *flow) origAddr() addr {
	if f.origIsA {
		return f.key.a
	}
	return f.key.b
}

func (f *flow) respAddr() addr {
	if f.origIsA {
		return f.key.b
	}
	return f.key.a
}

func (f *flow) origPort() uint16 {
	if f.origIsA {
		return f.key.pa
	}
	return f.key.pb
}

func (f *flow) respPort() uint16 {
	if f.origIsA {
		return f.key.pb
	}
	return f.key.pa
}

// flip swaps the connection's roles, and records it with '^' in the
// history as Zeek does.
func (f *flow) flip() {
	f.origIsA = !f.origIsA
	f.ep[0], f.ep[1] = f.ep[1], f.ep[0]
	f.half[0], f.half[1] = f.half[1], f.half[0]
	if f.resumeBot != botproto.None {
		f.resumeBotDir ^= 1
	}
	if f.bot != nil {
		f.bot.Swap()
		f.bot.next[0], f.bot.next[1] = f.bot.next[1], f.bot.next[0]
		f.bot.started[0], f.bot.started[1] = f.bot.started[1], f.bot.started[0]
	}
	for i, c := range f.hist[:f.histN] {
		switch {
		case c >= 'A' && c <= 'Z':
			f.hist[i] = c + 'a' - 'A'
		case c >= 'a' && c <= 'z':
			f.hist[i] = c - ('a' - 'A')
		}
	}
	f.histSeen = f.histSeen>>6&0x3f | f.histSeen&0x3f<<6 | f.histSeen&(1<<12)
	f.history(true, '^')
	// Turns read with the roles the other way round mean nothing.
	f.talk, f.exch = talkSilent, 0
}

// synAckAnswered reports whether a connection whose first packet was a
// SYN-ACK (its sender taken for the originator until then) now sees an ACK
// or data, without SYN or RST, before the other side said anything else:
// the SYN was missed and the SYN-ACK's sender is the responder. A stealth
// scan's SYN-ACK draws a RST or nothing, so it keeps its roles (Zeek flips
// the same way since 5.1).
func (f *flow) synAckAnswered(flags uint8, plen int) bool {
	o, r := &f.ep[0], &f.ep[1]
	return o.state == tcpSynAckSent && r.state == tcpInactive && r.pkts == 0 &&
		flags&(flagSYN|flagRST) == 0 && (flags&flagACK != 0 || plen > 0)
}

// flipByPort is Zeek's guess of the roles of a TCP connection whose first
// packet is not a bare SYN: its sender is the responder when it sends from
// a likely server port to one that is not, or, between two likely server
// ports, when the packet has no SYN and comes from the lower port.
func flipByPort(flags uint8, sp, dp uint16) bool {
	if flags&(flagSYN|flagACK) == flagSYN || !likely(likelyServerTCP, sp) {
		return false
	}
	if likely(likelyServerTCP, dp) {
		return flags&flagSYN == 0 && sp < dp
	}
	return true
}

// The side that asked, from the first datagram of a UDP connection.
const (
	askerUnknown = iota
	askerSender
	askerPeer
)

// udpAsker reads who asked from the first datagram of a connection to or
// from the ports of DNS (and NetBIOS, mDNS, LLMNR), NTP and DHCP: the QR
// bit of a DNS header, NTP's mode (3 client, 4 server), DHCP's op
// (BOOTREQUEST, BOOTREPLY), as Zeek's analyzers of these protocols set the
// roles. A datagram that does not look like the protocol (a DNS header
// with more than one question or 64 records in a section, an NTP version
// or stratum out of range, no DHCP magic cookie) tells nothing.
func udpAsker(sp, dp uint16, b []byte) int {
	switch {
	case isDNSPort(sp) || isDNSPort(dp):
		if len(b) >= 12 && binary.BigEndian.Uint16(b[4:]) <= 1 && binary.BigEndian.Uint16(b[6:]) <= 64 &&
			binary.BigEndian.Uint16(b[8:]) <= 64 && binary.BigEndian.Uint16(b[10:]) <= 64 {
			if b[2]&0x80 != 0 {
				return askerPeer
			}
			return askerSender
		}
	case sp == 123 || dp == 123:
		if len(b) >= 48 && b[0]>>3&7 >= 1 && b[0]>>3&7 <= 4 && b[1] <= 16 {
			switch b[0] & 7 {
			case 3:
				return askerSender
			case 4:
				return askerPeer
			}
		}
	case (sp == 67 || sp == 68) && (dp == 67 || dp == 68):
		if len(b) >= 240 && b[236] == 99 && b[237] == 130 && b[238] == 83 && b[239] == 99 {
			switch b[0] {
			case 1:
				return askerSender
			case 2:
				return askerPeer
			}
		}
	}
	return askerUnknown
}

// udpSenderIsOrig decides whether the sender of a UDP connection's first
// datagram is its originator: by content when udpAsker can tell, except
// that a multicast or broadcast destination is never made the originator
// (Zeek's rule for DNS); otherwise by Zeek's port heuristic, the sender
// being the responder when it sends from a likely server port to one that
// is not.
func udpSenderIsOrig(sp, dp uint16, payload []byte, dst addr, v6 bool) bool {
	switch udpAsker(sp, dp, payload) {
	case askerSender:
		return true
	case askerPeer:
		return groupAddr(dst, v6)
	}
	return !(likely(likelyServerUDP, sp) && !likely(likelyServerUDP, dp))
}

// groupAddr reports a multicast or limited-broadcast address.
func groupAddr(a addr, v6 bool) bool {
	if v6 {
		return a[0] == 0xff
	}
	return a[0]>>4 == 0xe || a[0] == 255 && a[1] == 255 && a[2] == 255 && a[3] == 255
}

// historyLetters are the letters of Zeek's history that tb-parse records,
// the originator's in upper case, the responder's in lower case, each once.
const historyLetters = "SHADFR"

// history records a letter of the connection's history once per side.
func (f *flow) history(isOrig bool, c byte) {
	bit := uint16(1 << 12) // '^'
	if c != '^' {
		i := uint16(0)
		for historyLetters[i] != c {
			i++
		}
		bit = 1 << i
		if !isOrig {
			bit <<= 6
			c += 'a' - 'A'
		}
	}
	if f.histSeen&bit != 0 || int(f.histN) >= len(f.hist) {
		return
	}
	f.histSeen |= bit
	f.hist[f.histN] = c
	f.histN++
}

// tcpHistory records a TCP segment's history letters: S a SYN, H a
// SYN-ACK, A a pure ACK, D data, F a FIN, R a reset.
func (f *flow) tcpHistory(isOrig bool, flags uint8, plen int) {
	switch {
	case flags&flagSYN != 0 && flags&flagACK != 0:
		f.history(isOrig, 'H')
	case flags&flagSYN != 0:
		f.history(isOrig, 'S')
	}
	if plen > 0 && flags&flagRST == 0 {
		f.history(isOrig, 'D')
	} else if flags == flagACK {
		f.history(isOrig, 'A')
	}
	if flags&flagFIN != 0 {
		f.history(isOrig, 'F')
	}
	if flags&flagRST != 0 {
		f.history(isOrig, 'R')
	}
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 1, 58:
		return "icmp"
	}
	return strconv.Itoa(int(p))
}

// lru is an intrusive doubly linked list of flows, oldest first.
type lru struct{ head, tail *flow }

func (l *lru) remove(f *flow) {
	if f.prev != nil {
		f.prev.next = f.next
	} else {
		l.head = f.next
	}
	if f.next != nil {
		f.next.prev = f.prev
	} else {
		l.tail = f.prev
	}
	f.prev, f.next = nil, nil
}

func (l *lru) push(f *flow) {
	f.prev, f.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = f
	} else {
		l.head = f
	}
	l.tail = f
}

// likelyServer are ports on which the responder of a connection whose
// start was not seen is assumed to be (as Zeek's likely_server_ports).
var likelyServerTCP = portSet(21, 22, 23, 25, 53, 80, 81, 88, 102, 110, 111, 135, 139, 143, 179, 389, 443, 445, 465,
	502, 563, 585, 587, 614, 631, 636, 853, 989, 990, 992, 993, 995, 1080, 1433, 1521, 1723, 1883, 2049, 2811, 3128,
	3306, 3389, 5060, 5222, 5223, 5269, 5432, 5672, 5900, 6379, 6666, 6667, 6668, 6669, 8000, 8080, 8443, 8883, 8888, 9200, 27017)

var likelyServerUDP = portSet(53, 67, 69, 88, 111, 123, 137, 138, 161, 162, 443, 500, 514, 1194, 1812, 1813, 1900,
	2049, 2152, 3478, 3544, 4500, 4789, 5060, 5353, 5355, 6081)

func portSet(ports ...int) *[65536 / 64]uint64 {
	var s [65536 / 64]uint64
	for _, p := range ports {
		s[p/64] |= 1 << (p % 64)
	}
	return &s
}

func likely(s *[65536 / 64]uint64, p uint16) bool { return s[p/64]&(1<<(p%64)) != 0 }

// Services recorded in a connection (Zeek's conn.log service).
const (
	svcNone = iota
	svcDNS
	svcHTTP
	svcSSL
)

var svcNames = [...]string{svcNone: "", svcDNS: "dns", svcHTTP: "http", svcSSL: "ssl"}

// service is what was recognised in the connection's payload, or what it
// had in the capture it was carried from.
func (f *flow) service() uint8 {
	switch {
	case f.pend != nil && f.pend.tls != nil:
		return svcSSL
	case f.app == appHTTP && f.pend != nil:
		return svcHTTP
	case f.dnsSeen:
		return svcDNS
	}
	return f.svc
}

// DefaultMaxCarry bounds the connections a capture hands to the next one
// of its stream (FinishCarry), each a JSON line of about 200 bytes before
// compression where tb-parse stores them.
const DefaultMaxCarry = 1 << 14

// Carried is a connection still open at the end of a capture, as the next
// capture of the same stream (the next rotated file) continues it: its
// roles, its history and service, its DNS queries awaiting an answer and,
// for TCP, each endpoint's state and the sequence number of its next byte.
// Counts are not carried: the next capture's record of the connection
// counts what that capture saw, so that a connection's records add up to
// its totals.
type Carried struct {
	Proto   uint8             `json:"proto"`
	Orig    netip.AddrPort    `json:"orig"`
	Resp    netip.AddrPort    `json:"resp"`
	Last    int64             `json:"last"` // its last packet, Unix nanoseconds
	History string            `json:"history,omitempty"`
	Service string            `json:"service,omitempty"`
	TCP     *[2]CarriedTCP    `json:"tcp,omitempty"` // originator, responder
	DNS     []CarriedDNSQuery `json:"dns,omitempty"`
	// Bot is the command channel the connection was recognised as
	// carrying, so that the next capture reads it on (a day-long session
	// registers once).
	Bot *CarriedBot `json:"bot,omitempty"`
}

// CarriedBot is a carried connection's command channel: its protocol
// (botproto's name) and the bot's side (0 the originator).
type CarriedBot struct {
	Protocol string `json:"protocol"`
	BotDir   int    `json:"bot_dir"`
}

// CarriedTCP is one endpoint of a carried TCP connection.
type CarriedTCP struct {
	State  uint8  `json:"state"`
	Prev   uint8  `json:"prev"`
	Closed bool   `json:"closed,omitempty"`
	Next   uint32 `json:"next"` // the sequence number of its next byte
}

// CarriedDNSQuery is a DNS query of a carried connection not yet answered.
type CarriedDNSQuery struct {
	ID   uint16 `json:"id"`
	Type uint16 `json:"type"`
	Name uint64 `json:"name"` // nameHash of its name
}

// carriable reports whether a connection open at the end of a capture is
// worth continuing in the next one, boundedly for a scanning bot: a TCP
// connection established or seen in the middle (not a bare attempt, an
// unanswered SYN-ACK, or one that closed or was reset), or another that
// both sides spoke in or that awaits a DNS answer.
func (f *flow) carriable() bool {
	o, r := &f.ep[0], &f.ep[1]
	if f.key.proto == 6 {
		return !f.tcpClosing() &&
			(o.state == tcpEstablished || r.state == tcpEstablished || o.state == tcpPartial || r.state == tcpPartial)
	}
	if o.pkts > 0 && r.pkts > 0 || f.carried {
		return true
	}
	for i := range f.dnsQ.len() {
		if f.dnsQ.at(i).open {
			return true
		}
	}
	return false
}

// carry describes a connection for the next capture.
func (f *flow) carry() Carried {
	v6 := f.key.v6
	c := Carried{Proto: f.key.proto, Orig: netip.AddrPortFrom(f.origAddr().netip(v6), f.origPort()),
		Resp: netip.AddrPortFrom(f.respAddr().netip(v6), f.respPort()), Last: f.last,
		History: string(f.hist[:f.histN]), Service: svcNames[f.service()]}
	if f.key.proto == 6 {
		c.TCP = &[2]CarriedTCP{carryTCP(&f.ep[0]), carryTCP(&f.ep[1])}
	}
	for i := range f.dnsQ.len() {
		if q := f.dnsQ.at(i); q.open {
			c.DNS = append(c.DNS, CarriedDNSQuery{ID: q.id, Type: q.qtype, Name: q.name})
		}
	}
	if f.bot != nil {
		if p, dir := f.bot.Decided(); p != botproto.None {
			c.Bot = &CarriedBot{Protocol: p.String(), BotDir: dir}
		}
	}
	return c
}

func carryTCP(e *endpoint) CarriedTCP {
	next := e.last32
	if int32(e.ack32-e.last32) > 0 {
		next = e.ack32
	}
	return CarriedTCP{State: e.state, Prev: e.prev, Closed: e.didClose, Next: next}
}

// resume sets a new flow to continue c: the roles are set by the caller.
// TCP endpoints start over at their next byte, as if a SYN had come just
// before it, so that their byte counts are this capture's. It reports
// false for a description that does not fit (a corrupt carry).
func (f *flow) resume(c *Carried) bool {
	f.carried = true
	for i := 0; i < len(c.History); i++ {
		switch ch := c.History[i]; {
		case ch == '^':
			f.history(true, '^')
		case ch >= 'A' && ch <= 'Z' && strings.IndexByte(historyLetters, ch) >= 0:
			f.history(true, ch)
		case ch >= 'a' && ch <= 'z' && strings.IndexByte(historyLetters, ch-('a'-'A')) >= 0:
			f.history(false, ch-('a'-'A'))
		default:
			return false
		}
	}
	for i, name := range svcNames {
		if name == c.Service {
			f.svc = uint8(i)
		}
	}
	for _, q := range c.DNS {
		if int(f.dnsQ.n) < len(f.dnsQ.names) {
			f.dnsQ.set(int(f.dnsQ.n), dnsQuery{id: q.ID, qtype: q.Type, name: q.Name, open: true})
			f.dnsQ.n++
		}
	}
	if (c.TCP != nil) != (c.Proto == 6) {
		return false
	}
	if b := c.Bot; b != nil {
		p := botproto.ByName(b.Protocol)
		if c.Proto != 6 || b.BotDir != 0 && b.BotDir != 1 || p == botproto.None || p == botproto.MiraiReport {
			return false
		}
		f.resumeBot, f.resumeBotDir = p, uint8(b.BotDir)
	}
	if c.TCP != nil {
		for i, t := range c.TCP {
			if t.State > tcpReset || t.Prev > tcpReset {
				return false
			}
			e := &f.ep[i]
			e.state, e.prev, e.didClose = t.State, t.Prev, t.Closed
			if e.state != tcpInactive {
				e.initSeq(t.Next-1, t.Next-1, t.Next)
			}
		}
	}
	return true
}

// FinishCarry is Finish that also returns, for the next capture of the
// same stream (Seed), up to max of the connections still open that are
// worth continuing (see carriable), the most recently active first.
func (d *Decoder) FinishCarry(max int) []Carried {
	var carry []Carried
	if max > 0 {
		var open []*flow
		for i := range d.lists {
			for f := d.lists[i].head; f != nil; f = f.next {
				if f.carriable() {
					open = append(open, f)
				}
			}
		}
		slices.SortStableFunc(open, func(a, b *flow) int { return cmp.Compare(b.last, a.last) })
		carry = make([]Carried, 0, min(len(open), max))
		for _, f := range open[:min(len(open), max)] {
			carry = append(carry, f.carry())
		}
	}
	d.finishAll()
	return carry
}

// Seed continues the connections the previous capture of the same stream
// carried (FinishCarry): they keep their roles and state, and are reported
// here only if a packet of theirs comes before they time out. Call it
// before the first packet. Descriptions that do not fit are skipped; it
// returns how many were.
func (d *Decoder) Seed(cs []Carried) (skipped int) {
	cs = slices.Clone(cs)
	slices.SortStableFunc(cs, func(a, b Carried) int { return cmp.Compare(a.Last, b.Last) })
	for i := range cs {
		c := &cs[i]
		o, r := c.Orig.Addr(), c.Resp.Addr()
		if !o.IsValid() || o.Is6() != r.Is6() || o.Is4In6() || r.Is4In6() || d.flows.n >= d.cfg.MaxFlows {
			skipped++
			continue
		}
		v6 := o.Is6()
		key, fwd := makeKey(addrOf(o), addrOf(r), c.Orig.Port(), c.Resp.Port(), c.Proto, v6)
		f, h := d.find(&key)
		if f != nil {
			skipped++
			continue
		}
		f = d.insert(key, h, c.Last, 0)
		f.origIsA = fwd
		if !f.resume(c) {
			d.unlink(f)
			*f = flow{}
			d.free = append(d.free, f)
			skipped++
			continue
		}
		d.touch(f, c.Last)
	}
	return skipped
}

func addrOf(a netip.Addr) addr {
	var b addr
	if a.Is4() {
		v4 := a.As4()
		copy(b[:4], v4[:])
		return b
	}
	return a.As16()
}
