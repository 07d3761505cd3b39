// Package botproto recognises the command channels of the bot families
// that dominate IoT botnets in the bytes of one TCP connection, on any
// port: Mirai's binary protocol (the bot's hello and ID, the two-byte
// keep-alive, length-prefixed attack orders) and its scanner's credential
// report, Gafgyt/Bashlite/Qbot-style text lines (registration, PING/PONG,
// "!* " orders) and IRC (RFC 1459/2812: NICK, USER, JOIN, PING, PRIVMSG and
// topics). It also tells regular HTTP polling (Poll).
//
// The decoders are written from the protocols' public descriptions, not
// from any bot's source. Every byte they read is the sample's: a
// connection's state is two fixed buffers and a few bounded lists, no
// length a sample claims decides an allocation, and a line or message
// that does not fit is skipped.
package botproto

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"strconv"
	"strings"
)

// Protocol is a recognised channel's protocol.
type Protocol uint8

// Protocols recognised.
const (
	None Protocol = iota
	Mirai
	MiraiReport
	Gafgyt
	IRC
)

var protocolNames = [...]string{None: "", Mirai: "mirai", MiraiReport: "mirai-report", Gafgyt: "gafgyt", IRC: "irc"}

// Family guesses, from the protocol alone: an IRC channel is a bot's, of a
// family the protocol does not tell (Tsunami/Kaiten and many others).
var familyNames = [...]string{None: "", Mirai: "mirai", MiraiReport: "mirai", Gafgyt: "gafgyt", IRC: "irc-bot"}

func (p Protocol) String() string { return protocolNames[p] }

// ByName is the protocol a name (String) names, None for any other.
func ByName(name string) Protocol {
	for i, n := range protocolNames {
		if n == name && name != "" {
			return Protocol(i)
		}
	}
	return None
}

// Family is the bot family the protocol suggests.
func (p Protocol) Family() string { return familyNames[p] }

// Bounds on one connection's state. maxBuf holds a whole Mirai order (its
// bot refuses one longer than 1024 bytes, length included), a credential
// report (at most 519 bytes) or a text line; a longer line is skipped.
const (
	maxBuf       = 1024
	maxText      = 160 // bytes of a sample's string kept in a record
	maxList      = 8   // identities, channels, reports kept per connection
	maxIDLen     = 64  // a Mirai ID longer than this is not Mirai's
	maxCredLen   = 64  // nor a reported user name or password
	maxUndecided = 32  // text lines read before a connection is given up as no channel
	maxFields    = 16  // words of a text order split
)

// Kind is what the first bytes of a connection may start.
type Kind uint8

// Kinds a connection's first bytes may start.
const (
	KindNone   Kind = iota
	KindBinary      // Mirai's hello or its credential report
	KindText        // IRC or Gafgyt lines
)

// textOpenings are the first words of the text channels' openings, by
// either side: IRC's registration, a server's prefixed line or NOTICE,
// Gafgyt's registration, keep-alives and orders.
var textOpenings = []string{"NICK ", "USER ", "PASS ", "CAP ", ":", "NOTICE ", "PING", "PONG", "BUILD ", "!* "}

// Sniff tells what the first bytes one side sent on a connection may
// start. A few bytes (a segment split early) that could still become an
// opening count as one.
func Sniff(b []byte) Kind {
	if len(b) == 0 {
		return KindNone
	}
	if b[0] == 0 {
		// Mirai's hello (00 00 00 version) or a report (00, then an
		// address that does not start with 0.0.0).
		return KindBinary
	}
	for _, w := range textOpenings {
		n := min(len(b), len(w))
		if bytes.EqualFold(b[:n], []byte(w[:n])) {
			return KindText
		}
	}
	return KindNone
}

// Command is one order a C2 sent, decoded.
type Command struct {
	Protocol Protocol
	Vector   string
	Targets  []string
	Ports    []string
	Duration int64 // seconds
	Options  []string
	Raw      string // the text line, or a Mirai order's bytes in hex
	// Text is the order as the c2-command observable's value names it
	// (without the family).
	Text string
}

// Sink receives the orders a connection's C2 side sends, as they are
// decoded; dir is the side that sent it (0 the originator).
type Sink interface {
	Command(dir int, c *Command)
}

