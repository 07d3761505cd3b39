package packet

import (
	"bytes"

	"github.com/talkbox-sandbox/talkbox/internal/decode/botproto"
	"github.com/talkbox-sandbox/talkbox/internal/decode/httpmsg"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
)

// What the originator's first payload on a connection was (flow.talk), so
// that the responder's first answer can be judged against it: a web server
// answers an HTTP request with a status line, a TLS server a ClientHello
// with a ServerHello, a bot's C2 its bot in the channel's own framing.
const (
	talkSilent    = iota // the originator has sent no payload yet
	talkOther            // a protocol not recognised here: any answer fits
	talkHTTP             // an HTTP request
	talkTLS              // a TLS handshake record
	talkBotText          // an IRC or Gafgyt opening (botproto.KindText)
	talkBotBinary        // Mirai's hello (botproto.KindBinary)
	talkQuery            // a DNS query: a resolver's answer is no conversation
)

// talkOf classifies the originator's first payload; it reads only the
// bytes of the segment at hand, as the other first-bytes tests do.
func talkOf(b []byte, dnsPort bool) uint8 {
	switch {
	case dnsPort:
		return talkQuery
	case len(b) >= 2 && b[0] == 22 && b[1] == 3:
		return talkTLS
	case httpmsg.LooksLikeRequest(b):
		return talkHTTP
	}
	switch botproto.Sniff(b) {
	case botproto.KindText:
		return talkBotText
	case botproto.KindBinary:
		return talkBotBinary
	}
	return talkOther
}

var httpVersion = []byte("HTTP/")

// answers reports whether the responder's first payload b is in the
// protocol talk names. A first segment shorter than what is tested counts
// when it is a prefix of it.
func answers(talk uint8, b []byte) bool {
	switch talk {
	case talkOther:
		return true
	case talkHTTP:
		n := min(len(b), len(httpVersion))
		return bytes.Equal(b[:n], httpVersion[:n])
	case talkTLS:
		// A handshake record whose first message is a ServerHello (type
		// 2): an alert or anything else is a refusal.
		return len(b) >= 2 && b[0] == 22 && b[1] == 3 && (len(b) < 6 || b[5] == 2)
	case talkBotText:
		return botproto.Sniff(b) == botproto.KindText
	case talkBotBinary:
		// An order starts with its 16-bit length, a keep-alive is 00 00.
		return b[0] == 0
	}
	return false
}

// converse follows the turns of a connection's payload, as new payload
// (never a retransmission) arrives from one side: the originator's first
// payload names its protocol; the responder's first payload after it is in
// that protocol or not; new payload of the originator after an answer in
// protocol, while the responder has not closed its side, makes the
// connection a conversation. Two bytes of state per connection; a server
// that speaks first (a greeting) is read from the originator's first
// payload after it.
func (f *flow) converse(isOrig bool, b []byte) {
	switch {
	case len(b) == 0:
	case isOrig && f.talk == talkSilent:
		f.talk = talkOf(b, f.key.proto == 17 && (isDNSPort(f.key.pa) || isDNSPort(f.key.pb)))
	case !isOrig && f.talk != talkSilent && f.exch == flowlog.ExchangeNone:
		f.exch = flowlog.ExchangeAnswered
		if answers(f.talk, b) {
			f.exch = flowlog.ExchangeProtocol
		}
	case isOrig && f.exch == flowlog.ExchangeProtocol && !f.ep[1].didClose:
		f.exch = flowlog.ExchangeConversed
	}
}

// exchange is the connection's Exchange level: its turns, or, for a
// command channel botproto recognised, an order its C2 side sent in the
// channel's framing (a bot acts on an order elsewhere, not necessarily on
// the same connection).
func (f *flow) exchange() uint8 {
	if f.exch == flowlog.ExchangeProtocol && f.bot != nil {
		if ch, ok := f.bot.Channel(); ok && ch.Commands > 0 {
			return flowlog.ExchangeConversed
		}
	}
	return f.exch
}
