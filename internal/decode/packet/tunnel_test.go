package packet

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

// Tunnel endpoints: a capture point's mirror or overlay, not the sample.
var (
	tunA  = netip.MustParseAddr("192.0.2.1")
	tunB  = netip.MustParseAddr("192.0.2.2")
	tunA6 = netip.MustParseAddr("2001:db8:ffff::1")
	tunB6 = netip.MustParseAddr("2001:db8:ffff::2")
	dns6  = netip.MustParseAddr("2001:db8:2::53")
)

// frameLog keeps the frames a generator writes.
type frameLog [][]byte

func (f *frameLog) WritePacket(_ gopacket.CaptureInfo, data []byte) error {
	*f = append(*f, append([]byte(nil), data...))
	return nil
}

// sample is the traffic the tests wrap: an HTTP session and a DNS lookup,
// as raw IP packets of one family.
type sample struct {
	v6               bool
	frames           [][]byte
	req, resp        []byte
	client, srv, dns netip.Addr
}

func newSample(v6 bool) *sample {
	s := &sample{v6: v6, client: client, srv: server, dns: dnssrv}
	if v6 {
		s.client, s.srv, s.dns = client6, server6, dns6
	}
	var log frameLog
	g := pcapgen.To(&log, pcapgen.Options{Link: layers.LinkTypeRaw})
	s.req, s.resp = httpSession(g, ap(s.client, 49152), ap(s.srv, 80))
	g.DNSOverUDP(ap(s.client, 40000), ap(s.dns, 53), pcapgen.DNSQuery(9, "tunnel.example", layers.DNSTypeA),
		pcapgen.DNSResponse(9, "tunnel.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("tunnel.example", server, 60)}))
	s.frames = log
	return s
}

// check asserts the sample's connections and lookup were decoded, with
// their addresses and bytes, and nothing was left undecoded.
func (s *sample) check(t *testing.T, r result) {
	t.Helper()
	f := r.Flow(t, connKey("tcp", s.client, 49152, s.srv, 80))
	if f.ConnState != "SF" || f.Service != "http" || f.OrigBytes != int64(len(s.req)) || f.RespBytes != int64(len(s.resp)) {
		t.Errorf("tcp flow %+v", f)
	}
	if u := r.Flow(t, connKey("udp", s.client, 40000, s.dns, 53)); u.ConnState != "SF" || u.Service != "dns" {
		t.Errorf("udp flow %+v", u)
	}
	if d := r.get(t, "domain", "tunnel.example").Domain; len(d.Addrs) != 1 || d.Addrs[0] != server.String() {
		t.Errorf("domain %+v", d)
	}
	if r.stats.Malformed != 0 || r.stats.NonIP != 0 || r.stats.OtherLink != 0 || r.stats.Deep != 0 {
		t.Errorf("stats %+v", r.stats)
	}
}

func etherType(ip []byte) layers.EthernetType {
	if ip[0]>>4 == 6 {
		return layers.EthernetTypeIPv6
	}
	return layers.EthernetTypeIPv4
}

func pppType(ip []byte) layers.PPPType {
	if ip[0]>>4 == 6 {
		return layers.PPPTypeIPv6
	}
	return layers.PPPTypeIPv4
}

func ipInIP(ip []byte) layers.IPProtocol {
	if ip[0]>>4 == 6 {
		return layers.IPProtocolIPv6
	}
	return layers.IPProtocolIPv4
}

func eth(et layers.EthernetType) *layers.Ethernet {
	return &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: et}
}

func outer4(proto layers.IPProtocol) *layers.IPv4 {
	return &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: tunA.AsSlice(), DstIP: tunB.AsSlice()}
}

func outer6(proto layers.IPProtocol) *layers.IPv6 {
	return &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: tunA6.AsSlice(), DstIP: tunB6.AsSlice()}
}

