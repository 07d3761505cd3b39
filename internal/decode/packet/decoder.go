// Package packet turns packets into observables: it decodes link, network and
// transport layers at fixed offsets (headers.go, link.go), tracks connections
// the way Zeek's conn.log counts them, reads DNS from UDP and TCP, and reads
// HTTP and TLS from the first bytes of each TCP direction.
package packet

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/crashhook"
	"github.com/talkbox-sandbox/talkbox/internal/decode"
	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/dns"
	"github.com/talkbox-sandbox/talkbox/internal/decode/httpmsg"
	"github.com/talkbox-sandbox/talkbox/internal/decode/tlsfp"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// DefaultMaxFlows bounds the connection table (about 450 bytes a
// connection); beyond it the least recently active connection is ended
// early.
const DefaultMaxFlows = 1 << 17

// Config is what a Decoder needs.
type Config struct {
	// MaxFlows bounds the connection table (DefaultMaxFlows when 0).
	MaxFlows int
	Origin   observe.Origin
	Sink     decode.Sink
}

// Stats counts what the decoder saw.
type Stats struct {
	Packets       int64
	Bytes         int64
	Malformed     int64 // frames whose headers did not decode
	NonIP         int64 // frames without IPv4 or IPv6 (ARP, LLDP, …)
	OtherLink     int64 // frames of link types not decoded (the reader reports them)
	Tunnelled     int64 // packets taken out of a tunnel (GRE, IP in IP, MPLS in IP, VXLAN, Geneve)
	Deep          int64 // packets left in a tunnel nested deeper than maxTunnels
	Fragments     int64
	Reassembled   int64
	Flows         int64
	Evicted       int64 // connections ended early because the table was full
	BadDNS        int64
	BadDNSRecords int64 // records of readable messages that could not be read
	// HeadsRefused counts stream directions not read because MaxHeads
	// buffers were in use.
	HeadsRefused int64
	// BotsRefused counts connections that might have carried a bot's
	// channel, not read because MaxBotConvs recognisers were in use.
	BotsRefused int64
	// FloodsRefused counts packets of would-be floods not followed
	// because maxFloods were.
	FloodsRefused int64
	// Faults counts the packets the decoder failed on (a panic: a bug
	// those bytes reached) and passed over; Fault describes the first.
	Faults int64
	Fault  string
}

// FaultEnv names the packet (its number in the file) at which a decoder
// built with the talkboxtest tag panics, as a bug reached there would
// (crashhook.Panic): the tests of what a fault costs use it.
const FaultEnv = "TB_PARSE_FAULT_AT"

// Decoder is the per-file packet engine. It is not safe for concurrent use.
type Decoder struct {
	cfg Config

	ip4   ip4Header
	ip6   ip6Header
	tcp   tcpHeader
	udp   udpHeader
	encap int // tunnels the current packet was taken out of

	// flows finds a connection by its 5-tuple (flowTable).
	flows     flowTable
	seed      maphash.Seed
	lists     [nLists]lru
	free      []*flow
	now       int64
	frags     defrag
	bufs      [][]byte
	names     map[endpointKey]string
	endpoints map[endpointKey]string
	prints    map[uint64]fingerprints
	held      int // stream-head buffers in use
	oooBytes  int // bytes held behind gaps
	scratch   []byte
	dnsMsg    dns.Msg
	dnsNames  dns.Names
	strs      httpmsg.Strings
	ch        tlsfp.ClientHello
	sh        tlsfp.ServerHello
	conn      flowlog.Conn
	uids      *flowlog.UIDs
	uid       string // the uid uidOf made last, of the connection numbered uidSeq
	uidSeq    int64
	bots      int // bot-channel recognisers in use
	freeBots  []*botConv
	botFlow   *flow // the connection a recogniser is being fed
	botTS     int64 // and the packet's time and number
	botN      int64
	polls     map[uint64]*poll
	orders    orderBook // the capture's orders, for the attacks that carry them out
	floods    map[uint64]*flood
	hot       [hotSlots]hotSlot
	inSink    bool // the sink is running (toSink, connToSink)
	// faultStack is where the first fault was (Stats.Fault), for the
	// tests that must fail on any.
	faultStack []byte

	Stats
}

