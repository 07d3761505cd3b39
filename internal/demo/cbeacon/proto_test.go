package cbeacon

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/botproto"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

// protoDriver compiles testdata/proto_driver.c with proto.c and policy.c
// only, for the host, under AddressSanitizer and UBSan: a read past the
// bytes a C2 sent, or an overflow, aborts the driver and fails the test.
func protoDriver(t *testing.T) func(args ...string) []string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatal("gcc missing: run scripts/deps.sh test")
	}
	bin := filepath.Join(t.TempDir(), "proto_driver")
	if out, err := exec.Command(cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-g", "-fsanitize=address,undefined",
		"-fno-sanitize-recover=all", "-o", bin, "testdata/proto_driver.c", "proto.c", "policy.c").CombinedOutput(); err != nil {
		t.Fatalf("building the proto driver: %v\n%s", err, out)
	}
	return func(args ...string) []string {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("proto_driver %s (%d arguments): %v\n%.2000s", args[0], len(args), err, out)
		}
		s := strings.TrimSuffix(string(out), "\n")
		if s == "" {
			return nil
		}
		return strings.Split(s, "\n")
	}
}

func hexOf(s string) string { return hex.EncodeToString([]byte(s)) }

// orders collects what botproto decodes from the C2's side.
type orders []botproto.Command

func (o *orders) Command(_ int, c *botproto.Command) { *o = append(*o, *c) }

// recognise feeds a conversation to botproto as tb-parse would read it:
// the bot's side is the originator's.
func recognise(t *testing.T, turns ...turn) (botproto.Channel, bool, orders) {
	t.Helper()
	var c botproto.Conv
	var got orders
	c.Reset(botproto.Sniff(turns[0].b), turns[0].dir)
	for i, tn := range turns {
		c.Feed(tn.dir, int64(i+1)*5e9, tn.b, &got)
	}
	ch, ok := c.Channel()
	return ch, ok, got
}

type turn struct {
	dir int // 0 the bot, 1 the C2
	b   []byte
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(s, "reply="), "ping reply="), "welcome reply="))
	if err != nil {
		t.Fatalf("driver said %q", s)
	}
	return b
}

// TestBotFramesAreTheSpecs: the C beacon's hello, keep-alive and answers
// are the bytes of the shared spec (the Go beacon's and the demo C2's), and
// tb-parse's recognisers take the conversation they make for the channel
// it is, with the identity, the channel and the keep-alives.
func TestBotFramesAreTheSpecs(t *testing.T) {
	run := protoDriver(t)
	const id = "tb-beacon"
	for _, c := range []struct {
		proto, hello, keepAlive string
		c2Says                  []string // what the C2 sends, each with the bot's answer (hex) or "" for none
		answers                 []string
		want                    botproto.Protocol
		identity, channel       string
	}{
		{"mirai", "\x00\x00\x00\x01\x09" + id, "\x00\x00", []string{"\x00\x00"}, []string{"keepalive"}, botproto.Mirai, id, ""},
		{"gafgyt", "BUILD TALKBOX\n", "", []string{"PING\n"}, []string{"ping reply=" + hexOf("PONG\n")}, botproto.Gafgyt, "BUILD TALKBOX", ""},
		{"irc", "NICK " + id + "\r\nUSER " + id + " 0 * :talkbox\r\n", "",
			[]string{":c2.example 001 " + id + " :Welcome\r\n", "PING :c2.example\r\n"},
			[]string{"welcome reply=" + hexOf("JOIN #tb beacon\r\n"), "ping reply=" + hexOf("PONG :c2.example\r\n")},
			botproto.IRC, "NICK " + id, "#tb beacon"},
	} {
		t.Run(c.proto, func(t *testing.T) {
			hello := run("hello", c.proto, id)[0]
			if hello != hexOf(c.hello) {
				t.Errorf("hello %s, want %s (%q)", hello, hexOf(c.hello), c.hello)
			}
			if ka := run("keepalive", c.proto); hexOf(c.keepAlive) != strings.Join(ka, "") {
				t.Errorf("keep-alive %q, want %x", ka, c.keepAlive)
			}
			turns := []turn{{0, unhex(t, hello)}}
			for i, say := range c.c2Says {
				got := run("feed", c.proto, hexOf(say))
				if len(got) != 1 || got[0] != c.answers[i] {
					t.Fatalf("C2 says %q: driver %q, want %q", say, got, c.answers[i])
				}
				turns = append(turns, turn{1, []byte(say)})
				if _, reply, ok := strings.Cut(got[0], "reply="); ok {
					turns = append(turns, turn{0, unhex(t, reply)})
				}
			}
			// Three periods of keep-alives: the bot's own and the C2's.
			for range 3 {
				if c.keepAlive != "" {
					turns = append(turns, turn{0, []byte(c.keepAlive)}, turn{1, []byte(c.c2Says[0])})
				} else {
					turns = append(turns, turns[len(turns)-2:]...)
				}
			}
			ch, ok, _ := recognise(t, turns...)
			if !ok || ch.Protocol != c.want || ch.BotDir != 0 || ch.KeepAlives < 3 || len(ch.Identities) == 0 || ch.Identities[0] != c.identity {
				t.Fatalf("botproto reads %+v (recognised %v)", ch, ok)
			}
			if c.channel != "" && (len(ch.Channels) != 1 || ch.Channels[0] != c.channel) {
				t.Errorf("channels %q, want %q", ch.Channels, c.channel)
			}
		})
	}
}