// ser serializes layers as gopacket writes them (lengths and checksums
// filled in, Ethernet padded to its minimum).
func ser(t testing.TB, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	for i, l := range ls {
		if u, ok := l.(*layers.UDP); ok {
			u.SetNetworkLayerForChecksum(ls[i-1].(gopacket.NetworkLayer))
		}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

func raw(b []byte) gopacket.Payload { return gopacket.Payload(b) }

// nflogRecord frames an IP packet as Linux NFLOG does on a host of that
// byte order: the header, a packet-header attribute, a prefix that needs
// padding, then the payload attribute.
func nflogRecord(order binary.AppendByteOrder, ip []byte) []byte {
	fam := byte(2)
	if ip[0]>>4 == 6 {
		fam = 10
	}
	b := []byte{fam, 0, 0, 0}
	tlv := func(typ uint16, v []byte) {
		b = order.AppendUint16(b, uint16(4+len(v)))
		b = order.AppendUint16(b, typ)
		b = append(b, v...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	tlv(1, []byte{byte(etherType(ip) >> 8), byte(etherType(ip)), 3, 0})
	tlv(10, []byte("tb\x00"))
	tlv(9, ip)
	return b
}

// geneve is a Geneve header with one 4-byte option, then what proto names.
func geneve(proto layers.EthernetType) gopacket.Payload {
	h := []byte{2, 0, 0, 0, 0, 0x10, 0x01, 0, 0x01, 0x02, 0x03, 1, 0xaa, 0xbb, 0xcc, 0xdd}
	binary.BigEndian.PutUint16(h[2:], uint16(proto))
	return h
}

// erspan3 is an ERSPAN type III header with its platform subheader.
func erspan3() gopacket.Payload {
	h := make([]byte, 20)
	h[0] = 0x20 // version 2 (type III)
	h[11] = 1   // O: the platform subheader follows
	return h
}

// encap frames an IP packet as one link type and encapsulation does.
type encap struct {
	name  string
	link  uint32
	wrap  func(t testing.TB, ip []byte) []byte
	outer []string // tunnel flows recorded besides the sample's
}

func encapsulations() []encap {
	gre4 := connKey("47", tunA, 0, tunB, 0)
	gre6 := connKey("47", tunA6, 0, tunB6, 0)
	return []encap{
		{name: "raw", link: 101, wrap: func(t testing.TB, ip []byte) []byte { return ip }},
		{name: "raw-bsd", link: 12, wrap: func(t testing.TB, ip []byte) []byte { return ip }},
		{name: "raw-openbsd", link: 14, wrap: func(t testing.TB, ip []byte) []byte { return ip }},
		{name: "raw-ipv4", link: 228, wrap: func(t testing.TB, ip []byte) []byte { return ip }},
		{name: "raw-ipv6", link: 229, wrap: func(t testing.TB, ip []byte) []byte { return ip }},
		{name: "bsd-null", link: 0, wrap: func(t testing.TB, ip []byte) []byte {
			fam := uint32(2)
			if ip[0]>>4 == 6 {
				fam = 30
			}
			return append(binary.LittleEndian.AppendUint32(nil, fam), ip...)
		}},
		{name: "ethernet-802.1ad-qinq", link: 1, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, eth(layers.EthernetTypeQinQ), &layers.Dot1Q{VLANIdentifier: 100, Type: layers.EthernetTypeDot1Q},
				&layers.Dot1Q{VLANIdentifier: 7, Type: etherType(ip)}, raw(ip))
		}},
		{name: "ethernet-9100-qinq", link: 1, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, eth(0x9100), &layers.Dot1Q{VLANIdentifier: 100, Type: layers.EthernetTypeDot1Q},
				&layers.Dot1Q{VLANIdentifier: 7, Type: etherType(ip)}, raw(ip))
		}},
		{name: "sll2", link: 276, wrap: func(t testing.TB, ip []byte) []byte {
			h := make([]byte, 20)
			binary.BigEndian.PutUint16(h, uint16(etherType(ip)))
			binary.BigEndian.PutUint32(h[4:], 3)   // interface index
			binary.BigEndian.PutUint16(h[8:], 1)   // ARPHRD_ETHER
			h[10], h[11] = 4, 6                    // outgoing, 6-byte address
			copy(h[12:], []byte{2, 0, 0, 0, 0, 1}) // address
			return append(h, ip...)
		}},
		{name: "ppp", link: 9, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, &layers.PPP{PPPType: pppType(ip), HasPPTPHeader: true}, raw(ip))
		}},
		{name: "ppp-compressed-protocol", link: 9, wrap: func(t testing.TB, ip []byte) []byte {
			return append([]byte{byte(pppType(ip))}, ip...)
		}},
		{name: "ppp-hdlc", link: 50, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, &layers.PPP{PPPType: pppType(ip), HasPPTPHeader: true}, raw(ip))
		}},
		{name: "ppp-hdlc-cisco", link: 50, wrap: func(t testing.TB, ip []byte) []byte {
			return append([]byte{0x0f, 0, byte(etherType(ip) >> 8), byte(etherType(ip))}, ip...)
		}},
		{name: "ppp-with-direction", link: 204, wrap: func(t testing.TB, ip []byte) []byte {
			return append([]byte{1}, ser(t, &layers.PPP{PPPType: pppType(ip), HasPPTPHeader: true}, raw(ip))...)
		}},
		{name: "cisco-hdlc", link: 104, wrap: func(t testing.TB, ip []byte) []byte {
			return append([]byte{0x8f, 0, byte(etherType(ip) >> 8), byte(etherType(ip))}, ip...)
		}},
		{name: "pppoe", link: 1, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, eth(layers.EthernetTypePPPoESession), &layers.PPPoE{Version: 1, Type: 1, Code: layers.PPPoECodeSession, SessionId: 0x1234},
				&layers.PPP{PPPType: pppType(ip)}, raw(ip))
		}},
		{name: "ppp-ether", link: 51, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, &layers.PPPoE{Version: 1, Type: 1, Code: layers.PPPoECodeSession, SessionId: 0x1234},
				&layers.PPP{PPPType: pppType(ip)}, raw(ip))
		}},
		{name: "mpls", link: 1, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, eth(layers.EthernetTypeMPLSUnicast), &layers.MPLS{Label: 100, TTL: 64},
				&layers.MPLS{Label: 200, TTL: 64, StackBottom: true}, raw(ip))
		}},
		{name: "mpls-over-ppp", link: 9, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, &layers.PPP{PPPType: 0x0281, HasPPTPHeader: true}, &layers.MPLS{Label: 16, TTL: 64, StackBottom: true}, raw(ip))
		}},
		{name: "nflog", link: 239, wrap: func(t testing.TB, ip []byte) []byte { return nflogRecord(binary.LittleEndian, ip) }},
		{name: "nflog-big-endian", link: 239, wrap: func(t testing.TB, ip []byte) []byte { return nflogRecord(binary.BigEndian, ip) }},
		{name: "gre", link: 1, outer: []string{gre4}, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, eth(layers.EthernetTypeIPv4), outer4(layers.IPProtocolGRE),
				&layers.GRE{Protocol: etherType(ip), KeyPresent: true, Key: 42, ChecksumPresent: true}, raw(ip))
		}},
		{name: "gre-mpls", link: 1, outer: []string{gre4}, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, eth(layers.EthernetTypeIPv4), outer4(layers.IPProtocolGRE), &layers.GRE{Protocol: layers.EthernetTypeMPLSUnicast, SeqPresent: true},
				&layers.MPLS{Label: 17, TTL: 64}, &layers.MPLS{Label: 18, TTL: 64, StackBottom: true}, raw(ip))
		}},
		{name: "gre-ethernet-over-ipv6", link: 101, outer: []string{gre6}, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, outer6(layers.IPProtocolGRE), &layers.GRE{Protocol: layers.EthernetTypeTransparentEthernetBridging},
				eth(etherType(ip)), raw(ip))
		}},
		{name: "erspan-type-i", link: 1, outer: []string{gre4}, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, eth(layers.EthernetTypeIPv4), outer4(layers.IPProtocolGRE), &layers.GRE{Protocol: layers.EthernetTypeERSPAN},
				eth(etherType(ip)), raw(ip))
		}},
		{name: "erspan-type-ii", link: 1, outer: []string{gre4}, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, eth(layers.EthernetTypeIPv4), outer4(layers.IPProtocolGRE),
				&layers.GRE{Protocol: layers.EthernetTypeERSPAN, SeqPresent: true, Seq: 7}, &layers.ERSPANII{Version: 1, SessionID: 5},
				eth(etherType(ip)), raw(ip))
		}},
		{name: "erspan-type-iii", link: 1, outer: []string{gre4}, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, eth(layers.EthernetTypeIPv4), outer4(layers.IPProtocolGRE),
				&layers.GRE{Protocol: 0x22eb, SeqPresent: true, Seq: 7}, erspan3(), eth(etherType(ip)), raw(ip))
		}},
		{name: "vxlan", link: 1, outer: []string{connKey("udp", tunA, 49999, tunB, 4789)}, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, eth(layers.EthernetTypeIPv4), outer4(layers.IPProtocolUDP), &layers.UDP{SrcPort: 49999, DstPort: 4789},
				&layers.VXLAN{ValidIDFlag: true, VNI: 1000}, eth(layers.EthernetTypeDot1Q), &layers.Dot1Q{VLANIdentifier: 3, Type: etherType(ip)}, raw(ip))
		}},
		{name: "geneve", link: 1, outer: []string{connKey("udp", tunA6, 49999, tunB6, 6081)}, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, eth(layers.EthernetTypeIPv6), outer6(layers.IPProtocolUDP), &layers.UDP{SrcPort: 49999, DstPort: 6081},
				geneve(layers.EthernetTypeTransparentEthernetBridging), eth(etherType(ip)), raw(ip))
		}},
		{name: "geneve-ip", link: 101, outer: []string{connKey("udp", tunA, 49999, tunB, 6081)}, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, outer4(layers.IPProtocolUDP), &layers.UDP{SrcPort: 49999, DstPort: 6081}, geneve(etherType(ip)), raw(ip))
		}},
		{name: "mpls-in-ip", link: 101, outer: []string{connKey("137", tunA, 0, tunB, 0)}, wrap: func(t testing.TB, ip []byte) []byte {
			return ser(t, outer4(137), &layers.MPLS{Label: 16, TTL: 64, StackBottom: true}, raw(ip))
		}},
		{name: "nested", link: 1, outer: []string{gre4, connKey("udp", tunA6, 49999, tunB6, 4789)}, wrap: func(t testing.TB, ip []byte) []byte {
			vx := ser(t, eth(layers.EthernetTypeIPv6), outer6(layers.IPProtocolUDP), &layers.UDP{SrcPort: 49999, DstPort: 4789},
				&layers.VXLAN{ValidIDFlag: true, VNI: 1}, eth(etherType(ip)), raw(ip))
			return ser(t, eth(layers.EthernetTypeMPLSUnicast), &layers.MPLS{Label: 100, TTL: 64, StackBottom: true}, outer4(layers.IPProtocolGRE),
				&layers.GRE{Protocol: layers.EthernetTypeTransparentEthernetBridging}, raw(vx))
		}},
	}
}

