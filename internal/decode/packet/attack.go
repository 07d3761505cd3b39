package packet

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"math"
	"math/bits"
	"net/netip"
	"strconv"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Flood vectors, classified from single packets the lab sends.
const (
	vecNone = iota
	vecSYN  // a SYN without ACK
	vecACK  // an ACK (or ACK+PSH) to a peer that never answered
	vecUDP  // UDP with a varied payload to a peer that never answered
	vecUDPPlain
	vecVSE  // Valve Source Engine queries
	vecGRE  // GRE packets
	vecICMP // echo requests
	vecHTTP // HTTP requests
	vecDNS  // queries for random names under one domain
	vecAmpNTP
	vecAmpSSDP
	vecAmpMemcached
	vecAmpChargen
	vecAmpCLDAP
	vecAmpSNMP
	nVectors
)

var vectorNames = [nVectors]string{"", "syn", "ack", "udp", "udpplain", "vse", "gre", "icmp", "http", "dns", "amp-ntp", "amp-ssdp",
	"amp-memcached", "amp-chargen", "amp-cldap", "amp-snmp"}

func reflection(vec uint8) bool { return vec >= vecAmpNTP }

// What makes an attack of the packets of one vector to one target: at
// least minFloodPkts of them at minFloodPPS or more, and, for vectors a
// scan also sends, each port hit floodRepeat times on average (a port scan
// hits each once). HTTP counts requests.
const (
	minFloodPkts = 500
	minFloodPPS  = 50
	minHTTPReqs  = 100
	minHTTPRate  = 10
	floodRepeat  = 4
)

// Bounds: floods followed at once, and the slots of the filter that keeps
// a target out of the table until it has had hotPkts packets (a scan's
// targets have one or two each).
const (
	maxFloods  = 4096
	hotSlots   = 1024
	hotPkts    = 8
	hotWindow  = 1e9 // within which they come: a flood's rate is far higher
	floodList  = 8   // ports, sources and reflectors kept
	portBits   = 512 // linear-counting bitmaps
	sourceBits = 256
)

type floodKey struct {
	target addr
	v6     bool
	vec    uint8
}

type hotSlot struct {
	key   uint64
	n     uint32
	first int64
	bytes int64
	pkt   int64 // the first packet's number
	conn  int64 // and its connection's number (flowlog.UIDs)
}

// flood is the packets of one vector to one target.
type flood struct {
	key         floodKey
	name        string // the domain, for vecDNS
	first, last int64
	n           int64 // the first packet's number
	conn        int64 // and its connection's number: a flood's provenance
	pkts, bytes int64
	ports       [floodList]uint16
	nports      uint8
	srcs        [floodList]addr // sources, or for reflection the reflectors
	nsrcs       uint8
	portSeen    [portBits / 64]uint64
	srcSeen     [sourceBits / 64]uint64
}

// floodPacket counts a packet the lab sent towards a flood of vec against
// target from src (for reflection, target is the address the request
// claims to come from and src the reflector) to port.
func (d *Decoder) floodPacket(vec uint8, target, src addr, v6 bool, port uint16, ipLen int, ts, n, conn int64) {
	key := floodKey{target: target, v6: v6, vec: vec}
	f := d.floodEntry(maphash.Comparable(d.seed, key), ipLen, ts, n, conn)
	if f == nil {
		return
	}
	f.key = key
	f.see(uint64(port)*0x9e3779b97f4a7c15, port, src)
}

// floodQuery counts a DNS query the lab sent towards a random-subdomain
// flood ("water torture") of the queried name's parent domain: many
// queries, most for a name not asked before, through any resolver.
func (d *Decoder) floodQuery(name string, resolver addr, v6 bool, ipLen int, ts, n, conn int64) {
	label, parent, ok := strings.Cut(name, ".")
	if !ok || !strings.Contains(parent, ".") {
		return
	}
	f := d.floodEntry(maphash.String(d.seed, parent)^vecDNS, ipLen, ts, n, conn)
	if f == nil {
		return
	}
	if f.name == "" {
		f.key, f.name = floodKey{v6: v6, vec: vecDNS}, parent
	}
	f.see(maphash.String(d.seed, label), 0, resolver)
}

// floodEntry finds the flood whose key hashes to h and counts a packet of
// it (numbered n, on the connection numbered conn), or counts the packet in the
// filter while the key has had fewer than hotPkts (nil then). A flood made
// here has no key yet.
func (d *Decoder) floodEntry(h uint64, ipLen int, ts, n, conn int64) *flood {
	f := d.floods[h]
	if f == nil {
		s := &d.hot[h%hotSlots]
		if s.key != h || ts-s.first > hotWindow {
			*s = hotSlot{key: h, n: 1, first: ts, bytes: int64(ipLen), pkt: n, conn: conn}
			return nil
		}
		if s.n++; s.n < hotPkts {
			s.bytes += int64(ipLen)
			return nil
		}
		if len(d.floods) >= maxFloods && !d.sweepFloods() {
			d.FloodsRefused++
			return nil
		}
		f = &flood{first: s.first, n: s.pkt, conn: s.conn, pkts: int64(s.n) - 1, bytes: s.bytes}
		d.floods[h] = f
		*s = hotSlot{}
	}
	f.pkts++
	f.bytes += int64(ipLen)
	f.last = max(f.last, ts)
	return f
}

