package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"math"
	"net/netip"
	"os"
	"strconv"
	"testing"

	"github.com/google/gopacket/layers"
	"github.com/rogpeppe/go-internal/testscript"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/clitest"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"tb-parse": main})
}

func TestScripts(t *testing.T) {
	cmds := clitest.Cmds()
	cmds["mkpcap"] = mkpcap
	cmds["mkbotpcap"] = mkbotpcap
	cmds["putblob"] = putblob
	cmds["cut"] = cut
	cmds["poke"] = poke
	cmds["expand"] = expand
	testscript.Run(t, testscript.Params{Dir: "testdata/script", Setup: clitest.Setup, Cmds: cmds})
}

var (
	lab      = netip.MustParseAddr("10.13.37.5")
	resolver = netip.MustParseAddr("10.13.37.1")
	c2       = netip.MustParseAddr("203.0.113.7")
	other    = netip.MustParseAddr("198.51.100.9")
)

// mkpcap PATH [ng] [gz] [nano] [vlan] [sll] [beacons=N] [scan=N]: writes a
// capture of a sample that resolves c2.example, fetches a URL from it, opens
// TLS to it with SNI, and is refused by another host; scan=N adds a telnet
// scan of N addresses of 198.51.100.0/24 and 203.0.113.0/24 (N ≤ 500),
// every tenth one answering.
func mkpcap(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 {
		ts.Fatalf("usage: mkpcap PATH [ng] [gz] [nano] [vlan] [sll] [beacons=N]")
	}
	var opt pcapgen.Options
	gz := false
	beacons, scan := 1, 0
	for _, a := range args[1:] {
		switch {
		case a == "ng":
			opt.NG = true
		case a == "gz":
			gz = true
		case a == "nano":
			opt.Nano = true
		case a == "vlan":
			opt.VLAN = 10
		case a == "sll":
			opt.Link = layers.LinkTypeLinuxSLL
		case len(a) > 8 && a[:8] == "beacons=":
			n, err := strconv.Atoi(a[8:])
			ts.Check(err)
			beacons = n
		case len(a) > 5 && a[:5] == "scan=":
			n, err := strconv.Atoi(a[5:])
			ts.Check(err)
			scan = min(n, 500)
		default:
			ts.Fatalf("mkpcap: unknown option %q", a)
		}
	}
	var buf bytes.Buffer
	g, err := pcapgen.New(&buf, opt)
	ts.Check(err)
	g.DNSOverUDP(netip.AddrPortFrom(lab, 40000), netip.AddrPortFrom(resolver, 53),
		pcapgen.DNSQuery(7, "c2.example", layers.DNSTypeA),
		pcapgen.DNSResponse(7, "c2.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("c2.example", c2, 300)}))
	for i := 0; i < beacons; i++ {
		c := g.Dial(netip.AddrPortFrom(lab, uint16(41000+i)), netip.AddrPortFrom(c2, 80), uint32(i*1000), 77)
		c.Send(pcapgen.HTTPGet("c2.example", "/gate.php?bot=1", "tb-test-agent"))
		c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("sleep 60")))
		c.Close()
		g.T = g.T.Add(60e9)
	}
	c := g.Dial(netip.AddrPortFrom(lab, 42000), netip.AddrPortFrom(c2, 443), 5, 6)
	c.Send(pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x1301, 0xc02f}, Order: []uint16{0, 10, 11, 16, 43},
		SNI: "c2.example", Groups: []uint16{29}, PointFormats: []uint8{0}, ALPN: []string{"http/1.1"}, SupportedVersions: []uint16{0x0304}}))
	c.Close()
	g.Refused(netip.AddrPortFrom(lab, 43000), netip.AddrPortFrom(other, 6667), 1)
	for i := range scan {
		net := [2][3]byte{{198, 51, 100}, {203, 0, 113}}[i/250]
		dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{net[0], net[1], net[2], byte(1 + i%250)}), 23)
		src := netip.AddrPortFrom(lab, uint16(50000+i))
		if i%10 == 0 {
			g.Dial(src, dst, uint32(i), 9).Reset()
		} else {
			g.Refused(src, dst, uint32(i))
		}
		g.T = g.T.Add(10e6)
	}
	ts.Check(g.Flush())
	data := buf.Bytes()
	if gz {
		var z bytes.Buffer
		w := gzip.NewWriter(&z)
		w.Write(data)
		ts.Check(w.Close())
		data = z.Bytes()
	}
	ts.Check(os.WriteFile(ts.MkAbs(args[0]), data, 0o644))
}

