// Package endpoint owns the value every tool names a destination by,
// ADDR:PORT/PROTO ("198.51.100.7:443/tcp", "[2001:db8::1]:53/udp"): one
// type, one parser and one formatter, which tb-parse's endpoint
// observables, tb-allow's entries and enforced lists, the lab's firewall
// elements and the lease report all use.
package endpoint

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Endpoint is a destination: an address, a port and tcp or udp.
type Endpoint struct {
	Addr  netip.Addr
	Port  uint16
	Proto string
}

// New is the endpoint of addr (an IPv4-mapped address taken as IPv4).
func New(addr netip.Addr, port uint16, proto string) Endpoint {
	return Endpoint{Addr: addr.Unmap(), Port: port, Proto: proto}
}

// ErrSyntax is wrapped by every parse error.
var ErrSyntax = errors.New("want IP:PORT/PROTO, PROTO tcp or udp")

// Parse reads ADDR:PORT/PROTO; the protocol is tcp or udp, required.
func Parse(s string) (Endpoint, error) {
	hp, proto, ok := strings.Cut(s, "/")
	ap, err := netip.ParseAddrPort(hp)
	if !ok || err != nil || (proto != "tcp" && proto != "udp") {
		return Endpoint{}, fmt.Errorf("endpoint %q: %w", s, ErrSyntax)
	}
	return New(ap.Addr(), ap.Port(), proto), nil
}

// ParseIPv4 reads an IPv4 endpoint from bytes without allocating: the fast
// path for the compact lines of enforced allow lists, read by the hundred
// thousand. Anything else (IPv6 included) is not ok, and the caller falls
// back to Parse.
func ParseIPv4(v []byte) (Endpoint, bool) {
	var a [4]byte
	var port int
	i := 0
	for k := 0; k < 5; k++ {
		n, start := 0, i
		for i < len(v) && v[i] >= '0' && v[i] <= '9' && i-start < 5 {
			n = n*10 + int(v[i]-'0')
			i++
		}
		if i == start || (v[start] == '0' && i-start > 1) || i >= len(v) {
			return Endpoint{}, false
		}
		switch {
		case k < 3 && v[i] == '.' && n <= 255, k == 3 && v[i] == ':' && n <= 255:
			a[k] = byte(n)
		case k == 4 && v[i] == '/' && n <= 65535:
			port = n
		default:
			return Endpoint{}, false
		}
		i++
	}
	switch string(v[i:]) {
	case "tcp":
		return Endpoint{Addr: netip.AddrFrom4(a), Port: uint16(port), Proto: "tcp"}, true
	case "udp":
		return Endpoint{Addr: netip.AddrFrom4(a), Port: uint16(port), Proto: "udp"}, true
	}
	return Endpoint{}, false
}

// String is ADDR:PORT/PROTO.
func (e Endpoint) String() string {
	return string(e.Append(make([]byte, 0, 48)))
}

// Append appends ADDR:PORT/PROTO to b.
func (e Endpoint) Append(b []byte) []byte {
	return Append(b, e.Addr.String(), e.Port, e.Proto)
}

// AppendText implements encoding.TextAppender.
func (e Endpoint) AppendText(b []byte) ([]byte, error) { return e.Append(b), nil }

// MarshalText implements encoding.TextMarshaler.
func (e Endpoint) MarshalText() ([]byte, error) { return e.Append(nil), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (e *Endpoint) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	*e = v
	return err
}

// Append appends HOST:PORT/PROTO for a host already in text form (a flow
// log's field, without allocating), in brackets when it is IPv6: the one
// formatter, which Endpoint.Append uses too.
func Append[T string | []byte](b []byte, host T, port uint16, proto T) []byte {
	v6 := false
	for i := 0; i < len(host); i++ {
		if host[i] == ':' {
			v6 = true
			break
		}
	}
	if v6 {
		b = append(b, '[')
		b = append(b, host...)
		b = append(b, ']')
	} else {
		b = append(b, host...)
	}
	b = strconv.AppendUint(append(b, ':'), uint64(port), 10)
	b = append(b, '/')
	return append(b, proto...)
}
