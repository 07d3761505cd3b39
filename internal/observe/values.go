package observe

import (
	"net/netip"
	"strings"
)

// The values of observables and of their infos' fields, as every decoder
// writes them, so that a name, a request or a server seen in a capture and
// in a sensor's log is the same observable.

// HostPort formats an address and port, IPv6 in brackets.
func HostPort(a netip.Addr, p uint16) string {
	return netip.AddrPortFrom(a, p).String()
}

// HTTPValue is the value of an http observable: "METHOD http://host/uri",
// or the URI alone when it is already absolute (proxy requests).
func HTTPValue(method, host, uri string) string {
	if len(uri) > 7 && (uri[:7] == "http://" || len(uri) > 8 && uri[:8] == "https://") {
		return method + " " + uri
	}
	if method == "CONNECT" {
		return method + " " + uri
	}
	return method + " http://" + lowerASCII(host) + uri
}

func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// NormName is the observable value of a DNS name: lower case, without a
// trailing dot ("." for the root).
func NormName(s string) string {
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return "."
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}
