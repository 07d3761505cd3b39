package packet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"slices"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/decode/botproto"
	"github.com/talkbox-sandbox/talkbox/internal/decode/dns"
	"github.com/talkbox-sandbox/talkbox/internal/decode/httpmsg"
	"github.com/talkbox-sandbox/talkbox/internal/decode/tlsfp"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Stream-head bounds: how much of one TCP direction is buffered while a
// message is incomplete, how many directions may be buffering at once
// (MaxHeads × maxHead bytes in all), and how many buffers are kept for
// reuse.
const (
	maxHead      = 16 << 10
	MaxHeads     = 2048
	maxPooled    = 256
	maxHTTPQueue = 16
	maxDNSPerDir = 256
)

// half is the reassembly state of one TCP direction: in-order bytes only,
// enough for a request or a ClientHello split across segments. The fields
// are ordered so that the upgrade and chunk state fill what would be
// padding.
type half struct {
	buf      []byte
	ooo      []oooSeg
	oooBytes int
	skip     int64
	next     uint32
	tag      uint32 // the IMAP tag of an upgrade command (hashed)
	started  bool
	done     bool
	msgs     uint16 // DNS messages, or plaintext lines, read
	up       uint8  // where an upgrade to TLS stands (up*)
	kind     uint8  // the plaintext protocol (kind*)
	chunk    uint8  // the httpmsg chunk phase of a chunked body
}

// Upgrade phases of a direction (half.up). A flow whose plaintext start
// may upgrade to TLS is read as appTLS with both directions in upPlain;
// the originator's upgrade command moves it to upAsked and its peer to
// upWait; the answer moves them to upHello and upTLS, or back to upPlain.
const (
	upNone  = iota // read by f.app from the first byte
	upPlain        // plaintext lines of a protocol that may upgrade
	upAsked        // originator: upgrade asked; bytes wait for the answer
	upWait         // responder: awaiting the answer to the upgrade command
	upHello        // originator: upgraded; the ClientHello is near
	upTLS          // responder: upgraded; its ServerHello follows
)

// Plaintext protocols that upgrade to TLS (half.kind). A 220 greeting is
// SMTP's or FTP's: the command tells which (kindSMTP or kindFTP then name
// the answer awaited).
const (
	kindNone = iota
	kind220
	kindSMTP // STARTTLS, answered 220
	kindFTP  // AUTH TLS or AUTH SSL, answered 234
	kindPOP3 // STLS, answered +OK
	kindIMAP // tag STARTTLS, answered tag OK
	kindXMPP // <starttls/>, answered <proceed/>
	kindIRC  // STARTTLS, answered 670
)

// Bounds on reading a plaintext start: lines (XML elements for XMPP) read
// in each direction, and how far after an upgrade the ClientHello may
// start.
const (
	maxPlainLines  = 100
	maxHelloSearch = 1024
)

type httpReq struct {
	req    httpmsg.Request
	status int
	ts, n  int64
}

type tlsSeen struct {
	sni, ja3, ja4 string
	alpn          string
	client        uint16
	server        uint16
	ts, n         int64
}

// getBuf returns an empty head buffer, or nil when MaxHeads are in use.
func (d *Decoder) getBuf() []byte {
	if d.held >= MaxHeads {
		return nil
	}
	d.held++
	if n := len(d.bufs); n > 0 {
		b := d.bufs[n-1]
		d.bufs = d.bufs[:n-1]
		return b[:0]
	}
	return make([]byte, 0, maxHead)
}

// release frees what a direction holds: its head buffer and the segments
// waiting behind a gap.
func (d *Decoder) release(h *half) {
	d.releaseBuf(h)
	d.oooBytes -= h.oooBytes
	h.ooo, h.oooBytes = nil, 0
}

func (d *Decoder) releaseBuf(h *half) {
	if h.buf == nil {
		return
	}
	d.held--
	if len(d.bufs) < maxPooled {
		d.bufs = append(d.bufs, h.buf)
	}
	h.buf = nil
}

