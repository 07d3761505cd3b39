package state

import (
	"net"
	"net/netip"
	"net/url"
	"strings"
)

// withTLSDefault returns the database URL with sslmode=verify-full added
// when it names no sslmode and reaches its server over the network: the
// client library's own default (prefer) falls back to plain text and takes
// any certificate, so a host on the path could read the records and the
// password, or pose as the database. A Unix socket or a loopback address
// keeps the library's default.
func withTLSDefault(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw // the library reports it
	}
	q := u.Query()
	if q.Has("sslmode") {
		return raw
	}
	hosts := strings.Split(u.Host, ",")
	if h := q.Get("host"); h != "" {
		hosts = strings.Split(h, ",")
	}
	for _, h := range hosts {
		if remoteHost(h) {
			q.Set("sslmode", "verify-full")
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	return raw
}

// remoteHost reports whether a URL's host (host, host:port, [v6]:port, a
// socket directory) is reached over the network.
func remoteHost(h string) bool {
	if h == "" || strings.HasPrefix(h, "/") || strings.HasPrefix(h, "%2F") || strings.HasPrefix(h, "%2f") {
		return false
	}
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.Trim(h, "[]")
	if strings.EqualFold(h, "localhost") {
		return false
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		return !ip.IsLoopback()
	}
	return true
}
