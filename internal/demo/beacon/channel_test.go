package beacon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode/botproto"
	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon/botwire"
	"github.com/talkbox-sandbox/talkbox/internal/demo/c2"
)

// watch is a log that tells the test, once, when a line it waits for was
// written.
type watch struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want func(line []byte) bool
	seen chan struct{}
	once sync.Once
}

func newWatch(want func(line []byte) bool) *watch {
	return &watch{want: want, seen: make(chan struct{})}
}

func (w *watch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.want(p) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *watch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// chunk is what one side of the beacon's connection carried at once: dir
// 0 the beacon's bytes, 1 the C2's.
type chunk struct {
	dir  int
	ts   int64
	data []byte
}

// tap records the bytes of the beacon's connections as it reads and
// writes them.
type tap struct {
	mu    sync.Mutex
	conns [][]chunk
}

type tapped struct {
	net.Conn
	t *tap
	i int
}

func (t *tap) dial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		t.conns = append(t.conns, nil)
		return &tapped{Conn: c, t: t, i: len(t.conns) - 1}, nil
	}
}

func (c *tapped) record(dir int, p []byte) {
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	c.t.conns[c.i] = append(c.t.conns[c.i], chunk{dir, time.Now().UnixNano(), bytes.Clone(p)})
}

func (c *tapped) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.record(1, p[:n])
	}
	return n, err
}

func (c *tapped) Write(p []byte) (int, error) {
	c.record(0, p)
	return c.Conn.Write(p)
}

func (t *tap) streams() [][]chunk {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.conns)
}

type commands []botproto.Command

func (c *commands) Command(dir int, cmd *botproto.Command) {
	if dir != 1 {
		panic("an order from the bot's side")
	}
	*c = append(*c, *cmd)
}

// recognise feeds a connection's bytes, in the order they were read and
// written, to tb-parse's recogniser.
func recognise(stream []chunk) (botproto.Channel, []botproto.Command, bool) {
	var conv botproto.Conv
	var cmds commands
	conv.Reset(botproto.Sniff(stream[0].data), stream[0].dir)
	for _, c := range stream {
		conv.Feed(c.dir, c.ts, c.data, &cmds)
	}
	ch, ok := conv.Channel()
	return ch, cmds, ok
}

// startC2 serves proto's C2 side with order on loopback; its log tells
// when the bot's third keep-alive (check-in, for HTTP) came.
func startC2(t *testing.T, proto string, o botwire.Order) (port string, log *watch) {
	t.Helper()
	log = newWatch(func(line []byte) bool {
		var h c2.Hit
		return json.Unmarshal(line, &h) == nil && h.Seq >= 3
	})
	if proto == botwire.HTTP {
		srv := httptest.NewServer(c2.NewOrderHandler(log, &o))
		t.Cleanup(srv.Close)
		_, port, _ = net.SplitHostPort(srv.Listener.Addr().String())
		return port, log
	}
	s, err := c2.NewServer(proto, &o, 10*time.Millisecond, log)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	_, port, _ = net.SplitHostPort(ln.Addr().String())
	return port, log
}

