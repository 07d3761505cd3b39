package httpmsg

import (
	"errors"
	"strings"
	"testing"
)

func TestRequest(t *testing.T) {
	var r Request
	in := "POST /gate.php?a=1 HTTP/1.1\r\nhost: C2.example:8080\r\nUser-Agent: bot/2\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.0\r\n\r\n"
	if err := ParseRequest([]byte(in), &r, false, nil); err != nil {
		t.Fatal(err)
	}
	if r.Method != "POST" || r.URI != "/gate.php?a=1" || r.Host != "C2.example:8080" || r.UserAgent != "bot/2" || r.BodyLen != 5 {
		t.Errorf("%+v", r)
	}
	next := in[r.HeadLen+5:]
	if err := ParseRequest([]byte(next), &r, false, nil); err != nil || r.Method != "GET" || r.Host != "" {
		t.Errorf("pipelined: %v %+v", err, r)
	}
	if err := ParseRequest([]byte("GET /x HTTP/1.1\r\nHost: a"), &r, false, nil); !errors.Is(err, ErrIncomplete) {
		t.Errorf("incomplete: %v", err)
	}
	if err := ParseRequest([]byte("GET /x HTTP/1.1\r\nHost: a"), &r, true, nil); err != nil || r.Host != "a" {
		t.Errorf("full buffer: %v %+v", err, r)
	}
	for _, bad := range []string{"\x16\x03\x01", "SSH-2.0-OpenSSH\r\n", "GET x HTTP/1.1\r\n\r\n", "GET /a b\r\n",
		"cat /etc/passwd\n", "\xff\xfd\x18\xff\xfd\x20", "GET / HTTP/1.x\r\n\r\n", "GET /\x00 HTTP/1.1\r\n\r\n",
		"GET * HTTP/1.1\r\n\r\n", "NICK bot\r\n", "EHLO mail.example\r\n", "\r\n\r\nSTARTTLS\r\n"} {
		if err := ParseRequest([]byte(bad), &r, false, nil); !errors.Is(err, ErrNotHTTP) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if !LooksLikeRequest([]byte("GET / HT")) || LooksLikeRequest([]byte("\x16\x03")) || LooksLikeRequest([]byte("ABCDEFGHIJKLMNOPQRSTUVWXYZ")) {
		t.Error("LooksLikeRequest")
	}
}

func TestResponse(t *testing.T) {
	var r Response
	if err := ParseResponse([]byte("HTTP/1.1 404 Not Found\nTransfer-Encoding: chunked\n\n"), &r, false); err != nil || r.Status != 404 || !r.Chunked || r.BodyLen != -1 {
		t.Errorf("%v %+v", err, r)
	}
	if err := ParseResponse([]byte("HTTP/1.1 2x0 OK\r\n\r\n"), &r, false); !errors.Is(err, ErrNotHTTP) {
		t.Errorf("bad status: %v", err)
	}
	if err := ParseResponse([]byte("HTTP/1.0 200 OK\r\nContent-Length: 12\r\n"), &r, false); !errors.Is(err, ErrIncomplete) {
		t.Errorf("incomplete: %v", err)
	}
}

// Request lines servers answer although they are not RFC 9112's: each is
// read with its method, target and headers, and its head ends where the
// next request starts.
func TestLenientRequestLines(t *testing.T) {
	for _, tc := range []struct{ in, method, uri, host string }{
		{"GET /path\r\n", "GET", "/path", ""},
		{"GET /path\nGET /next HTTP/1.1\r\n\r\n", "GET", "/path", ""},
		{"POST /gate\r\nHost: c2.example\r\n\r\n", "POST", "/gate", "c2.example"},
		{"GET  /a   HTTP/1.1  \r\nHost: h\r\n\r\n", "GET", "/a", "h"},
		{"GET\t/a\tHTTP/1.0\r\n\r\n", "GET", "/a", ""},
		{"get /lower HTTP/1.1\r\n\r\n", "get", "/lower", ""},
		{"BEACON /x HTTP/1.1\r\n\r\n", "BEACON", "/x", ""},
		{"GET /lf HTTP/1.1\nHost: lf.example\n\n", "GET", "/lf", "lf.example"},
		{"\r\n\r\n\nGET /late HTTP/1.1\r\n\r\n", "GET", "/late", ""},
		{"GET http://proxy.example/x HTTP/1.1\r\n\r\n", "GET", "http://proxy.example/x", ""},
		{"OPTIONS * HTTP/1.1\r\n\r\n", "OPTIONS", "*", ""},
		{"CONNECT tunnel.example:443 HTTP/1.1\r\n\r\n", "CONNECT", "tunnel.example:443", ""},
		{"GET /a b HTTP/1.1\r\n\r\n", "GET", "/a b", ""},
	} {
		var r Request
		b := []byte(tc.in)
		if !LooksLikeRequest(b) {
			t.Errorf("%q: LooksLikeRequest false", tc.in)
		}
		if err := ParseRequest(b, &r, false, nil); err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if r.Method != tc.method || r.URI != tc.uri || r.Host != tc.host {
			t.Errorf("%q: %+v", tc.in, r)
		}
		rest := tc.in[r.HeadLen:]
		if rest != "" && !LooksLikeRequest([]byte(rest)) {
			t.Errorf("%q: head ends at %d, before %q", tc.in, r.HeadLen, rest)
		}
	}
	// A version-less line is complete at its end; what follows it decides
	// whether headers belong to it.
	var r Request
	if err := ParseRequest([]byte("GET /x\r\nHo"), &r, false, nil); !errors.Is(err, ErrIncomplete) {
		t.Errorf("header or request: %v", err)
	}
	for _, partial := range []string{"G", "get", "GET ", "GET /", "PUT http:/", "GET /x HT", "GET /x HTTP/1.", "OPTIONS *", "\r\n"} {
		if err := ParseRequest([]byte(partial), &r, false, nil); !errors.Is(err, ErrIncomplete) {
			t.Errorf("%q: %v", partial, err)
		}
	}
}

func TestReadChunked(t *testing.T) {
	body := "5;name=value\r\nhello\r\n1A \r\n" + strings.Repeat("x", 26) + "\n0;last\r\nX-Trailer: 1\r\nX-Other: 2\n\r\nGET /next"
	// Fed in every split: the reader resumes where it stopped.
	for cut := 0; cut <= len(body); cut++ {
		phase, off, skip, buf := ChunkSize, 0, int64(0), []byte(body[:cut])
		var data []int64
		for phase != 0 {
			if skip > 0 {
				if int64(len(buf)-off) < skip {
					buf = []byte(body[:len(buf)+1])
					continue
				}
				off += int(skip)
				skip = 0
			}
			n, d, err := ReadChunked(buf[off:], &phase, false)
			off += n
			if errors.Is(err, ErrIncomplete) {
				if cut == len(body) {
					t.Fatalf("whole body incomplete at %d", off)
				}
				buf = []byte(body[:len(buf)+1])
				continue
			}
			if err != nil {
				t.Fatalf("cut %d: %v", cut, err)
			}
			if d > 0 {
				data = append(data, d)
				skip = d
			}
		}
		if body[off:] != "GET /next" || len(data) != 2 || data[0] != 5 || data[1] != 26 {
			t.Fatalf("cut %d: ends at %q, data %v", cut, body[off:], data)
		}
	}
	for _, bad := range []string{"zz\r\n", "5\r\nhelloX", "1234567890abcdef0\r\n", "5x\r\n"} {
		phase := ChunkSize
		var err error
		for off, d := 0, int64(0); err == nil && phase != 0; {
			var n int
			n, d, err = ReadChunked([]byte(bad[off:]), &phase, false)
			off += n + int(d)
			if off > len(bad) {
				break
			}
		}
		if !errors.Is(err, ErrNotHTTP) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	phase := ChunkSize
	if _, _, err := ReadChunked([]byte("5;ext=very-long"), &phase, true); !errors.Is(err, ErrNotHTTP) {
		t.Errorf("full buffer: %v", err)
	}
}

// Whatever the bytes, a request head read lies within them and a chunked
// body's reader moves forward within them.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{"GET /path\r\n", "\r\nget\t/a HTTP/1.1\nHost: h\n\n", "POST /x\r\nContent-Length: 3\r\n\r\nabc",
		"CONNECT h:443 HTTP/1.1\r\n\r\n", "5;e=1\r\nhello\r\n0\r\nT: 1\r\n\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		for _, full := range []bool{false, true} {
			if err := ParseRequest(b, &r, full, nil); err == nil && (r.HeadLen <= 0 || r.HeadLen > len(b)) {
				t.Fatalf("head length %d of %d bytes", r.HeadLen, len(b))
			}
			phase, off := ChunkSize, 0
			for phase != 0 && off < len(b) {
				n, d, err := ReadChunked(b[off:], &phase, full)
				if n < 0 || n > len(b)-off || d < 0 {
					t.Fatalf("read %d, data %d of %d bytes", n, d, len(b)-off)
				}
				if err != nil || n == 0 && d == 0 {
					break
				}
				off += n + int(min(d, int64(len(b)-off-n)))
			}
		}
		_ = LooksLikeRequest(b)
	})
}
