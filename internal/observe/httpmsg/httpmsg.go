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

func isToken(c byte) bool { return c >= 'A' && c <= 'Z' || c == '-' || c == '_' }

// LooksLikeRequest reports whether b can start an HTTP request: a method
// token in capitals followed by a space.
func LooksLikeRequest(b []byte) bool {
	for i, c := range b {
		if c == ' ' {
			return i >= 3
		}
		if !isToken(c) || i >= 20 {
			return false
		}
	}
	return len(b) > 0 && len(b) < 20 // not enough bytes to say no
}

// headEnd finds the end of the head; lines may end in CRLF or LF.
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

// ParseRequest reads one request head from the start of b. With full set
// (the caller's buffer is full), a head without its blank line is parsed
// as far as it goes instead of reporting ErrIncomplete.
func ParseRequest(b []byte, req *Request, full bool, strs *Strings) error {
	*req = Request{}
	nl := bytes.IndexByte(b, '\n')
	if nl < 0 && !full {
		if !LooksLikeRequest(b) {
			return ErrNotHTTP
		}
		return ErrIncomplete
	}
	if nl < 0 {
		nl = len(b)
	}
	line := trimCR(b[:nl])
	sp1 := bytes.IndexByte(line, ' ')
	sp2 := bytes.LastIndexByte(line, ' ')
	if sp1 < 3 || sp2 <= sp1 || !bytes.HasPrefix(line[sp2+1:], []byte("HTTP/")) {
		return ErrNotHTTP
	}
	for _, c := range line[:sp1] {
		if !isToken(c) {
			return ErrNotHTTP
		}
	}
	end := headEnd(b)
	if end < 0 {
		if !full {
			return ErrIncomplete
		}
		end = len(b)
	}
	head := b[:end]
	nl = min(nl, len(head))
	req.Method = strs.str(line[:sp1])
	req.URI = clip(line[sp1+1:sp2], MaxURI)
	req.HeadLen = end
	for h, rest := nextHeader(head[min(nl+1, len(head)):]); h.name != nil; h, rest = nextHeader(rest) {
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