// New returns a Decoder.
func New(cfg Config) *Decoder {
	if cfg.MaxFlows <= 0 {
		cfg.MaxFlows = DefaultMaxFlows
	}
	d := &Decoder{cfg: cfg, seed: maphash.MakeSeed(), uids: flowlog.NewUIDs(cfg.Origin.Key()),
		names: make(map[endpointKey]string), endpoints: make(map[endpointKey]string), prints: make(map[uint64]fingerprints),
		polls: make(map[uint64]*poll), floods: make(map[uint64]*flood)}
	d.frags.m = make(map[fragKey]*fragBuf)
	d.dnsMsg.Names = &d.dnsNames
	return d
}

// Packet processes one captured frame. A frame the decoder fails on is
// counted (Stats.Faults) and passed over.
func (d *Decoder) Packet(p *capfile.Packet) {
	defer d.survive(p)
	d.Packets++
	d.Bytes += int64(len(p.Data))
	if crashhook.Enabled {
		crashhook.Panic(FaultEnv, strconv.FormatInt(p.N, 10))
	}
	d.now = max(d.now, p.TS)
	d.sweep()
	d.encap = 0
	data := p.Data
	switch p.LinkType {
	case capfile.LinkEthernet:
		if len(data) < 14 {
			d.Malformed++
			return
		}
		d.ether(p, binary.BigEndian.Uint16(data[12:]), data[14:])
	case capfile.LinkSLL:
		// Linux cooked capture v1: the protocol at 14, whatever the
		// address length says (the address field is 8 bytes).
		if len(data) < 16 {
			d.Malformed++
			return
		}
		d.ether(p, binary.BigEndian.Uint16(data[14:]), data[16:])
	case capfile.LinkRaw, capfile.LinkIPv4, capfile.LinkIPv6, capfile.LinkRawBSD, capfile.LinkRawOpen:
		d.ip(p, data)
	case capfile.LinkNull, capfile.LinkLoop:
		if len(data) < 4 {
			d.Malformed++
			return
		}
		d.ip(p, data[4:])
	case capfile.LinkSLL2:
		if len(data) < 20 {
			d.Malformed++
			return
		}
		d.ether(p, binary.BigEndian.Uint16(data), data[20:])
	case capfile.LinkPPP, capfile.LinkPPPHDLC:
		d.ppp(p, data)
	case capfile.LinkPPPDir:
		if len(data) < 1 {
			d.Malformed++
			return
		}
		d.ppp(p, data[1:])
	case capfile.LinkPPPoE:
		d.ether(p, etherPPPoE, data)
	case capfile.LinkCHDLC:
		if len(data) < 4 {
			d.Malformed++
			return
		}
		d.ether(p, binary.BigEndian.Uint16(data[2:]), data[4:])
	case capfile.LinkNFLOG:
		d.nflog(p, data)
	default:
		d.OtherLink++
	}
}

// survive passes over a frame the decoder failed on. Every byte of a
// capture is the sample's to choose, and a bug that one frame reaches must
// not cost the rest of the capture, as a dissector's exception costs
// Wireshark one packet. What the frame left half done stays with its
// connection, which later frames may fault on too. A panic in the sink is
// not the decoder's to survive (the caller's sets and store may be left
// half changed) and goes on up, as does a memory fault at an address
// (capfile.Mapped.Guard's: a mapped capture cut short as it was read).
func (d *Decoder) survive(p *capfile.Packet) {
	if d.inSink {
		return
	}
	if r := recover(); r != nil {
		if _, fault := r.(interface{ Addr() uintptr }); fault {
			panic(r)
		}
		d.Faults++
		if d.Fault == "" {
			d.Fault = fmt.Sprintf("packet %d: %v", p.N, r)
			d.faultStack = debug.Stack()
		}
	}
}

// toSink hands an observable to the sink.
func (d *Decoder) toSink(o *records.Observable) {
	d.inSink = true
	d.cfg.Sink.Add(o)
	d.inSink = false
}

// connToSink hands a connection to the sink.
func (d *Decoder) connToSink(c *flowlog.Conn) {
	d.inSink = true
	d.cfg.Sink.Conn(c)
	d.inSink = false
}