// keepAlive counts one side's keep-alive messages and spans their times.
type keepAlive struct {
	n           int64
	first, last int64
}

func (k *keepAlive) add(ts int64) {
	if k.n == 0 {
		k.first = ts
	}
	k.n++
	k.last = max(k.last, ts)
}

// Mirai stages of the bot's side.
const (
	stageHello = iota // awaiting 00 00 00 version, or a report's 00
	stageIDLen
	stageID
	stageKeepAlive // hello done: the bot only sends 00 00
	stageReport    // credential reports, one after another
)

type side struct {
	buf  [maxBuf]byte
	off  int
	n    int
	got  int64 // bytes fed
	skip bool  // skipping the rest of a line longer than the buffer
	dead bool  // the side's framing was lost: nothing more is read
	// Mirai: the bot side's stage and its ID's length.
	stage uint8
	idLen int
}

// Conv is one connection's recogniser state. The zero Conv is not ready:
// call Reset.
type Conv struct {
	kind   Kind
	proto  Protocol
	failed bool
	botDir int8 // the bot's side, -1 until the bytes say
	side   [2]side
	ka     [2]keepAlive

	nick, user, welcome bool
	gafgyt              bool
	lines               int

	identities, channels, reports []string
	commands                      int64
}

// Reset readies c for a connection whose first bytes, sent by side dir,
// are of kind k (Sniff).
func (c *Conv) Reset(k Kind, dir int) {
	*c = Conv{kind: k, botDir: -1}
	if k == KindBinary {
		c.botDir = int8(dir)
	}
}

// Decided is the protocol a connection was recognised as so far (None
// if not yet, or no more) and the bot's side, for a connection that goes
// on in the next capture of its stream (Resume).
func (c *Conv) Decided() (Protocol, int) {
	if c.failed || c.proto == MiraiReport {
		return None, 0
	}
	return c.proto, max(int(c.botDir), 0)
}

// Resume readies c for a connection recognised as p in the previous
// capture of its stream, read again from a message boundary: its
// identities were reported there; its keep-alives and orders here are
// this capture's.
func (c *Conv) Resume(p Protocol, botDir int) {
	*c = Conv{proto: p, botDir: int8(botDir), kind: KindText}
	if p == Mirai {
		c.kind = KindBinary
		c.side[botDir].stage = stageKeepAlive
	}
}

// Failed reports whether the connection turned out not to be a channel
// this package recognises: its state may be dropped.
func (c *Conv) Failed() bool { return c.failed }

// Swap exchanges the two sides, for a connection whose originator turned
// out to be the other side.
func (c *Conv) Swap() {
	c.side[0], c.side[1] = c.side[1], c.side[0]
	c.ka[0], c.ka[1] = c.ka[1], c.ka[0]
	if c.botDir >= 0 {
		c.botDir = 1 - c.botDir
	}
}

// Gap tells c that bytes of side dir were lost (a gap in the stream): a
// text side resumes at its next line, a binary side is read no more.
func (c *Conv) Gap(dir int) {
	s := &c.side[dir]
	s.off, s.n = 0, 0
	if c.kind == KindText {
		s.skip = true
		return
	}
	s.dead = true
	if c.proto == None {
		c.failed = true
	}
}

// Feed reads in-order bytes of side dir (0 the originator), seen at ts
// (Unix nanoseconds); decoded orders go to out.
func (c *Conv) Feed(dir int, ts int64, data []byte, out Sink) {
	s := &c.side[dir]
	s.got += int64(len(data))
	for len(data) > 0 && !c.failed && !s.dead {
		room := maxBuf - s.n
		if room == 0 {
			// A whole buffer without a complete message.
			if c.kind == KindText {
				s.off, s.n, s.skip = 0, 0, true
				continue
			}
			c.Gap(dir)
			return
		}
		n := copy(s.buf[s.n:], data[:min(len(data), room)])
		s.n += n
		data = data[n:]
		c.parse(dir, ts, out)
	}
}

func (c *Conv) parse(dir int, ts int64, out Sink) {
	was := c.proto
	if c.kind == KindText {
		c.textLines(dir, ts, out)
	} else {
		c.binary(dir, ts, out)
	}
	if was == None && c.proto == Mirai {
		// The C2's side may have spoken before the hello was complete.
		c.binary(1-dir, ts, out)
		c.side[1-dir].compact()
	}
	c.side[dir].compact()
}

