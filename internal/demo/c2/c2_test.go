package c2

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon/botwire"
)

func TestHandlerLogsEachCheckIn(t *testing.T) {
	var log bytes.Buffer
	srv := httptest.NewServer(NewHandler(&log))
	defer srv.Close()
	for i, body := range []string{`{"id":"bot-1","seq":1,"attempt":1}`, `not json`} {
		req, _ := http.NewRequest("POST", srv.URL+"/gate", strings.NewReader(body))
		req.Host = "c2.example"
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Server") != ServerName {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, resp.Header.Get("Server"))
		}
	}
	hits, err := ReadHits(&log)
	if err != nil {
		t.Fatal(err)
	}
	if len(hits) != 2 || hits[0].Bot != "bot-1" || hits[0].Seq != 1 || hits[0].Host != "c2.example" || hits[0].Path != "/gate" || hits[0].Remote != "127.0.0.1" || hits[1].Bot != "" {
		t.Fatalf("hits = %+v", hits)
	}
}

// The beacon's report of its task is answered, not logged as a check-in.
func TestHandlerAnswersAReportWithoutLoggingIt(t *testing.T) {
	var log bytes.Buffer
	srv := httptest.NewServer(NewHandler(&log))
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL+"/gate", "application/json", strings.NewReader(`{"id":"bot-1","seq":1,"attempt":1,"done":"sleep"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || log.Len() != 0 {
		t.Fatalf("%d, logged %q", resp.StatusCode, log.String())
	}
}

// With an order, each bot's first check-in is answered with it (and the
// order logged), later ones with "sleep".
func TestHandlerSendsTheOrderOnceToEachBot(t *testing.T) {
	var log bytes.Buffer
	o, err := botwire.ParseOrder("udp 203.0.113.77 9 4")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewOrderHandler(&log, &o))
	defer srv.Close()
	var tasks []string
	for _, bot := range []string{"bot-1", "bot-1", "bot-2", "bot-1"} {
		resp, err := srv.Client().Post(srv.URL+"/gate", "application/json", strings.NewReader(`{"id":"`+bot+`","seq":1,"attempt":1}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		tasks = append(tasks, strings.TrimSpace(string(body)))
	}
	order, sleep := `{"task":"udp 203.0.113.77 9 4"}`, `{"task":"sleep"}`
	if !slices.Equal(tasks, []string{order, sleep, order, sleep}) {
		t.Fatalf("tasks %q", tasks)
	}
	hits, err := ReadHits(&log)
	if err != nil {
		t.Fatal(err)
	}
	var orders []string
	for _, h := range hits {
		if h.Order != "" {
			orders = append(orders, h.Order)
			if h.Bot != "" || h.Method != "" || h.Remote != "127.0.0.1" {
				t.Errorf("order line %+v", h)
			}
		}
	}
	if len(hits) != 6 || !slices.Equal(orders, []string{o.String(), o.String()}) {
		t.Fatalf("log:\n%s", log.String())
	}
}

// The session protocols' C2 side, byte for byte as botwire.md has it: the
// registration answered, the keep-alive exchange, then the order, once.
func TestServerSpeaksEachProtocol(t *testing.T) {
	o, err := botwire.ParseOrder("udp 203.0.113.77 9 4")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		proto string
		// steps alternate: what the bot sends, what the C2 must answer.
		steps []string
		bot   string
	}{
		{botwire.Mirai, []string{"\x00\x00\x00\x01\x05bot-7\x00\x00", "\x00\x00" +
			"\x00\x15\x00\x00\x00\x04\x00\x01\xcb\x00\x71\x4d\x20\x02\x07\x019\x00\x0264", "\x00\x00", "\x00\x00"}, "bot-7"},
		{botwire.Gafgyt, []string{"BUILD TALKBOX\n", "PING\n", "PONG\n", "!* UDP 203.0.113.77 9 4 32 0 10\n", "", "PING\n", "PONG\n", ""}, "TALKBOX"},
		{botwire.IRC, []string{"NICK bot-7\r\nUSER bot-7 0 * :talkbox\r\n", ":c2.example 001 bot-7 :Welcome\r\n", "JOIN #tb beacon\r\n", "PING :c2.example\r\n",
			"PONG :c2.example\r\n", ":op!op@c2.example PRIVMSG #tb :!udp 203.0.113.77 9 4\r\n", "", "PING :c2.example\r\n", "PONG :c2.example\r\n", ""}, "bot-7"},
	} {
		// In a bubble, the PINGs come on the bubble's clock: the second one
		// only once everything before it was said.
		t.Run(tc.proto, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var log lockedBuffer
				s, err := NewServer(tc.proto, &o, time.Second, &log)
				if err != nil {
					t.Fatal(err)
				}
				bot, c2 := net.Pipe()
				done := make(chan struct{})
				go func() { s.Handle(context.Background(), c2); close(done) }()
				for i, step := range tc.steps {
					if i%2 == 0 {
						io.WriteString(bot, step)
						continue
					}
					got := make([]byte, len(step))
					if _, err := io.ReadFull(bot, got); err != nil || string(got) != step {
						t.Fatalf("step %d: %q, %v; want %q", i, got, err, step)
					}
				}
				bot.Close()
				<-done
				hits, err := ReadHits(strings.NewReader(log.String()))
				if err != nil {
					t.Fatal(err)
				}
				if len(hits) != 4 || hits[0].Bot != tc.bot || hits[0].Seq != 0 || hits[1].Seq != 1 || hits[2].Order != o.String() || hits[3].Seq != 2 || hits[3].Proto != tc.proto {
					t.Fatalf("log:\n%s", log.String())
				}
			})
		})
	}
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
