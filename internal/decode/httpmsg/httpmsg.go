// Package httpmsg parses HTTP/1.x request and response heads from the
// start of a TCP stream: request line, status line, and the few headers
// that matter (Host, User-Agent, Content-Length, Transfer-Encoding).
package httpmsg

import (
	"bytes"
	"errors"
	"strconv"
)

// Errors. ErrIncomplete means the head has not fully arrived.
var (
	ErrIncomplete = errors.New("http: incomplete head")
	ErrNotHTTP    = errors.New("http: not an HTTP message")
)

// Bounds on the length kept of a value: a URI, a Host or User-Agent header.
const (
	MaxURI    = 2048
	MaxHeader = 512
)

// Strings makes header values, once per distinct value (hosts and user
// agents repeat). The zero value is ready to use.
type Strings struct{ m map[string]string }

const maxStrings = 1 << 12

func (c *Strings) str(b []byte) string {
	if c == nil {
		return string(b)
	}
	if s, ok := c.m[string(b)]; ok {
		return s
	}
	if c.m == nil || len(c.m) >= maxStrings {
		c.m = make(map[string]string)
	}
	s := string(b)
	c.m[s] = s
	return s
}

// Request is a request head.
type Request struct {
	Method    string
	URI       string
	Host      string
	UserAgent string
	// BodyLen is the Content-Length (0 when absent); Chunked is set for a
	// chunked body, whose length the head does not give.
	BodyLen int64
	Chunked bool
	// HeadLen is the length of the head including the blank line.
	HeadLen int
}

// Response is a response head.
type Response struct {
	Status int
	// BodyLen is the Content-Length, -1 when absent.
	BodyLen int64
	Chunked bool
	HeadLen int
}

// maxMethod bounds a method's length (the longest registered method,
// UPDATEREDIRECTREF, has 17 letters).
const maxMethod = 20

// isTchar reports a token character (RFC 9110 5.6.2): methods are tokens.
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' }