// The bytes of a side's buffer not yet read are buf[off:n]: reading one
// moves off, and the buffer is compacted once a feed is read, so that a
// flood of small messages costs a copy per feed, not per message.
func (s *side) unread() []byte { return s.buf[s.off:s.n] }
func (s *side) len() int       { return s.n - s.off }
func (s *side) at(i int) byte  { return s.buf[s.off+i] }
func (s *side) consume(n int)  { s.off += n }

func (s *side) compact() {
	if s.off > 0 {
		s.n = copy(s.buf[:], s.buf[s.off:s.n])
		s.off = 0
	}
}

// lost gives up reading a side of a Mirai connection whose bytes stopped
// following the protocol: the whole connection, unless a keep-alive or an
// order already showed it to be Mirai's.
func (c *Conv) lost(dir int) {
	if c.ka[0].n+c.ka[1].n == 0 && c.commands == 0 {
		c.failed = true
		return
	}
	c.side[dir].dead = true
}

// binary reads Mirai's messages of one side.
func (c *Conv) binary(dir int, ts int64, out Sink) {
	s := &c.side[dir]
	if int(c.botDir) != dir {
		// The C2's side: orders and keep-alives, read once the bot's
		// hello made the connection Mirai's.
		for c.proto == Mirai && !s.dead && s.len() >= 2 {
			l := int(binary.BigEndian.Uint16(s.unread()[:2]))
			if l == 0 {
				c.ka[dir].add(ts)
				s.consume(2)
				continue
			}
			if l < 2 || l > maxBuf {
				c.lost(dir) // not a length Mirai's bot accepts
				return
			}
			if s.len() < l {
				return
			}
			if cmd, ok := miraiOrder(s.unread()[:l]); ok {
				c.commands++
				out.Command(dir, &cmd)
			}
			s.consume(l)
		}
		return
	}
	for !c.failed && !s.dead {
		switch s.stage {
		case stageHello:
			if s.len() < 4 {
				if s.len() > 0 && s.at(0) != 0 {
					c.failed = true
				}
				return
			}
			switch {
			case s.at(1) == 0 && s.at(2) == 0 && s.at(3) != 0:
				s.stage = stageIDLen
				s.consume(4)
			case s.at(1) == 0 && s.at(2) == 0:
				c.failed = true
			default:
				s.stage = stageReport
			}
		case stageIDLen:
			if s.len() < 1 {
				return
			}
			s.idLen = int(s.at(0))
			if s.idLen > maxIDLen {
				c.failed = true
				return
			}
			s.stage = stageID
			s.consume(1)
		case stageID:
			if s.len() < s.idLen {
				return
			}
			id := s.unread()[:s.idLen]
			if !graphic(id) {
				c.failed = true
				return
			}
			if len(id) > 0 {
				c.identities = addClipped(c.identities, id)
			}
			c.proto = Mirai
			s.stage = stageKeepAlive
			s.consume(s.idLen)
		case stageKeepAlive:
			if s.len() < 2 {
				return
			}
			if s.at(0) != 0 || s.at(1) != 0 {
				c.lost(dir) // the bot said something else
				return
			}
			c.ka[dir].add(ts)
			s.consume(2)
		case stageReport:
			n, report, ok := miraiReport(s.unread())
			if !ok {
				if c.proto == None {
					c.failed = true
				} else {
					s.dead = true
				}
				return
			}
			if n == 0 {
				return
			}
			c.proto = MiraiReport
			c.reports = addText(c.reports, report)
			s.consume(n)
		}
	}
}