// ip decodes a raw IP packet of either version.
func (d *Decoder) ip(p *capfile.Packet, b []byte) {
	if len(b) == 0 {
		d.NonIP++
		return
	}
	switch b[0] >> 4 {
	case 4:
		d.ipv4(p, b)
	case 6:
		d.ipv6(p, b)
	default:
		d.NonIP++
	}
}

// pkt is one transport-layer packet after IP decoding and reassembly.
type pkt struct {
	n, ts    int64
	src, dst addr
	v6       bool
	proto    uint8
	ipLen    int
	l4Len    int // transport length from the IP header (not the captured length)
}

func (d *Decoder) ipv4(p *capfile.Packet, b []byte) {
	ip := &d.ip4
	if !ip.decode(b) {
		d.Malformed++
		return
	}
	var k pkt
	k.n, k.ts = p.N, p.TS
	copy(k.src[:4], ip.src)
	copy(k.dst[:4], ip.dst)
	k.proto = ip.proto
	hl := ip.hdrLen
	k.ipLen = int(ip.length)
	k.l4Len = k.ipLen - hl
	if ip.more || ip.fragOff != 0 {
		d.Fragments++
		whole := d.frags.add(fragKey{src: k.src, dst: k.dst, id: uint32(ip.id), proto: k.proto}, int(ip.fragOff)*8,
			ip.more, ip.payload, k.ts)
		if whole == nil {
			return
		}
		d.Reassembled++
		k.ipLen, k.l4Len = hl+len(whole), len(whole)
		d.transport(&k, whole)
		d.tunnel(p, k.proto, whole)
		return
	}
	payload := ip.payload
	// A transport header that does not decode makes the whole packet
	// malformed: a tunnel is not looked for inside it.
	if d.transport(&k, payload) {
		d.tunnel(p, k.proto, payload)
	}
}

func (d *Decoder) ipv6(p *capfile.Packet, b []byte) {
	ip := &d.ip6
	if !ip.decode(b) {
		d.Malformed++
		return
	}
	var k pkt
	k.n, k.ts, k.v6 = p.N, p.TS, true
	copy(k.src[:], ip.src)
	copy(k.dst[:], ip.dst)
	nh := ip.next
	payload := ip.payload
	// A payload length of 0 (a jumbogram, or a segment captured before
	// the NIC split it) means the captured bytes, as Zeek reads it.
	k.ipLen, k.l4Len = 40+len(payload), len(payload)
	if ip.length > 0 {
		k.ipLen = 40 + int(ip.length)
		k.l4Len = int(ip.length) - ip.hbhLen
	}
	switch nh {
	case 6, 17, 58:
		// As right after an IPv4 header: a transport header that does
		// not decode makes the packet malformed.
		k.proto = nh
		if d.transport(&k, payload) {
			d.tunnel(p, k.proto, payload)
		}
		return
	}
	// Extension headers, and fragments.
	for i := 0; i < 8; i++ {
		switch nh {
		case 0, 43, 60: // hop-by-hop, routing, destination options
			if len(payload) < 8 {
				d.Malformed++
				return
			}
			l := (int(payload[1]) + 1) * 8
			if l > len(payload) {
				d.Malformed++
				return
			}
			nh, payload = payload[0], payload[l:]
			k.l4Len -= l
		case 51: // authentication header
			if len(payload) < 8 {
				d.Malformed++
				return
			}
			l := (int(payload[1]) + 2) * 4
			if l > len(payload) {
				d.Malformed++
				return
			}
			nh, payload = payload[0], payload[l:]
			k.l4Len -= l
		case 44:
			if len(payload) < 8 {
				d.Malformed++
				return
			}
			d.Fragments++
			k.proto = payload[0]
			off := int(binary.BigEndian.Uint16(payload[2:4]) &^ 7)
			more := payload[3]&1 != 0
			id := binary.BigEndian.Uint32(payload[4:8])
			whole := d.frags.add(fragKey{src: k.src, dst: k.dst, id: id, proto: k.proto, v6: true}, off, more, payload[8:], k.ts)
			if whole == nil {
				return
			}
			d.Reassembled++
			k.ipLen = k.ipLen - k.l4Len + len(whole)
			k.l4Len = len(whole)
			d.transport(&k, whole)
			d.tunnel(p, k.proto, whole)
			return
		default:
			k.proto = nh
			d.transport(&k, payload)
			d.tunnel(p, k.proto, payload)
			return
		}
	}
	d.Malformed++
}

