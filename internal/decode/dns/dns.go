// Package dns parses DNS messages (RFC 1035 and successors) defensively:
// every length is checked, compression pointers must point backwards, and
// names, questions and answers are bounded.
package dns

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strconv"
	"strings"
)

// Bounds on one message.
const (
	MaxQuestions = 16
	MaxAnswers   = 128
	maxNameLen   = 255
	maxPointers  = 64
)

// Errors.
var (
	ErrShort    = errors.New("dns: message truncated")
	ErrBadName  = errors.New("dns: malformed name")
	ErrPtrLoop  = errors.New("dns: compression pointer loop")
	ErrTooLarge = errors.New("dns: name longer than 255 bytes")
)

// Question is one entry of the question section.
type Question struct {
	Name  string
	Type  uint16
	Class uint16
}

// RR is one answer record, its data rendered as text (addresses, names,
// TXT strings; other types as "\# len hex", RFC 3597).
type RR struct {
	Name  string
	Type  uint16
	Class uint16
	TTL   uint32
	Data  string
}

// Names makes the strings of names, once per distinct name: a capture asks
// for the same few names over and over. The zero value is ready to use.
type Names struct{ m map[string]string }

// maxNames bounds the Names cache; it starts over when full.
const maxNames = 1 << 14

func (n *Names) str(b []byte) string {
	if n == nil {
		return string(b)
	}
	if s, ok := n.m[string(b)]; ok {
		return s
	}
	if n.m == nil || len(n.m) >= maxNames {
		n.m = make(map[string]string)
	}
	s := string(b)
	n.m[s] = s
	return s
}

// Msg is a parsed message. Questions beyond MaxQuestions and answers beyond
// MaxAnswers are counted in the header but not kept. When Names is set,
// names are made through it.
type Msg struct {
	Names *Names

	ID        uint16
	Response  bool
	Opcode    uint8
	RCode     uint8
	TC        bool
	QDCount   uint16
	ANCount   uint16
	Questions []Question
	Answers   []RR
	// Bad counts the records that could not be read: a record whose data
	// does not parse is kept with its data in RFC 3597 form; a section cut
	// short ends the message there, keeping what came before (a message of
	// which nothing could be read is an error).
	Bad int
}

// Parse decodes b into m, reusing m's slices.
func Parse(b []byte, m *Msg) error {
	m.Questions = m.Questions[:0]
	m.Answers = m.Answers[:0]
	if len(b) < 12 {
		return ErrShort
	}
	m.ID = binary.BigEndian.Uint16(b[0:2])
	flags := binary.BigEndian.Uint16(b[2:4])
	m.Response = flags&0x8000 != 0
	m.Opcode = uint8(flags>>11) & 0xf
	m.TC = flags&0x0200 != 0
	m.RCode = uint8(flags & 0xf)
	m.QDCount = binary.BigEndian.Uint16(b[4:6])
	m.ANCount = binary.BigEndian.Uint16(b[6:8])
	m.Bad = 0
	off := 12
	var nb [maxNameLen * 4]byte
	for i := 0; i < int(m.QDCount); i++ {
		name, n, err := readName(b, off, nb[:0], m.Names)
		if err == nil && n+4 > len(b) {
			err = ErrShort
		}
		if err != nil {
			return m.cut(err, int(m.QDCount)-i+int(m.ANCount))
		}
		off = n
		if i < MaxQuestions {
			m.Questions = append(m.Questions, Question{Name: name, Type: binary.BigEndian.Uint16(b[off:]), Class: binary.BigEndian.Uint16(b[off+2:])})
		}
		off += 4
	}
	for i := 0; i < int(m.ANCount) && i < MaxAnswers; i++ {
		name, n, err := readName(b, off, nb[:0], m.Names)
		if err == nil && n+10 > len(b) {
			err = ErrShort
		}
		var rdlen int
		if err == nil {
			rdlen = int(binary.BigEndian.Uint16(b[n+8:]))
			if n+10+rdlen > len(b) {
				err = ErrShort
			}
		}
		if err != nil {
			return m.cut(err, int(m.ANCount)-i)
		}
		off = n
		rr := RR{Name: name, Type: binary.BigEndian.Uint16(b[off:]), Class: binary.BigEndian.Uint16(b[off+2:]), TTL: binary.BigEndian.Uint32(b[off+4:])}
		off += 10
		if rr.Data, err = rdata(b, off, rdlen, rr.Type, nb[:0], m.Names); err != nil {
			// Data that does not parse as its type (an empty CNAME of a
			// dynamic update, a malformed TXT): kept as RFC 3597 hex.
			rr.Data = unknownData(b[off : off+rdlen])
			m.Bad++
		}
		off += rdlen
		m.Answers = append(m.Answers, rr)
	}
	return nil
}