// skipEmptyLines is the length of the empty lines before a request line,
// which servers ignore (RFC 9112 2.2).
func skipEmptyLines(b []byte) int {
	i := 0
	for i < len(b) && (b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// LooksLikeRequest reports whether b can start an HTTP request: optional
// empty lines, then a request line as requestLine accepts it, judged on as
// much of it as b holds.
func LooksLikeRequest(b []byte) bool {
	b = b[skipEmptyLines(b):]
	nl := bytes.IndexByte(b, '\n')
	if nl < 0 {
		_, _, _, ok := requestLine(b, true)
		return ok
	}
	_, _, _, ok := requestLine(trimCR(b[:nl]), false)
	return ok
}

// requestLine splits a request line (without its line end) the way lenient
// servers read one: a method token, a target and an optional HTTP version,
// separated by runs of spaces or tabs. The target is an origin form
// ("/path"), an absolute URI ("scheme://…"), "*" for OPTIONS or anything
// for CONNECT; a versioned line's target may hold spaces. A line without a
// version (HTTP/0.9) needs a method in capitals, so that a shell command
// ("cat /etc/passwd") is not a request. With partial set the line has not
// ended and is judged on what it holds so far.
func requestLine(line []byte, partial bool) (method, target []byte, versioned, ok bool) {
	i := 0
	for i < len(line) && i <= maxMethod && isTchar(line[i]) {
		i++
	}
	if i > maxMethod {
		return nil, nil, false, false
	}
	if i == len(line) {
		return nil, nil, false, partial
	}
	if i == 0 || !isSpace(line[i]) {
		return nil, nil, false, false
	}
	method = line[:i]
	for i < len(line) && isSpace(line[i]) {
		i++
	}
	rest := line[i:]
	j := len(rest)
	for j > 0 && isSpace(rest[j-1]) {
		j--
	}
	rest = rest[:j]
	k := j
	for k > 0 && !isSpace(rest[k-1]) {
		k--
	}
	switch {
	case k > 0 && isVersion(rest[k:], partial):
		target, versioned = rest[:k], true
		for len(target) > 0 && isSpace(target[len(target)-1]) {
			target = target[:len(target)-1]
		}
	case k > 0:
		return nil, nil, false, false
	default:
		target = rest
		if !partial && !isCapitals(method) {
			return nil, nil, false, false
		}
	}
	if !validTarget(method, target, versioned, partial && (!versioned || len(rest[k:]) == 0)) {
		return nil, nil, false, false
	}
	return method, target, versioned, true
}

func isCapitals(b []byte) bool {
	for _, c := range b {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// isVersion reports "HTTP/d.d" (or, with partial set, a start of it).
func isVersion(v []byte, partial bool) bool {
	const p = "HTTP/"
	if len(v) < len(p) {
		return partial && bytes.EqualFold(v, []byte(p[:len(v)]))
	}
	if !bytes.EqualFold(v[:len(p)], []byte(p)) {
		return false
	}
	v = v[len(p):]
	digits := func() int {
		n := 0
		for n < len(v) && v[n] >= '0' && v[n] <= '9' {
			n++
		}
		return n
	}
	n := digits()
	if n == len(v) {
		return partial
	}
	if n == 0 || v[n] != '.' {
		return false
	}
	v = v[n+1:]
	n = digits()
	return n == len(v) && (n > 0 || partial)
}

// validTarget reports whether t is a request target a server answers;
// with partial set, whether it can still become one.
func validTarget(method, t []byte, spaces, partial bool) bool {
	if len(t) == 0 {
		return partial
	}
	for _, c := range t {
		if (c <= ' ' || c == 0x7f) && (c != ' ' || !spaces) {
			return false
		}
	}
	switch {
	case t[0] == '/':
		return true
	case bytes.EqualFold(method, []byte("CONNECT")):
		return true
	case len(t) == 1 && t[0] == '*':
		return bytes.EqualFold(method, []byte("OPTIONS")) || partial
	}
	// An absolute URI: scheme "://".
	i := 0
	for i < len(t) && (t[i] >= 'a' && t[i] <= 'z' || t[i] >= 'A' && t[i] <= 'Z' ||
		i > 0 && (t[i] >= '0' && t[i] <= '9' || t[i] == '+' || t[i] == '-' || t[i] == '.')) {
		i++
	}
	if i == 0 {
		return false
	}
	sep := t[i:]
	if len(sep) < 3 {
		return partial && bytes.HasPrefix([]byte("://"), sep)
	}
	return bytes.HasPrefix(sep, []byte("://"))
}

// headEnd finds the end of the head in b, which starts at the request or
// status line's line end; lines may end in CRLF or LF.
func headEnd(b []byte) int {
	for i := 0; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		if i+1 < len(b) && b[i+1] == '\n' {
			return i + 2
		}
		if i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n' {
			return i + 3
		}
	}
	return -1
}

func trimCR(l []byte) []byte { return bytes.TrimSuffix(l, []byte{'\r'}) }

func clip(b []byte, max int) string {
	if len(b) > max {
		b = b[:max]
	}
	return string(b)
}

// ParseRequest reads one request head from the start of b, after any empty
// lines. A request line without a version (HTTP/0.9) is the whole head
// unless header lines follow it. With full set (the caller's buffer is
// full), a head without its blank line is parsed as far as it goes instead
// of reporting ErrIncomplete.
func ParseRequest(b []byte, req *Request, full bool, strs *Strings) error {
	*req = Request{}
	start := skipEmptyLines(b)
	if start == len(b) {
		if full {
			return ErrNotHTTP
		}
		return ErrIncomplete
	}
	lineEnd := len(b)
	if nl := bytes.IndexByte(b[start:], '\n'); nl >= 0 {
		lineEnd = start + nl
	}
	partial := lineEnd == len(b) && !full
	method, target, versioned, ok := requestLine(trimCR(b[start:lineEnd]), partial)
	if !ok {
		return ErrNotHTTP
	}
	if partial {
		return ErrIncomplete
	}
	next := min(lineEnd+1, len(b))
	end := next
	headers := versioned
	if !versioned && next < len(b) {
		// What follows a version-less line already is either its header
		// or the next request; nothing following means it is complete.
		switch startsHeader(b[next:]) {
		case yes:
			headers = true
		case maybe:
			if !full {
				return ErrIncomplete
			}
		}
	}
	if headers {
		if e := headEnd(b[lineEnd:]); e >= 0 {
			end = lineEnd + e
		} else if !full {
			return ErrIncomplete
		} else {
			end = len(b)
		}
	}
	req.Method = strs.str(method)
	req.URI = clip(target, MaxURI)
	req.HeadLen = end
	for h, rest := nextHeader(b[next:end]); h.name != nil; h, rest = nextHeader(rest) {
		switch {
		case h.is("host"):
			req.Host = strs.str(h.value[:min(len(h.value), MaxHeader)])
		case h.is("user-agent"):
			req.UserAgent = strs.str(h.value[:min(len(h.value), MaxHeader)])
		case h.is("content-length"):
			if n, err := strconv.ParseInt(string(h.value), 10, 64); err == nil && n >= 0 {
				req.BodyLen = n
			}
		case h.is("transfer-encoding"):
			req.Chunked = containsFold(h.value, "chunked")
		}
	}
	return nil
}

const (
	no = iota
	yes
	maybe
)

// startsHeader reports whether b starts with a header field line (a token
// and a colon), or cannot tell yet.
func startsHeader(b []byte) int {
	for i, c := range b {
		if c == ':' && i > 0 {
			return yes
		}
		if !isTchar(c) {
			return no
		}
	}
	return maybe
}

// Chunk phases: where a chunked body (RFC 9112 7.1) is being read.
const (
	ChunkSize    uint8 = iota + 1 // at a chunk-size line
	ChunkData                     // after a chunk's data, at its line end
	ChunkTrailer                  // in the trailer section
)

// maxChunkDigits bounds a chunk size (60 bits).
const maxChunkDigits = 15

// ReadChunked reads a chunked body from b, which starts where *phase says.
// It returns the bytes it read and, when a chunk's data follows them, the
// data's length: the caller skips the data (which may not have arrived) and
// calls again in phase ChunkData. *phase becomes 0 at the end of the body
// (the last chunk and its trailer). Chunk extensions are ignored and line
// ends may be LF. ErrIncomplete: a line has not fully arrived (with full
// set it never will, and the body is not read further).
func ReadChunked(b []byte, phase *uint8, full bool) (used int, data int64, err error) {
	incomplete := ErrIncomplete
	if full {
		incomplete = ErrNotHTTP
	}
	for *phase != 0 {
		rest := b[used:]
		if *phase == ChunkData {
			switch {
			case len(rest) >= 2 && rest[0] == '\r' && rest[1] == '\n':
				used += 2
			case len(rest) >= 1 && rest[0] == '\n':
				used++
			case len(rest) == 0 || len(rest) == 1 && rest[0] == '\r':
				return used, 0, incomplete
			default:
				return used, 0, ErrNotHTTP
			}
			*phase = ChunkSize
			continue
		}
		nl := bytes.IndexByte(rest, '\n')
		if nl < 0 {
			return used, 0, incomplete
		}
		line := trimCR(rest[:nl])
		used += nl + 1
		if *phase == ChunkTrailer {
			if len(line) == 0 {
				*phase = 0
			}
			continue
		}
		n, i := int64(0), 0
		for ; i < len(line) && i <= maxChunkDigits; i++ {
			c := line[i] | 0x20
			switch {
			case c >= '0' && c <= '9':
				n = n<<4 | int64(c-'0')
				continue
			case c >= 'a' && c <= 'f':
				n = n<<4 | int64(c-'a'+10)
				continue
			}
			break
		}
		if i == 0 || i > maxChunkDigits || i < len(line) && line[i] != ';' && !isSpace(line[i]) {
			return used, 0, ErrNotHTTP
		}
		if n == 0 {
			*phase = ChunkTrailer
			continue
		}
		*phase = ChunkData
		return used, n, nil
	}
	return used, 0, nil
}

// ParseResponse reads one response head from the start of b.
func ParseResponse(b []byte, resp *Response, full bool) error {
	*resp = Response{BodyLen: -1}
	if len(b) >= 5 && !bytes.HasPrefix(b, []byte("HTTP/")) {
		return ErrNotHTTP
	}
	end := headEnd(b)
	if end < 0 {
		if !full {
			return ErrIncomplete
		}
		end = len(b)
	}
	head := b[:end]
	nl := bytes.IndexByte(head, '\n')
	if nl < 0 {
		nl = len(head)
	}
	line := trimCR(head[:nl])
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 || len(line) < sp+4 {
		return ErrNotHTTP
	}
	code, err := strconv.Atoi(string(line[sp+1 : sp+4]))
	if err != nil || code < 100 || code > 999 {
		return ErrNotHTTP
	}
	resp.Status = code
	resp.HeadLen = end
	for h, rest := nextHeader(head[min(nl+1, len(head)):]); h.name != nil; h, rest = nextHeader(rest) {
		switch {
		case h.is("content-length"):
			if n, err := strconv.ParseInt(string(h.value), 10, 64); err == nil && n >= 0 {
				resp.BodyLen = n
			}
		case h.is("transfer-encoding"):
			resp.Chunked = containsFold(h.value, "chunked")
		}
	}
	return nil
}

type header struct{ name, value []byte }

func (h header) is(name string) bool {
	return len(h.name) == len(name) && bytes.EqualFold(h.name, []byte(name))
}

// nextHeader returns the first header line of b and what follows it; a
// nil name at the end of the head.
func nextHeader(b []byte) (header, []byte) {
	for len(b) > 0 {
		nl := bytes.IndexByte(b, '\n')
		var line []byte
		if nl < 0 {
			line, b = b, nil
		} else {
			line, b = b[:nl], b[nl+1:]
		}
		line = trimCR(line)
		if len(line) == 0 {
			return header{}, nil
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			continue
		}
		return header{name: bytes.TrimSpace(line[:colon]), value: bytes.TrimSpace(line[colon+1:])}, b
	}
	return header{}, nil
}

func containsFold(b []byte, s string) bool {
	for i := 0; i+len(s) <= len(b); i++ {
		if bytes.EqualFold(b[i:i+len(s)], []byte(s)) {
			return true
		}
	}
	return false
}