// transport decodes the transport header by the IP protocol and updates
// the connection; false when the header is malformed.
func (d *Decoder) transport(k *pkt, b []byte) bool {
	k.l4Len = max(k.l4Len, 0)
	ok := true
	switch k.proto {
	case 6:
		if ok = d.tcp.decode(b); ok {
			d.tcpPacket(k)
		}
	case 17:
		if ok = d.udp.decode(b); ok {
			d.udpPacket(k)
		}
	case 1, 58:
		var typ, code uint8
		if typ, code, ok = icmpHeader(b, k.proto == 58); ok {
			d.icmpPacket(k, typ, code, k.proto == 58)
		}
	default:
		d.otherPacket(k)
	}
	if !ok {
		d.Malformed++
	}
	return ok
}

// lookup finds or creates the connection of a packet. newOrigIsSender
// says whether a new connection's originator is the sender; when it is not,
// the history records the flip with '^' as Zeek's does.
func (d *Decoder) lookup(k *pkt, sp, dp uint16, newOrigIsSender func() bool, expired func(*flow) bool) (f *flow, isOrig bool) {
	key, fwd := makeKey(k.src, k.dst, sp, dp, k.proto, k.v6)
	f, h := d.find(&key)
	if f != nil && expired(f) {
		d.finish(f)
		f = nil
	}
	if f == nil {
		f = d.newFlow(key, h, k)
		f.origIsA = fwd
		if !newOrigIsSender() {
			f.flip()
		}
	}
	d.started(f, k)
	return f, fwd == f.origIsA
}

// started dates a connection carried from the previous capture by its
// first packet in this one (a new connection is dated when made).
func (d *Decoder) started(f *flow, k *pkt) {
	if f.carried && f.ep[0].pkts == 0 && f.ep[1].pkts == 0 {
		f.start, f.firstPkt = k.ts, k.n
	}
}

// find returns the connection of a 5-tuple, if any, and the tuple's hash.
func (d *Decoder) find(key *flowKey) (*flow, uint64) {
	h := maphash.Comparable(d.seed, *key)
	return d.flows.find(h, key), h
}

// unlink removes f from the table.
func (d *Decoder) unlink(f *flow) { d.flows.remove(f) }

// uidOf is a connection's uid, made when something keeps it. The last one
// made is kept here rather than in the flow: a connection's observables
// mostly come together (a DNS message's names, an HTTP exchange, the
// connection's end), while a string in every flow of the table took the
// flow to the next size class (64 bytes more a connection held).
func (d *Decoder) uidOf(f *flow) string {
	if d.uidSeq != f.seq {
		d.uid, d.uidSeq = d.uids.At(f.seq), f.seq
	}
	return d.uid
}

// madeUID is the connection's uid if uidOf made it last, else "" (the flow
// log writes it from the connection's number).
func (d *Decoder) madeUID(f *flow) string {
	if d.uidSeq == f.seq {
		return d.uid
	}
	return ""
}

func (d *Decoder) newFlow(key flowKey, h uint64, k *pkt) *flow {
	d.Flows++
	return d.insert(key, h, k.ts, k.n)
}

// insert adds a connection to the table, ending the least recently active
// one when the table is full.
func (d *Decoder) insert(key flowKey, h uint64, ts, n int64) *flow {
	if d.flows.n >= d.cfg.MaxFlows {
		d.evictOne()
	}
	var f *flow
	if n := len(d.free); n > 0 {
		f, d.free = d.free[n-1], d.free[:n-1]
	} else {
		f = new(flow)
	}
	*f = flow{key: key, hash: h, start: ts, last: ts, firstPkt: n, list: nLists, seq: d.uids.Next()}
	d.flows.insert(f)
	return f
}

// touch moves f to the tail of the list its state belongs on.
func (d *Decoder) touch(f *flow, ts int64) {
	if ts > f.last && (f.key.proto != 6 || f.bothClosedAt == 0) {
		f.last = ts
	}
	l := uint8(listOther)
	if f.key.proto == 6 {
		l = listTCP
		if f.tcpAttempt() || f.tcpClosing() {
			l = listShort
		}
	}
	if f.list < nLists {
		d.lists[f.list].remove(f)
	}
	f.list = l
	d.lists[l].push(f)
}

