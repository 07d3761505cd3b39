// Package botwire is the wire format of the benign beacon's bot protocols
// (-c2-proto): the frames and lines the bot and the demo's C2 server send
// each other in Mirai's binary protocol, a Gafgyt/Bashlite text channel and
// IRC, and the attack order all three (and the HTTP check-in's task) carry.
// The beacon and internal/demo/c2 both speak through it, so the two sides
// cannot drift apart; internal/decode/botproto, written from the
// protocols' public descriptions, is the independent check that these are
// the bytes its recognisers decode.
//
// Nothing here touches the network. The decoders read bytes from a peer
// that may be hostile (the beacon's C2 is whatever answers): every length
// is checked against the bytes there are, and nothing is allocated by a
// size the peer sent.
package botwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// The protocols of -c2-proto.
const (
	HTTP   = "http"
	Mirai  = "mirai"
	Gafgyt = "gafgyt"
	IRC    = "irc"
)

// Protocols lists them, the default first.
var Protocols = []string{HTTP, Mirai, Gafgyt, IRC}

// Known reports whether proto is one of Protocols.
func Known(proto string) bool {
	for _, p := range Protocols {
		if p == proto {
			return true
		}
	}
	return false
}

// MaxID bounds the bot's identifier as the binary and IRC registrations
// carry it (Mirai's one-byte length, and a short IRC nick).
const MaxID = 32

// ValidID reports whether id can be announced: 1 to MaxID printable
// ASCII bytes without spaces.
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > MaxID {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] >= 0x7f {
			return false
		}
	}
	return true
}

// Vectors are Mirai's attack vectors by number, named as its operators'
// console names them; the text protocols name an order's vector with the
// same words. The beacon carries out only udp and udpplain.
var Vectors = []string{"udp", "vse", "dns", "syn", "ack", "stomp", "greip", "greeth", "proxy", "udpplain", "http"}

func vectorNumber(name string) (int, bool) {
	for i, v := range Vectors {
		if v == name {
			return i, true
		}
	}
	return 0, false
}

// Order is an attack order: VECTOR TARGET PORT SECONDS, the form of
// c2server's -order and of the HTTP task.
type Order struct {
	Vector  string // one of Vectors
	Target  netip.Addr
	Port    uint16
	Seconds uint32
}

// ParseOrder reads "VECTOR TARGET PORT SECONDS". It checks the form only:
// where an order may be carried out is the beacon's policy.
func ParseOrder(s string) (Order, error) {
	f := strings.Fields(s)
	if len(f) != 4 {
		return Order{}, fmt.Errorf("order %q: want VECTOR TARGET PORT SECONDS", clip(s))
	}
	return orderFields(strings.ToLower(f[0]), f[1], f[2], f[3])
}

func orderFields(vector, target, port, seconds string) (Order, error) {
	if _, ok := vectorNumber(vector); !ok {
		return Order{}, fmt.Errorf("unknown vector %q", clip(vector))
	}
	a, err := netip.ParseAddr(target)
	if err != nil || !a.Is4() {
		return Order{}, fmt.Errorf("target %q is not an IPv4 address", clip(target))
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return Order{}, fmt.Errorf("port %q is not 1-65535", clip(port))
	}
	d, err := strconv.ParseUint(seconds, 10, 32)
	if err != nil || d == 0 {
		return Order{}, fmt.Errorf("duration %q is not a positive number of seconds", clip(seconds))
	}
	return Order{Vector: vector, Target: a, Port: uint16(p), Seconds: uint32(d)}, nil
}

func (o Order) String() string {
	return fmt.Sprintf("%s %s %d %d", o.Vector, o.Target, o.Port, o.Seconds)
}

// clip keeps a peer's text in an error short and printable.
func clip(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return strconv.Quote(s)
}

// Mirai's binary protocol.
var (
	// MiraiKeepAlive is the bot's keep-alive, which the C2 echoes.
	MiraiKeepAlive = []byte{0, 0}
	miraiVersion   = []byte{0, 0, 0, 1}
)