// stream places one segment of a direction: in order it goes to the
// application parser; ahead of a gap it waits (copied, bounded) for the
// missing bytes, so that a retransmission or a reordering within the head
// is reassembled as Zeek would.
func (d *Decoder) stream(f *flow, isOrig bool, seq uint32, data []byte, k *pkt) {
	dir := 0
	if !isOrig {
		dir = 1
	}
	h := &f.half[dir]
	if h.done {
		return
	}
	if !h.started {
		// The first byte follows the SYN (or the first packet of a
		// connection seen from the middle).
		h.started, h.next = true, f.ep[dir].start+1
	}
	if off := int64(int32(seq - h.next)); off > 0 {
		d.hold(h, off, data)
		return
	} else if off < 0 {
		if -off >= int64(len(data)) {
			return
		}
		data = data[-off:]
	}
	d.deliver(f, h, dir, data, k)
	for !h.done && len(h.ooo) > 0 {
		i := slices.IndexFunc(h.ooo, func(s oooSeg) bool { return int32(s.seq-h.next) <= 0 })
		if i < 0 {
			return
		}
		s := h.ooo[i]
		h.ooo = slices.Delete(h.ooo, i, i+1)
		h.oooBytes -= len(s.data)
		d.oooBytes -= len(s.data)
		if trim := int64(int32(h.next - s.seq)); trim < int64(len(s.data)) {
			d.deliver(f, h, dir, s.data[trim:], k)
		}
	}
}

// Bounds on segments held ahead of a gap.
const (
	maxOOOSegs  = 16
	MaxOOOBytes = 8 << 20 // over all connections
)

type oooSeg struct {
	seq  uint32
	data []byte
}

// hold keeps a copy of a segment that arrived off bytes ahead of the next
// expected one, or gives up on the direction when the bounds are reached.
func (d *Decoder) hold(h *half, off int64, data []byte) {
	if off >= maxHead || len(h.ooo) >= maxOOOSegs || h.oooBytes+len(data) > maxHead || d.oooBytes+len(data) > MaxOOOBytes {
		h.done = true // a gap that is not filled within the head
		d.release(h)
		return
	}
	h.ooo = append(h.ooo, oooSeg{seq: h.next + uint32(off), data: append([]byte(nil), data...)})
	h.oooBytes += len(data)
	d.oooBytes += len(data)
}

// deliver feeds in-order bytes to the flow's application parser.
func (d *Decoder) deliver(f *flow, h *half, dir int, data []byte, k *pkt) {
	h.next += uint32(len(data))
	if f.app == appUnknown {
		switch {
		case f.key.pa == 53 || f.key.pb == 53:
			f.app = appDNS
		case dir == 1:
			// The server spoke first: a greeting of a protocol that may
			// upgrade to TLS, or nothing read here.
			kind := serverGreeting(data)
			if kind == kindNone {
				h.done = true
				d.release(h)
				return
			}
			f.startPlain(kind)
		case len(data) >= 2 && data[0] == 22 && data[1] == 3:
			f.app = appTLS
		case httpmsg.LooksLikeRequest(data):
			f.app = appHTTP
		case clientOpening(data) != kindNone:
			f.startPlain(clientOpening(data))
		default:
			f.app = appNone
			h.done = true
			d.release(h)
			return
		}
	}
	if f.app == appNone {
		h.done = true
		d.release(h)
		return
	}
	if h.skip > 0 {
		n := min(h.skip, int64(len(data)))
		h.skip -= n
		data = data[n:]
		if len(data) == 0 {
			return
		}
	}
	buf, full := data, false
	if len(h.buf) > 0 {
		room := maxHead - len(h.buf)
		if len(data) >= room {
			data, full = data[:room], true
		}
		h.buf = append(h.buf, data...)
		buf = h.buf
	}
	var used int
	var more bool
	switch f.app {
	case appTLS:
		if h.up == upNone || h.up == upHello || h.up == upTLS {
			used, more = d.tlsData(f, h, dir, buf, full, k)
		} else {
			used, more = d.plainData(f, h, dir, buf, full, k)
		}
	case appHTTP:
		if h.up == upHello || h.up == upTLS {
			used, more = d.tlsData(f, h, dir, buf, full, k)
		} else {
			used, more = d.httpData(f, h, dir, buf, full, k)
		}
	case appDNS:
		used, more = d.dnsStream(f, h, buf, full, k)
	}
	rest := buf[used:]
	if !more || full || len(rest) >= maxHead {
		h.done = true
		d.release(h)
		return
	}
	if len(rest) == 0 {
		if h.buf != nil {
			d.releaseBuf(h)
		}
		return
	}
	if h.buf == nil {
		b := d.getBuf()
		if b == nil {
			d.HeadsRefused++
			h.done = true
			d.release(h)
			return
		}
		h.buf = append(b, rest...)
	} else {
		n := copy(h.buf, rest)
		h.buf = h.buf[:n]
	}
}