func TestLinkTypesAndTunnels(t *testing.T) {
	for _, c := range encapsulations() {
		for _, v6 := range []bool{false, true} {
			t.Run(c.name+"/"+map[bool]string{false: "ipv4", true: "ipv6"}[v6], func(t *testing.T) {
				s := newSample(v6)
				var frames [][]byte
				for _, f := range s.frames {
					frames = append(frames, c.wrap(t, f))
				}
				r := decodeCapture(t, rawPcap(c.link, frames), 0)
				s.check(t, r)
				for _, o := range c.outer {
					if r.Flows[o] == nil {
						t.Errorf("no outer flow %s", o)
					}
				}
				if want := int64(len(frames) * len(c.outer)); r.stats.Tunnelled != want {
					t.Errorf("%d packets taken out of tunnels, want %d", r.stats.Tunnelled, want)
				}
			})
		}
	}
}

// The hand-written link and tunnel decoders never panic and never hold
// more connections than the bound. The fuzzed bytes are a sequence of
// frames, each behind its length (two bytes, big-endian; the rest is the
// last frame), so that one input can open more connections than the
// bound of one: the seeds are the sample's whole exchange, two
// connections, in each encapsulation.
func FuzzLinkFrames(f *testing.F) {
	for _, v6 := range []bool{false, true} {
		s := newSample(v6)
		for _, c := range encapsulations() {
			var seq []byte
			for _, fr := range s.frames {
				w := c.wrap(f, fr)
				seq = binary.BigEndian.AppendUint16(seq, uint16(len(w)))
				seq = append(seq, w...)
			}
			f.Add(c.link, seq)
		}
	}
	f.Fuzz(func(t *testing.T, link uint32, data []byte) {
		d := New(Config{MaxFlows: 1, Origin: origin(), Sink: discard{}})
		for n := int64(1); len(data) > 0; n++ {
			frame := data
			if len(data) >= 2 {
				if l := int(binary.BigEndian.Uint16(data)); 2+l <= len(data) {
					frame, data = data[2:2+l], data[2+l:]
				} else {
					frame, data = data[2:], nil
				}
			} else {
				data = nil
			}
			d.Packet(&capfile.Packet{N: n, LinkType: link, Data: frame})
			if d.flows.n > 1 {
				t.Fatalf("%d flows held after packet %d", d.flows.n, n)
			}
		}
		d.Finish()
		d.noFaults(t)
	})
}