// miraiReport reads a Mirai scanner's report of a login that worked: a
// zero byte, the IPv4 address and port found, then the user and password
// each with a one-byte length. It returns the bytes it took (0 when the
// report is incomplete) and the report as "addr:port user:password".
func miraiReport(b []byte) (int, string, bool) {
	if len(b) < 9 {
		return 0, "", len(b) == 0 || b[0] == 0
	}
	if b[0] != 0 || b[1] == 0 && b[2] == 0 && b[3] == 0 {
		return 0, "", false
	}
	ulen := int(b[7])
	if ulen == 0 || ulen > maxCredLen || b[5] == 0 && b[6] == 0 {
		return 0, "", false
	}
	if len(b) < 9+ulen {
		return 0, "", true
	}
	plen := int(b[8+ulen])
	if plen > maxCredLen {
		return 0, "", false
	}
	end := 9 + ulen + plen
	if len(b) < end {
		return 0, "", true
	}
	user, pass := b[8:8+ulen], b[9+ulen:end]
	if !graphic(user) || !graphic(pass) {
		return 0, "", false
	}
	ap := netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[1:5])), binary.BigEndian.Uint16(b[5:7]))
	return end, ap.String() + " " + string(user) + ":" + string(pass), true
}

// Mirai's attack vectors and order options, by number, named as its
// operators' console and the published analyses name them.
var miraiVectors = [...]string{"udp", "vse", "dns", "syn", "ack", "stomp", "greip", "greeth", "proxy", "udpplain", "http"}

var miraiOptions = [...]string{"len", "rand", "tos", "ident", "ttl", "df", "sport", "dport", "domain", "dhid", "tcpcc",
	"urg", "ack", "psh", "rst", "syn", "fin", "seqnum", "acknum", "gcip", "method", "postdata", "path", "ssl", "conns",
	"source"}

const (
	optSport  = 6
	optDport  = 7
	optDomain = 8
)

// miraiOrder decodes one attack order, its two-byte length included:
// duration (4 bytes), vector, targets (address and prefix length each),
// options (key, length, value each). An order whose parts do not add up to
// its length exactly is not one.
func miraiOrder(b []byte) (Command, bool) {
	c := Command{Protocol: Mirai, Raw: hex.EncodeToString(b)}
	p := b[2:]
	if len(p) < 7 {
		return c, false
	}
	dur := binary.BigEndian.Uint32(p)
	c.Duration = int64(dur)
	vec := p[4]
	c.Vector = "vector" + strconv.Itoa(int(vec))
	if int(vec) < len(miraiVectors) {
		c.Vector = miraiVectors[vec]
	}
	nt := int(p[5])
	p = p[6:]
	if nt == 0 || len(p) < nt*5+1 {
		return c, false
	}
	for i := 0; i < nt; i++ {
		bits := int(p[4])
		if bits > 32 {
			return c, false
		}
		if len(c.Targets) < maxList {
			c.Targets = append(c.Targets, netip.PrefixFrom(netip.AddrFrom4([4]byte(p[:4])), bits).String())
		}
		p = p[5:]
	}
	no := int(p[0])
	p = p[1:]
	for i := 0; i < no; i++ {
		if len(p) < 2 || len(p) < 2+int(p[1]) {
			return c, false
		}
		key, val := p[0], p[2:2+int(p[1])]
		p = p[2+int(p[1]):]
		name := "opt" + strconv.Itoa(int(key))
		if int(key) < len(miraiOptions) {
			name = miraiOptions[key]
		}
		v := printable(val)
		switch key {
		case optDport, optSport:
			if key == optDport && len(c.Ports) < maxList {
				c.Ports = append(c.Ports, v)
			}
		case optDomain:
			if len(c.Targets) < maxList {
				c.Targets = append(c.Targets, v)
			}
		}
		if len(c.Options) < maxFields {
			c.Options = append(c.Options, name+"="+v)
		}
	}
	if len(p) != 0 {
		return c, false
	}
	var t strings.Builder
	t.WriteString(c.Vector)
	t.WriteByte(' ')
	t.WriteString(strings.Join(c.Targets, ","))
	t.WriteByte(' ')
	t.WriteString(strconv.FormatUint(uint64(dur), 10))
	t.WriteByte('s')
	for _, o := range c.Options {
		t.WriteByte(' ')
		t.WriteString(o)
	}
	c.Text = t.String()
	return c, true
}

// textLines reads the complete lines of one side of a text channel.
func (c *Conv) textLines(dir int, ts int64, out Sink) {
	s := &c.side[dir]
	for !c.failed {
		i := bytes.IndexByte(s.unread(), '\n')
		if i < 0 {
			return
		}
		line := bytes.TrimRight(s.unread()[:i], "\r")
		if s.skip {
			s.skip = false
		} else {
			c.line(dir, ts, line, out)
		}
		s.consume(i + 1)
	}
}