func (f *flow) pending() *pending {
	if f.pend == nil {
		f.pend = &pending{}
	}
	return f.pend
}

func (d *Decoder) tlsData(f *flow, h *half, dir int, b []byte, full bool, k *pkt) (int, bool) {
	if d.scratch == nil {
		d.scratch = make([]byte, 0, tlsfp.MaxHandshake+(1<<14))
	}
	if h.up == upHello {
		// After an upgrade the ClientHello starts within the first bytes,
		// not necessarily at the first (a CONNECT's head may precede it).
		i := tlsfp.FindClientHello(b[:min(len(b), maxHelloSearch)])
		if i < 0 {
			return 0, len(b) < maxHelloSearch && !full
		}
		h.up = upNone
		used, more := d.tlsData(f, h, dir, b[i:], full, k)
		return i + used, more
	}
	if dir == 0 {
		err := tlsfp.ParseClientHello(b, &d.ch, d.scratch)
		if errors.Is(err, tlsfp.ErrIncomplete) {
			return 0, !full
		}
		if err != nil {
			switch {
			case f.pend != nil && f.pend.tls != nil:
			case f.app == appHTTP:
				// A CONNECT tunnel that is not TLS: its requests stay.
				s := &f.half[1]
				s.done = true
				d.release(s)
			default:
				f.app = appNone
			}
			return 0, false
		}
		alpn := ""
		if len(d.ch.ALPN) > 0 {
			alpn = d.ch.ALPN[0]
		}
		client := d.ch.Version
		for _, v := range d.ch.SupportedVersions {
			if !tlsfp.IsGREASE(v) && v > client {
				client = v
			}
		}
		fp := d.fingerprint(&d.ch)
		f.pending().tls = &tlsSeen{sni: strings.ToLower(d.ch.ServerName), ja3: fp.ja3, ja4: fp.ja4, alpn: alpn,
			client: client, ts: k.ts, n: k.n}
		return len(b), false
	}
	if f.pend == nil || f.pend.tls == nil {
		return 0, false
	}
	err := tlsfp.ParseServerHello(b, &d.sh, d.scratch)
	if errors.Is(err, tlsfp.ErrIncomplete) {
		return 0, !full
	}
	if err == nil {
		f.pend.tls.server = d.sh.Version
	}
	return len(b), false
}