// IP in IP: both families in both, and the outer flow of each.
func TestIPInIPOuterFlows(t *testing.T) {
	for _, tc := range []struct {
		inner6, outer6 bool
		want           string
	}{
		{false, false, connKey("4", tunA, 0, tunB, 0)},
		{true, false, connKey("41", tunA, 0, tunB, 0)},
		{false, true, connKey("4", tunA6, 0, tunB6, 0)},
		{true, true, connKey("41", tunA6, 0, tunB6, 0)},
	} {
		s := newSample(tc.inner6)
		var frames [][]byte
		for _, f := range s.frames {
			if tc.outer6 {
				frames = append(frames, ser(t, outer6(ipInIP(f)), raw(f)))
			} else {
				frames = append(frames, ser(t, outer4(ipInIP(f)), raw(f)))
			}
		}
		r := decodeCapture(t, rawPcap(capfile.LinkRaw, frames), 0)
		s.check(t, r)
		if r.Flows[tc.want] == nil || r.stats.Tunnelled != int64(len(frames)) {
			t.Errorf("%s: no outer flow, or %d packets taken out of tunnels", tc.want, r.stats.Tunnelled)
		}
	}
}

// Tunnels are followed maxTunnels deep; a packet nested deeper leaves only
// its outer flows.
func TestTunnelDepth(t *testing.T) {
	for _, depth := range []int{maxTunnels, maxTunnels + 1} {
		s := newSample(false)
		var frames [][]byte
		for _, f := range s.frames {
			for range depth {
				f = ser(t, outer4(layers.IPProtocolIPv4), raw(f))
			}
			frames = append(frames, f)
		}
		r := decodeCapture(t, rawPcap(capfile.LinkRaw, frames), 0)
		tcp := connKey("tcp", s.client, 49152, s.srv, 80)
		switch {
		case depth <= maxTunnels:
			s.check(t, r)
		case r.Flows[tcp] != nil || r.stats.Deep != int64(len(frames)):
			t.Errorf("depth %d: the inner flow was decoded, or %d of %d packets counted too deep", depth, r.stats.Deep, len(frames))
		}
		if r.Flows[connKey("4", tunA, 0, tunB, 0)] == nil {
			t.Errorf("depth %d: no outer flow", depth)
		}
	}
}

