package packet

import (
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

// Request lines that servers answer although RFC 9112 does not define
// them are requests: each conversation here is read as the request it
// carries, with its Host and User-Agent, and its response's status.
func TestLenientRequestLines(t *testing.T) {
	srv := server.String() + ":80"
	for _, tc := range []struct {
		name, req, value, ua string
		status               int
	}{
		{"http09", "GET /path/0.9\r\n", "GET http://" + srv + "/path/0.9", "", 0},
		{"versionless-with-headers", "POST /gate\r\nHost: C2.example\r\nUser-Agent: bot\r\nContent-Length: 4\r\n\r\nabcd",
			"POST http://c2.example/gate", "bot", 200},
		{"tabs", "GET\t/tabbed\tHTTP/1.1\r\nHost: tab.example\r\n\r\n", "GET http://tab.example/tabbed", "", 200},
		{"extra-spaces", "GET   /spaced    HTTP/1.1   \r\nHost: space.example\r\n\r\n", "GET http://space.example/spaced", "", 200},
		{"bare-lf", "GET /lf HTTP/1.1\nHost: lf.example\nUser-Agent: unix\n\n", "GET http://lf.example/lf", "unix", 200},
		{"lowercase-method", "get /lower HTTP/1.1\r\nHost: lower.example\r\n\r\n", "get http://lower.example/lower", "", 200},
		{"unknown-method", "BEACON /b HTTP/1.1\r\nHost: beacon.example\r\n\r\n", "BEACON http://beacon.example/b", "", 200},
		{"leading-empty-lines", "\r\n\n\r\nGET /after-blank HTTP/1.1\r\nHost: blank.example\r\n\r\n", "GET http://blank.example/after-blank", "", 200},
		{"absolute-uri", "GET http://proxied.example/x HTTP/1.1\r\n\r\n", "GET http://proxied.example/x", "", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
				c := g.Dial(ap(client, 41000), ap(server, 80), 1, 1)
				c.Send([]byte(tc.req))
				if tc.status != 0 {
					c.Reply(pcapgen.HTTPResponse(tc.status, "OK", []byte("ok")))
				} else {
					c.Reply([]byte("<html>0.9 has no status line</html>"))
				}
				c.Close()
			})
			h := r.get(t, "http", tc.value).HTTP
			if tc.ua != "" && !slices.Equal(h.UserAgents, []string{tc.ua}) {
				t.Errorf("user agents %v", h.UserAgents)
			}
			var want []int
			if tc.status != 0 {
				want = []int{tc.status}
			}
			if !slices.Equal(h.Statuses, want) {
				t.Errorf("statuses %v, want %v", h.Statuses, want)
			}
			if n := r.count("http"); n != 1 {
				t.Errorf("%d http observables", n)
			}
			if f := r.Flow(t, connKey("tcp", client, 41000, server, 80)); f.Service != "http" {
				t.Errorf("service %q", f.Service)
			}
		})
	}
}

// Pipelined HTTP/0.9 lines are each a request.
func TestPipelinedVersionlessRequests(t *testing.T) {
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c := g.Dial(ap(client, 41001), ap(server, 8080), 1, 1)
		c.Send([]byte("GET /one\r\nGET /two\nGET /three HTTP/1.0\r\n\r\n"))
		c.Close()
	})
	for _, p := range []string{"/one", "/two", "/three"} {
		r.get(t, "http", "GET http://"+server.String()+":8080"+p)
	}
}

// Every request after a chunked body on a keep-alive connection is seen:
// the body (chunk extensions, a chunk split across segments, a trailer) is
// read to its end, and so is a chunked response, so the statuses still
// pair with their requests. The request hidden right after the body in
// the same segment is the one request smuggling relies on.
func TestRequestsAfterChunkedBodies(t *testing.T) {
	body := "7;ext=1\r\nchunk-1\r\n" + "1a ; name=\"quoted\"\r\n" + strings.Repeat("z", 26) + "\r\n" +
		"0;last=yes\r\nX-Checksum: 42\r\nX-More: 1\r\n\r\n"
	first := "POST /upload HTTP/1.1\r\nHost: chunk.example\r\nTransfer-Encoding: chunked\r\n\r\n" + body
	second := "GET /hidden HTTP/1.1\r\nHost: chunk.example\r\nUser-Agent: smuggled\r\n\r\n"
	third := "GET /after-chunked-response HTTP/1.1\r\nHost: chunk.example\r\n\r\n"
	chunkedResp := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nwiki\r\n0\r\n\r\n"
	for _, mss := range []int{1460, 9} {
		r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
			c := g.Dial(ap(client, 41002), ap(server, 80), 1, 1)
			c.MSS = mss
			c.Send([]byte(first + second))
			c.Reply([]byte(chunkedResp))
			c.Reply(pcapgen.HTTPResponse(404, "Not Found", nil))
			c.Send([]byte(third))
			c.Reply(pcapgen.HTTPResponse(204, "No Content", nil))
			c.Close()
		})
		for _, w := range []struct {
			value  string
			status int
		}{
			{"POST http://chunk.example/upload", 200},
			{"GET http://chunk.example/hidden", 404},
			{"GET http://chunk.example/after-chunked-response", 204},
		} {
			if h := r.get(t, "http", w.value).HTTP; !slices.Equal(h.Statuses, []int{w.status}) {
				t.Errorf("mss %d: %s statuses %v, want %d", mss, w.value, h.Statuses, w.status)
			}
		}
	}
}

// Streams that are not HTTP stay so: telnet option negotiation, a shell
// command (a line a lenient reader could take for HTTP/0.9), binary, and
// text whose second word is not a request target.
func TestNotHTTP(t *testing.T) {
	for i, payload := range [][]byte{
		[]byte("\xff\xfd\x18\xff\xfd\x20\xff\xfd\x23\xff\xfd\x27login: root\r\n"),
		[]byte("cat /etc/passwd\nls -la /tmp\n"),
		{0x00, 0x00, 0x00, 0x2c, 0x47, 0x45, 0x54, 0x20, 0x2f, 0x0d, 0x0a, 0x01, 0x02},
		[]byte("HELLO world HTTP/1.1\r\n\r\n"),
		[]byte("GET\x00/x HTTP/1.1\r\n\r\n"),
		[]byte("GET /\x00\x01\x02 HTTP/1.1\r\n\r\n"),
	} {
		r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
			c := g.Dial(ap(client, uint16(41100+i)), ap(server, 80), 1, 1)
			c.Send(payload)
			c.Reply(pcapgen.HTTPResponse(400, "Bad Request", nil))
			c.Close()
		})
		if n := r.count("http"); n != 0 {
			t.Errorf("%q: %d http observables: %v", payload, n, r.Obs)
		}
		if f := r.Flow(t, connKey("tcp", client, uint16(41100+i), server, 80)); f.Service != "" {
			t.Errorf("%q: service %q", payload, f.Service)
		}
	}
}
