package botproto

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// orderVectors maps the vector word of an order, as the families name it
// (Mirai's console: udp, udpplain, syn, ack, stomp, greip, greeth, vse,
// dns, http; Gafgyt/Bashlite's "!* " orders: UDP, TCP, STD, HTTP; IRC
// bots' "!udp", "!syn", Kaiten's "!pan", "!tsunami", "!unknown"; HTTP
// tasks use the same words), to the vectors tb-parse classifies floods as
// (records.AttackInfo.Vector) that carry it out. Every UDP order takes
// both udp and udpplain: whether a bot's payload is random or constant is
// an option, not the vector. A word not in the table is no attack order
// tb-parse can tie to an attack.
var orderVectors = map[string][]string{
	"udp": {"udp", "udpplain"}, "udpplain": {"udp", "udpplain"}, "std": {"udp", "udpplain"},
	"unknown": {"udp", "udpplain"},
	"syn":     {"syn"}, "pan": {"syn"},
	"ack": {"ack"}, "stomp": {"ack"}, "tsunami": {"ack"},
	"tcp":   {"syn", "ack"},
	"greip": {"gre"}, "greeth": {"gre"}, "gre": {"gre"},
	"vse":  {"vse"},
	"dns":  {"dns"},
	"http": {"http"},
	"icmp": {"icmp"},
}

// orderWord is an order's vector word as the table keys it: lower case,
// without an IRC command's "!".
func orderWord(vector string) string {
	return strings.ToLower(strings.TrimPrefix(vector, "!"))
}

// Carries reports whether a flood classified as attack (syn, udpplain, …)
// is of a kind that carries out an order naming vector (as the C2 sent it:
// "udpplain", "UDP", "!udp").
func Carries(vector, attack string) bool {
	return slices.Contains(orderVectors[orderWord(vector)], attack)
}

// Bounds on an HTTP answer read as an order: its body's size, and the
// words of the order (VECTOR TARGET [PORT [SECONDS]]).
const (
	MaxOrderBody  = 1024
	maxOrderWords = 4
)

// HTTPOrder reads the body of an answer to a bot's poll as an attack
// order: a short text whose words are VECTOR TARGET [PORT [SECONDS]], or a
// JSON object one of whose string members is such a text
// ({"task":"udp 203.0.113.77 9 4"}). The vector must be one the order
// table knows and the target an address, a prefix, a URL or a host name,
// so that a page that merely shows an address is no order. The Command's
// Protocol is None: the caller names the channel.
func HTTPOrder(body []byte) (Command, bool) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || len(body) > MaxOrderBody {
		return Command{}, false
	}
	if body[0] != '{' {
		return textTask(body)
	}
	if !quotesVector(body) {
		// Most answers to a poll hold no order: they cost no decoding.
		return Command{}, false
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil {
		return Command{}, false
	}
	keys := make([]string, 0, len(members))
	for k := range members {
		keys = append(keys, k)
	}
	// The first member that reads as an order, in the order of the
	// keys, so that the answer decides nothing by map order.
	slices.Sort(keys)
	for _, k := range keys {
		var s string
		if json.Unmarshal(members[k], &s) != nil {
			continue
		}
		if c, ok := textTask([]byte(s)); ok {
			return c, true
		}
	}
	return Command{}, false
}

// maxVectorWord is the longest word the order table has, "!" aside.
const maxVectorWord = 8

// startsVector reports whether b starts with a word of the order table
// and a space, the word in any case with "!" allowed before it. It
// allocates nothing.
func startsVector(b []byte) bool {
	b = bytes.TrimPrefix(b, []byte("!"))
	var w [maxVectorWord]byte
	for i := 0; i < len(b) && i <= maxVectorWord; i++ {
		c := b[i]
		if c == ' ' {
			return i > 0 && orderVectors[string(w[:i])] != nil
		}
		if i == maxVectorWord {
			return false
		}
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		w[i] = c
	}
	return false
}

// quotesVector reports whether a JSON string in b starts with a word of
// the order table and a space, as a member holding an order does.
func quotesVector(b []byte) bool {
	for i := bytes.IndexByte(b, '"'); i >= 0 && i+1 < len(b); {
		if startsVector(b[i+1:]) {
			return true
		}
		j := bytes.IndexByte(b[i+1:], '"')
		if j < 0 {
			return false
		}
		i += 1 + j
	}
	return false
}

// textTask reads one line of words VECTOR TARGET [PORT [SECONDS]].
func textTask(b []byte) (Command, bool) {
	b = bytes.TrimSpace(b)
	if len(b) > MaxOrderBody || !startsVector(b) || bytes.ContainsAny(b, "\r\n") {
		return Command{}, false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 || len(f) > maxOrderWords || orderVectors[orderWord(f[0])] == nil || !hostTarget(f[1]) {
		return Command{}, false
	}
	text := printable(b)
	c := Command{Vector: f[0], Targets: []string{f[1]}, Raw: text, Text: text}
	if len(f) > 2 {
		if !isPort(f[2]) {
			return Command{}, false
		}
		c.Ports = []string{f[2]}
	}
	if len(f) > 3 {
		d, err := strconv.ParseUint(f[3], 10, 31)
		if err != nil {
			return Command{}, false
		}
		c.Duration = int64(d)
	}
	return c, true
}

// hostTarget is isTarget for an order read from an answer that any web
// page could give: a name must end in a label with a letter, as a
// version number or a price does not.
func hostTarget(s string) bool {
	if !isTarget(s) {
		return false
	}
	host := TargetHost(s)
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	if _, err := netip.ParsePrefix(host); err == nil {
		return true
	}
	last := host[strings.LastIndexByte(host, '.')+1:]
	return strings.IndexFunc(last, func(r rune) bool { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' }) >= 0
}

// TargetHost is the host an order's target names: the target itself, or a
// URL's host.
func TargetHost(t string) string {
	for _, scheme := range []string{"http://", "https://"} {
		if rest, ok := strings.CutPrefix(t, scheme); ok {
			host, _, _ := strings.Cut(rest, "/")
			if h, _, ok := strings.Cut(host, ":"); ok && !strings.Contains(h, "[") {
				host = h
			}
			return host
		}
	}
	return t
}