// Frames of a link type the decoder does not read are counted, and the
// decoder reads exactly the link types the reader says it does.
func TestOtherLinkTypes(t *testing.T) {
	d := New(Config{Origin: origin(), Sink: discard{}})
	frame := newSample(false).frames[0]
	for link := uint32(0); link < 1024; link++ {
		before := d.OtherLink
		d.Packet(&capfile.Packet{N: 1, LinkType: link, Data: frame})
		if counted := d.OtherLink > before; counted == capfile.Decodable(link) {
			t.Errorf("link type %d: counted as not decoded %v, capfile.Decodable %v", link, counted, capfile.Decodable(link))
		}
	}
}

// IPv6 with a payload length of 0 is read to the end of the captured
// frame: segments captured before the NIC split them (TSO) and jumbograms.
func TestIPv6ZeroPayloadLength(t *testing.T) {
	t.Run("tso", func(t *testing.T) {
		s := newSample(true)
		want := decodeCapture(t, rawPcap(capfile.LinkRaw, s.frames), 0)
		var tso [][]byte
		for _, f := range s.frames {
			f = append([]byte(nil), f...)
			f[4], f[5] = 0, 0
			tso = append(tso, f)
		}
		r := decodeCapture(t, rawPcap(capfile.LinkRaw, tso), 0)
		s.check(t, r)
		for _, v := range []string{connKey("tcp", s.client, 49152, s.srv, 80), connKey("udp", s.client, 40000, s.dns, 53)} {
			if a, b := *r.Flow(t, v), *want.Flow(t, v); a.OrigIPBytes != b.OrigIPBytes ||
				a.RespIPBytes != b.RespIPBytes || a.OrigPkts != b.OrigPkts || a.RespPkts != b.RespPkts || a.RespBytes != b.RespBytes {
				t.Errorf("%s: %+v, want %+v", v, a, b)
			}
		}
	})
	t.Run("jumbogram", func(t *testing.T) {
		// gopacket writes a Hop-by-Hop jumbo payload option and a payload
		// length of 0 for a payload beyond 65535 bytes.
		var log frameLog
		g := pcapgen.To(&log, pcapgen.Options{Link: layers.LinkTypeRaw})
		big := make([]byte, 70000)
		copy(big, "GET /jumbo HTTP/1.1\r\nHost: jumbo.example\r\n\r\n")
		c := g.Dial(ap(client6, 50000), ap(server6, 80), 1, 1)
		c.MSS = len(big)
		c.Send(big)
		c.Close()
		var jumbo []byte
		for _, f := range log {
			if len(f) > 65535 {
				jumbo = f
			}
		}
		if jumbo == nil || jumbo[4] != 0 || jumbo[5] != 0 || jumbo[6] != 0 {
			t.Fatal("no jumbogram written")
		}
		r := decodeCapture(t, rawPcap(capfile.LinkRaw, log), 0)
		f := r.Flow(t, connKey("tcp", client6, 50000, server6, 80))
		if f.OrigBytes != int64(len(big)) || f.ConnState != "SF" || f.OrigIPBytes != int64(len(jumbo)+4*60) || r.stats.Malformed != 0 {
			t.Errorf("jumbogram flow %+v, stats %+v", f, r.stats)
		}
		if h := r.get(t, "http", "GET http://jumbo.example/jumbo").HTTP; h.Host != "jumbo.example" {
			t.Errorf("http %+v", h)
		}
	})
}