func (d *Decoder) httpData(f *flow, h *half, dir int, b []byte, full bool, k *pkt) (int, bool) {
	off := 0
	for off < len(b) {
		if h.up == upAsked {
			// A CONNECT awaits its answer: what follows is a tunnel or
			// the next request, read once the answer is known.
			return off, !f.half[1].done
		}
		if h.chunk != 0 {
			// A chunked body, read to its end so that the next message
			// on the connection is seen.
			n, data, err := httpmsg.ReadChunked(b[off:], &h.chunk, full)
			off += n
			if errors.Is(err, httpmsg.ErrIncomplete) {
				return off, true
			}
			if err != nil {
				return off, false
			}
			if int64(len(b)-off) < data {
				h.skip = data - int64(len(b)-off)
				return len(b), true
			}
			off += int(data)
			continue
		}
		// Empty lines between messages (after a body, say) are skipped,
		// not held while the connection idles.
		for off < len(b) && (b[off] == '\r' || b[off] == '\n') {
			off++
		}
		if off == len(b) {
			break
		}
		if dir == 0 {
			var r httpReq
			err := httpmsg.ParseRequest(b[off:], &r.req, full, &d.strs)
			if errors.Is(err, httpmsg.ErrIncomplete) {
				return off, true
			}
			if err != nil {
				return off, false
			}
			r.ts, r.n = k.ts, k.n
			p := f.pending()
			if len(p.reqs)-p.statusAt >= maxHTTPQueue {
				// Unanswered requests are reported without a status.
				d.emitHTTP(f, &p.reqs[p.statusAt])
				p.statusAt++
			}
			if p.statusAt > 0 {
				p.reqs = p.reqs[:copy(p.reqs, p.reqs[p.statusAt:])]
				p.statusAt = 0
			}
			p.reqs = append(p.reqs, r)
			off += r.req.HeadLen
			if strings.EqualFold(r.req.Method, "CONNECT") {
				h.up = upAsked
				continue
			}
			if r.req.Chunked {
				h.chunk = httpmsg.ChunkSize
				continue
			}
			body := r.req.BodyLen
			if int64(len(b)-off) >= body {
				off += int(body)
				continue
			}
			h.skip = body - int64(len(b)-off)
			return len(b), true
		}
		var resp httpmsg.Response
		err := httpmsg.ParseResponse(b[off:], &resp, full)
		if errors.Is(err, httpmsg.ErrIncomplete) {
			return off, true
		}
		if err != nil {
			return off, false
		}
		off += resp.HeadLen
		method := ""
		var polled *poll // the poll the request answered counts towards
		if p := f.pend; p != nil && p.statusAt < len(p.reqs) {
			r := &p.reqs[p.statusAt]
			method = r.req.Method
			if resp.Status >= 200 || resp.Status == 101 {
				r.status = resp.Status
				polled = d.emitHTTP(f, r)
				p.statusAt++
				if p.statusAt == len(p.reqs) {
					p.reqs, p.statusAt = p.reqs[:0], 0
				}
			}
		}
		if c := &f.half[0]; c.up == upAsked && resp.Status >= 200 && strings.EqualFold(method, "CONNECT") {
			if resp.Status < 300 {
				// The tunnel is open: TLS, if the client speaks it.
				h.up, c.up = upTLS, upHello
				d.reread(f, k)
				return off, true
			}
			c.up = upNone
			d.reread(f, k)
		}
		switch {
		case method == "HEAD" || resp.Status < 200 || resp.Status == 204 || resp.Status == 304:
			continue
		case resp.Chunked:
			h.chunk = httpmsg.ChunkSize
			continue
		case resp.BodyLen < 0:
			return off, false
		}
		if int64(len(b)-off) >= resp.BodyLen {
			if polled != nil && resp.BodyLen <= botproto.MaxOrderBody {
				// A short answer to what may be a bot's poll, whole
				// with its head: it may carry an order.
				d.pollAnswer(polled, b[off:off+int(resp.BodyLen)], k, d.uidOf(f))
			}
			off += int(resp.BodyLen)
			continue
		}
		h.skip = resp.BodyLen - int64(len(b)-off)
		return len(b), true
	}
	return off, true
}

