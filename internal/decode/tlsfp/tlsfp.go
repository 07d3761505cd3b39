// Package tlsfp parses TLS ClientHello and ServerHello messages from the
// first bytes of a TCP stream and computes the JA3 and JA4 fingerprints of
// a ClientHello.
package tlsfp

import (
	"bytes"
	"crypto/md5"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
)

// Errors. ErrIncomplete means more stream bytes are needed.
var (
	ErrNotTLS     = errors.New("tls: not a TLS handshake")
	ErrIncomplete = errors.New("tls: incomplete")
	ErrMalformed  = errors.New("tls: malformed hello")
)

// MaxHandshake bounds the handshake message reassembled from records.
const MaxHandshake = 1 << 16

// ClientHello holds the fields the fingerprints and observables use.
type ClientHello struct {
	Version           uint16 // legacy_version
	Ciphers           []uint16
	Extensions        []uint16
	Groups            []uint16 // supported_groups (JA3's EllipticCurves)
	PointFormats      []uint8
	SigAlgs           []uint16
	SupportedVersions []uint16
	ServerName        string
	ALPN              []string
}

// ServerHello holds the negotiated version.
type ServerHello struct {
	Version uint16 // legacy_version, or supported_versions when present
	Cipher  uint16
}

// IsGREASE reports whether v is a GREASE value (RFC 8701).
func IsGREASE(v uint16) bool { return v&0x0f0f == 0x0a0a && v>>8 == v&0xff }

// handshake reassembles the first handshake message of type want from the
// TLS records at the start of stream s.
func handshake(s []byte, want byte, scratch []byte) ([]byte, error) {
	msg := scratch[:0]
	for {
		if len(s) < 5 {
			return nil, ErrIncomplete
		}
		if s[0] != 22 || s[1] != 3 || s[2] > 4 {
			if s[0] == 22 && s[1] == 3 {
				return nil, ErrMalformed
			}
			return nil, ErrNotTLS
		}
		rl := int(binary.BigEndian.Uint16(s[3:5]))
		if rl == 0 || rl > 1<<14+2048 {
			return nil, ErrMalformed
		}
		if len(s) < 5+rl {
			// Use what has arrived: a hello that is already complete need
			// not wait for the rest of its record.
			msg = append(msg, s[5:]...)
			if done(msg, want) {
				break
			}
			return nil, ErrIncomplete
		}
		msg = append(msg, s[5:5+rl]...)
		s = s[5+rl:]
		if len(msg) >= 4 {
			if msg[0] != want {
				return nil, ErrNotTLS
			}
			if done(msg, want) {
				break
			}
		}
		if len(msg) > MaxHandshake {
			return nil, ErrMalformed
		}
	}
	n := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
	return msg[4 : 4+n], nil
}

func done(msg []byte, want byte) bool {
	if len(msg) < 4 || msg[0] != want {
		return false
	}
	n := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
	return len(msg) >= 4+n
}