// A tunnel packet fragmented on its way (a mirrored full-size frame in GRE
// exceeds the path's MTU) is reassembled, then decapsulated.
func TestFragmentedTunnel(t *testing.T) {
	// frag6 is an IPv6 fragment header for GRE.
	frag6 := func(id uint32, off int, more bool) []byte {
		h := []byte{47, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint16(h[2:], uint16(off))
		if more {
			h[3] |= 1
		}
		binary.BigEndian.PutUint32(h[4:], id)
		return h
	}
	for _, v6 := range []bool{false, true} {
		s := newSample(false)
		var frames [][]byte
		for i, f := range s.frames {
			inner := ser(t, &layers.GRE{Protocol: layers.EthernetTypeTransparentEthernetBridging}, eth(etherType(f)), raw(f))
			switch {
			case len(inner) <= 512:
				frames = append(frames, ser(t, outer4(layers.IPProtocolGRE), raw(inner)))
			case v6:
				frames = append(frames, ser(t, outer6(layers.IPProtocolIPv6Fragment), raw(append(frag6(uint32(i), 0, true), inner[:512]...))),
					ser(t, outer6(layers.IPProtocolIPv6Fragment), raw(append(frag6(uint32(i), 512, false), inner[512:]...))))
			default:
				first := outer4(layers.IPProtocolGRE)
				first.Id, first.Flags = uint16(i), layers.IPv4MoreFragments
				rest := outer4(layers.IPProtocolGRE)
				rest.Id, rest.FragOffset = uint16(i), 512/8
				frames = append(frames, ser(t, first, raw(inner[:512])), ser(t, rest, raw(inner[512:])))
			}
		}
		r := decodeCapture(t, rawPcap(capfile.LinkRaw, frames), 0)
		s.check(t, r)
		if r.stats.Reassembled == 0 || r.stats.Tunnelled != int64(len(s.frames)) {
			t.Errorf("v6 %v: stats %+v", v6, r.stats)
		}
	}
}