// reread runs the originator's parser again over the bytes it holds, once
// the responder's answer to an upgrade decided how they are read.
func (d *Decoder) reread(f *flow, k *pkt) {
	if c := &f.half[0]; len(c.buf) > 0 && !c.done {
		d.deliver(f, c, 0, nil, k)
	}
}

// startPlain marks a flow as the plaintext start of a protocol that may
// upgrade to TLS.
func (f *flow) startPlain(kind uint8) {
	f.app = appTLS
	for i := range f.half {
		f.half[i].up, f.half[i].kind = upPlain, kind
	}
}

// plainData reads the plaintext start of a protocol that may upgrade to
// TLS, a line (an XML element for XMPP) at a time: the originator's
// upgrade command, then the responder's answer. Once the upgrade is
// accepted the responder's next bytes are its ServerHello, and the
// originator's ClientHello is searched for in what it sent after the
// command. Nothing said before an accepted upgrade is read as TLS.
func (d *Decoder) plainData(f *flow, h *half, dir int, b []byte, full bool, k *pkt) (int, bool) {
	off := 0
	for off < len(b) {
		switch h.up {
		case upAsked:
			return off, !f.half[1].done
		case upHello, upTLS:
			used, more := d.tlsData(f, h, dir, b[off:], full, k)
			return off + used, more
		}
		sep := byte('\n')
		if h.kind == kindXMPP {
			sep = '>'
		}
		end := bytes.IndexByte(b[off:], sep)
		if end < 0 {
			return off, true
		}
		line := b[off : off+end]
		off += end + 1
		if h.msgs++; h.msgs > maxPlainLines {
			return off, false
		}
		if dir == 0 {
			f.upgradeCommand(h, line)
		} else if h.up == upWait {
			switch upgradeAnswer(h.kind, h.tag, line) {
			case 1:
				h.up, f.half[0].up = upTLS, upHello
			case -1:
				h.up, f.half[0].up = upPlain, upPlain
			default:
				continue
			}
			d.reread(f, k)
		}
	}
	return off, true
}

// upgradeCommand reads one line of the originator: an upgrade command sets
// what the responder's answer must be.
func (f *flow) upgradeCommand(h *half, line []byte) {
	line = bytes.TrimSpace(line)
	kind, tag := uint8(kindNone), uint32(0)
	switch h.kind {
	case kind220:
		switch {
		case bytes.EqualFold(line, []byte("STARTTLS")):
			kind = kindSMTP
		case len(line) >= 8 && bytes.EqualFold(line[:5], []byte("AUTH ")) &&
			(bytes.EqualFold(line[5:8], []byte("TLS")) || bytes.EqualFold(line[5:8], []byte("SSL"))):
			kind = kindFTP
		}
	case kindPOP3:
		if bytes.EqualFold(line, []byte("STLS")) {
			kind = kindPOP3
		}
	case kindIRC:
		if bytes.EqualFold(line, []byte("STARTTLS")) {
			kind = kindIRC
		}
	case kindIMAP:
		if t, cmd, ok := bytes.Cut(line, []byte(" ")); ok && bytes.EqualFold(bytes.TrimSpace(cmd), []byte("STARTTLS")) {
			kind, tag = kindIMAP, tagHash(t)
		}
	case kindXMPP:
		if bytes.Contains(line, []byte("<starttls")) {
			kind = kindXMPP
		}
	}
	if kind == kindNone {
		return
	}
	h.up = upAsked
	s := &f.half[1]
	s.up, s.kind, s.tag = upWait, kind, tag
}