// sweep ends connections idle past their timeout.
func (d *Decoder) sweep() {
	for i := range d.lists {
		l := &d.lists[i]
		for l.head != nil && d.now-l.head.last >= listTimeout[i] {
			d.finish(l.head)
		}
	}
}

func (d *Decoder) evictOne() {
	var oldest *flow
	for i := range d.lists {
		if h := d.lists[i].head; h != nil && (oldest == nil || h.last < oldest.last) {
			oldest = h
		}
	}
	if oldest != nil {
		d.Evicted++
		d.finish(oldest)
	}
}

// Finish ends every connection still open (the end of the capture).
func (d *Decoder) Finish() { d.FinishCarry(0) }

func (d *Decoder) finishAll() {
	for i := range d.lists {
		for d.lists[i].head != nil {
			d.finish(d.lists[i].head)
		}
	}
	// Every connection is on a list but one being inserted: this ends
	// none, unless a list lost one.
	for f := d.flows.first(); f != nil; f = d.flows.first() {
		d.finish(f)
	}
	d.emitPolls()
	d.emitFloods()
}

func (d *Decoder) tcpPacket(k *pkt) {
	t := &d.tcp
	flags := t.flags
	sp, dp := t.srcPort, t.dstPort
	plen := max(k.l4Len-int(t.dataOffset)*4, 0)
	ts := k.ts
	key, fwd := makeKey(k.src, k.dst, sp, dp, 6, k.v6)
	f, h := d.find(&key)
	if f != nil {
		if (f.tcpAttempt() && f.attemptAt != 0 && ts-f.attemptAt >= attemptDelay) ||
			(f.tcpClosing() && ts-f.last >= listTimeout[listShort]) || ts-f.last >= listTimeout[listTCP] ||
			f.isReuse(fwd == f.origIsA, flags, t.seq) {
			d.finish(f)
			f = nil
		}
	}
	if f == nil {
		f = d.newFlow(key, h, k)
		f.origIsA = fwd
		if flipByPort(flags, sp, dp) {
			f.flip()
		}
	} else if f.synAckAnswered(flags, plen) {
		f.flip()
		// As if the SYN-ACK had been the responder's from the start.
		f.ep[1].state, f.ep[1].prev = tcpEstablished, tcpInactive
	}
	d.started(f, k)
	isOrig := fwd == f.origIsA
	ep := &f.ep[0]
	if !isOrig {
		ep = &f.ep[1]
	}
	ep.pkts++
	ep.ipBytes += int64(k.ipLen)
	sent := ep.lastRel
	f.tcpSegment(isOrig, flags, t.seq, t.ack, plen, ts)
	f.tcpHistory(fwd == f.origIsA, flags, plen)
	payload := t.payload
	if len(payload) > plen {
		payload = payload[:plen]
	}
	if plen > 0 && flags&flagRST == 0 && ep.lastRel > sent {
		// New bytes, not a retransmission.
		f.converse(fwd == f.origIsA, payload)
	}
	if d.encap == 0 {
		peer := &f.ep[1]
		if fwd != f.origIsA {
			peer = &f.ep[0]
		}
		switch flags & (flagSYN | flagACK | flagRST | flagFIN) {
		case flagSYN:
			d.floodPacket(vecSYN, k.dst, k.src, k.v6, dp, k.ipLen, ts, k.n, f.seq)
		case flagACK:
			if peer.pkts == 0 {
				d.floodPacket(vecACK, k.dst, k.src, k.v6, dp, k.ipLen, ts, k.n, f.seq)
			}
		}
	}
	if len(payload) > 0 && flags&flagRST == 0 {
		seq := t.seq
		if flags&flagSYN != 0 {
			seq++
		}
		if f.app != appNone {
			d.stream(f, fwd == f.origIsA, seq, payload, k)
		}
		if !f.botOff {
			d.botSegment(f, fwd == f.origIsA, seq, payload, k)
		}
	}
	d.touch(f, ts)
}