// reader is a bounds-checked cursor.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) u8() uint8 {
	if len(r.b) < 1 {
		r.bad = true
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) u16() uint16 {
	if len(r.b) < 2 {
		r.bad = true
		r.b = nil
		return 0
	}
	v := binary.BigEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if n > len(r.b) {
		r.bad = true
		r.b = nil
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// ParseClientHello reads a ClientHello from the start of a client's TCP
// stream (TLS records). scratch is reused for reassembly across records.
func ParseClientHello(stream []byte, ch *ClientHello, scratch []byte) error {
	body, err := handshake(stream, 1, scratch)
	if err != nil {
		return err
	}
	return parseClientHelloBody(body, ch)
}

func parseClientHelloBody(body []byte, ch *ClientHello) error {
	*ch = ClientHello{Ciphers: ch.Ciphers[:0], Extensions: ch.Extensions[:0], Groups: ch.Groups[:0],
		PointFormats: ch.PointFormats[:0], SigAlgs: ch.SigAlgs[:0], SupportedVersions: ch.SupportedVersions[:0], ALPN: ch.ALPN[:0]}
	r := reader{b: body}
	ch.Version = r.u16()
	r.bytes(32)                 // random
	r.bytes(int(r.u8()))        // session id
	cs := r.bytes(int(r.u16())) // cipher suites
	r.bytes(int(r.u8()))        // compression methods
	if r.bad || len(cs)%2 != 0 {
		return ErrMalformed
	}
	for i := 0; i+1 < len(cs); i += 2 {
		ch.Ciphers = append(ch.Ciphers, binary.BigEndian.Uint16(cs[i:]))
	}
	if len(r.b) == 0 {
		return nil // no extensions (SSLv3-style hello)
	}
	ext := reader{b: r.bytes(int(r.u16()))}
	if r.bad {
		return ErrMalformed
	}
	for len(ext.b) > 0 {
		typ := ext.u16()
		data := ext.bytes(int(ext.u16()))
		if ext.bad {
			return ErrMalformed
		}
		ch.Extensions = append(ch.Extensions, typ)
		d := reader{b: data}
		switch typ {
		case 0: // server_name
			list := reader{b: d.bytes(int(d.u16()))}
			for len(list.b) > 0 && !list.bad {
				kind := list.u8()
				name := list.bytes(int(list.u16()))
				if kind == 0 && ch.ServerName == "" && !list.bad {
					ch.ServerName = printable(name)
				}
			}
		case 10: // supported_groups
			list := d.bytes(int(d.u16()))
			for i := 0; i+1 < len(list); i += 2 {
				ch.Groups = append(ch.Groups, binary.BigEndian.Uint16(list[i:]))
			}
		case 11: // ec_point_formats
			ch.PointFormats = append(ch.PointFormats, d.bytes(int(d.u8()))...)
		case 13: // signature_algorithms
			list := d.bytes(int(d.u16()))
			for i := 0; i+1 < len(list); i += 2 {
				ch.SigAlgs = append(ch.SigAlgs, binary.BigEndian.Uint16(list[i:]))
			}
		case 16: // application_layer_protocol_negotiation
			list := reader{b: d.bytes(int(d.u16()))}
			for len(list.b) > 0 && !list.bad {
				p := list.bytes(int(list.u8()))
				if !list.bad && len(p) > 0 && len(ch.ALPN) < 16 {
					ch.ALPN = append(ch.ALPN, string(p))
				}
			}
		case 43: // supported_versions
			list := d.bytes(int(d.u8()))
			for i := 0; i+1 < len(list); i += 2 {
				ch.SupportedVersions = append(ch.SupportedVersions, binary.BigEndian.Uint16(list[i:]))
			}
		}
	}
	return nil
}

// ParseServerHello reads a ServerHello from the start of a server's TCP
// stream.
func ParseServerHello(stream []byte, sh *ServerHello, scratch []byte) error {
	body, err := handshake(stream, 2, scratch)
	if err != nil {
		return err
	}
	r := reader{b: body}
	sh.Version = r.u16()
	r.bytes(32)
	r.bytes(int(r.u8()))
	sh.Cipher = r.u16()
	r.u8()
	if r.bad {
		return ErrMalformed
	}
	if len(r.b) == 0 {
		return nil
	}
	ext := reader{b: r.bytes(int(r.u16()))}
	for len(ext.b) > 0 && !ext.bad {
		typ := ext.u16()
		data := ext.bytes(int(ext.u16()))
		if typ == 43 && len(data) == 2 {
			sh.Version = binary.BigEndian.Uint16(data)
		}
	}
	return nil
}

func printable(b []byte) string {
	for _, c := range b {
		if c < 0x21 || c >= 0x7f {
			var sb strings.Builder
			for _, c := range b {
				if c < 0x21 || c >= 0x7f || c == '\\' {
					sb.WriteString(`\x`)
					sb.WriteString(hex.EncodeToString([]byte{c}))
				} else {
					sb.WriteByte(c)
				}
			}
			return sb.String()
		}
	}
	return string(b)
}

// VersionName names a protocol version as Zeek's ssl.log does (TLSv12,
// TLSv13, SSLv3, DTLSv12, …).
func VersionName(v uint16) string {
	switch v {
	case 0x0002:
		return "SSLv2"
	case 0x0300:
		return "SSLv3"
	case 0x0301:
		return "TLSv10"
	case 0x0302:
		return "TLSv11"
	case 0x0303:
		return "TLSv12"
	case 0x0304:
		return "TLSv13"
	case 0xfeff:
		return "DTLSv10"
	case 0xfefd:
		return "DTLSv12"
	case 0xfefc:
		return "DTLSv13"
	}
	if v>>8 == 0x7f { // TLS 1.3 drafts
		return "TLSv13-draft" + strconv.Itoa(int(v&0xff))
	}
	return "unknown-" + strconv.Itoa(int(v))
}

// JA3String is the JA3 input: "SSLVersion,Ciphers,Extensions,
// EllipticCurves,EllipticCurvePointFormats", decimal values joined by "-",
// GREASE values left out.
func (ch *ClientHello) JA3String() string {
	var sb strings.Builder
	sb.WriteString(strconv.Itoa(int(ch.Version)))
	sb.WriteByte(',')
	join16(&sb, ch.Ciphers)
	sb.WriteByte(',')
	join16(&sb, ch.Extensions)
	sb.WriteByte(',')
	join16(&sb, ch.Groups)
	sb.WriteByte(',')
	for i, v := range ch.PointFormats {
		if i > 0 {
			sb.WriteByte('-')
		}
		sb.WriteString(strconv.Itoa(int(v)))
	}
	return sb.String()
}

func join16(sb *strings.Builder, vs []uint16) {
	first := true
	for _, v := range vs {
		if IsGREASE(v) {
			continue
		}
		if !first {
			sb.WriteByte('-')
		}
		first = false
		sb.WriteString(strconv.Itoa(int(v)))
	}
}

// JA3 is the md5 of JA3String, in hex.
func (ch *ClientHello) JA3() string {
	sum := md5.Sum([]byte(ch.JA3String()))
	return hex.EncodeToString(sum[:])
}

// JA4 is FoxIO's JA4 fingerprint of a ClientHello seen over TCP:
// "t" + version + SNI flag + cipher count + extension count + ALPN chars,
// then the truncated sha256 of the sorted ciphers, then that of the sorted
// extensions (without SNI and ALPN) followed by the signature algorithms.
func (ch *ClientHello) JA4() string {
	var a strings.Builder
	a.WriteByte('t')
	v := ch.Version
	var highest uint16
	for _, sv := range ch.SupportedVersions {
		if !IsGREASE(sv) && sv > highest {
			highest = sv
		}
	}
	if highest != 0 {
		v = highest
	}
	a.WriteString(ja4Version(v))
	if ch.ServerName != "" || slices.Contains(ch.Extensions, 0) {
		a.WriteByte('d')
	} else {
		a.WriteByte('i')
	}
	ciphers := make([]uint16, 0, len(ch.Ciphers))
	for _, c := range ch.Ciphers {
		if !IsGREASE(c) {
			ciphers = append(ciphers, c)
		}
	}
	exts := make([]uint16, 0, len(ch.Extensions))
	nExt := 0
	for _, e := range ch.Extensions {
		if IsGREASE(e) {
			continue
		}
		nExt++
		if e != 0 && e != 16 {
			exts = append(exts, e)
		}
	}
	a.WriteString(count2(len(ciphers)))
	a.WriteString(count2(nExt))
	a.WriteString(alpnChars(ch.ALPN))

	slices.Sort(ciphers)
	slices.Sort(exts)
	b := hash12(hexList(ciphers), len(ciphers) == 0)
	c := hexList(exts)
	if len(ch.SigAlgs) > 0 {
		c += "_" + hexList(ch.SigAlgs)
	}
	return a.String() + "_" + b + "_" + hash12(c, len(exts) == 0)
}

func ja4Version(v uint16) string {
	switch v {
	case 0x0304:
		return "13"
	case 0x0303:
		return "12"
	case 0x0302:
		return "11"
	case 0x0301:
		return "10"
	case 0x0300:
		return "s3"
	case 0x0002:
		return "s2"
	case 0xfeff:
		return "d1"
	case 0xfefd:
		return "d2"
	case 0xfefc:
		return "d3"
	}
	return "00"
}

func count2(n int) string {
	n = min(n, 99)
	return string([]byte{'0' + byte(n/10), '0' + byte(n%10)})
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func alpnChars(alpn []string) string {
	if len(alpn) == 0 || alpn[0] == "" {
		return "00"
	}
	p := alpn[0]
	f, l := p[0], p[len(p)-1]
	if isAlnum(f) && isAlnum(l) {
		return string([]byte{f, l})
	}
	h := hex.EncodeToString([]byte(p))
	return string([]byte{h[0], h[len(h)-1]})
}

func hexList(vs []uint16) string {
	var sb strings.Builder
	for i, v := range vs {
		if i > 0 {
			sb.WriteByte(',')
		}
		var b [2]byte
		binary.BigEndian.PutUint16(b[:], v)
		sb.WriteString(hex.EncodeToString(b[:]))
	}
	return sb.String()
}

func hash12(s string, empty bool) string {
	if empty {
		return "000000000000"
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:12]
}

// FindClientHello returns where the first record in b that starts like a
// ClientHello begins (a handshake record of a TLS version, whose message
// is a client_hello), -1 when there is none. A candidate cut short by the
// end of b is returned: it may be one.
func FindClientHello(b []byte) int {
	for i := 0; i < len(b); i++ {
		j := bytes.IndexByte(b[i:], 22)
		if j < 0 {
			return -1
		}
		i += j
		r := b[i:]
		if (len(r) < 2 || r[1] == 3) && (len(r) < 3 || r[2] <= 4) && (len(r) < 6 || r[5] == 1) {
			return i
		}
	}
	return -1
}