// upgradeAnswer reads a responder's line while an upgrade command awaits
// its answer: 1 accepted, -1 refused, 0 another line (a reply to an
// earlier pipelined command, an untagged or informational line).
func upgradeAnswer(kind uint8, tag uint32, line []byte) int {
	line = bytes.TrimSpace(line)
	switch kind {
	case kindSMTP, kindFTP:
		want := 220
		if kind == kindFTP {
			want = 234
		}
		switch c := replyCode(line); {
		case c == want:
			return 1
		case c >= 400:
			return -1
		}
	case kindPOP3:
		switch {
		case bytes.HasPrefix(line, []byte("+OK")):
			return 1
		case bytes.HasPrefix(line, []byte("-ERR")):
			return -1
		}
	case kindIMAP:
		t, rest, _ := bytes.Cut(line, []byte(" "))
		if tagHash(t) != tag {
			return 0
		}
		st, _, _ := bytes.Cut(bytes.TrimLeft(rest, " "), []byte(" "))
		switch {
		case bytes.EqualFold(st, []byte("OK")):
			return 1
		case bytes.EqualFold(st, []byte("NO")), bytes.EqualFold(st, []byte("BAD")):
			return -1
		}
	case kindXMPP:
		switch {
		case bytes.Contains(line, []byte("<proceed")):
			return 1
		case bytes.Contains(line, []byte("<failure")):
			return -1
		}
	case kindIRC:
		if len(line) > 0 && line[0] == ':' {
			_, line, _ = bytes.Cut(line, []byte(" "))
		}
		switch c := replyCode(line); {
		case c == 670:
			return 1
		case c == 691, c >= 400 && c < 600:
			return -1
		}
	}
	return 0
}

// replyCode is the three-digit code that starts a reply line (SMTP, FTP,
// an IRC numeric), -1 if none.
func replyCode(line []byte) int {
	if len(line) < 3 || len(line) > 3 && line[3] != ' ' && line[3] != '-' && line[3] != '\r' {
		return -1
	}
	c := 0
	for _, b := range line[:3] {
		if b < '0' || b > '9' {
			return -1
		}
		c = c*10 + int(b-'0')
	}
	return c
}

// tagHash is an IMAP tag's FNV-1a hash: the responder's direction keeps 4
// bytes of the upgrade command's tag rather than the tag.
func tagHash(t []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range t {
		h = (h ^ uint32(c)) * 16777619
	}
	return h
}

// serverGreeting tells a greeting of a protocol that may upgrade to TLS
// from the first bytes a server sends.
func serverGreeting(b []byte) uint8 {
	switch {
	case replyCode(b) == 220:
		return kind220
	case bytes.HasPrefix(b, []byte("+OK")):
		return kindPOP3
	case hasPrefixFold(b, "* OK") || hasPrefixFold(b, "* PREAUTH"):
		return kindIMAP
	case len(b) > 0 && b[0] == ':', hasPrefixFold(b, "NOTICE "):
		return kindIRC
	}
	return kindNone
}

// clientOpening tells the opening of a client-first protocol that may
// upgrade to TLS: an XMPP stream or an IRC registration.
func clientOpening(b []byte) uint8 {
	b = bytes.TrimLeft(b, " \t\r\n")
	if bytes.HasPrefix(b, []byte("<?xml")) || bytes.HasPrefix(b, []byte("<stream:stream")) {
		return kindXMPP
	}
	word := b
	if i := bytes.IndexAny(b, " \r\n"); i >= 0 {
		word = b[:i]
	} else if len(b) > 8 {
		return kindNone
	}
	for _, w := range []string{"CAP", "NICK", "USER", "PASS", "STARTTLS"} {
		if len(word) == len(w) && bytes.EqualFold(word, []byte(w)) {
			return kindIRC
		}
	}
	return kindNone
}

func hasPrefixFold(b []byte, p string) bool {
	return len(b) >= len(p) && bytes.EqualFold(b[:len(p)], []byte(p))
}