// driverOrder is one "order ..." line of the driver, parsed.
type driverOrder struct {
	proto, vector, target, result string
	targets                       int
	port, seconds, len, netmask   int64
}

var orderLine = regexp.MustCompile(`^order proto=(\S+) vector=(\S*) targets=(\d+) target=(\S+) port=(-?\d+) seconds=(-?\d+) len=(-?\d+) netmask=(-?\d+): (.*)$`)

func parseOrder(t *testing.T, line string) (driverOrder, bool) {
	t.Helper()
	m := orderLine.FindStringSubmatch(line)
	if m == nil {
		return driverOrder{}, false
	}
	n := func(s string) int64 {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		return v
	}
	return driverOrder{proto: m[1], vector: m[2], targets: int(n(m[3])), target: m[4], port: n(m[5]), seconds: n(m[6]),
		len: n(m[7]), netmask: n(m[8]), result: m[9]}, true
}

// feedAll feeds each stream to a session of its own, in one run of the
// driver: what each session printed.
func feedAll(run func(...string) []string, proto string, streams [][]string) [][]string {
	args := []string{"feed", proto}
	for _, s := range streams {
		args = append(append(args, s...), "--")
	}
	var out [][]string
	var cur []string
	for _, line := range run(args...) {
		if line == "--" {
			out = append(out, cur)
			cur = nil
			continue
		}
		cur = append(cur, line)
	}
	return out
}

// chunks splits b at random points: the driver reads each as one recv.
func chunks(r *rand.Rand, b []byte) []string {
	var out []string
	for len(b) > 0 {
		n := 1 + r.IntN(len(b))
		out = append(out, hex.EncodeToString(b[:n]))
		b = b[n:]
	}
	return out
}

