package allowlist

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/parsejob"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// writeCapture writes a capture with write and returns its path.
func writeCapture(t *testing.T, write func(g *pcapgen.Gen)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cycle.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := pcapgen.New(f, pcapgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	write(g)
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
	return path
}

// parsed is what tb-parse prints of a capture written by write.
func parsed(t *testing.T, write func(g *pcapgen.Gen)) []*records.Observable {
	t.Helper()
	return tbParse(t, parsejob.Request{Inputs: []string{writeCapture(t, write)}, NoStore: true})
}

// TestBotChannelAndAttackTarget: a Mirai command channel kept alive over
// one connection to an unnamed address is enough to promote it, and says
// so; the address the bot then floods is never promoted, whatever else it
// looks like, and says why.
func TestBotChannelAndAttackTarget(t *testing.T) {
	c2 := netip.MustParseAddrPort("198.51.100.7:48101")
	victim := netip.MustParseAddr("203.0.113.9")
	obs := parsed(t, func(g *pcapgen.Gen) {
		miraiFlood(g, c2, victim)
		// And connections to the victim's web server that would look
		// like a beacon on their own.
		for i := 0; i < 8; i++ {
			g.T = pcapgen.Start.Add(time.Duration(i) * time.Minute)
			c := g.Dial(netip.AddrPortFrom(guest, uint16(41000+i)), netip.AddrPortFrom(victim, 80), uint32(i*100), 9000)
			c.Send(pcapgen.HTTPGet("203.0.113.9", "/", "x"))
			c.Close()
		}
	})
	pol, err := LoadPolicy("")
	if err != nil {
		t.Fatal(err)
	}
	pol.Documentation = true
	var c2Dest, victimDest *Dest
	for _, d := range Classify(obs, &pol) {
		switch d.Value {
		case c2.String() + "/tcp":
			c2Dest = &d
		case netip.AddrPortFrom(victim, 80).String() + "/tcp":
			victimDest = &d
		}
	}
	if c2Dest == nil || c2Dest.Class != ClassC2 || c2Dest.Score < pol.PromoteScore || !strings.Contains(c2Dest.Reason, "a mirai command channel (mirai, 4 keep-alives)") {
		t.Errorf("the C2: %+v", c2Dest)
	}
	if victimDest == nil || victimDest.Class != ClassAbuse || !strings.Contains(victimDest.Reason, "the target of a") {
		t.Errorf("the attack's target: %+v", victimDest)
	}
}

// TestBotChannelOnTheScannedPort: Mirai's C2 listens on the telnet port
// its bots scan; a live channel to it stands out from the scan, while the
// scanned addresses stay a scan.
func TestBotChannelOnTheScannedPort(t *testing.T) {
	c2 := netip.MustParseAddrPort("198.51.100.242:23")
	obs := parsed(t, func(g *pcapgen.Gen) {
		g.T = pcapgen.Start
		g.MiraiSession(netip.AddrPortFrom(guest, 40001), c2, "bot-7", 4, nil, 1460)
		for i := 1; i <= 64; i++ {
			g.Unanswered(netip.AddrPortFrom(guest, uint16(42000+i)), netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), 23), uint32(i), 1)
		}
	})
	pol, err := LoadPolicy("")
	if err != nil {
		t.Fatal(err)
	}
	pol.Documentation = true
	var c2Dest *Dest
	scanned := 0
	for _, d := range Classify(obs, &pol) {
		switch {
		case d.Value == c2.String()+"/tcp":
			c2Dest = &d
		case d.Class == ClassScan:
			scanned++
		}
	}
	if c2Dest == nil || c2Dest.Class != ClassC2 || !strings.Contains(c2Dest.Reason, "a mirai command channel") || !strings.Contains(c2Dest.Reason, "stands out from the scan") {
		t.Errorf("the C2 on the scanned port: %+v", c2Dest)
	}
	if scanned == 0 {
		t.Error("the scan was not classified as one")
	}
}

// TestBotRegistrationAlone: a Gafgyt or IRC bot registers, then waits for
// its C2's PING; with the C2 sinkholed (a silent connection) that is all a
// cycle shows, and it is enough for probation.
func TestBotRegistrationAlone(t *testing.T) {
	for _, tc := range []struct {
		proto string
		write func(g *pcapgen.Gen, bot, c2 netip.AddrPort)
	}{
		{"gafgyt", func(g *pcapgen.Gen, bot, c2 netip.AddrPort) {
			c := g.Dial(bot, c2, 100, 9000)
			c.Send([]byte("BUILD TALKBOX\n"))
		}},
		{"irc", func(g *pcapgen.Gen, bot, c2 netip.AddrPort) {
			c := g.Dial(bot, c2, 100, 9000)
			c.Send([]byte("NICK bot-7\r\nUSER bot-7 0 * :talkbox\r\n"))
		}},
	} {
		t.Run(tc.proto, func(t *testing.T) {
			c2 := netip.MustParseAddrPort("198.51.100.242:666")
			obs := parsed(t, func(g *pcapgen.Gen) {
				g.T = pcapgen.Start
				tc.write(g, netip.AddrPortFrom(guest, 40001), c2)
			})
			pol, err := LoadPolicy("")
			if err != nil {
				t.Fatal(err)
			}
			pol.Documentation = true
			var c2Dest *Dest
			for _, d := range Classify(obs, &pol) {
				if d.Value == c2.String()+"/tcp" {
					c2Dest = &d
				}
			}
			if c2Dest == nil || c2Dest.Class != ClassC2 || c2Dest.Score < pol.PromoteScore || !strings.Contains(c2Dest.Reason, "the bot registered") {
				t.Errorf("the C2 after the bot's registration alone: %+v", c2Dest)
			}
		})
	}
}