// MaxMiraiOrder bounds an order's length, its two length bytes included,
// as Mirai's bot bounds its read buffer.
const MaxMiraiOrder = 1024

// Mirai's option keys the beacon reads.
const (
	miraiOptLen   = 0
	miraiOptDport = 7
)

// miraiPayload is the payload size an order asks for (its len option):
// the beacon's fixed packet size.
const miraiPayload = "64"

// MiraiHello is what the bot sends on connecting: the version, then its
// ID with a one-byte length. id must be ValidID.
func MiraiHello(id string) []byte {
	return append(append(append([]byte{}, miraiVersion...), byte(len(id))), id...)
}

// ReadMiraiHello reads a hello from the start of b: the ID and the bytes
// it took, 0 when b does not yet hold all of it.
func ReadMiraiHello(b []byte) (id string, n int, err error) {
	if len(b) < 5 {
		return "", 0, nil
	}
	if b[0] != 0 || b[1] != 0 || b[2] != 0 || b[3] == 0 {
		return "", 0, errors.New("not a Mirai hello")
	}
	l := int(b[4])
	if l > MaxID {
		return "", 0, fmt.Errorf("Mirai ID of %d bytes", l)
	}
	if len(b) < 5+l {
		return "", 0, nil
	}
	id = string(b[5 : 5+l])
	if !ValidID(id) {
		return "", 0, errors.New("Mirai ID not printable")
	}
	return id, 5 + l, nil
}

// MiraiOrder encodes an order: its total length (uint16), the duration
// (uint32), the vector's number, one target (address, prefix length 32)
// and two options, the destination port and the payload size.
func MiraiOrder(o Order) []byte {
	vec, _ := vectorNumber(o.Vector)
	port := strconv.Itoa(int(o.Port))
	b := binary.BigEndian.AppendUint16(nil, 0)
	b = binary.BigEndian.AppendUint32(b, o.Seconds)
	b = append(b, byte(vec), 1)
	t := o.Target.As4()
	b = append(b, t[:]...)
	b = append(b, 32, 2)
	b = append(b, miraiOptDport, byte(len(port)))
	b = append(b, port...)
	b = append(b, miraiOptLen, byte(len(miraiPayload)))
	b = append(b, miraiPayload...)
	binary.BigEndian.PutUint16(b, uint16(len(b)))
	return b
}

// DecodeMiraiOrder reads an order's body (what follows its two length
// bytes). The parts must add up to the body exactly; the beacon takes one
// target, a single address, and needs a destination port; other options
// are skipped.
func DecodeMiraiOrder(body []byte) (Order, error) {
	if len(body) < 7 {
		return Order{}, errors.New("order too short")
	}
	o := Order{Seconds: binary.BigEndian.Uint32(body)}
	if int(body[4]) >= len(Vectors) {
		return Order{}, fmt.Errorf("unknown vector %d", body[4])
	}
	o.Vector = Vectors[body[4]]
	if n := body[5]; n != 1 {
		return Order{}, fmt.Errorf("%d targets, want 1", n)
	}
	p := body[6:]
	if len(p) < 6 {
		return Order{}, errors.New("order cut in its target")
	}
	if p[4] != 32 {
		return Order{}, fmt.Errorf("target prefix /%d, want /32", p[4])
	}
	o.Target = netip.AddrFrom4([4]byte(p[:4]))
	opts := int(p[5])
	p = p[6:]
	for i := 0; i < opts; i++ {
		if len(p) < 2 || len(p) < 2+int(p[1]) {
			return Order{}, errors.New("order cut in its options")
		}
		key, val := p[0], p[2:2+int(p[1])]
		p = p[2+int(p[1]):]
		if key == miraiOptDport {
			port, err := strconv.ParseUint(string(val), 10, 16)
			if err != nil || port == 0 {
				return Order{}, fmt.Errorf("port %s is not 1-65535", clip(string(val)))
			}
			o.Port = uint16(port)
		}
	}
	switch {
	case len(p) != 0:
		return Order{}, fmt.Errorf("%d bytes after the options", len(p))
	case o.Port == 0:
		return Order{}, errors.New("no destination port")
	case o.Seconds == 0:
		return Order{}, errors.New("no duration")
	}
	return o, nil
}