// cut ends a message at a section cut short: what came before is kept and
// the unread records are counted, unless nothing at all could be read.
func (m *Msg) cut(err error, unread int) error {
	if len(m.Questions) == 0 && len(m.Answers) == 0 {
		return err
	}
	m.Bad += unread
	return nil
}

// readName decodes the possibly compressed name at off, returning it and
// the offset just past it in the original position.
func readName(b []byte, off int, buf []byte, names *Names) (string, int, error) {
	end := -1
	ptrs := 0
	wire := 0
	for {
		if off >= len(b) {
			return "", 0, ErrShort
		}
		l := int(b[off])
		switch {
		case l == 0:
			if end < 0 {
				end = off + 1
			}
			if len(buf) == 0 {
				return ".", end, nil
			}
			return names.str(buf), end, nil
		case l&0xc0 == 0xc0:
			if off+1 >= len(b) {
				return "", 0, ErrShort
			}
			ptr := int(binary.BigEndian.Uint16(b[off:]) & 0x3fff)
			if end < 0 {
				end = off + 2
			}
			// Pointers must go backwards, which rules out loops; the count
			// bounds the work a chain of backward pointers can cause.
			if ptr >= off {
				return "", 0, ErrPtrLoop
			}
			if ptrs++; ptrs > maxPointers {
				return "", 0, ErrPtrLoop
			}
			off = ptr
		case l&0xc0 != 0:
			return "", 0, ErrBadName
		default:
			if off+1+l > len(b) {
				return "", 0, ErrShort
			}
			if wire += l + 1; wire > maxNameLen {
				return "", 0, ErrTooLarge
			}
			if len(buf) > 0 {
				buf = append(buf, '.')
			}
			for _, c := range b[off+1 : off+1+l] {
				buf = appendEscaped(buf, c)
			}
			off += 1 + l
		}
	}
}

const hexdigits = "0123456789abcdef"

// appendEscaped writes a label byte, escaping what is not printable or
// would change how the name reads (as \xNN, the way Zeek logs it).
func appendEscaped(buf []byte, c byte) []byte {
	if c <= 0x20 || c >= 0x7f || c == '.' || c == '\\' {
		return append(buf, '\\', 'x', hexdigits[c>>4], hexdigits[c&0xf])
	}
	return append(buf, c)
}

func rdata(b []byte, off, n int, typ uint16, buf []byte, names *Names) (string, error) {
	d := b[off : off+n]
	switch typ {
	case TypeA:
		if n == 4 {
			return names.str(netip.AddrFrom4([4]byte(d)).AppendTo(buf)), nil
		}
	case TypeAAAA:
		if n == 16 {
			return names.str(netip.AddrFrom16([16]byte(d)).AppendTo(buf)), nil
		}
	case TypeCNAME, TypeNS, TypePTR, TypeDNAME:
		name, _, err := readName(b[:off+n], off, buf, names)
		return name, err
	case TypeMX:
		if n >= 3 {
			name, _, err := readName(b[:off+n], off+2, buf, names)
			return name, err
		}
	case TypeSRV:
		if n >= 7 {
			name, _, err := readName(b[:off+n], off+6, buf, names)
			if err != nil {
				return "", err
			}
			return strconv.Itoa(int(binary.BigEndian.Uint16(d[0:]))) + " " + strconv.Itoa(int(binary.BigEndian.Uint16(d[2:]))) + " " +
				strconv.Itoa(int(binary.BigEndian.Uint16(d[4:]))) + " " + name, nil
		}
	case TypeTXT, TypeSPF:
		var sb strings.Builder
		for i := 0; i < n; {
			l := int(d[i])
			if i+1+l > n {
				return "", ErrShort
			}
			if i > 0 {
				sb.WriteByte(' ')
			}
			for _, c := range d[i+1 : i+1+l] {
				if c < 0x20 || c >= 0x7f || c == '\\' {
					sb.WriteString(`\x`)
					sb.WriteByte(hexdigits[c>>4])
					sb.WriteByte(hexdigits[c&0xf])
				} else {
					sb.WriteByte(c)
				}
			}
			i += 1 + l
		}
		return sb.String(), nil
	}
	return unknownData(d), nil
}

