package behave

import (
	"net/netip"
	"strconv"
	"strings"
)

// sockAddr is a socket address as the trace printed it.
type sockAddr struct {
	family string // inet, inet6, unix; "" for the others
	addr   netip.Addr
	port   uint16
	path   string // unix: the path, "@name" for an abstract name
	known  bool   // the address (not only the family) could be read
}

// parseSockaddr reads strace's and QEMU's renderings of a struct sockaddr:
//
//	{sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("203.0.113.5")}
//	{sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "2001:db8::1", &sin6_addr), sin6_scope_id=0}
//	{sa_family=AF_UNIX, sun_path="/run/x.sock"}
//	{sin_family=AF_INET,sin_port=htons(80),sin_addr=inet_addr("203.0.113.5")}   (QEMU)
//	{sa_family=10, sa_data={00, 50, ...}}                                      (QEMU, other families)
//
// ok is false for no address (NULL, a pointer QEMU did not decode).
func parseSockaddr(s string) (sa sockAddr, ok bool) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "{") {
		return sa, false
	}
	fam := field(s, "sa_family=")
	for _, k := range []string{"sin_family=", "sin6_family=", "sun_family="} {
		if fam == "" {
			fam = field(s, k)
		}
	}
	switch fam {
	case "AF_INET", "PF_INET", "2":
		sa.family = "inet"
	case "AF_INET6", "PF_INET6", "10":
		sa.family = "inet6"
	case "AF_UNIX", "AF_LOCAL", "PF_UNIX", "1":
		sa.family = "unix"
	default:
		return sa, fam != ""
	}
	switch sa.family {
	case "unix":
		i := strings.Index(s, "sun_path=")
		if i < 0 {
			return sa, true
		}
		v := s[i+len("sun_path="):]
		if p, ok := unquote(v, false); ok {
			sa.path, sa.known = p, true
		}
		return sa, true
	case "inet":
		sa.port = htons(s, "sin_port=htons(")
		if a, ok := quotedAfter(s, "inet_addr("); ok {
			if ip, err := netip.ParseAddr(a); err == nil {
				sa.addr, sa.known = ip, true
			}
		}
	case "inet6":
		sa.port = htons(s, "sin6_port=htons(")
		if a, ok := quotedAfter(s, "inet_pton(AF_INET6, "); ok {
			if ip, err := netip.ParseAddr(a); err == nil {
				sa.addr, sa.known = ip.Unmap(), true
				if sa.addr.Is4() {
					sa.family = "inet"
				}
			}
		} else if i := strings.Index(s, "sa_data={"); i >= 0 {
			// QEMU prints an IPv6 address's first 8 bytes only: the port.
			bs := strings.Split(s[i+len("sa_data={"):], ",")
			if len(bs) >= 2 {
				hi, err1 := strconv.ParseUint(strings.TrimSpace(bs[0]), 16, 8)
				lo, err2 := strconv.ParseUint(strings.TrimSpace(bs[1]), 16, 8)
				if err1 == nil && err2 == nil {
					sa.port = uint16(hi<<8 | lo)
				}
			}
		}
	}
	return sa, true
}

// field is the value of "key=VALUE" up to the next comma or brace.
func field(s, key string) string {
	i := strings.Index(s, key)
	if i < 0 {
		return ""
	}
	v := s[i+len(key):]
	if j := strings.IndexAny(v, ",}"); j >= 0 {
		v = v[:j]
	}
	return strings.TrimSpace(v)
}

func htons(s, key string) uint16 {
	i := strings.Index(s, key)
	if i < 0 {
		return 0
	}
	v := s[i+len(key):]
	if j := strings.IndexByte(v, ')'); j >= 0 {
		v = v[:j]
	}
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 16)
	if err != nil {
		return 0
	}
	return uint16(n)
}

func quotedAfter(s, key string) (string, bool) {
	i := strings.Index(s, key)
	if i < 0 {
		return "", false
	}
	v, ok := unquote(s[i+len(key):], false)
	return v, ok
}

// sockaddrArg finds the socket address among a network call's arguments.
func sockaddrArg(name string, args []string) string {
	switch name {
	case "connect", "bind", "accept", "accept4":
		if len(args) > 1 {
			return args[1]
		}
	case "sendto":
		if len(args) > 4 {
			return args[4]
		}
	case "sendmsg":
		if len(args) > 1 {
			if i := strings.Index(args[1], "msg_name="); i >= 0 {
				v := args[1][i+len("msg_name="):]
				if strings.HasPrefix(v, "{") {
					if j := closeBrace(v); j > 0 {
						return v[:j+1]
					}
				}
			}
		}
	}
	return ""
}

// closeBrace is the index of the brace closing the one s starts with.
func closeBrace(s string) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			if j := endQuote(s, i, false); j >= 0 {
				i = j
			}
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}