func (d *Decoder) udpPacket(k *pkt) {
	u := &d.udp
	sp, dp := u.srcPort, u.dstPort
	ulen := int(u.length) - 8
	if ulen < 0 || ulen > k.l4Len-8 {
		ulen = max(k.l4Len-8, 0)
	}
	f, isOrig := d.lookup(k, sp, dp, func() bool {
		return udpSenderIsOrig(sp, dp, u.payload[:min(ulen, len(u.payload))], k.dst, k.v6)
	}, func(f *flow) bool { return k.ts-f.last >= listTimeout[listOther] })
	ep := &f.ep[1]
	if isOrig {
		ep = &f.ep[0]
	}
	ep.pkts++
	ep.ipBytes += int64(k.ipLen)
	ep.udpBytes += int64(ulen)
	if ulen > 0 {
		f.history(isOrig, 'D')
		f.converse(isOrig, u.payload[:min(ulen, len(u.payload))])
	}
	peer := &f.ep[1]
	if !isOrig {
		peer = &f.ep[0]
	}
	if peer.pkts == 0 && d.encap == 0 && !isDNSPort(sp) && !isDNSPort(dp) {
		// A datagram to a peer that never answered may be a flood's.
		vec := udpVector(dp, u.payload[:min(ulen, len(u.payload))])
		if reflection(vec) {
			d.floodPacket(vec, k.src, k.dst, k.v6, dp, k.ipLen, k.ts, k.n, f.seq)
		} else {
			d.floodPacket(vec, k.dst, k.src, k.v6, dp, k.ipLen, k.ts, k.n, f.seq)
		}
	}
	if isDNSPort(sp) || isDNSPort(dp) {
		payload := u.payload
		if len(payload) > ulen {
			payload = payload[:ulen]
		}
		d.dnsMessage(f, payload, k, "udp", isOrig)
	}
	d.touch(f, k.ts)
}

// isDNSPort: DNS, NetBIOS name service, mDNS and LLMNR, the ports Zeek's
// DNS analyzer reads.
func isDNSPort(p uint16) bool { return p == 53 || p == 137 || p == 5353 || p == 5355 }

// icmpCounterpart pairs request and reply types into one connection, as
// Zeek does; other messages are one-way and keyed by their code.
func icmpCounterpart(typ, code uint8, v6 bool) uint8 {
	if !v6 {
		switch typ {
		case 8:
			return 0
		case 0:
			return 8
		case 13, 15, 17:
			return typ + 1
		case 14, 16, 18:
			return typ - 1
		case 10:
			return 9
		case 9:
			return 10
		}
		return code
	}
	switch typ {
	case 128:
		return 129
	case 129:
		return 128
	case 133:
		return 134
	case 134:
		return 133
	case 135:
		return 136
	case 136:
		return 135
	case 130:
		return 131
	case 131:
		return 130
	}
	return code
}

func (d *Decoder) icmpPacket(k *pkt, typ, code uint8, v6 bool) {
	f, isOrig := d.lookup(k, uint16(typ), uint16(icmpCounterpart(typ, code, v6)), func() bool { return true },
		func(f *flow) bool { return k.ts-f.last >= listTimeout[listOther] })
	if f.ep[0].pkts == 0 && f.ep[1].pkts == 0 {
		f.icmpType, f.icmpCode = typ, code
	}
	if d.encap == 0 && (typ == 8 && !v6 || typ == 128 && v6) {
		d.floodPacket(vecICMP, k.dst, k.src, k.v6, 0, k.ipLen, k.ts, k.n, f.seq)
	}
	ep := &f.ep[1]
	if isOrig {
		ep = &f.ep[0]
	}
	ep.pkts++
	ep.ipBytes += int64(k.ipLen)
	ep.udpBytes += int64(max(k.l4Len-8, 0))
	d.touch(f, k.ts)
}

func (d *Decoder) otherPacket(k *pkt) {
	f, isOrig := d.lookup(k, 0, 0, func() bool { return true },
		func(f *flow) bool { return k.ts-f.last >= listTimeout[listOther] })
	ep := &f.ep[1]
	if isOrig {
		ep = &f.ep[0]
	}
	if k.proto == 47 && d.encap == 0 {
		d.floodPacket(vecGRE, k.dst, k.src, k.v6, 0, k.ipLen, k.ts, k.n, f.seq)
	}
	// Zeek counts no payload bytes for protocols it does not analyse;
	// only their IP bytes.
	ep.pkts++
	ep.ipBytes += int64(k.ipLen)
	d.touch(f, k.ts)
}

func tsTime(ns int64) time.Time { return time.Unix(0, ns).UTC() }
