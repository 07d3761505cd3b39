package pcapgen

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// DNSQuery is a standard query for one name.
func DNSQuery(id uint16, name string, qtype layers.DNSType) []byte {
	return dnsBytes(&layers.DNS{ID: id, RD: true, QDCount: 1,
		Questions: []layers.DNSQuestion{{Name: []byte(name), Type: qtype, Class: layers.DNSClassIN}}})
}

// DNSResponse answers a query.
func DNSResponse(id uint16, name string, qtype layers.DNSType, rcode layers.DNSResponseCode, answers []layers.DNSResourceRecord) []byte {
	for i := range answers {
		answers[i].Class = cmp.Or(answers[i].Class, layers.DNSClassIN)
	}
	return dnsBytes(&layers.DNS{ID: id, QR: true, RD: true, RA: true, ResponseCode: rcode,
		Questions: []layers.DNSQuestion{{Name: []byte(name), Type: qtype, Class: layers.DNSClassIN}}, Answers: answers})
}

func dnsBytes(d *layers.DNS) []byte {
	b := gopacket.NewSerializeBuffer()
	if err := d.SerializeTo(b, gopacket.SerializeOptions{FixLengths: true}); err != nil {
		panic("pcapgen: DNS serialization: " + err.Error())
	}
	return append([]byte(nil), b.Bytes()...)
}

// A is an address answer.
func A(name string, ip netip.Addr, ttl uint32) layers.DNSResourceRecord {
	t := layers.DNSTypeA
	if ip.Is6() {
		t = layers.DNSTypeAAAA
	}
	return layers.DNSResourceRecord{Name: []byte(name), Type: t, Class: layers.DNSClassIN, TTL: ttl, IP: ip.AsSlice()}
}

// CNAME is an alias answer.
func CNAME(name, target string, ttl uint32) layers.DNSResourceRecord {
	return layers.DNSResourceRecord{Name: []byte(name), Type: layers.DNSTypeCNAME, Class: layers.DNSClassIN, TTL: ttl, CNAME: []byte(target)}
}

// TXT is a text answer.
func TXT(name string, ttl uint32, texts ...string) layers.DNSResourceRecord {
	var ts [][]byte
	for _, t := range texts {
		ts = append(ts, []byte(t))
	}
	return layers.DNSResourceRecord{Name: []byte(name), Type: layers.DNSTypeTXT, Class: layers.DNSClassIN, TTL: ttl, TXTs: ts}
}

// MX is a mail exchanger answer.
func MX(name string, pref uint16, host string, ttl uint32) layers.DNSResourceRecord {
	return layers.DNSResourceRecord{Name: []byte(name), Type: layers.DNSTypeMX, Class: layers.DNSClassIN, TTL: ttl,
		MX: layers.DNSMX{Preference: pref, Name: []byte(host)}}
}

// DNSOverUDP writes a query and its response.
func (g *Gen) DNSOverUDP(c, s netip.AddrPort, query, response []byte) {
	g.UDP(c, s, query)
	if response != nil {
		g.UDP(s, c, response)
	}
}

// TCPDNS prefixes a DNS message with its length, for DNS over TCP.
func TCPDNS(msg []byte) []byte {
	b := make([]byte, 2+len(msg))
	binary.BigEndian.PutUint16(b, uint16(len(msg)))
	copy(b[2:], msg)
	return b
}

// Hello describes a ClientHello. Extensions are written in Order; the
// content of the known ones (server_name, supported_groups,
// ec_point_formats, signature_algorithms, ALPN, supported_versions) comes
// from the fields, any other is empty (or Pad bytes for padding, 21).
type Hello struct {
	Version           uint16
	Ciphers           []uint16
	Order             []uint16
	SNI               string
	Groups            []uint16
	PointFormats      []uint8
	SigAlgs           []uint16
	ALPN              []string
	SupportedVersions []uint16
	Pad               int
}

