package packet

import (
	"cmp"
	"strconv"

	"github.com/talkbox-sandbox/talkbox/internal/decode/tlsfp"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// finish ends a connection: the connection, and its icmp, http and tls
// observables go to the sink, and its slot is recycled. A connection
// carried from the previous capture that saw no packet in this one was
// reported there and is not reported again.
func (d *Decoder) finish(f *flow) {
	if f.list < nLists {
		d.lists[f.list].remove(f)
	}
	d.unlink(f)
	if !f.carried || f.ep[0].pkts+f.ep[1].pkts > 0 {
		d.emitFlow(f)
	}
	d.emitBot(f)
	d.release(&f.half[0])
	d.release(&f.half[1])
	*f = flow{}
	d.free = append(d.free, f)
}

func (d *Decoder) emitFlow(f *flow) {
	v6 := f.key.v6
	oh, rh := f.origAddr().netip(v6), f.respAddr().netip(v6)
	op, rp := f.origPort(), f.respPort()
	proto := protoName(f.key.proto)
	o, r := &f.ep[0], &f.ep[1]
	var state string
	var ob, rb int64
	switch f.key.proto {
	case 6:
		state = f.tcpConnState()
		ob, rb = o.size(r), r.size(o)
	case 17:
		ob, rb = o.udpBytes, r.udpBytes
		switch {
		case o.pkts > 0 && r.pkts > 0:
			state = "SF"
		case o.pkts > 0:
			state = "S0"
		case r.pkts > 0:
			state = "SHR"
		default:
			state = "OTH"
		}
	default:
		ob, rb = o.udpBytes, r.udpBytes
		state = "OTH"
	}
	service := svcNames[f.service()]
	d.conn = flowlog.Conn{UID: d.madeUID(f), UIDs: d.uids, UIDSeq: f.seq, Start: f.start, End: f.last, Proto: proto, OrigH: oh, OrigP: op, RespH: rh, RespP: rp,
		Service: service, ConnState: state, History: string(f.hist[:f.histN]),
		OrigPkts: o.pkts, OrigBytes: ob, OrigIPBytes: o.ipBytes, RespPkts: r.pkts, RespBytes: rb, RespIPBytes: r.ipBytes,
		Packet: f.firstPkt, Exchange: f.exchange(), Resumed: f.carried}
	d.connToSink(&d.conn)
	start, last := tsTime(f.start), tsTime(f.last)
	if proto == "icmp" {
		ohs, rhs := d.addrString(f.origAddr(), v6), d.addrString(f.respAddr(), v6)
		value := ohs + ">" + rhs + " " + strconv.Itoa(int(f.icmpType)) + "/" + strconv.Itoa(int(f.icmpCode))
		ic := d.cfg.Origin.OfConn(d.uidOf(f)).New(records.ObsICMP, value, start, f.firstPkt, 0)
		ic.LastSeen = last
		ic.ICMP = &records.ICMPInfo{OrigH: ohs, RespH: rhs, Type: f.icmpType, Code: f.icmpCode, V6: v6,
			Packets: o.pkts + r.pkts, Bytes: ob + rb}
		d.toSink(ic)
	}
	if p := f.pend; p != nil {
		for i := p.statusAt; i < len(p.reqs); i++ {
			d.emitHTTP(f, &p.reqs[i])
		}
		if t := p.tls; t != nil {
			d.emitTLS(f, t, rp)
		}
	}
}

// emitHTTP reports a request; it returns the poll the request counts
// towards (nil when none is followed).
func (d *Decoder) emitHTTP(f *flow, r *httpReq) *poll {
	v6 := f.key.v6
	server := d.hostPort(f.respAddr(), v6, f.respPort())
	host := cmp.Or(r.req.Host, server)
	value, client := observe.HTTPValue(r.req.Method, host, r.req.URI), d.addrString(f.origAddr(), v6)
	uid := d.uidOf(f)
	p := d.pollRequest(r, value, server, client, uid)
	d.floodPacket(vecHTTP, f.respAddr(), f.origAddr(), v6, f.respPort(), 0, r.ts, r.n, f.seq)
	o, _ := d.cfg.Origin.OfConn(uid).NewHTTP(value, tsTime(r.ts), r.n, 0,
		r.req.Method, r.req.Host, r.req.URI, r.req.UserAgent, r.status, server, client)
	d.toSink(o)
	return p
}

func (d *Decoder) emitTLS(f *flow, t *tlsSeen, rp uint16) {
	value := t.sni
	if value == "" {
		value = d.hostPort(f.respAddr(), f.key.v6, rp)
	}
	v := cmp.Or(t.server, t.client)
	o, _ := d.cfg.Origin.OfConn(d.uidOf(f)).NewTLS(value, tsTime(t.ts), t.n, 0, t.sni, tlsfp.VersionName(v), t.ja3, t.ja4, t.alpn,
		d.hostPort(f.respAddr(), f.key.v6, rp), d.addrString(f.origAddr(), f.key.v6))
	d.toSink(o)
}

// Bounds of the caches of address and endpoint text (a capture has far
// fewer distinct addresses than connections).
const (
	maxAddrNames = 1 << 16
	maxEndpoints = 1 << 16
)

type endpointKey struct {
	a    addr
	v6   bool
	port uint16
}

// addrString is the text of an address, made once per address.
func (d *Decoder) addrString(a addr, v6 bool) string {
	k := endpointKey{a: a, v6: v6}
	if s, ok := d.names[k]; ok {
		return s
	}
	s := a.netip(v6).String()
	if len(d.names) < maxAddrNames {
		d.names[k] = s
	}
	return s
}

// hostPort is "addr:port" ("[addr]:port" for IPv6), made once per endpoint.
func (d *Decoder) hostPort(a addr, v6 bool, port uint16) string {
	k := endpointKey{a: a, v6: v6, port: port}
	if s, ok := d.endpoints[k]; ok {
		return s
	}
	s := observe.HostPort(a.netip(v6), port)
	if len(d.endpoints) < maxEndpoints {
		d.endpoints[k] = s
	}
	return s
}
