package netlab_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// TestSinkholeCatchAll: a guest's TCP and UDP to a port the sinkhole serves
// nothing on (a bot's C2 on telnet's port or a high one) is accepted by
// INetSim's catch-all, which receives the bytes sent and sends nothing,
// while a served port still reaches its service; by the lab's default rule,
// by a lease's redirect verdict and straight to the sinkhole's address (a
// resolved name) alike. Nothing leaves by the uplink.
func TestSinkholeCatchAll(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	cfg.DNS, cfg.INetSim = true, true
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	c2 := netip.MustParseAddr("198.51.100.242")
	def := l.AddGuest("g1", netip.MustParseAddr("10.13.37.10"))
	red := l.AddGuest("g2", netip.MustParseAddr("10.13.37.11"))
	for _, g := range []*labtest.Guest{def, red} {
		if err := netlab.AttachPort(ctx, cfg, g.LabPort()); err != nil {
			t.Fatal(err)
		}
	}
	fw, err := cfg.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	var elems []firewall.Element
	for _, e := range []struct {
		proto string
		port  uint16
	}{{"tcp", 23}, {"tcp", 48101}, {"tcp", 80}, {"udp", 48101}, {"udp", 7}} {
		elems = append(elems, firewall.Element{Dst: c2, Proto: e.proto, Port: e.port, Verdict: firewall.Redirect})
	}
	if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: records.NewID("lease", time.Now()), IP: red.IP, Port: red.Port, Elements: elems}); err != nil {
		t.Fatal(err)
	}

	sinkhole := cfg.Sinkhole()
	sink := l.Sniff(cfg.SinkNS, cfg.SinkVeth+"p")
	inet := l.Sniff(l.Internet, l.InternetIf)
	logs := watchDir(t, netlab.LogDir(&cfg, "inetsim"))
	const catchAll = 1 // dummy_bind_port

	// A bot that waits for its C2 to speak first: INetSim's catch-all
	// sends its banner after 5 silent seconds unless told not to.
	var silent net.Conn
	labtest.In(t, def.NS, func() (err error) {
		silent, err = net.DialTimeout("tcp", netip.AddrPortFrom(c2, 48101).String(), wait)
		return err
	})
	defer silent.Close()
	silentSince := time.Now()

	for _, g := range []struct {
		name  string
		guest *labtest.Guest
		dst   netip.Addr
	}{{"default rule", def, c2}, {"lease redirect", red, c2}, {"resolved name", def, sinkhole}} {
		t.Run(g.name, func(t *testing.T) {
			from := func(p labtest.Packet) bool { return p.Src == g.guest.IP && p.Dst == sinkhole }
			for _, port := range []uint16{23, 48101} {
				hello := "hello-" + strings.ReplaceAll(g.name, " ", "-") + "-tcp-" + netip.AddrPortFrom(g.dst, port).String()
				var c net.Conn
				labtest.In(t, g.guest.NS, func() (err error) {
					c, err = net.DialTimeout("tcp", netip.AddrPortFrom(g.dst, port).String(), wait)
					return err
				})
				if _, err := c.Write([]byte(hello + "\n")); err != nil {
					t.Fatal(err)
				}
				sink.Wait(t, "tcp to port "+hello+" at the catch-all", wait, func(p labtest.Packet) bool {
					return from(p) && p.Proto == "tcp" && p.DstPort == catchAll && strings.Contains(string(p.Payload), hello)
				})
				logs.waitFor(t, "service.log", "recv: "+hello)
				c.Close()
			}
			hello := "hello-" + strings.ReplaceAll(g.name, " ", "-") + "-udp"
			sendUDP(t, g.guest.NS, netip.AddrPortFrom(g.dst, 48101).String(), []byte(hello))
			sink.Wait(t, "udp to port 48101 at the catch-all", wait, func(p labtest.Packet) bool {
				return from(p) && p.Proto == "udp" && p.DstPort == catchAll && string(p.Payload) == hello
			})
			logs.waitFor(t, "service.log", "recv: "+hello)

			// Served ports keep theirs: HTTP and UDP echo answer.
			if body := httpGet(t, g.guest.NS, netip.AddrPortFrom(g.dst, 80).String()); !strings.Contains(body, "INetSim") {
				t.Fatalf("port 80 was not answered by INetSim's HTTP: %.200q", body)
			}
			labtest.In(t, g.guest.NS, func() error {
				c, err := net.Dial("udp", netip.AddrPortFrom(g.dst, 7).String())
				if err != nil {
					return err
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(wait))
				if _, err := c.Write([]byte("echo me")); err != nil {
					return err
				}
				buf := make([]byte, 64)
				n, err := c.Read(buf)
				if err != nil || string(buf[:n]) != "echo me" {
					t.Errorf("udp port 7 was not echoed by INetSim: %q %v", buf[:n], err)
				}
				return nil
			})
		})
	}

	t.Run("the catch-all sends nothing", func(t *testing.T) {
		// INetSim's default banner wait is 5 s: a second more, counted
		// from the connection, and a banner would have been read.
		silent.SetReadDeadline(silentSince.Add(6 * time.Second))
		buf := make([]byte, 256)
		n, err := silent.Read(buf)
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("the catch-all spoke first: %q (%v)", buf[:n], err)
		}
	})

	// A marker down the default path: everything sent before it has been
	// delivered (or not) by the time it arrives.
	sendUDP(t, def.NS, "192.0.2.99:4444", []byte("marker"))
	sink.Wait(t, "sinkhole marker", wait, func(p labtest.Packet) bool { return string(p.Payload) == "marker" })
	if leaked := inet.Seen(func(p labtest.Packet) bool {
		noise := p.Proto == "icmp6" && p.Dst.IsMulticast()
		return !noise && p.Proto != "other"
	}); len(leaked) > 0 {
		t.Errorf("packets left by the uplink: %v", leaked)
	}
}