// line reads one line of IRC or of a Gafgyt-style channel.
func (c *Conv) line(dir int, ts int64, line []byte, out Sink) {
	if c.proto == None {
		if c.lines++; c.lines > maxUndecided {
			c.failed = true
			return
		}
	}
	if bytes.HasPrefix(line, []byte("!* ")) {
		// A Gafgyt order; IRC carries orders inside PRIVMSG, never so.
		c.gafgyt = true
		c.setBot(1 - dir)
		c.decide()
		c.commands++
		cmd := textOrder(Gafgyt, line, line[3:])
		out.Command(dir, &cmd)
		return
	}
	rest := line
	if len(rest) > 0 && rest[0] == ':' {
		// An IRC prefix: the server, or the sender of a message.
		_, rest, _ = bytes.Cut(rest, []byte(" "))
	}
	verb, params, _ := bytes.Cut(rest, []byte(" "))
	switch {
	case bytes.EqualFold(verb, []byte("NICK")):
		if !c.nick {
			c.identities = addClipped(c.identities, line)
		}
		c.nick = true
		c.setBot(dir)
	case bytes.EqualFold(verb, []byte("USER")):
		if !c.user {
			c.identities = addClipped(c.identities, line)
		}
		c.user = true
		c.setBot(dir)
	case bytes.EqualFold(verb, []byte("JOIN")):
		if int(c.botDir) == dir {
			c.channels = addClipped(c.channels, bytes.TrimSpace(params))
		}
	case bytes.Equal(verb, []byte("001")):
		c.welcome = true
		c.setBot(1 - dir)
	case bytes.EqualFold(verb, []byte("PING")):
		if len(bytes.TrimSpace(params)) == 0 && line[0] != ':' {
			// A bare PING is Gafgyt's keep-alive; IRC's carries a token.
			c.gafgyt = true
			c.setBot(1 - dir)
		}
		c.ka[dir].add(ts)
	case bytes.EqualFold(verb, []byte("BUILD")):
		c.gafgyt = true
		c.identities = addClipped(c.identities, line)
		c.setBot(dir)
	case c.proto == IRC && int(c.botDir) != dir &&
		(bytes.EqualFold(verb, []byte("PRIVMSG")) || bytes.EqualFold(verb, []byte("TOPIC")) || bytes.Equal(verb, []byte("332"))):
		// An order to the bot: a message to it or its channel, or the
		// channel's topic, which Tsunami-style bots obey on joining.
		if _, text, ok := bytes.Cut(params, []byte(" :")); ok && len(text) > 0 {
			c.commands++
			cmd := textOrder(IRC, text, text)
			out.Command(dir, &cmd)
		}
	}
	c.decide()
}

func (c *Conv) setBot(dir int) {
	if c.botDir < 0 {
		c.botDir = int8(dir)
	}
}

// decide names the protocol once the evidence is enough: an IRC
// registration (NICK and USER, or a server's welcome), or Gafgyt's
// registration, bare PING or order. IRC is decided first: it may carry
// anything.
func (c *Conv) decide() {
	switch {
	case c.proto != None:
	case c.nick && c.user || c.welcome:
		c.proto = IRC
	case c.gafgyt:
		c.proto = Gafgyt
	}
}

// textOrder splits a text order: its first word is the vector; an address
// or name after it is the target, then the port and duration when they
// are numbers, as Gafgyt's "!* UDP addr port time …" has them; the rest
// are options as sent.
func textOrder(p Protocol, line, order []byte) Command {
	text := printable(line)
	c := Command{Protocol: p, Raw: text, Text: text}
	f := strings.Fields(printable(order))
	if len(f) == 0 {
		return c
	}
	f = f[:min(len(f), maxFields)]
	c.Vector, f = f[0], f[1:]
	if len(f) > 0 && isTarget(f[0]) {
		c.Targets, f = []string{f[0]}, f[1:]
		if len(f) > 0 && isPort(f[0]) {
			c.Ports, f = []string{f[0]}, f[1:]
			if len(f) > 0 {
				if d, err := strconv.ParseUint(f[0], 10, 31); err == nil {
					c.Duration, f = int64(d), f[1:]
				}
			}
		}
	}
	if len(f) > 0 {
		c.Options = f
	}
	return c
}