func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// TestMiraiOrdersDecodeAsBotproto feeds the C beacon's decoder and
// tb-parse's recogniser the same C2 bytes: valid orders, orders that are
// truncated, oversized, whose lengths lie, and random mutations of them.
// Both must find the same orders, with the same vector, target, duration
// and port; the C decoder must never read past the bytes (the driver runs
// under AddressSanitizer) and must end the session on a length Mirai's bot
// refuses.
func TestMiraiOrdersDecodeAsBotproto(t *testing.T) {
	run := protoDriver(t)
	r := rand.New(rand.NewPCG(28, 3))
	spec := func(dur uint32, vec byte, target string, opts ...pcapgen.MiraiOption) []byte {
		return pcapgen.MiraiOrder(dur, vec, []netip.Prefix{prefix(target)}, opts)
	}
	dport := func(v string) pcapgen.MiraiOption { return pcapgen.MiraiOption{Key: 7, Value: v} }
	size := pcapgen.MiraiOption{Key: 0, Value: "64"}
	valid := spec(4, 0, "203.0.113.77/32", dport("9"), size)
	if got := hex.EncodeToString(valid); got != "0015"+"00000004"+"00"+"01"+"cb00714d"+"20"+"02"+"0701"+"39"+"0002"+"3634" {
		t.Fatalf("the spec's order is %s", got) // botwire.md's example, byte for byte
	}
	lying := func(b []byte, at int, v byte) []byte {
		b = append([]byte(nil), b...)
		b[at] = v
		return b
	}
	cases := [][]byte{
		valid,
		spec(1, 9, "192.0.2.5/32", dport("9"), size),
		spec(5, 0, "198.51.100.255/32", dport("65535")),
		spec(6, 0, "198.51.100.1/32", dport("9")),
		spec(0xffffffff, 9, "192.0.2.1/32", dport("53"), dport("54")),
		spec(0, 0, "192.0.2.1/32", dport("9")),
		spec(4, 3, "192.0.2.1/32", dport("9")),   // syn: decoded, refused
		spec(4, 200, "192.0.2.1/32", dport("9")), // an unknown vector
		spec(4, 0, "192.0.2.0/24", dport("9")),
		spec(4, 0, "8.8.8.8/32", dport("9")),
		spec(4, 0, "10.13.37.5/32", dport("9")),
		spec(4, 0, "127.0.0.1/32", dport("9")),
		spec(4, 0, "192.0.2.1/32"),
		spec(4, 0, "192.0.2.1/32", dport("0")),
		spec(4, 0, "192.0.2.1/32", dport("65536")),
		spec(4, 0, "192.0.2.1/32", dport("x9")),
		spec(4, 0, "192.0.2.1/32", dport(""), pcapgen.MiraiOption{Key: 200, Value: strings.Repeat("z", 255)}),
		pcapgen.MiraiOrder(4, 0, []netip.Prefix{prefix("192.0.2.1/32"), prefix("192.0.2.2/32")}, []pcapgen.MiraiOption{dport("9")}),
		lying(valid, 1, 0x14),             // claims one byte less than its parts
		append(lying(valid, 1, 0x16), 0),  // one byte more: a byte left over
		lying(valid, 19, 9),               // the len option claims more than there is
		lying(valid, 9, 200),              // 200 targets in 21 bytes
		lying(valid, 10, 33),              // a /33
		lying(valid, 11, 255),             // 255 options
		{0x00, 0x02},                      // an order of nothing
		{0x00, 0x09, 0, 0, 0, 4, 0, 0, 0}, // no target
	}
	for range 3000 {
		b := append([]byte(nil), cases[r.IntN(len(cases))]...)
		for range 1 + r.IntN(3) {
			i := r.IntN(len(b))
			if i < 2 && len(b) > 2 && r.IntN(4) != 0 {
				i = 2 + r.IntN(len(b)-2) // mostly inside: the framing is the next cases'
			}
			b[i] = byte(r.IntN(256))
		}
		cases = append(cases, b)
	}
	// Framing the bot refuses: the session ends, no order decoded.
	for _, bad := range [][]byte{{0x00, 0x01}, {0x04, 0x01}, {0xff, 0xff}} {
		got := run(append([]string{"feed", "mirai"}, chunks(r, append(append([]byte{0, 0}, bad...), valid...))...)...)
		if len(got) != 2 || got[0] != "keepalive" || !strings.HasPrefix(got[1], "bad: mirai message length") {
			t.Errorf("length %x: %q, want a keep-alive then the session's end", bad, got)
		}
	}
	// Truncated: an order cut short is waited for, never decoded.
	for n := range len(valid) {
		if got := run("feed", "mirai", "0000", hex.EncodeToString(valid[:n])); len(got) != 1 || got[0] != "keepalive" {
			t.Errorf("order cut at %d bytes: %q", n, got)
		}
	}

	decoded := 0
	streams := make([][]byte, len(cases))
	var fed [][]string
	for i, order := range cases {
		// The echo of a keep-alive before and after: the framing goes on.
		streams[i] = append(append([]byte{0, 0}, order...), 0, 0)
		fed = append(fed, chunks(r, streams[i]))
	}
	outs := feedAll(run, "mirai", fed)
	if len(outs) != len(cases) {
		t.Fatalf("%d sessions for %d cases", len(outs), len(cases))
	}
	for i, order := range cases {
		stream, got := streams[i], outs[i]
		_, ok, bp := recognise(t, turn{0, pcapgen.MiraiHello("tb-beacon")}, turn{0, []byte{0, 0}}, turn{1, stream})
		if !ok {
			t.Fatalf("case %d: botproto lost the channel", i)
		}
		// Whatever follows an order that lied about its length is framed
		// as the next message, by both.
		if len(got) == 0 || got[0] != "keepalive" || slices.Contains(got, "stuck") {
			t.Errorf("case %d (%x): %q", i, order, got)
			continue
		}
		if l := int(order[0])<<8 | int(order[1]); (l < 2 || l > 1024) && !strings.HasPrefix(got[len(got)-1], "bad: ") {
			t.Errorf("case %d (%x) of length %d: %q", i, order, l, got)
		}
		var ours []driverOrder
		for _, line := range got {
			if o, ok := parseOrder(t, line); ok {
				ours = append(ours, o)
			}
		}
		if len(ours) != len(bp) {
			t.Errorf("case %d (%x): C decodes %d orders, botproto %d\nC: %q\nbotproto: %+v", i, order, len(ours), len(bp), got, bp)
			continue
		}
		for j, o := range ours {
			decoded++
			b := bp[j]
			if b.Vector != o.vector || len(b.Targets) == 0 || b.Targets[0] != o.target || b.Duration != o.seconds {
				t.Errorf("case %d (%x): C %+v, botproto %+v", i, order, o, b)
			}
			wantPort := int64(-1)
			if len(b.Ports) > 0 {
				if p, err := strconv.ParseUint(b.Ports[0], 10, 16); err == nil && p > 0 && !strings.ContainsAny(b.Ports[0], "+-") {
					wantPort = int64(p)
				}
			}
			if o.port != wantPort {
				t.Errorf("case %d (%x): C port %d, botproto ports %q", i, order, o.port, b.Ports)
			}
			checkPolicy(t, fmt.Sprintf("case %d (%x)", i, order), o)
		}
	}
	// Each message alone, from a buffer of exactly its size: the decoder
	// reads nothing past it (AddressSanitizer), and finds an order where
	// botproto does.
	var whole [][]byte
	for _, order := range cases {
		if l := int(order[0])<<8 | int(order[1]); l >= 2 && l <= 1024 && l <= len(order) {
			whole = append(whole, order[:l])
		}
	}
	var args []string
	for _, m := range whole {
		args = append(args, hex.EncodeToString(m))
	}
	alone := run(append([]string{"order"}, args...)...)
	for i, m := range whole {
		_, _, bp := recognise(t, turn{0, pcapgen.MiraiHello("tb-beacon")}, turn{1, m})
		if (alone[i] != "none") != (len(bp) == 1) {
			t.Errorf("order %x alone: C %q, botproto %+v", m, alone[i], bp)
		}
	}
	if decoded < 100 {
		t.Errorf("only %d orders decoded: the cases do not exercise the decoder", decoded)
	}
}