// see records a packet's destination port (for DNS, its name's first
// label) by its hash x, and its source.
func (f *flood) see(x uint64, port uint16, src addr) {
	ph := x >> 55 // 9 bits
	if f.portSeen[ph/64]&(1<<(ph%64)) == 0 {
		f.portSeen[ph/64] |= 1 << (ph % 64)
		if int(f.nports) < floodList && f.key.vec != vecDNS {
			f.ports[f.nports] = port
			f.nports++
		}
	}
	sh := mix(src) >> 56 // 8 bits
	if f.srcSeen[sh/64]&(1<<(sh%64)) == 0 {
		f.srcSeen[sh/64] |= 1 << (sh % 64)
		if int(f.nsrcs) < floodList {
			f.srcs[f.nsrcs] = src
			f.nsrcs++
		}
	}
}

// mix spreads an address's bits over a word: enough for a bitmap's index,
// cheaper than a seeded hash on every packet of a flood.
func mix(a addr) uint64 {
	x := binary.LittleEndian.Uint64(a[:8]) ^ binary.LittleEndian.Uint64(a[8:])*0xff51afd7ed558ccd
	x ^= x >> 33
	return x * 0x9e3779b97f4a7c15
}

// sweepFloods drops the floods too small to become attacks, to make room;
// it reports whether it did.
func (d *Decoder) sweepFloods() bool {
	freed := false
	for h, f := range d.floods {
		if f.pkts < minFloodPkts/4 {
			delete(d.floods, h)
			freed = true
		}
	}
	return freed
}

// count estimates the distinct values a linear-counting bitmap saw, exact
// enough for telling one source from many, or a scan's ports from a
// flood's.
func count(set []uint64, listed uint8) int64 {
	m, zeros := len(set)*64, 0
	for _, w := range set {
		zeros += 64 - bits.OnesCount64(w)
	}
	if zeros == 0 {
		return int64(float64(m) * math.Log(float64(m)))
	}
	return max(int64(float64(m)*math.Log(float64(m)/float64(zeros))+0.5), int64(listed))
}

func (f *flood) attack(vec uint8) bool {
	span := max(float64(f.last-f.first)/1e9, 1)
	if vec == vecHTTP {
		return f.pkts >= minHTTPReqs && float64(f.pkts)/span >= minHTTPRate
	}
	if f.pkts < minFloodPkts || float64(f.pkts)/span < minFloodPPS {
		return false
	}
	switch vec {
	case vecSYN, vecACK, vecUDP, vecUDPPlain:
		return f.pkts >= floodRepeat*count(f.portSeen[:], f.nports)
	case vecDNS:
		// Mostly new names: a resolver's cache cannot answer them.
		return 2*count(f.portSeen[:], 0) >= min(f.pkts, portBits)
	}
	return true
}

// emitFloods reports the floods that were attacks; it runs at the end of
// the capture.
func (d *Decoder) emitFloods() {
	for h, f := range d.floods {
		delete(d.floods, h)
		key := f.key
		if !f.attack(key.vec) {
			continue
		}
		target := d.addrString(key.target, key.v6)
		if key.vec == vecDNS {
			target = f.name
		}
		name := vectorNames[key.vec]
		o := d.cfg.Origin.OfConn(d.uids.At(f.conn)).New(records.ObsAttack, name+" "+target, tsTime(f.first), f.n, 0)
		o.LastSeen = tsTime(f.last)
		span := max(float64(f.last-f.first)/1e9, 1)
		a := &records.AttackInfo{Vector: name, Target: target, PortCount: count(f.portSeen[:], f.nports), Packets: f.pkts,
			Bytes: f.bytes, PPS: observe.Rate(f.pkts, span), BPS: observe.Rate(f.bytes, span)}
		for _, p := range f.ports[:f.nports] {
			a.Ports = append(a.Ports, strconv.Itoa(int(p)))
		}
		srcs := make([]string, 0, f.nsrcs)
		for _, s := range f.srcs[:f.nsrcs] {
			srcs = append(srcs, d.addrString(s, key.v6))
		}
		switch {
		case key.vec == vecDNS:
			a.Names, a.PortCount = a.PortCount, 0
			a.Reflectors = srcs
			d.attribute(a, netip.Addr{}, f.name, f.first)
		case reflection(key.vec):
			a.Reflectors = srcs
			d.attribute(a, key.target.netip(key.v6), "", f.first)
		default:
			a.Sources = srcs
			a.SourceCount = count(f.srcSeen[:], f.nsrcs)
			a.Spoofed = a.SourceCount > 1
			d.attribute(a, key.target.netip(key.v6), "", f.first)
		}
		o.Attack = a
		d.toSink(o)
	}
	clear(d.hot[:])
}

// udpVector classifies a datagram the lab sent to a peer that never
// answered: a request shaped to draw an amplified answer from its port's
// service, a VSE query, or a flood with a constant or a varied payload.
func udpVector(dp uint16, p []byte) uint8 {
	switch {
	case dp == 123 && len(p) > 0 && p[0]&7 == 7: // NTP mode 7 (monlist)
		return vecAmpNTP
	case dp == 1900 && bytes.HasPrefix(p, []byte("M-SEARCH")):
		return vecAmpSSDP
	case dp == 11211:
		return vecAmpMemcached
	case dp == 19:
		return vecAmpChargen
	case dp == 389:
		return vecAmpCLDAP
	case dp == 161:
		return vecAmpSNMP
	case dp == 27015 && bytes.Contains(p[:min(len(p), 32)], []byte("Source Engine Query")):
		return vecVSE
	}
	if len(p) > 1 && bytes.Count(p[:min(len(p), 64)], p[:1]) == min(len(p), 64) {
		return vecUDPPlain
	}
	return vecUDP
}