// For each protocol, the beacon and the demo's C2 talk over loopback: the
// C2 sends its order after the first keep-alive exchange, the beacon
// carries out the attack (into a test socket: no packet leaves), and the
// bytes of the session are what tb-parse's recognisers take for that
// protocol's channel, with the bot's identity, its keep-alives and the
// order decoded (over HTTP, the answer carrying the order is what
// botproto.HTTPOrder reads as one). An order against an address outside the documentation
// ranges is refused: no attack socket is even opened.
func TestChannelsCarryTheC2sOrderToTheAttack(t *testing.T) {
	type want struct {
		proto      botproto.Protocol
		identities []string
		channels   []string
		vector     string
		target     string
	}
	for _, tc := range []struct {
		proto string
		want  want
	}{
		{botwire.HTTP, want{}},
		{botwire.Mirai, want{botproto.Mirai, []string{"bot-7"}, nil, "udp", "192.0.2.1/32"}},
		{botwire.Gafgyt, want{botproto.Gafgyt, []string{"BUILD TALKBOX"}, nil, "UDP", "192.0.2.1"}},
		{botwire.IRC, want{botproto.IRC, []string{"NICK bot-7", "USER bot-7 0 * :talkbox"}, []string{"#tb beacon"}, "!udp", "192.0.2.1"}},
	} {
		for _, target := range []string{"192.0.2.1", "10.13.37.5"} {
			t.Run(tc.proto+"/"+target, func(t *testing.T) {
				t.Parallel()
				allowed := target == "192.0.2.1"
				o := order(t, "udp "+target+" 9 1")
				port, c2log := startC2(t, tc.proto, o)
				b, _, _ := newTest(t, config(t, port, "-c2-proto", tc.proto, "-interval", "10ms", "-jitter", "0"), []netip.Addr{netip.MustParseAddr("127.0.0.1")})
				tp := &tap{}
				b.Dial = tp.dial(b.Dial)
				log := newWatch(func(line []byte) bool { return bytes.Contains(line, []byte(`order "`+o.String())) })
				b.Log = log
				sinks := make(chan *packetSink, 1)
				b.PacketConn = func(context.Context) (net.PacketConn, error) {
					s := newPacketSink()
					sinks <- s
					return s, nil
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan Stats)
				go func() { done <- b.Run(ctx) }()
				<-log.seen
				<-c2log.seen
				var sink *packetSink
				if allowed {
					sink = <-sinks
					<-sink.closed
				}
				cancel()
				st := <-done
				if st.Answered < 1 {
					t.Errorf("stats %+v", st)
				}
				if allowed {
					if pk := sink.sent(); len(pk) != AttackRate || pk[0].to != "192.0.2.1:9" || pk[len(pk)-1].to != "192.0.2.1:9" {
						t.Errorf("%d packets, first to %s", len(pk), pk[0].to)
					}
				} else if len(sinks) != 0 || !strings.Contains(log.String(), "refused: target 10.13.37.5") {
					t.Errorf("the order against the lab was not refused:\n%s", log)
				}
				hits, err := c2.ReadHits(strings.NewReader(c2log.String()))
				if err != nil {
					t.Fatal(err)
				}
				if orders := slices.DeleteFunc(hits, func(h c2.Hit) bool { return h.Order == "" }); len(orders) != 1 || orders[0].Order != o.String() || orders[0].Remote != "127.0.0.1" {
					t.Errorf("orders logged: %+v\n%s", orders, c2log)
				}
				streams := tp.streams()
				if tc.proto == botwire.HTTP {
					// Each check-in is a connection; the first carried
					// the order, which the beacon reports done.
					var sent, got []byte
					for _, c := range streams[0] {
						if c.dir == 0 {
							sent = append(sent, c.data...)
						} else {
							got = append(got, c.data...)
						}
					}
					if !bytes.Contains(sent, []byte(`"done":"`+o.String()+`"`)) {
						t.Errorf("first check-in: %q", sent)
					}
					resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(got)), nil)
					if err != nil {
						t.Fatal(err)
					}
					body, _ := io.ReadAll(resp.Body)
					if c, ok := botproto.HTTPOrder(body); !ok || c.Vector != "udp" || !slices.Equal(c.Targets, []string{target}) || !slices.Equal(c.Ports, []string{"9"}) || c.Duration != 1 {
						t.Errorf("the answer %q decoded as %+v, %v", body, c, ok)
					}
					return
				}
				if len(streams) != 1 {
					t.Fatalf("%d sessions, want 1\n%s", len(streams), log)
				}
				ch, cmds, ok := recognise(streams[0])
				if !ok || ch.Protocol != tc.want.proto || ch.BotDir != 0 || !slices.Equal(ch.Identities, tc.want.identities) || !slices.Equal(ch.Channels, tc.want.channels) || ch.KeepAlives < 3 || ch.Commands != 1 {
					t.Fatalf("recognised %v as %+v", ok, ch)
				}
				if c := cmds[0]; c.Vector != tc.want.vector || !slices.Equal(c.Targets, []string{strings.Replace(tc.want.target, "192.0.2.1", target, 1)}) || !slices.Equal(c.Ports, []string{"9"}) || c.Duration != 1 {
					t.Fatalf("order decoded as %+v", c)
				}
			})
		}
	}
}