// checkPolicy holds an order's outcome to the spec: carried out only for
// udp or udpplain (Gafgyt's udp alone) at one documentation address with a
// port and a duration, as at most 5 s of 200 packets a second.
func checkPolicy(t *testing.T, name string, o driverOrder) {
	t.Helper()
	a, err := netip.ParsePrefix(o.target)
	doc := err == nil && a.Bits() == 32 && (prefix("192.0.2.0/24").Contains(a.Addr()) || prefix("198.51.100.0/24").Contains(a.Addr()) ||
		prefix("203.0.113.0/24").Contains(a.Addr()))
	vector := o.vector == "udp" || o.vector == "udpplain" && o.proto != "gafgyt"
	want := doc && vector && o.targets == 1 && o.port >= 1 && o.port <= 65535 && o.seconds >= 1 && (o.netmask == -1 || o.netmask == 32)
	if !want {
		if !strings.HasPrefix(o.result, "refused: ") {
			t.Errorf("%s: %+v carried out", name, o)
		}
		return
	}
	secs := min(o.seconds, 5)
	random := 0
	if o.vector == "udp" {
		random = 1
	}
	if w := fmt.Sprintf("ok to=%s:%d packets=%d gap_ns=5000000 duration_ns=%d random=%d", a.Addr(), o.port, secs*200, secs*1e9, random); o.result != w {
		t.Errorf("%s: %q, want %q", name, o.result, w)
	}
}