// dnsStream reads length-prefixed DNS messages (RFC 1035 4.2.2).
func (d *Decoder) dnsStream(f *flow, h *half, b []byte, full bool, k *pkt) (int, bool) {
	off := 0
	for off+2 <= len(b) {
		l := int(binary.BigEndian.Uint16(b[off:]))
		if l < 12 {
			return off, false
		}
		if off+2+l > len(b) {
			return off, !full
		}
		if h.msgs++; h.msgs > maxDNSPerDir {
			return off, false
		}
		d.dnsMessage(f, b[off+2:off+2+l], k, "tcp", h == &f.half[0])
		off += 2 + l
	}
	return off, true
}

// dnsMessage turns one DNS message into domain observables. Only a
// response to a query seen on the same flow (the originator's query, the
// same id, name and type, answered from the other side) links names to
// addresses: answers anywhere else (in a query, an unsolicited response, an
// announcement) are what a sample could forge to make an address look
// resolved, so they are counted as unsolicited and never taken as
// resolutions.
func (d *Decoder) dnsMessage(f *flow, b []byte, k *pkt, transport string, fromOrig bool) {
	m := &d.dnsMsg
	if err := dns.Parse(b, m); err != nil {
		d.BadDNS++
		return
	}
	d.BadDNSRecords += int64(m.Bad)
	f.dnsSeen = true
	count := int64(1)
	answered := false
	var q0 dnsQuery
	if len(m.Questions) > 0 {
		q0 = dnsQuery{id: m.ID, qtype: m.Questions[0].Type, name: nameHash(m.Questions[0].Name), open: true}
	}
	switch {
	case !m.Response && fromOrig && q0.open:
		d.floodQuery(observe.NormName(m.Questions[0].Name), f.respAddr(), f.key.v6, k.ipLen, k.ts, k.n, f.seq)
		f.dnsQ.set(int(f.dnsQ.n)%len(f.dnsQ.names), q0)
		f.dnsQ.n++
	case m.Response && !fromOrig && q0.open:
		for i := range f.dnsQ.len() {
			if f.dnsQ.at(i) == q0 {
				count, answered = 0, true
				f.dnsQ.open &^= 1 << i // answered once
				break
			}
		}
	}
	v6 := f.key.v6
	client := d.addrString(f.origAddr(), v6)
	resolver := d.addrString(f.respAddr(), v6)
	rcode := ""
	if m.Response {
		rcode = dns.RCodeName(m.RCode)
	}
	newDomain := func(name, qtype string) *records.Observable {
		o, di := d.cfg.Origin.OfConn(d.uidOf(f)).NewDomain(name, tsTime(k.ts), k.n, 0, qtype, rcode, transport, resolver, client)
		if m.Response {
			di.Responses = 1
		} else {
			di.Queries = 1
		}
		return o
	}
	netbios := transport == "udp" && f.respPort() == 137
	if len(m.Questions) > 0 {
		for i, q := range m.Questions {
			name, qtype := observe.NormName(q.Name), dns.TypeName(q.Type)
			if netbios {
				name = NetBIOSName(q.Name)
				if q.Type == 33 {
					qtype = "NBSTAT" // the SRV number, reused by NetBIOS
				}
			}
			o := newDomain(name, qtype)
			if i > 0 {
				o.Count = 0
			} else {
				o.Count = count
				if answered {
					addAnswers(o.Domain, m.Answers)
					d.orders.answered(name, m.Answers)
				} else {
					o.Domain.Unsolicited = answerCount(m.Answers)
				}
			}
			d.toSink(o)
		}
		return
	}
	// Answers without a question (mDNS announcements): one per owner name,
	// unsolicited.
	for i, a := range m.Answers {
		name := observe.NormName(a.Name)
		if slices.ContainsFunc(m.Answers[:i], func(b dns.RR) bool { return observe.NormName(b.Name) == name }) {
			continue
		}
		o := newDomain(name, "")
		var own []dns.RR
		for _, b := range m.Answers {
			if observe.NormName(b.Name) == name {
				own = append(own, b)
			}
		}
		o.Domain.Unsolicited = answerCount(own)
		d.toSink(o)
	}
}

