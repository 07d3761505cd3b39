package botproto

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

type orders []Command

func (o *orders) Command(_ int, c *Command) { *o = append(*o, *c) }

func hello(t testing.TB) *Conv {
	t.Helper()
	c := new(Conv)
	c.Reset(KindBinary, 0)
	c.Feed(0, 1, pcapgen.MiraiHello("x"), &orders{})
	if c.proto != Mirai {
		t.Fatal("hello not read")
	}
	return c
}

// A length a C2 claims decides no allocation: a Mirai order claiming
// 65535 bytes followed by a megabyte allocates nothing, decodes nothing,
// and the side is read no more.
func TestClaimedLengthAllocatesNothing(t *testing.T) {
	c := hello(t)
	c.Feed(1, 2, pcapgen.MiraiKeepAlive(), &orders{})
	junk := append([]byte{0xff, 0xff}, bytes.Repeat([]byte{7}, 1<<20)...)
	var got orders
	allocs := testing.AllocsPerRun(1, func() { c.Feed(1, 3, junk, &got) })
	if allocs != 0 || len(got) != 0 || !c.side[1].dead {
		t.Fatalf("%v allocations, %d orders, dead %v", allocs, len(got), c.side[1].dead)
	}
	if ch, ok := c.Channel(); !ok || ch.Protocol != Mirai {
		t.Fatal("the channel seen before is forgotten")
	}
}

// An order whose parts overrun its length, or leave bytes over, is no
// order; the framing goes on with the next message.
func TestMiraiOrderMustAddUp(t *testing.T) {
	good := pcapgen.MiraiOrder(10, 9, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, []pcapgen.MiraiOption{{Key: 7, Value: "53"}})
	long := append(bytes.Clone(good), 0)
	long[1]++
	short := bytes.Clone(good)
	short[len(short)-3] = 9 // the option's value claims more than is there
	c := hello(t)
	var got orders
	c.Feed(1, 2, append(append(long, short...), good...), &got)
	if len(got) != 1 || got[0].Text != "udpplain 198.51.100.0/24 10s dport=53" {
		t.Fatalf("%+v", got)
	}
}

// A line longer than the buffer is skipped, the next one read.
func TestLongLineSkipped(t *testing.T) {
	c := new(Conv)
	c.Reset(KindText, 1)
	var got orders
	c.Feed(1, 1, []byte("PING\n!* UDP "+string(bytes.Repeat([]byte{'9'}, 5000))+"\n!* STD 198.51.100.9 80 5\n"), &got)
	if len(got) != 1 || got[0].Vector != "STD" || got[0].Duration != 5 {
		t.Fatalf("%+v", got)
	}
}

// Nothing a sample sends reaches a record unescaped or unbounded.
func TestTextKeptPrintable(t *testing.T) {
	c := new(Conv)
	c.Reset(KindText, 0)
	c.Feed(0, 1, []byte("BUILD \x00\xff"+string(bytes.Repeat([]byte{'a'}, 400))+"\n"), &orders{})
	ch, ok := c.Channel()
	if !ok || len(ch.Identities) != 1 || !bytes.HasPrefix([]byte(ch.Identities[0]), []byte(`BUILD \x00\xffaaa`)) ||
		len(ch.Identities[0]) > maxText+8 {
		t.Fatalf("%q", ch.Identities)
	}
}

func FuzzConv(f *testing.F) {
	f.Add(byte(0), append(pcapgen.MiraiHello("id"), 0, 0), pcapgen.MiraiOrder(1, 0, []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32")}, nil))
	f.Add(byte(0), pcapgen.MiraiReport(netip.MustParseAddrPort("192.0.2.1:23"), "root", "x"), []byte{})
	f.Add(byte(1), []byte("NICK a\r\nUSER a a a :a\r\nJOIN #c k\r\n"), []byte(":s 001 a :hi\r\nPING :s\r\n:b PRIVMSG #c :!udp 1.2.3.4 5 6\r\n"))
	f.Add(byte(1), []byte("BUILD X\nPONG\n"), []byte("PING\n!* UDP 192.0.2.1 80 10\n"))
	f.Fuzz(func(t *testing.T, split byte, a, b []byte) {
		k := Sniff(a)
		if k == KindNone {
			k = KindText
		}
		c := new(Conv)
		c.Reset(k, 0)
		var got orders
		// Feed both sides in chunks of a size the input chooses.
		n := int(split%16) + 1
		for len(a) > 0 || len(b) > 0 {
			x, y := min(n, len(a)), min(n, len(b))
			c.Feed(0, 1, a[:x], &got)
			c.Feed(1, 2, b[:y], &got)
			a, b = a[x:], b[y:]
		}
		ch, _ := c.Channel()
		if len(ch.Identities) > maxList || len(ch.Channels) > maxList || len(ch.Reports) > maxList {
			t.Fatalf("lists unbounded: %+v", ch)
		}
		for _, o := range got {
			if len(o.Raw) > 2*maxBuf+8 || len(o.Targets) > maxList || len(o.Options) > maxFields {
				t.Fatalf("order unbounded: %+v", o)
			}
		}
		for i := range c.side {
			if c.side[i].n > maxBuf {
				t.Fatal("buffer overrun")
			}
		}
	})
}