// TestTextOrdersDecodeAsBotproto: Gafgyt's and IRC's order lines, valid and
// not, each after the channel's registration, read by the C decoder and by
// botproto: the same orders, the same words; an over-long line skipped by
// both.
func TestTextOrdersDecodeAsBotproto(t *testing.T) {
	run := protoDriver(t)
	r := rand.New(rand.NewPCG(28, 4))
	long := strings.Repeat("x", 2000)
	cases := []struct {
		proto, line string
		order       bool // the C decoder reads an order (well formed or not)
	}{
		{"gafgyt", "!* UDP 203.0.113.77 9 4 32 0 10\n", true},
		{"gafgyt", "!* UDP 192.0.2.9 53 1 32 0 10\r\n", true},
		{"gafgyt", "!* udp 198.51.100.7 9 99 32 0 10\n", true},
		{"gafgyt", "!* UDP 192.0.2.9 9 4\n", true},
		{"gafgyt", "!* UDP 192.0.2.9 9 4 24 0 10\n", true},
		{"gafgyt", "!* UDPPLAIN 192.0.2.9 9 4 32 0 10\n", true},
		{"gafgyt", "!* TCP 192.0.2.9 9 4 32 all 0 10\n", true},
		{"gafgyt", "!* UDP 8.8.8.8 9 4 32 0 10\n", true},
		{"gafgyt", "!* UDP 10.13.37.1 9 4 32 0 10\n", true},
		{"gafgyt", "!* UDP 192.0.2.9 0 4 32 0 10\n", true},
		{"gafgyt", "!* UDP 192.0.2.9 9 0 32 0 10\n", true},
		{"gafgyt", "!* UDP 192.0.2.9 9 4294967296 32 0 10\n", true},
		{"gafgyt", "!* UDP 192.0.2.9 9 4294967295 32 0 10\n", true},
		{"gafgyt", "!* UDP c2.example 9 4 32 0 10\n", true},
		{"gafgyt", "!* UDP ::ffff:192.0.2.9 9 4 32 0 10\n", true},
		{"gafgyt", "!* KILLATTK\n", true},
		{"gafgyt", "!* \n", false},
		{"gafgyt", "!*UDP 192.0.2.9 9 4\n", false},
		{"gafgyt", "!* UDP " + long + " 9 4\n", false},
		{"irc", ":op!op@c2.example PRIVMSG #tb :!udp 203.0.113.77 9 4\r\n", true},
		{"irc", ":op!op@c2.example PRIVMSG #tb :!udpplain 203.0.113.77 9 6\r\n", true},
		{"irc", ":op PRIVMSG tb-beacon :!UDP 192.0.2.1 9 4\r\n", true},
		{"irc", ":op PRIVMSG #tb :!udp 192.0.2.1 9 4 extra\r\n", true},
		{"irc", ":op PRIVMSG #tb :!udp 192.0.2.1 9\r\n", true},
		{"irc", ":op PRIVMSG #tb :!syn 192.0.2.1 9 4\r\n", true},
		{"irc", ":op PRIVMSG #tb :!udp 203.0.114.1 9 4\r\n", true},
		{"irc", ":op PRIVMSG #tb :!udp 192.0.2.1 65536 4\r\n", true},
		{"irc", ":op PRIVMSG #tb :hello\r\n", false},
		{"irc", ":op PRIVMSG #tb :!udp " + long + "\r\n", false},
		{"irc", ":op NOTICE #tb :!udp 192.0.2.1 9 4\r\n", false},
	}
	// Random lines near the valid ones.
	for range 1500 {
		c := cases[r.IntN(2)]
		if r.IntN(2) == 0 {
			c = cases[19+r.IntN(2)]
		}
		b := []byte(c.line)
		for range 1 + r.IntN(3) {
			b[r.IntN(len(b)-2)] = " .0123456789!:*aUDP\x00\xff"[r.IntN(21)]
		}
		cases = append(cases, struct {
			proto, line string
			order       bool
		}{c.proto, string(b), false})
	}
	register := map[string][]turn{
		"gafgyt": {{0, []byte("BUILD TALKBOX\n")}, {1, []byte("PING\n")}, {0, []byte("PONG\n")}},
		"irc": {{0, []byte("NICK tb-beacon\r\nUSER tb-beacon 0 * :talkbox\r\n")}, {1, []byte(":c2.example 001 tb-beacon :Welcome\r\n")},
			{0, []byte("JOIN #tb beacon\r\n")}},
	}
	orders := 0
	ping := map[string]string{"gafgyt": "PING\n", "irc": "PING :c2.example\r\n"}
	fed := map[string][][]string{}
	for _, c := range cases {
		// The order line between two keep-alives: the framing goes on.
		fed[c.proto] = append(fed[c.proto], chunks(r, []byte(ping[c.proto]+c.line+ping[c.proto])))
	}
	outs := map[string][][]string{"gafgyt": feedAll(run, "gafgyt", fed["gafgyt"]), "irc": feedAll(run, "irc", fed["irc"])}
	for i, c := range cases {
		stream := []byte(ping[c.proto] + c.line + ping[c.proto])
		got := outs[c.proto][0]
		outs[c.proto] = outs[c.proto][1:]
		if len(got) < 2 || !strings.HasPrefix(got[0], "ping ") || !strings.HasPrefix(got[len(got)-1], "ping ") {
			t.Errorf("case %d %q: %q", i, c.line, got)
			continue
		}
		var ours []driverOrder
		for _, line := range got[1 : len(got)-1] {
			if o, ok := parseOrder(t, line); ok {
				ours = append(ours, o)
			} else if !strings.HasPrefix(line, "other: ") && !strings.HasPrefix(line, "ping ") {
				t.Errorf("case %d %q: %q", i, c.line, line)
			}
		}
		if c.order && len(ours) != 1 || i < 30 && !c.order && len(ours) != 0 {
			t.Errorf("case %d %q: %q", i, c.line, got)
			continue
		}
		_, ok, bp := recognise(t, append(register[c.proto], turn{1, stream})...)
		if !ok {
			t.Fatalf("case %d: botproto lost the channel", i)
		}
		for _, o := range ours {
			orders++
			if len(bp) != 1 {
				t.Errorf("case %d %q: C reads an order, botproto %d", i, c.line, len(bp))
				continue
			}
			checkPolicy(t, fmt.Sprintf("case %d %q", i, c.line), o)
			if strings.HasPrefix(o.result, "refused: want") || strings.HasPrefix(o.result, "refused: target is not") {
				continue // malformed: botproto reads whatever words it finds
			}
			b := bp[0]
			target, _ := netip.ParseAddr(strings.Join(b.Targets, ""))
			// The C decoder stops at the first malformed word, and keeps
			// only printable bytes (a '?' for others).
			bv := b.Vector
			if o.proto == "irc" {
				bv = strings.TrimPrefix(bv, "!")
			}
			vector := !strings.Contains(o.vector, "?") && !strings.EqualFold(bv, o.vector)
			if vector || target.Unmap().String()+"/32" != o.target {
				t.Errorf("case %d %q: C %+v, botproto %+v", i, c.line, o, b)
			}
			if o.port != -1 && (len(b.Ports) != 1 || strconv.FormatInt(o.port, 10) != strings.TrimLeft(b.Ports[0], "0")) {
				t.Errorf("case %d %q: C port %d, botproto %q", i, c.line, o.port, b.Ports)
			}
			if o.seconds != -1 && o.seconds < 1<<31 && b.Duration != o.seconds {
				t.Errorf("case %d %q: C %d s, botproto %d s", i, c.line, o.seconds, b.Duration)
			}
		}
	}
	if orders < 30 {
		t.Errorf("only %d orders read", orders)
	}
}