func isTarget(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	if _, err := netip.ParsePrefix(s); err == nil {
		return true
	}
	if strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") {
		return true
	}
	return strings.Contains(s, ".") && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-')
	}) < 0
}

func isPort(s string) bool {
	_, err := strconv.ParseUint(s, 10, 16)
	return err == nil
}

// Channel is what a connection showed of a command channel.
type Channel struct {
	Protocol Protocol
	// BotDir is the bot's side (0 the originator), -1 when the bytes did
	// not tell: the C2 is the other side.
	BotDir     int
	Identities []string
	Channels   []string
	Reports    []string
	KeepAlives int64
	Period     float64 // mean keep-alive interval, seconds
	Commands   int64
}

// Channel reports the command channel the connection carried, if it was
// recognised.
func (c *Conv) Channel() (Channel, bool) {
	c.decide()
	if c.proto == None || c.failed {
		return Channel{}, false
	}
	if c.proto == MiraiReport {
		// A report connection carries reports and nothing else: the
		// reporter's bytes all read as reports, the server silent.
		bot := &c.side[c.botDir]
		if bot.len() != 0 || bot.dead || c.side[1-c.botDir].got != 0 {
			return Channel{}, false
		}
	}
	ka := c.ka[0]
	if c.ka[1].n > ka.n {
		ka = c.ka[1]
	}
	ch := Channel{Protocol: c.proto, BotDir: int(c.botDir), Identities: c.identities, Channels: c.channels,
		Reports: c.reports, KeepAlives: ka.n, Commands: c.commands}
	if ka.n > 1 {
		ch.Period = float64(ka.last-ka.first) / float64(ka.n-1) / 1e9
	}
	return ch, true
}

// graphic reports whether b is printable ASCII without spaces, as bot IDs,
// user names and passwords are.
func graphic(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// printable is b as text, at most maxText bytes of it, with bytes outside
// printable ASCII as \xNN.
func printable(b []byte) string {
	var s strings.Builder
	for _, c := range b {
		if s.Len() >= maxText {
			s.WriteString("…")
			break
		}
		if c >= ' ' && c < 0x7f {
			s.WriteByte(c)
			continue
		}
		s.WriteString(`\x`)
		s.WriteByte("0123456789abcdef"[c>>4])
		s.WriteByte("0123456789abcdef"[c&15])
	}
	return s.String()
}

func addClipped(list []string, b []byte) []string { return addText(list, printable(b)) }

func addText(list []string, s string) []string {
	if len(list) >= maxList {
		return list
	}
	for _, v := range list {
		if v == s {
			return list
		}
	}
	return append(list, s)
}

// Poll follows the requests of one client to one HTTP resource (the query
// left out) to tell a bot's polling: at least MinPolls turns, at least a
// second apart, no gap more than twice the shortest. Requests less than a
// second after the last turn's first are that turn's (a bot reporting its
// task on the check-in's connection, a retry), not turns of their own.
type Poll struct {
	N              int64
	First, Last    int64 // Unix nanoseconds
	MinGap, MaxGap int64
}

// MinPolls is how many turns make a poll; sameTurn is how soon after a
// turn's first request another is part of it.
const (
	MinPolls = 4
	sameTurn = 1e9
)

// Add counts a request at ts; requests out of time order make the poll
// irregular.
func (p *Poll) Add(ts int64) {
	if p.N == 0 {
		p.First, p.Last, p.N = ts, ts, 1
		return
	}
	if ts >= p.Last && ts-p.Last < sameTurn {
		return
	}
	g := max(ts-p.Last, 0)
	if p.N == 1 || g < p.MinGap {
		p.MinGap = g
	}
	p.MaxGap = max(p.MaxGap, g)
	p.Last = max(p.Last, ts)
	p.N++
}

// Regular reports whether the requests are a poll.
func (p *Poll) Regular() bool {
	return p.N >= MinPolls && p.MinGap >= sameTurn && p.MaxGap <= 2*p.MinGap
}

// Period is the mean interval between the requests, in seconds.
func (p *Poll) Period() float64 {
	if p.N < 2 {
		return 0
	}
	return float64(p.Last-p.First) / float64(p.N-1) / 1e9
}