// answerCount is the resource records of an answer section, EDNS aside.
func answerCount(rrs []dns.RR) int64 {
	n := int64(0)
	for _, a := range rrs {
		if a.Type != 41 {
			n++
		}
	}
	return n
}

// nameHash is a hash of a DNS name, case-insensitively (FNV-1a).
func nameHash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}

func addAnswers(di *records.DomainInfo, rrs []dns.RR) {
	for _, a := range rrs {
		if a.Type == 41 {
			continue
		}
		data := a.Data
		switch a.Type {
		case dns.TypeA, dns.TypeAAAA:
			di.Addrs = append(di.Addrs, data)
		case dns.TypeCNAME:
			data = observe.NormName(data)
			di.CNAMEs = append(di.CNAMEs, data)
		case dns.TypeNS, dns.TypePTR, dns.TypeMX, dns.TypeDNAME:
			data = observe.NormName(data)
		}
		if len(di.Answers) < 64 {
			di.Answers = append(di.Answers, records.DNSAnswer{Name: observe.NormName(a.Name), Type: dns.TypeName(a.Type), Data: clip(data), TTL: a.TTL})
		}
	}
}

// maxAnswerData bounds one answer's text (long TXT records) as kept.
const maxAnswerData = 512

func clip(s string) string {
	if len(s) > maxAnswerData {
		return s[:maxAnswerData] + "…"
	}
	return s
}

// NetBIOSName decodes a NetBIOS name service query (RFC 1001 first-level
// encoding: each byte as two letters 'A'+nibble) the way Zeek's
// decode_netbios_name does: the first 15 characters, up to the first that
// is not alphanumeric or punctuation (the space padding), without the
// suffix byte. A name that is not so encoded is returned as is.
func NetBIOSName(s string) string {
	label, _, _ := strings.Cut(s, ".")
	if len(label) != 32 {
		return observe.NormName(s)
	}
	var out []byte
	for i := 0; i < 15; i++ {
		hi, lo := label[2*i]-'A', label[2*i+1]-'A'
		if label[2*i] < 'A' || label[2*i+1] < 'A' || hi > 15 || lo > 15 {
			return observe.NormName(s)
		}
		c := hi<<4 | lo
		if !(c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c > ' ' && c < 0x7f || c < 3) {
			break
		}
		out = append(out, c)
	}
	return string(out)
}

// fingerprints are a ClientHello's JA3 hash and JA4.
type fingerprints struct{ ja3, ja4 string }

// maxPrints bounds the cache of fingerprints.
const maxPrints = 1 << 12

// fingerprint computes JA3 and JA4 once per distinct ClientHello (as far
// as they see it): a sample repeats one hello for every connection.
func (d *Decoder) fingerprint(ch *tlsfp.ClientHello) fingerprints {
	var h maphash.Hash
	h.SetSeed(d.seed)
	var b [2]byte
	put := func(v uint16) {
		binary.BigEndian.PutUint16(b[:], v)
		h.Write(b[:])
	}
	list := func(vs []uint16) {
		put(uint16(len(vs)))
		for _, v := range vs {
			put(v)
		}
	}
	put(ch.Version)
	list(ch.Ciphers)
	list(ch.Extensions)
	list(ch.Groups)
	list(ch.SigAlgs)
	list(ch.SupportedVersions)
	h.Write(ch.PointFormats)
	put(uint16(len(ch.PointFormats)))
	if len(ch.ALPN) > 0 {
		h.WriteString(ch.ALPN[0])
	}
	put(uint16(len(ch.ALPN)))
	if ch.ServerName != "" {
		h.WriteByte(1)
	}
	k := h.Sum64()
	if fp, ok := d.prints[k]; ok {
		return fp
	}
	fp := fingerprints{ja3: ch.JA3(), ja4: ch.JA4()}
	if len(d.prints) < maxPrints {
		d.prints[k] = fp
	}
	return fp
}