// The Gafgyt/Bashlite text channel: lines ending "\n".
const (
	GafgytBuild = "BUILD TALKBOX\n"
	GafgytPing  = "PING\n"
	GafgytPong  = "PONG\n"
	// GafgytOrderPrefix starts an order to every bot.
	GafgytOrderPrefix = "!* "
)

// GafgytOrder is an order line: Bashlite's "!* UDP ip port time netmask
// packetsize pollinterval".
func GafgytOrder(o Order) string {
	return fmt.Sprintf("!* %s %s %d %d 32 0 10\n", strings.ToUpper(o.Vector), o.Target, o.Port, o.Seconds)
}

// ParseGafgytOrder reads an order line (without its "\n"): the vector,
// target, port and duration; the fields after them are Bashlite's tuning,
// not read.
func ParseGafgytOrder(line string) (Order, error) {
	rest, ok := strings.CutPrefix(line, GafgytOrderPrefix)
	if !ok {
		return Order{}, errors.New("not an order")
	}
	f := strings.Fields(rest)
	if len(f) < 4 {
		return Order{}, fmt.Errorf("order %s: want VECTOR TARGET PORT SECONDS", clip(rest))
	}
	return orderFields(strings.ToLower(f[0]), f[1], f[2], f[3])
}

// IRC (RFC 1459): lines ending "\r\n", the C2 as server "c2.example",
// the bots in channel "#tb" with key "beacon".
const (
	IRCServer  = "c2.example"
	IRCChannel = "#tb"
	IRCKey     = "beacon"
	IRCJoin    = "JOIN " + IRCChannel + " " + IRCKey + "\r\n"
	IRCPing    = "PING :" + IRCServer + "\r\n"
	// MaxIRCLine is RFC 1459's bound on a line, "\r\n" included.
	MaxIRCLine = 512
)

// IRCRegister is the bot's registration. id must be ValidID.
func IRCRegister(id string) string {
	return "NICK " + id + "\r\nUSER " + id + " 0 * :talkbox\r\n"
}

// IRCWelcome is the server's answer to a registration.
func IRCWelcome(id string) string { return ":" + IRCServer + " 001 " + id + " :Welcome\r\n" }

// IRCOrder is an order to the channel, as its operator sends it.
func IRCOrder(o Order) string {
	return fmt.Sprintf(":op!op@%s PRIVMSG %s :!%s %s %d %d\r\n", IRCServer, IRCChannel, o.Vector, o.Target, o.Port, o.Seconds)
}

// IRCMessage is one IRC line split: the command (upper case) and its
// parameters, the trailing one (after " :") apart.
type IRCMessage struct {
	Command  string
	Params   []string
	Trailing string
}

// maxIRCParams bounds the middle parameters kept (RFC 1459 allows 14).
const maxIRCParams = 15

// ParseIRC splits a line (without "\r\n"), its prefix dropped.
func ParseIRC(line string) IRCMessage {
	if strings.HasPrefix(line, ":") {
		_, line, _ = strings.Cut(line, " ")
	}
	line, trailing, _ := strings.Cut(line, " :")
	f := strings.Fields(line)
	m := IRCMessage{Trailing: trailing}
	if len(f) > 0 {
		m.Command, f = strings.ToUpper(f[0]), f[1:]
	}
	m.Params = f[:min(len(f), maxIRCParams)]
	return m
}

// ParseIRCOrder reads an order from a message's text: "!VECTOR TARGET
// PORT SECONDS".
func ParseIRCOrder(text string) (Order, error) {
	rest, ok := strings.CutPrefix(text, "!")
	if !ok {
		return Order{}, errors.New("not an order")
	}
	return ParseOrder(rest)
}
