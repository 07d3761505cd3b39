package c2

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon/botwire"
)

// Server is the C2's side of a session protocol (botwire.Mirai, Gafgyt or
// IRC): it takes a bot's registration, keeps the session alive (Mirai's
// bot sends the keep-alives and the server echoes them; in the text
// channels the server sends PING every Interval, the first at once) and,
// after the first keep-alive exchange, sends Order once.
type Server struct {
	Proto    string
	Order    *botwire.Order // nil: none
	Interval time.Duration
	log      hitLog
}

// NewServer logs to w.
func NewServer(proto string, order *botwire.Order, interval time.Duration, w io.Writer) (*Server, error) {
	if proto != botwire.Mirai && proto != botwire.Gafgyt && proto != botwire.IRC {
		return nil, fmt.Errorf("no session protocol %q (mirai, gafgyt, irc)", proto)
	}
	if interval <= 0 {
		return nil, errors.New("the keep-alive interval must be positive")
	}
	return &Server{Proto: proto, Order: order, Interval: interval, log: hitLog{w: w, now: time.Now}}, nil
}

// Serve takes sessions on ln until ctx ends (then nil) or ln fails.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Handle(ctx, c)
		}()
	}
}

// maxRegistration bounds the lines read before a text channel's bot has
// registered.
const maxRegistration = 16

// writeTimeout bounds one write to a bot.
const writeTimeout = 10 * time.Second

// conn is one session's connection: writes from the reader and the pinger
// are serialised.
type conn struct {
	net.Conn
	mu     sync.Mutex
	remote string
}

func (c *conn) send(p string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := io.WriteString(c.Conn, p)
	return err
}

// Handle serves one session until the bot leaves or ctx ends; it closes c.
func (s *Server) Handle(ctx context.Context, nc net.Conn) {
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	defer nc.Close()
	c := &conn{Conn: nc}
	c.remote, _, _ = net.SplitHostPort(nc.RemoteAddr().String())
	var err error
	switch s.Proto {
	case botwire.Mirai:
		err = s.mirai(c)
	default:
		err = s.text(ctx, c)
	}
	if err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
		s.log.write(Hit{Time: s.log.now().UTC(), Remote: c.remote, Proto: s.Proto, Error: err.Error()})
	}
}

// mirai reads the bot's hello, then echoes each keep-alive; the order
// follows the first echo.
func (s *Server) mirai(c *conn) error {
	r := bufio.NewReader(c)
	var buf [5 + botwire.MaxID]byte
	if _, err := io.ReadFull(r, buf[:5]); err != nil {
		return err
	}
	n := 5 + int(buf[4])
	if n > len(buf) {
		return fmt.Errorf("hello with a %d-byte ID", buf[4])
	}
	if _, err := io.ReadFull(r, buf[5:n]); err != nil {
		return err
	}
	bot, _, err := botwire.ReadMiraiHello(buf[:n])
	if err != nil {
		return err
	}
	s.registered(c, bot)
	for seq := 1; ; seq++ {
		if _, err := io.ReadFull(r, buf[:2]); err != nil {
			return err
		}
		if buf[0] != 0 || buf[1] != 0 {
			return errors.New("not a keep-alive")
		}
		if err := c.send(string(botwire.MiraiKeepAlive)); err != nil {
			return err
		}
		s.keptAlive(c, bot, seq)
		if seq == 1 && s.Order != nil {
			if err := s.sendOrder(c, string(botwire.MiraiOrder(*s.Order))); err != nil {
				return err
			}
		}
	}
}

// text serves a Gafgyt or IRC session: registration, then a PING every
// Interval; the order follows the first PONG.
func (s *Server) text(ctx context.Context, c *conn) error {
	r := bufio.NewReaderSize(c, botwire.MaxIRCLine)
	bot, err := s.textRegistration(r, c)
	if err != nil {
		return err
	}
	s.registered(c, bot)
	ping := botwire.GafgytPing
	if s.Proto == botwire.IRC {
		ping = botwire.IRCPing
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		t := time.NewTicker(s.Interval)
		defer t.Stop()
		for c.send(ping) == nil {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	for seq := 1; ; {
		line, err := readLine(r)
		if err != nil {
			return err
		}
		if s.Proto == botwire.IRC && botwire.ParseIRC(line).Command != "PONG" || s.Proto == botwire.Gafgyt && line != "PONG" {
			continue
		}
		s.keptAlive(c, bot, seq)
		if seq == 1 && s.Order != nil {
			order := botwire.GafgytOrder(*s.Order)
			if s.Proto == botwire.IRC {
				order = botwire.IRCOrder(*s.Order)
			}
			if err := s.sendOrder(c, order); err != nil {
				return err
			}
		}
		seq++
	}
}

// textRegistration reads a text channel's registration: Gafgyt's BUILD
// line, or IRC's NICK and USER (answered with the welcome) and the JOIN
// that follows it. It returns the bot's name.
func (s *Server) textRegistration(r *bufio.Reader, c *conn) (string, error) {
	var nick string
	var user, welcomed bool
	for i := 0; i < maxRegistration; i++ {
		line, err := readLine(r)
		if err != nil {
			return "", err
		}
		if s.Proto == botwire.Gafgyt {
			if build, ok := strings.CutPrefix(line, "BUILD "); ok {
				return build, nil
			}
			continue
		}
		m := botwire.ParseIRC(line)
		switch {
		case m.Command == "NICK" && len(m.Params) > 0:
			nick = m.Params[0]
		case m.Command == "USER":
			user = true
		case m.Command == "JOIN" && welcomed:
			return nick, nil
		}
		if nick != "" && user && !welcomed {
			if err := c.send(botwire.IRCWelcome(nick)); err != nil {
				return "", err
			}
			welcomed = true
		}
	}
	return "", errors.New("no registration")
}

// readLine reads one line of at most botwire.MaxIRCLine bytes, without
// its "\r\n"; a longer one is an error (the demo's bots send none).
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return "", err
	}
	return string(bytes.TrimRight(line, "\r\n")), nil
}

func (s *Server) registered(c *conn, bot string) {
	s.log.write(Hit{Time: s.log.now().UTC(), Remote: c.remote, Proto: s.Proto, Bot: bot})
}

func (s *Server) keptAlive(c *conn, bot string, seq int) {
	s.log.write(Hit{Time: s.log.now().UTC(), Remote: c.remote, Proto: s.Proto, Bot: bot, Seq: seq})
}

func (s *Server) sendOrder(c *conn, order string) error {
	if err := c.send(order); err != nil {
		return err
	}
	s.log.sent(c.remote, *s.Order)
	return nil
}