// mkbotpcap PATH: writes a capture of bot command channels, each on an
// unusual port with its bytes split into small segments: a Mirai session
// (hello, ID, keep-alives, a SYN flood order) and its scanner's credential
// report, a Gafgyt session (registration, PING/PONG, a UDP flood order),
// an IRC session (NICK, USER, JOIN with a key, PING/PONG, an order in a
// channel message), HTTP polling every 30 s; and, as no channel, an
// ordinary HTTP exchange and a TLS handshake on 443; then the SYN flood
// the Mirai order asked for.
func mkbotpcap(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: mkbotpcap PATH")
	}
	var buf bytes.Buffer
	g, err := pcapgen.New(&buf, pcapgen.Options{})
	ts.Check(err)
	at := func(p uint16) netip.AddrPort { return netip.AddrPortFrom(c2, p) }
	bot := func(p uint16) netip.AddrPort { return netip.AddrPortFrom(lab, p) }
	g.MiraiSession(bot(40001), at(48101), "lab.mips", 3, pcapgen.MiraiOrder(30, 3, []netip.Prefix{netip.PrefixFrom(other, 32)},
		[]pcapgen.MiraiOption{{Key: 7, Value: "80"}}), 3)
	c := g.Dial(bot(40002), at(48102), 1, 1)
	c.MSS = 5
	c.Send(pcapgen.MiraiReport(netip.MustParseAddrPort("192.0.2.44:23"), "root", "xc3511"))
	c.Close()
	g.GafgytSession(bot(40003), at(666), "MIPSEL", 2, []string{"!* UDP 198.51.100.9 80 60 32 1024 10"}, 4)
	g.IRCSession(bot(40004), at(4444), "x86|lab", "#b0ts", "s3cret", 3, []string{"!udp 198.51.100.9 53 120"}, 7)
	g.HTTPPolls(lab, at(8080), "c2.example", "/gate.php", 5, 30e9)
	c = g.Dial(bot(40005), netip.AddrPortFrom(other, 80), 1, 1)
	c.Send(pcapgen.HTTPGet("www.example", "/", "Mozilla/5.0"))
	c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("hello")))
	c.Close()
	c = g.Dial(bot(40006), netip.AddrPortFrom(other, 443), 1, 1)
	c.Send(pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x1301}, Order: []uint16{0}, SNI: "www.example"}))
	c.Reply(pcapgen.ServerHelloRecord(0x0303, 0x1301))
	c.Close()
	// The order carried out: a second of SYNs to the target's port 80.
	g.T = g.T.Add(10e9)
	for i := 0; i < 1000; i++ {
		g.TCP(bot(uint16(20000+i)), netip.AddrPortFrom(other, 80), uint32(i), 0, pcapgen.SYN, nil)
	}
	ts.Check(g.Flush())
	ts.Check(os.WriteFile(ts.MkAbs(args[0]), buf.Bytes(), 0o644))
}

// putblob FILE VAR: stores FILE in the state's blob store and sets $VAR to
// its sha256.
func putblob(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: putblob FILE VAR")
	}
	st, err := state.Open(context.Background(), ts.Getenv("TB_STATE"))
	ts.Check(err)
	f, err := os.Open(ts.MkAbs(args[0]))
	ts.Check(err)
	defer f.Close()
	b, err := st.PutBlob(context.Background(), f)
	ts.Check(err)
	ts.Setenv(args[1], b.SHA256)
}

// cut FILE N: truncates FILE to N bytes, or drops -N bytes from its end.
func cut(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: cut FILE N")
	}
	n, err := strconv.Atoi(args[1])
	ts.Check(err)
	path := ts.MkAbs(args[0])
	fi, err := os.Stat(path)
	ts.Check(err)
	if n < 0 {
		n = int(fi.Size()) + n
	}
	ts.Check(os.Truncate(path, int64(n)))
}

// poke FILE OFFSET HEX: overwrites FILE's bytes at OFFSET (from its end
// when negative) with HEX.
func poke(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: poke FILE OFFSET HEX")
	}
	at, err := strconv.ParseInt(args[1], 10, 64)
	ts.Check(err)
	b, err := hex.DecodeString(args[2])
	ts.Check(err)
	f, err := os.OpenFile(ts.MkAbs(args[0]), os.O_WRONLY, 0)
	ts.Check(err)
	defer f.Close()
	if at < 0 {
		fi, err := f.Stat()
		ts.Check(err)
		at += fi.Size()
	}
	_, err = f.WriteAt(b, at)
	ts.Check(err)
}

// expand IN OUT: writes IN to OUT with $VARS replaced from the script's
// environment.
func expand(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: expand IN OUT")
	}
	b, err := os.ReadFile(ts.MkAbs(args[0]))
	ts.Check(err)
	ts.Check(os.WriteFile(ts.MkAbs(args[1]), []byte(os.Expand(string(b), ts.Getenv)), 0o644))
}

// TestExamples fails when a command has no --help example or an example no
// longer parses as its command (a renamed flag, a removed argument).
func TestExamples(t *testing.T) {
	for _, p := range cli.CheckExamples(tool(), &tbParse{}) {
		t.Error(p)
	}
}

func TestPrimeSize(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct{ n, limit, want int64 }{
		{100 << 10, memoryLimit, 0},        // too small to matter
		{mib, memoryLimit, 3 * mib},        // 3 times the inputs
		{1 << 30, memoryLimit, 96 * mib},   // 3/4 of the soft limit
		{1 << 30, math.MaxInt64, 96 * mib}, // GOMEMLIMIT=off: tb-parse's own bound
		{1 << 30, 16 * mib, 12 * mib},      // a lower GOMEMLIMIT
	} {
		if got := primeSize(c.n, c.limit); got != c.want {
			t.Errorf("primeSize(%d, %d) = %d, want %d", c.n, c.limit, got, c.want)
		}
	}
}