func u16s(vs []uint16) []byte {
	b := make([]byte, 2*len(vs))
	for i, v := range vs {
		binary.BigEndian.PutUint16(b[2*i:], v)
	}
	return b
}

func vec16(b []byte) []byte { return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...) }
func vec8(b []byte) []byte  { return append([]byte{byte(len(b))}, b...) }

// ClientHelloRecord encodes h as one TLS handshake record.
func ClientHelloRecord(h Hello) []byte {
	body := binary.BigEndian.AppendUint16(nil, h.Version)
	body = append(body, make([]byte, 32)...) // random
	body = append(body, vec8(make([]byte, 32))...)
	body = append(body, vec16(u16s(h.Ciphers))...)
	body = append(body, 1, 0) // compression: null
	var exts []byte
	for _, t := range h.Order {
		var d []byte
		switch t {
		case 0:
			name := append([]byte{0}, vec16([]byte(h.SNI))...)
			d = vec16(name)
		case 10:
			d = vec16(u16s(h.Groups))
		case 11:
			d = vec8(h.PointFormats)
		case 13:
			d = vec16(u16s(h.SigAlgs))
		case 16:
			var l []byte
			for _, p := range h.ALPN {
				l = append(l, vec8([]byte(p))...)
			}
			d = vec16(l)
		case 43:
			d = vec8(u16s(h.SupportedVersions))
		case 21:
			d = make([]byte, h.Pad)
		}
		exts = binary.BigEndian.AppendUint16(exts, t)
		exts = append(exts, vec16(d)...)
	}
	body = append(body, vec16(exts)...)
	hs := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return Record(22, hs)
}

// Record wraps a payload in one TLS record (split into several when longer
// than 16 KiB).
func Record(typ byte, payload []byte) []byte {
	var out []byte
	for first := true; first || len(payload) > 0; first = false {
		n := min(len(payload), 1<<14)
		out = append(out, typ, 3, 1, byte(n>>8), byte(n))
		out = append(out, payload[:n]...)
		payload = payload[n:]
	}
	return out
}

// ServerHelloRecord is a ServerHello choosing version (for TLS 1.3 in the
// supported_versions extension) and cipher.
func ServerHelloRecord(version, cipher uint16) []byte {
	legacy := version
	if version == 0x0304 {
		legacy = 0x0303
	}
	body := binary.BigEndian.AppendUint16(nil, legacy)
	body = append(body, make([]byte, 32)...)
	body = append(body, 0)
	body = binary.BigEndian.AppendUint16(body, cipher)
	body = append(body, 0)
	var exts []byte
	if version == 0x0304 {
		exts = append(exts, 0, 43, 0, 2, 3, 4)
	}
	body = append(body, vec16(exts)...)
	hs := append([]byte{2, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return Record(22, hs)
}

// HTTPGet is a minimal GET request.
func HTTPGet(host, uri, ua string) []byte {
	return []byte("GET " + uri + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: " + ua + "\r\nAccept: */*\r\n\r\n")
}

// HTTPResponse is a response with a Content-Length body.
func HTTPResponse(status int, reason string, body []byte) []byte {
	h := "HTTP/1.1 " + itoa(status) + " " + reason + "\r\nContent-Type: text/plain\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n"
	return append([]byte(h), body...)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// WebVisits writes n visits of a web server a client makes, interval
// apart, each on its own connection: a GET for host's uri, the server's
// 200 and the server's close. That is all any web server gives a sample
// that aims at it: it answers, in HTTP, and the sample never answers back.
func (g *Gen) WebVisits(client netip.Addr, web netip.AddrPort, host, uri string, n int, interval time.Duration) {
	for i := 0; i < n; i++ {
		c := g.Dial(netip.AddrPortFrom(client, uint16(42000+i)), web, uint32(200*i), 9500)
		c.Send(HTTPGet(host, uri, "Mozilla/5.0"))
		c.Reply(HTTPResponse(200, "OK", []byte("<html>welcome</html>")))
		c.CloseByServer()
		g.T = g.T.Add(interval)
	}
}
