package botwire

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
)

func TestOrdersRoundTripInEveryProtocol(t *testing.T) {
	o, err := ParseOrder("UDP 203.0.113.77 9 4")
	if err != nil {
		t.Fatal(err)
	}
	if o.String() != "udp 203.0.113.77 9 4" {
		t.Fatalf("order %q", o)
	}
	wire := MiraiOrder(o)
	// botwire.md: length, duration, vector 0, one target /32, dport "9", len "64".
	if want := "0015" + "00000004" + "00" + "01" + "cb00714d" + "20" + "02" + "0701" + "39" + "0002" + "3634"; hex.EncodeToString(wire) != want {
		t.Fatalf("Mirai order %x, want %s", wire, want)
	}
	if got, err := DecodeMiraiOrder(wire[2:]); err != nil || got != o {
		t.Fatalf("Mirai: %+v, %v", got, err)
	}
	line := GafgytOrder(o)
	if line != "!* UDP 203.0.113.77 9 4 32 0 10\n" {
		t.Fatalf("Gafgyt order %q", line)
	}
	if got, err := ParseGafgytOrder(strings.TrimSuffix(line, "\n")); err != nil || got != o {
		t.Fatalf("Gafgyt: %+v, %v", got, err)
	}
	line = IRCOrder(o)
	if line != ":op!op@c2.example PRIVMSG #tb :!udp 203.0.113.77 9 4\r\n" {
		t.Fatalf("IRC order %q", line)
	}
	m := ParseIRC(strings.TrimSuffix(line, "\r\n"))
	if m.Command != "PRIVMSG" || len(m.Params) != 1 || m.Params[0] != "#tb" {
		t.Fatalf("IRC message %+v", m)
	}
	if got, err := ParseIRCOrder(m.Trailing); err != nil || got != o {
		t.Fatalf("IRC: %+v, %v", got, err)
	}
	if got, err := ParseOrder(o.String()); err != nil || got != o {
		t.Fatalf("HTTP task: %+v, %v", got, err)
	}
}

func TestHelloAndRegistrations(t *testing.T) {
	hello := MiraiHello("bot-7")
	if !bytes.Equal(hello, []byte("\x00\x00\x00\x01\x05bot-7")) {
		t.Fatalf("hello %q", hello)
	}
	for n := range hello {
		if id, used, err := ReadMiraiHello(hello[:n]); err != nil || used != 0 || id != "" {
			t.Fatalf("partial hello of %d bytes: %q %d %v", n, id, used, err)
		}
	}
	if id, n, err := ReadMiraiHello(append(hello, 0, 0)); id != "bot-7" || n != len(hello) || err != nil {
		t.Fatalf("hello: %q %d %v", id, n, err)
	}
	for _, bad := range []string{"\x00\x00\x00\x00\x01a", "\x01\x00\x00\x01\x01a", "\x00\x00\x00\x01\x21" + strings.Repeat("a", 33), "\x00\x00\x00\x01\x02a\n", "\x00\x00\x00\x01\x00"} {
		if _, _, err := ReadMiraiHello([]byte(bad)); err == nil {
			t.Errorf("hello %q accepted", bad)
		}
	}
	if got := IRCRegister("bot-7"); got != "NICK bot-7\r\nUSER bot-7 0 * :talkbox\r\n" {
		t.Fatalf("IRC registration %q", got)
	}
	for _, id := range []string{"", "a b", strings.Repeat("x", MaxID+1), "bot\x00", "bot\xff"} {
		if ValidID(id) {
			t.Errorf("ID %q valid", id)
		}
	}
}

// Orders from a hostile C2: cut short, lying about their parts, or asking
// for what the beacon does not do, are errors, never a panic.
func TestDecodersRefuseMalformedOrders(t *testing.T) {
	good := MiraiOrder(Order{Vector: "udpplain", Target: netip.MustParseAddr("192.0.2.1"), Port: 9, Seconds: 3})[2:]
	for n := range good {
		if _, err := DecodeMiraiOrder(good[:n]); err == nil {
			t.Errorf("order cut to %d bytes accepted", n)
		}
	}
	mutate := func(i int, v byte) []byte {
		b := bytes.Clone(good)
		b[i] = v
		return b
	}
	for name, b := range map[string][]byte{
		"unknown vector":    mutate(4, 200),
		"no targets":        mutate(5, 0),
		"two targets":       mutate(5, 2),
		"a prefix":          mutate(10, 24),
		"too many options":  mutate(11, 9),
		"option too long":   mutate(13, 200),
		"trailing bytes":    append(bytes.Clone(good), 0),
		"no duration":       append([]byte{0, 0, 0, 0}, good[4:]...),
		"port not a number": bytes.Replace(bytes.Clone(good), []byte{7, 1, '9'}, []byte{7, 1, 'x'}, 1),
		"port zero":         bytes.Replace(bytes.Clone(good), []byte{7, 1, '9'}, []byte{7, 1, '0'}, 1),
		"no port":           bytes.Replace(bytes.Clone(good), []byte{7, 1, '9'}, []byte{6, 1, '9'}, 1),
	} {
		if o, err := DecodeMiraiOrder(b); err == nil {
			t.Errorf("%s: accepted as %q", name, o)
		}
	}
	for _, line := range []string{"!* UDP 192.0.2.1 9", "!* UDP 192.0.2.1 x 5", "!* UDP 2001:db8::1 9 5", "!* UDP 192.0.2.1 9 0", "!* UDP 192.0.2.1 70000 5", "!* KILLATTK", "UDP 192.0.2.1 9 5", "!* FOO 192.0.2.1 9 5"} {
		if o, err := ParseGafgytOrder(line); err == nil {
			t.Errorf("Gafgyt %q accepted as %q", line, o)
		}
	}
	for _, text := range []string{"udp 192.0.2.1 9 5", "!udp 192.0.2.1 9", "!udp 192.0.2.1 9 5 extra", "!udp host.example 9 5", "!udp 192.0.2.1 9 99999999999"} {
		if o, err := ParseIRCOrder(text); err == nil {
			t.Errorf("IRC %q accepted as %q", text, o)
		}
	}
}

func TestParseIRCSplitsPrefixParamsAndTrailing(t *testing.T) {
	for line, want := range map[string]IRCMessage{
		"PING :c2.example":               {Command: "PING", Params: []string{}, Trailing: "c2.example"},
		":c2.example 001 bot-7 :Welcome": {Command: "001", Params: []string{"bot-7"}, Trailing: "Welcome"},
		"ping x":                         {Command: "PING", Params: []string{"x"}},
		":only-a-prefix":                 {Params: []string{}},
		"":                               {Params: []string{}},
		"JOIN " + strings.Repeat("#a ", 40) + ":x": {Command: "JOIN", Params: strings.Fields(strings.Repeat("#a ", 15)), Trailing: "x"},
	} {
		got := ParseIRC(line)
		if got.Command != want.Command || got.Trailing != want.Trailing || strings.Join(got.Params, " ") != strings.Join(want.Params, " ") {
			t.Errorf("ParseIRC(%q) = %+v, want %+v", line, got, want)
		}
	}
}
