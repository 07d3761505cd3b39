package pcap

import (
	"net/netip"
	"strconv"
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

// flow is one connection.
type flow struct {
	key                flowKey
	hash               uint64
	hnext              *flow // the next flow with the same hash
	origIsA            bool  // the originator is key.a
	start, last        int64
	attemptAt          int64
	bothClosedAt       int64
	firstPkt           int64
	ep                 [2]endpoint // originator, responder
	icmpType, icmpCode uint8
	list               uint8
	app                uint8
	prev, next         *flow
	half               [2]half
	pend               *pending
	dnsQ               [4]dnsQuery
	dnsN               uint8
	dnsSeen            bool
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

func (f *flow) flip() {
	f.origIsA = !f.origIsA
	f.ep[0], f.ep[1] = f.ep[1], f.ep[0]
	f.half[0], f.half[1] = f.half[1], f.half[0]
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
