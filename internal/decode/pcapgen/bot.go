package pcapgen

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"time"
)

// Bot command channels, written from the protocols' public descriptions
// for the recognisers' tests and the benchmark.

// MiraiHello is a Mirai bot's opening: 00 00 00 01, then its ID with a
// one-byte length.
func MiraiHello(id string) []byte {
	return append([]byte{0, 0, 0, 1, byte(len(id))}, id...)
}

// MiraiKeepAlive is the two zero bytes either side sends about every 60 s.
func MiraiKeepAlive() []byte { return []byte{0, 0} }

// MiraiOption is one option of an attack order: key and value.
type MiraiOption struct {
	Key   byte
	Value string
}

// MiraiOrder is an attack order: a two-byte length (itself included), the
// duration in seconds, the vector, the targets (address, prefix length)
// and the options (key, length, value).
func MiraiOrder(duration uint32, vector byte, targets []netip.Prefix, opts []MiraiOption) []byte {
	b := binary.BigEndian.AppendUint32([]byte{0, 0}, duration)
	b = append(b, vector, byte(len(targets)))
	for _, t := range targets {
		a := t.Addr().As4()
		b = append(append(b, a[:]...), byte(t.Bits()))
	}
	b = append(b, byte(len(opts)))
	for _, o := range opts {
		b = append(append(b, o.Key, byte(len(o.Value))), o.Value...)
	}
	binary.BigEndian.PutUint16(b, uint16(len(b)))
	return b
}

// MiraiReport is a Mirai scanner's report of a login that worked: a zero
// byte, the address and port, the user and password each with a one-byte
// length.
func MiraiReport(victim netip.AddrPort, user, pass string) []byte {
	a := victim.Addr().As4()
	b := append([]byte{0}, a[:]...)
	b = binary.BigEndian.AppendUint16(b, victim.Port())
	b = append(append(b, byte(len(user))), user...)
	return append(append(b, byte(len(pass))), pass...)
}

// Wait advances the capture's clock.
func (c *Conn) Wait(d time.Duration) { c.g.T = c.g.T.Add(d) }

// MiraiSession writes a Mirai bot's session with its C2: the hello and
// ID, keepAlives keep-alives each way 60 s apart, then the order the C2
// sends, and a close. mss splits the bot's and the C2's bytes into
// segments of that size.
func (g *Gen) MiraiSession(bot, c2 netip.AddrPort, id string, keepAlives int, order []byte, mss int) {
	c := g.Dial(bot, c2, 1000, 5000)
	c.MSS = mss
	// The bot writes its hello, ID length and ID separately.
	h := MiraiHello(id)
	c.Send(h[:4])
	c.Send(h[4:5])
	c.Send(h[5:])
	for i := 0; i < keepAlives; i++ {
		c.Wait(60 * time.Second)
		c.Send(MiraiKeepAlive())
		c.Reply(MiraiKeepAlive())
	}
	if order != nil {
		c.Wait(5 * time.Second)
		c.Reply(order)
	}
	c.Close()
}

// GafgytSession writes a Gafgyt-style session: the bot's registration,
// the C2's PING answered PONG pings times 60 s apart, then the orders,
// one line each, and a close.
func (g *Gen) GafgytSession(bot, c2 netip.AddrPort, build string, pings int, orders []string, mss int) {
	c := g.Dial(bot, c2, 2000, 6000)
	c.MSS = mss
	c.Send([]byte("BUILD " + build + "\n"))
	for i := 0; i < pings; i++ {
		c.Wait(60 * time.Second)
		c.Reply([]byte("PING\n"))
		c.Send([]byte("PONG\n"))
	}
	for _, o := range orders {
		c.Wait(time.Second)
		c.Reply([]byte(o + "\n"))
	}
	c.Close()
}

// IRCSession writes an IRC bot's session: NICK and USER, the server's
// welcome, JOIN with a key, pings server PINGs answered PONG 90 s apart,
// then the channel messages the controller sends, and a close.
func (g *Gen) IRCSession(bot, c2 netip.AddrPort, nick, channel, key string, pings int, orders []string, mss int) {
	c := g.Dial(bot, c2, 3000, 7000)
	c.MSS = mss
	c.Send([]byte("NICK " + nick + "\r\nUSER " + nick + " localhost localhost :" + nick + "\r\n"))
	c.Reply([]byte(":irc.example 001 " + nick + " :Welcome\r\n"))
	c.Send([]byte("JOIN " + channel + " " + key + "\r\n"))
	c.Reply([]byte(":" + nick + "!" + nick + "@lab JOIN :" + channel + "\r\n"))
	for i := 0; i < pings; i++ {
		c.Wait(90 * time.Second)
		c.Reply([]byte("PING :irc.example\r\n"))
		c.Send([]byte("PONG :irc.example\r\n"))
	}
	for _, o := range orders {
		c.Wait(time.Second)
		c.Reply([]byte(":boss!boss@c2 PRIVMSG " + channel + " :" + o + "\r\n"))
	}
	c.Close()
}

// HTTPPolls writes n requests for host's uri, each on its own connection
// from a new client port, every interval, with a query that changes.
func (g *Gen) HTTPPolls(bot netip.Addr, c2 netip.AddrPort, host, uri string, n int, interval time.Duration) {
	for i := 0; i < n; i++ {
		c := g.Dial(netip.AddrPortFrom(bot, uint16(41000+i)), c2, uint32(100*i), 9000)
		c.Send(HTTPGet(host, uri+"?seq="+strconv.Itoa(i), "Mozilla/5.0"))
		c.Reply(HTTPResponse(200, "OK", []byte("idle")))
		c.Close()
		g.T = g.T.Add(interval)
	}
}
