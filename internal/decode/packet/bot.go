package packet

import (
	"cmp"
	"hash/maphash"
	"slices"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/decode/botproto"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Bounds on the bot-channel recognisers: connections read at once (each
// holds two buffers of about 1 KiB), kept for reuse, and the HTTP
// resources followed for polling.
const (
	MaxBotConvs   = 1024
	maxPooledBots = 64
	maxPolls      = 4096
)

// botConv is a connection's recogniser with the next sequence number of
// each side, so that it reads the bytes in order.
type botConv struct {
	botproto.Conv
	next    [2]uint32
	started [2]bool
	ts      int64 // the connection's first bytes
	n       int64 // and their packet
}

// botSegment feeds a TCP segment's payload to the connection's recogniser,
// starting one on the connection's first bytes when they may open a
// channel (botproto.Sniff). Whether the connection's other parsers read
// it does not matter: a channel is recognised on any port.
func (d *Decoder) botSegment(f *flow, isOrig bool, seq uint32, data []byte, k *pkt) {
	dir := 0
	if !isOrig {
		dir = 1
	}
	c := f.bot
	if c == nil && f.resumeBot != botproto.None {
		// A channel carried from the previous capture reads on.
		if c = d.newBot(); c == nil {
			d.BotsRefused++
			f.botOff = true
			return
		}
		c.Resume(f.resumeBot, int(f.resumeBotDir))
		c.ts, c.n = k.ts, k.n
		f.bot = c
	}
	if c == nil {
		kind := botproto.KindNone
		if seq == f.ep[dir].start+1 && f.key.pa != 53 && f.key.pb != 53 {
			kind = botproto.Sniff(data)
		}
		if kind == botproto.KindNone {
			f.botOff = true
			return
		}
		if c = d.newBot(); c == nil {
			d.BotsRefused++
			f.botOff = true
			return
		}
		c.Reset(kind, dir)
		c.ts, c.n = k.ts, k.n
		f.bot = c
	}
	if !c.started[dir] {
		c.started[dir], c.next[dir] = true, f.ep[dir].start+1
	}
	switch off := int32(seq - c.next[dir]); {
	case off > 0:
		// Bytes missing: the recogniser resumes after them.
		c.Gap(dir)
	case off < 0:
		if int(-off) >= len(data) {
			return
		}
		data = data[-off:]
	}
	c.next[dir] = seq + uint32(len(data))
	d.botFlow, d.botTS, d.botN = f, k.ts, k.n
	c.Feed(dir, k.ts, data, d)
	if c.Failed() {
		d.releaseBot(f)
		f.botOff = true
	}
}

func (d *Decoder) newBot() *botConv {
	if d.bots >= MaxBotConvs {
		return nil
	}
	d.bots++
	if n := len(d.freeBots); n > 0 {
		c := d.freeBots[n-1]
		d.freeBots = d.freeBots[:n-1]
		return c
	}
	return new(botConv)
}

func (d *Decoder) releaseBot(f *flow) {
	if f.bot == nil {
		return
	}
	d.bots--
	if len(d.freeBots) < maxPooledBots {
		*f.bot = botConv{}
		d.freeBots = append(d.freeBots, f.bot)
	}
	f.bot = nil
}

// Command is botproto's Sink: an order the C2 side (dir) sent on the
// connection being fed becomes a c2-command observable.
func (d *Decoder) Command(dir int, c *botproto.Command) {
	f := d.botFlow
	v6 := f.key.v6
	c2, bot := f.origAddr(), f.respAddr()
	c2p := f.origPort()
	if dir == 1 {
		c2, bot, c2p = bot, c2, f.respPort()
	}
	d.command(c.Protocol.Family(), c.Protocol.String(), c, d.botTS, d.botN, d.uidOf(f), d.hostPort(c2, v6, c2p), d.addrString(bot, v6))
}

// command reports an order the C2 at server sent the bot at client, in
// the packet numbered n at ts on the connection uid, and keeps it for the
// attacks that may carry it out.
func (d *Decoder) command(family, protocol string, c *botproto.Command, ts, n int64, uid, server, client string) {
	o := d.cfg.Origin.OfConn(uid).New(records.ObsC2Command, family+" "+c.Text, tsTime(ts), n, 0)
	o.C2Command = &records.C2CommandInfo{Family: family, Protocol: protocol, Vector: c.Vector,
		Targets: c.Targets, Ports: c.Ports, Duration: c.Duration, Options: c.Options, Raw: c.Raw,
		Servers: []string{server}, Clients: []string{client}}
	d.orders.add(ts, n, o.Value, c)
	d.toSink(o)
}

// emitBot reports the channel a connection carried, if its recogniser
// recognised one, and frees the recogniser.
func (d *Decoder) emitBot(f *flow) {
	c := f.bot
	if c == nil {
		return
	}
	defer d.releaseBot(f)
	ch, ok := c.Channel()
	if !ok {
		return
	}
	v6 := f.key.v6
	c2, bot, c2p := f.respAddr(), f.origAddr(), f.respPort()
	if ch.BotDir == 1 {
		c2, bot, c2p = bot, c2, f.origPort()
	}
	server := d.hostPort(c2, v6, c2p)
	o := d.cfg.Origin.OfConn(d.uidOf(f)).New(records.ObsC2Channel, ch.Protocol.String()+" "+server, tsTime(c.ts), c.n, 0)
	o.LastSeen = tsTime(f.last)
	o.C2Channel = &records.C2ChannelInfo{Family: ch.Protocol.Family(), Protocol: ch.Protocol.String(), Server: server,
		Clients: []string{d.addrString(bot, v6)}, Identities: ch.Identities, Channels: ch.Channels, Reports: ch.Reports,
		KeepAlives: ch.KeepAlives, KeepAlivePeriod: round3(ch.Period), Commands: ch.Commands}
	d.toSink(o)
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// poll is one client's requests for one HTTP resource.
type poll struct {
	botproto.Poll
	request, server, client string
	n                       int64  // the first request's packet
	uid                     string // and its connection's
	orders                  []pollOrder
}

// pollRequest counts an HTTP request towards its resource's poll: the
// client, the server's endpoint, and the request ("METHOD url", the http
// observable's value) without its query, in which a bot's requests
// differ; uid is the request's connection. It returns the poll, nil when
// too many are followed.
func (d *Decoder) pollRequest(r *httpReq, request, server, client, uid string) *poll {
	request, _, _ = strings.Cut(request, "?")
	var h maphash.Hash
	h.SetSeed(d.seed)
	h.WriteString(client)
	h.WriteByte(0)
	h.WriteString(server)
	h.WriteByte(0)
	h.WriteString(request)
	key := h.Sum64()
	p := d.polls[key]
	if p == nil {
		if len(d.polls) >= maxPolls {
			return nil
		}
		p = &poll{request: request, server: server, client: client, n: r.n, uid: uid}
		d.polls[key] = p
	}
	p.Add(r.ts)
	return p
}

// emitPolls reports the resources polled regularly as HTTP channels, and
// the orders their answers carried; it runs at the end of the capture,
// when the requests are all counted, in the order of the polls' first
// packets.
func (d *Decoder) emitPolls() {
	regular := make([]*poll, 0, len(d.polls))
	for k, p := range d.polls {
		delete(d.polls, k)
		if p.Regular() {
			regular = append(regular, p)
		}
	}
	slices.SortFunc(regular, func(a, b *poll) int { return cmp.Compare(a.n, b.n) })
	for _, p := range regular {
		o := d.cfg.Origin.OfConn(p.uid).New(records.ObsC2Channel, "http "+p.request, tsTime(p.First), p.n, 0)
		o.LastSeen = tsTime(p.Last)
		o.Count = 1
		o.C2Channel = &records.C2ChannelInfo{Family: "http-poll", Protocol: "http", Server: p.server, Clients: []string{p.client},
			KeepAlives: p.N, KeepAlivePeriod: round3(p.Period()), Commands: int64(len(p.orders))}
		d.toSink(o)
		for i := range p.orders {
			po := &p.orders[i]
			d.command("http-poll", "http", &po.cmd, po.ts, po.n, po.uid, p.server, p.client)
		}
	}
	d.orders.pending = 0
}
