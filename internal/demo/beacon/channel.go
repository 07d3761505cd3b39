package beacon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon/botwire"
)

// runChannel is Run for the session protocols (mirai, gafgyt, irc): one
// long-lived TCP session, opened again (with the check-in's retries) when
// the C2 drops it. Each period is one beacon: Mirai's bot sends its
// keep-alive, the text channels' bots wait for the C2's PING; the beacon
// counts as answered when a keep-alive of the C2 came within the period.
func (b *Beacon) runChannel(ctx context.Context, st *Stats) {
	var s *session
	defer func() {
		if s != nil {
			s.close()
		}
	}()
	for seq := 1; b.Cfg.Count == 0 || seq <= b.Cfg.Count; seq++ {
		st.Sent++
		if s != nil && s.ended() {
			b.Logf("session ended: %v", s.err)
			s.close()
			s = nil
		}
		if s == nil {
			s = b.connect(ctx, seq)
		}
		var before int64
		if s != nil {
			before = s.keepAlives.Load()
			if err := s.tick(); err != nil {
				b.Logf("beacon seq=%d failed: %v", seq, err)
				s.close()
				s = nil
			}
		}
		// The whole period, whatever happened in it: a C2 that hangs up
		// at once is not dialled in a loop.
		sleep(ctx, b.period())
		answered := s != nil && s.keepAlives.Load() > before
		if s != nil {
			b.Logf("beacon seq=%d proto=%s answered=%v", seq, b.Cfg.Proto, answered)
		}
		if answered {
			st.Answered++
		} else {
			st.Failed++
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// session is one connection to the C2. The reader goroutine takes the C2's
// messages; writes (the beacon's keep-alives, the reader's answers) are
// serialised.
type session struct {
	b          *Beacon
	conn       net.Conn
	wmu        sync.Mutex
	keepAlives atomic.Int64 // the C2's keep-alives (Mirai's echo, the PINGs)
	done       chan struct{}
	err        error // why the reader ended, once done is closed
	stop       func() bool
}

// connect opens a session and registers, with the check-in's retries; nil
// when every attempt failed.
func (b *Beacon) connect(ctx context.Context, seq int) *session {
	for attempt := 1; attempt <= b.Cfg.Retries; attempt++ {
		s, err := b.dialSession(ctx)
		if err == nil {
			b.Logf("session seq=%d attempt=%d proto=%s to %s", seq, attempt, b.Cfg.Proto, s.conn.RemoteAddr())
			return s
		}
		b.Logf("session seq=%d attempt=%d failed: %v", seq, attempt, err)
		if attempt < b.Cfg.Retries && !sleep(ctx, b.Cfg.Retry) {
			return nil
		}
	}
	return nil
}

func (b *Beacon) dialSession(ctx context.Context) (*session, error) {
	cctx, cancel := context.WithTimeout(ctx, b.Cfg.Timeout)
	defer cancel()
	addr, err := b.resolve(cctx)
	if err != nil {
		return nil, err
	}
	c, err := b.Dial(cctx, "tcp", net.JoinHostPort(addr.String(), strconv.Itoa(b.Cfg.Port)))
	if err != nil {
		return nil, err
	}
	s := &session{b: b, conn: c, done: make(chan struct{})}
	// The session lives as long as the run: its end closes the connection,
	// which ends the reader.
	s.stop = context.AfterFunc(ctx, func() { c.Close() })
	var hello []byte
	switch b.Cfg.Proto {
	case botwire.Mirai:
		hello = botwire.MiraiHello(b.Cfg.ID)
	case botwire.Gafgyt:
		hello = []byte(botwire.GafgytBuild)
	case botwire.IRC:
		hello = []byte(botwire.IRCRegister(b.Cfg.ID))
	}
	if err := s.send(hello); err != nil {
		s.close()
		return nil, err
	}
	go s.read(ctx)
	return s, nil
}

// tick is the bot's part of one period: Mirai's keep-alive; the text
// channels' keep-alives are the C2's to start.
func (s *session) tick() error {
	if s.b.Cfg.Proto == botwire.Mirai {
		return s.send(botwire.MiraiKeepAlive)
	}
	return nil
}

func (s *session) send(p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.conn.SetWriteDeadline(time.Now().Add(s.b.Cfg.Timeout))
	_, err := s.conn.Write(p)
	return err
}

func (s *session) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// close ends the session and waits for its reader.
func (s *session) close() {
	s.stop()
	s.conn.Close()
	<-s.done
}

func (s *session) read(ctx context.Context) {
	defer close(s.done)
	if s.b.Cfg.Proto == botwire.Mirai {
		s.err = s.readMirai(ctx)
	} else {
		s.err = s.readLines(ctx)
	}
}

// readMirai reads the C2's messages: a two-byte length, zero for a
// keep-alive, else an order of that length. A length the bot does not
// accept loses the framing: the session ends.
func (s *session) readMirai(ctx context.Context) error {
	r := bufio.NewReader(s.conn)
	var buf [botwire.MaxMiraiOrder]byte
	for {
		if _, err := io.ReadFull(r, buf[:2]); err != nil {
			return err
		}
		l := int(binary.BigEndian.Uint16(buf[:2]))
		if l == 0 {
			s.keepAlives.Add(1)
			continue
		}
		if l < 2 || l > botwire.MaxMiraiOrder {
			return fmt.Errorf("message of %d bytes: not Mirai's framing", l)
		}
		if _, err := io.ReadFull(r, buf[2:l]); err != nil {
			return err
		}
		o, err := botwire.DecodeMiraiOrder(buf[2:l])
		if err != nil {
			s.b.Logf("order ignored: %v", err)
			continue
		}
		s.b.order(ctx, o)
	}
}

// readLines reads the text channels' lines, at most botwire.MaxIRCLine
// bytes each: a longer one is skipped.
func (s *session) readLines(ctx context.Context) error {
	r := bufio.NewReaderSize(s.conn, botwire.MaxIRCLine)
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			s.b.Logf("line of more than %d bytes skipped", botwire.MaxIRCLine)
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
			if err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		line = bytes.TrimRight(line, "\r\n")
		if s.b.Cfg.Proto == botwire.Gafgyt {
			err = s.gafgytLine(ctx, string(line))
		} else {
			err = s.ircLine(ctx, string(line))
		}
		if err != nil {
			return err
		}
	}
}

func (s *session) gafgytLine(ctx context.Context, line string) error {
	switch {
	case line == "PING":
		s.keepAlives.Add(1)
		return s.send([]byte(botwire.GafgytPong))
	case len(line) > 3 && line[:3] == botwire.GafgytOrderPrefix:
		o, err := botwire.ParseGafgytOrder(line)
		switch {
		case err != nil:
			s.b.Logf("order ignored: %v", err)
		case o.Vector != "udp":
			s.b.Logf("order %q ignored: Gafgyt's UDP only", o)
		default:
			s.b.order(ctx, o)
		}
	}
	return nil
}

func (s *session) ircLine(ctx context.Context, line string) error {
	m := botwire.ParseIRC(line)
	switch m.Command {
	case "001":
		return s.send([]byte(botwire.IRCJoin))
	case "PING":
		token := m.Trailing
		if token == "" && len(m.Params) > 0 {
			token = m.Params[0]
		}
		if !printable(token) {
			s.b.Logf("PING with an unprintable token ignored")
			return nil
		}
		s.keepAlives.Add(1)
		return s.send([]byte("PONG :" + token + "\r\n"))
	case "PRIVMSG":
		if len(m.Trailing) == 0 || m.Trailing[0] != '!' {
			return nil
		}
		o, err := botwire.ParseIRCOrder(m.Trailing)
		if err != nil {
			s.b.Logf("order ignored: %v", err)
			return nil
		}
		s.b.order(ctx, o)
	}
	return nil
}

// printable reports whether s is printable ASCII, safe to echo.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}
