package httpmsg

import (
	"errors"
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
	for _, bad := range []string{"\x16\x03\x01", "get / HTTP/1.1\r\n\r\n", "GET /\r\n\r\n", "SSH-2.0-OpenSSH\r\n"} {
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