// TestAttackBudget: however many orders a C2 sends, the beacon plans at
// most 1,000 packets in its life, 5 s each at 200 a second, one attack at
// a time (the beacon's attack_start refuses one while another runs).
func TestAttackBudget(t *testing.T) {
	run := protoDriver(t)
	order := hex.EncodeToString(pcapgen.MiraiOrder(3, 9, []netip.Prefix{prefix("192.0.2.1/32")}, []pcapgen.MiraiOption{{Key: 7, Value: "9"}}))
	var args []string
	for range 5 {
		args = append(args, order)
	}
	got := run(append([]string{"feed", "mirai"}, args...)...)
	var planned int
	for i, line := range got {
		o, ok := parseOrder(t, line)
		if !ok {
			t.Fatalf("%q", got)
		}
		var n int
		if _, err := fmt.Sscanf(o.result, "ok to=192.0.2.1:9 packets=%d", &n); err == nil {
			planned += n
		} else if o.result != "refused: budget spent" || i < 2 {
			t.Errorf("order %d: %q", i, o.result)
		}
	}
	if planned != 1000 {
		t.Errorf("%d packets planned for 5 orders of 3 s, want the budget's 1000", planned)
	}
}

// TestHTTPTasks: the HTTP C2's task "udp TARGET PORT SECONDS" is an order
// under the same policy; "sleep" is none.
func TestHTTPTasks(t *testing.T) {
	run := protoDriver(t)
	for task, want := range map[string]string{
		"sleep":                       "none",
		"udp 203.0.113.77 9 4":        "ok to=203.0.113.77:9 packets=800 gap_ns=5000000 duration_ns=4000000000 random=1",
		"UDPPLAIN 198.51.100.2 53 60": "ok to=198.51.100.2:53 packets=1000 gap_ns=5000000 duration_ns=5000000000 random=0",
		"udp 8.8.8.8 9 4":             "refused: target 8.8.8.8 outside 192.0.2.0/24, 198.51.100.0/24 and 203.0.113.0/24",
		"udp 10.13.38.1 9 4":          "refused: target 10.13.38.1 outside 192.0.2.0/24, 198.51.100.0/24 and 203.0.113.0/24",
		"udp 192.0.2.1 9":             "refused: want VECTOR TARGET PORT SECONDS",
		"syn 192.0.2.1 9 4":           "refused: vector syn not carried out",
	} {
		got := run("task", task)[0]
		if o, ok := parseOrder(t, got); ok {
			got = o.result
		}
		if got != want {
			t.Errorf("task %q: %q, want %q", task, got, want)
		}
	}
}

