package packet

import (
	"bytes"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// decodeCycle runs the decoder over a capture of one cycle, as tb-parse
// reads a cycle's capture.
func decodeCycle(t *testing.T, cycle string, build func(g *pcapgen.Gen)) *decodetest.Sink {
	t.Helper()
	origin := observe.Origin{Input: "test.pcap", Source: "pcap", Cycle: cycle}
	sink := decodetest.New(origin)
	rd, err := capfile.NewReader(bytes.NewReader(capture(t, pcapgen.Options{}, build)))
	if err != nil {
		t.Fatal(err)
	}
	d := New(Config{Origin: origin, Sink: sink})
	var p capfile.Packet
	for {
		if err := rd.Next(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		d.Packet(&p)
	}
	d.Finish()
	sink.Finish(t)
	return sink
}

// TestConversations: a connection's far side answers as the sample's C2
// would only when its first answer is in the protocol the sample spoke and
// the sample then sends new payload on the same connection while the far
// side holds it open (or a bot channel's C2 sends an order). A web server a
// sample aims at answers every request in HTTP, and that is all: not a
// conversation; a server answering HTTP with something else is not one
// either, however long it goes on; a retransmission is not new payload;
// the sample speaking after the far side closed is not a kept session.
func TestConversations(t *testing.T) {
	c2 := ap(server, 443)
	get := pcapgen.HTTPGet("www.example.org", "/", "Mozilla/5.0")
	hello := pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x1301}, SNI: "c2.example"})
	for _, tc := range []struct {
		name  string
		build func(g *pcapgen.Gen)
		want  uint8 // each connection's Exchange
	}{
		{"a web server answering each visit", func(g *pcapgen.Gen) {
			g.WebVisits(client, c2, "www.example.org", "/", 6, time.Minute)
		}, flowlog.ExchangeProtocol},
		{"an HTTP poll, the client closing", func(g *pcapgen.Gen) {
			g.HTTPPolls(client, c2, "www.example.org", "/gate", 6, time.Minute)
		}, flowlog.ExchangeProtocol},
		{"HTTP answered with garbage, the client going on", func(g *pcapgen.Gen) {
			c := g.Dial(ap(client, 40001), c2, 1, 2)
			c.Send(get)
			c.Reply([]byte("\x00\x01garbage\r\n"))
			c.Send(get)
			c.Close()
		}, flowlog.ExchangeAnswered},
		{"a ClientHello answered by an alert", func(g *pcapgen.Gen) {
			c := g.Dial(ap(client, 40001), c2, 1, 2)
			c.Send(hello)
			c.Reply(pcapgen.Record(21, []byte{2, 40}))
			c.Send(pcapgen.Record(23, []byte("more")))
			c.Close()
		}, flowlog.ExchangeAnswered},
		{"a request, its answer, the request retransmitted", func(g *pcapgen.Gen) {
			c := g.Dial(ap(client, 40001), c2, 1, 2)
			c.Send(get)
			c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("ok")))
			c.Retransmit(get)
			c.Close()
		}, flowlog.ExchangeProtocol},
		{"the client speaking after the server closed", func(g *pcapgen.Gen) {
			c := g.Dial(ap(client, 40001), c2, 1, 2)
			c.Send(get)
			c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("ok")))
			c.ServerFin()
			c.Send(get)
			c.Reset()
		}, flowlog.ExchangeProtocol},
		{"a request unanswered", func(g *pcapgen.Gen) {
			c := g.Dial(ap(client, 40001), c2, 1, 2)
			c.Send(get)
			c.Close()
		}, flowlog.ExchangeNone},
		{"two requests on a kept-alive connection", func(g *pcapgen.Gen) {
			c := g.Dial(ap(client, 40001), c2, 1, 2)
			c.Send(get)
			c.Reply(pcapgen.HTTPResponse(200, "OK", []byte(`{"task":"sleep"}`)))
			c.Send(get)
			c.Close()
		}, flowlog.ExchangeConversed},
		{"TLS: ClientHello, ServerHello, the client going on", func(g *pcapgen.Gen) {
			c := g.Dial(ap(client, 40001), c2, 1, 2)
			c.Send(hello)
			c.Reply(pcapgen.ServerHelloRecord(0x0303, 0x1301))
			c.Send(append(pcapgen.Record(20, []byte{1}), pcapgen.Record(23, []byte("finished"))...))
			c.Close()
		}, flowlog.ExchangeConversed},
		{"Mirai: hello, order, keep-alive", func(g *pcapgen.Gen) {
			c := g.Dial(ap(client, 40001), c2, 1, 2)
			c.Send(pcapgen.MiraiHello("telnet.x86"))
			c.Reply(miraiSYN())
			c.Send(pcapgen.MiraiKeepAlive())
			c.Close()
		}, flowlog.ExchangeConversed},
		{"Mirai: hello and an order, nothing after", func(g *pcapgen.Gen) {
			g.MiraiSession(ap(client, 40001), c2, "telnet.x86", 0, miraiSYN(), 1460)
		}, flowlog.ExchangeConversed},
		{"Mirai's hello answered by a web server", func(g *pcapgen.Gen) {
			c := g.Dial(ap(client, 40001), c2, 1, 2)
			c.Send(pcapgen.MiraiHello("telnet.x86"))
			c.Reply(pcapgen.HTTPResponse(400, "Bad Request", nil))
			c.Send(pcapgen.MiraiKeepAlive())
			c.Close()
		}, flowlog.ExchangeAnswered},
		{"Gafgyt: registration, PING, PONG", func(g *pcapgen.Gen) {
			g.GafgytSession(ap(client, 40001), c2, "x86", 2, nil, 1460)
		}, flowlog.ExchangeConversed},
		{"IRC: registration, welcome, JOIN", func(g *pcapgen.Gen) {
			g.IRCSession(ap(client, 40001), c2, "bot1", "#c2", "key", 0, nil, 1460)
		}, flowlog.ExchangeConversed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := decodeCycle(t, "cycle-1", tc.build)
			if len(s.Conns) == 0 {
				t.Fatal("no connection")
			}
			for _, c := range s.Conns {
				if c.Exchange != tc.want {
					t.Errorf("connection %s:%d: exchange %d, want %d", c.OrigH, c.OrigP, c.Exchange, tc.want)
				}
			}
			ep := s.Get(t, records.ObsEndpoint, c2.String()+"/tcp").Endpoint
			conversed := tc.want == flowlog.ExchangeConversed
			if slices.Equal(ep.ConfirmedIn, []string{"cycle-1"}) != conversed || (ep.Conversations > 0) != conversed ||
				slices.Equal(ep.SpokeIn, []string{"cycle-1"}) != (tc.want >= flowlog.ExchangeProtocol) ||
				slices.Equal(ep.AnsweredIn, []string{"cycle-1"}) != (tc.want >= flowlog.ExchangeAnswered) {
				t.Errorf("endpoint: answered in %v, spoke in %v, confirmed in %v, %d conversations", ep.AnsweredIn, ep.SpokeIn, ep.ConfirmedIn, ep.Conversations)
			}
		})
	}
}

// A server that greets first (SMTP, FTP) is judged from the client's
// first payload after the greeting.
func TestConversationAfterAGreeting(t *testing.T) {
	s := decodeCycle(t, "cycle-1", func(g *pcapgen.Gen) {
		c := g.Dial(ap(client, 40001), ap(server, 2525), 1, 2)
		c.Reply([]byte("220 mail.example ESMTP\r\n"))
		c.Send([]byte("EHLO bot\r\n"))
		c.Reply([]byte("250 mail.example\r\n"))
		c.Send([]byte("QUIT\r\n"))
		c.Close()
	})
	if c := s.Conns[0]; c.Exchange != flowlog.ExchangeConversed {
		t.Errorf("exchange %d", c.Exchange)
	}
}