// unknownData renders record data as RFC 3597's "\# len hex", the hex
// cut after 64 bytes.
func unknownData(d []byte) string {
	const maxHex = 64
	var sb strings.Builder
	sb.WriteString(`\# `)
	sb.WriteString(strconv.Itoa(len(d)))
	if len(d) > 0 {
		sb.WriteByte(' ')
	}
	for i, c := range d {
		if i == maxHex {
			sb.WriteString("…")
			break
		}
		sb.WriteByte(hexdigits[c>>4])
		sb.WriteByte(hexdigits[c&0xf])
	}
	return sb.String()
}

// Record types with a name here.
const (
	TypeA     = 1
	TypeNS    = 2
	TypeCNAME = 5
	TypeSOA   = 6
	TypePTR   = 12
	TypeMX    = 15
	TypeTXT   = 16
	TypeAAAA  = 28
	TypeSRV   = 33
	TypeDNAME = 39
	TypeSPF   = 99
)

var typeNames = map[uint16]string{
	1: "A", 2: "NS", 3: "MD", 4: "MF", 5: "CNAME", 6: "SOA", 7: "MB", 8: "MG", 9: "MR", 10: "NULL",
	11: "WKS", 12: "PTR", 13: "HINFO", 14: "MINFO", 15: "MX", 16: "TXT", 17: "RP", 18: "AFSDB",
	24: "SIG", 25: "KEY", 28: "AAAA", 32: "NB", 29: "LOC", 33: "SRV", 35: "NAPTR", 36: "KX", 37: "CERT",
	39: "DNAME", 41: "OPT", 42: "APL", 43: "DS", 44: "SSHFP", 45: "IPSECKEY", 46: "RRSIG",
	47: "NSEC", 48: "DNSKEY", 49: "DHCID", 50: "NSEC3", 51: "NSEC3PARAM", 52: "TLSA", 53: "SMIMEA",
	55: "HIP", 59: "CDS", 60: "CDNSKEY", 61: "OPENPGPKEY", 62: "CSYNC", 63: "ZONEMD", 64: "SVCB",
	65: "HTTPS", 99: "SPF", 108: "EUI48", 109: "EUI64", 249: "TKEY", 250: "TSIG", 251: "IXFR",
	252: "AXFR", 253: "MAILB", 254: "MAILA", 255: "*", 256: "URI", 257: "CAA",
}

// TypeName is the mnemonic of a record type ("A", "AAAA", …), or
// "TYPE<n>" (RFC 3597) when it has none.
func TypeName(t uint16) string {
	if s, ok := typeNames[t]; ok {
		return s
	}
	return "TYPE" + strconv.Itoa(int(t))
}

var rcodeNames = [...]string{"NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "YXDOMAIN", "YXRRSET", "NXRRSET", "NOTAUTH", "NOTZONE"}

// RCodeName is the mnemonic of a response code ("NOERROR", "NXDOMAIN", …).
func RCodeName(r uint8) string {
	if int(r) < len(rcodeNames) {
		return rcodeNames[r]
	}
	return "RCODE" + strconv.Itoa(int(r))
}