// TestC2ProtoFlag: -c2-proto takes the four protocols, and the bot
// protocols announce -id, which must then be 1-32 printable bytes.
func TestC2ProtoFlag(t *testing.T) {
	run := driver(t)
	for _, c := range []struct {
		args []string
		want string // the end of the driver's line
	}{
		{[]string{"-c2", "x"}, "hostile="},
		{[]string{"-c2", "x", "-c2-proto", "http"}, "hostile="},
		{[]string{"-c2", "x", "-c2-proto", "mirai", "-port", "23"}, " proto=mirai"},
		{[]string{"-c2", "x", "-c2-proto=gafgyt"}, " proto=gafgyt"},
		{[]string{"-c2", "x", "-c2-proto=gafgyt", "-id", strings.Repeat("é", 4)}, "-id must be 1-32 printable ASCII bytes with -c2-proto gafgyt"},
		{[]string{"-c2", "x", "-id", strings.Repeat("é", 4)}, "hostile="},
		{[]string{"-c2", "x", "-c2-proto", "irc", "-id", strings.Repeat("n", 32)}, " proto=irc"},
		{[]string{"-c2", "x", "-c2-proto", "irc", "-id", strings.Repeat("n", 33)}, "-id must be 1-32 printable ASCII bytes with -c2-proto irc"},
		{[]string{"-c2", "x", "-c2-proto", "mirai", "-id", ""}, "-id must be 1-32 printable ASCII bytes with -c2-proto mirai"},
		{[]string{"-c2", "x", "-c2-proto", "mirai", "-id", "b\x7fot"}, "-id must be 1-32 printable ASCII bytes with -c2-proto mirai"},
		{[]string{"-c2", "x", "-c2-proto", "ftp"}, `invalid value "ftp" for flag -c2-proto`},
		{[]string{"-c2", "x", "-c2-proto", "MIRAI"}, `invalid value "MIRAI" for flag -c2-proto`},
	} {
		if got := run(append([]string{"args"}, c.args...)...)[0]; !strings.HasSuffix(got, c.want) {
			t.Errorf("%q: %q, want …%q", c.args, got, c.want)
		}
	}
}