// A C2 that breaks Mirai's framing (a length the bot does not take)
// loses its session, and the beacon connects again; in the text channels
// a line longer than the buffer is skipped and the next one read.
func TestHostileC2BytesAreBounded(t *testing.T) {
	for _, tc := range []struct {
		name, proto, answer, log string
		sessions                 int
	}{
		{"mirai/length", botwire.Mirai, "\xff\xff" + strings.Repeat("A", 70000), "message of 65535 bytes", 2},
		{"mirai/short", botwire.Mirai, "\x00\x01", "message of 1 bytes", 2},
		{"mirai/lying", botwire.Mirai, "\x00\x09\x00\x00\x00\x05\x00\x01\xc0", "order ignored: order cut in its target", 1},
		{"gafgyt/line", botwire.Gafgyt, strings.Repeat("!* UDP 192.0.2.1 9 5 ", 5000) + "\nPING\n", "skipped", 1},
		{"irc/line", botwire.IRC, ":x PRIVMSG #tb :!udp " + strings.Repeat("9", 600) + "\r\nPING :c2.example\r\n", "skipped", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			_, port, _ := net.SplitHostPort(ln.Addr().String())
			b, rec, _ := newTest(t, config(t, port, "-c2-proto", tc.proto, "-interval", "5ms", "-jitter", "0", "-timeout", "1s"), []netip.Addr{netip.MustParseAddr("127.0.0.1")})
			log := newWatch(func(line []byte) bool { return bytes.Contains(line, []byte(tc.log)) })
			b.Log = log
			b.PacketConn = func(context.Context) (net.PacketConn, error) {
				t.Error("an attack socket opened")
				return newPacketSink(), nil
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan Stats)
			go func() { done <- b.Run(ctx) }()
			// The hostile C2: its answer to each session, then it reads
			// what the beacon sends until the session is done.
			replies := make(chan []byte, 4)
			for i := 0; i < tc.sessions; i++ {
				c, err := ln.Accept()
				if err != nil {
					t.Fatal(err)
				}
				go func() {
					defer c.Close()
					io.WriteString(c, tc.answer)
					var got bytes.Buffer
					buf := make([]byte, 4096)
					for !bytes.Contains(got.Bytes(), []byte("PONG")) && (tc.proto != botwire.Mirai || got.Len() < 20) {
						n, err := c.Read(buf)
						got.Write(buf[:n])
						if err != nil {
							break
						}
					}
					replies <- got.Bytes()
				}()
			}
			got := <-replies
			if tc.proto != botwire.Mirai && !bytes.Contains(got, []byte("PONG")) {
				t.Errorf("no PONG after the long line: %q", got)
			}
			<-log.seen
			cancel()
			<-done
			if n := len(rec.dials); n < tc.sessions {
				t.Errorf("%d sessions, want %d\n%s", n, tc.sessions, log)
			}
		})
	}
}

// A C2 that hangs up at once is dialled again once a period at most, not
// in a loop: by the fourth session, three whole periods have passed (a
// lower bound the beacon's own sleeps guarantee).
func TestC2ThatHangsUpIsNotDialledInALoop(t *testing.T) {
	const period = 20 * time.Millisecond
	for _, proto := range []string{botwire.Mirai, botwire.Gafgyt, botwire.IRC} {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		b, _, log := newTest(t, config(t, port, "-c2-proto", proto, "-interval", period.String(), "-jitter", "0"), []netip.Addr{netip.MustParseAddr("127.0.0.1")})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan Stats)
		start := time.Now()
		go func() { done <- b.Run(ctx) }()
		for i := 0; i < 4; i++ {
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		}
		elapsed := time.Since(start)
		cancel()
		st := <-done
		ln.Close()
		if elapsed < 3*period || st.Answered != 0 {
			t.Errorf("%s: four sessions in %v, stats %+v\n%s", proto, elapsed, st, log)
		}
	}
}
