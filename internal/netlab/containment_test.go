package netlab_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

const wait = 5 * time.Second

// TestContainment runs the lab for real in namespaces and checks, from the
// packets each side actually received, that a guest reaches nothing but
// the sinkhole, except an allow-listed destination at its rate limit.
func TestContainment(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	cfg.DNS, cfg.INetSim = true, true
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// Up twice is the same lab.
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatalf("second up: %v", err)
	}

	g1 := l.AddGuest("g1", netip.MustParseAddr("10.13.37.10"))
	g2 := l.AddGuest("g2", netip.MustParseAddr("10.13.37.11"))
	for _, g := range []*labtest.Guest{g1, g2} {
		if err := netlab.AttachPort(ctx, cfg, g.LabPort()); err != nil {
			t.Fatal(err)
		}
	}
	fw, err := cfg.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	lease := records.NewID("lease", time.Now())
	rate, _ := firewall.ParseRate("64kbytes/second")
	err = fw.ApplyLease(ctx, firewall.LeaseRules{Lease: lease, IP: g1.IP, Port: g1.Port, Rate: rate, Elements: []firewall.Element{
		{Dst: labtest.C2, Proto: "tcp", Port: 8080, Verdict: firewall.Forward},
		{Dst: labtest.C2, Proto: "tcp", Port: 9090, Verdict: firewall.RateLimit},
		{Dst: labtest.Other, Proto: "tcp", Port: 8080, Verdict: firewall.Drop},
		{Dst: labtest.Other, Proto: "udp", Port: 7777, Verdict: firewall.Reflect},
	}})
	if err != nil {
		t.Fatal(err)
	}

	sink := l.Sniff(cfg.SinkNS, cfg.SinkVeth+"p")
	inet := l.Sniff(l.Internet, l.InternetIf)
	other := l.Sniff(g2.NS, "eth0")
	fromG1 := func(p labtest.Packet) bool { return p.Src == g1.IP }

	// The internet: a C2 with two ports and a resolver that knows c2.example.
	var c2Bytes atomic.Int64
	for _, port := range []string{"8080", "9090"} {
		var ln net.Listener
		labtest.In(t, l.Internet, func() (err error) {
			ln, err = net.Listen("tcp", net.JoinHostPort(labtest.C2.String(), port))
			return err
		})
		t.Cleanup(func() { ln.Close() })
		go serveCount(ln, &c2Bytes)
	}
	var upstreamQueries atomic.Int64
	var dnsConn net.PacketConn
	labtest.In(t, l.Internet, func() (err error) {
		dnsConn, err = net.ListenPacket("udp", net.JoinHostPort(labtest.Resolver.String(), "53"))
		return err
	})
	t.Cleanup(func() { dnsConn.Close() })
	go serveDNS(dnsConn, "c2.example.", labtest.C2, &upstreamQueries)

	// The host listens on the gateway: nothing may arrive.
	var hostGot atomic.Int64
	var hostConn net.PacketConn
	labtest.In(t, l.HostNS(), func() (err error) {
		hostConn, err = net.ListenPacket("udp", net.JoinHostPort(cfg.Gateway().String(), "9999"))
		return err
	})
	t.Cleanup(func() { hostConn.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := hostConn.ReadFrom(buf); err != nil {
				return
			}
			hostGot.Add(1)
		}
	}()

	sinkhole := cfg.Sinkhole()
	t.Run("public address lands on the sinkhole", func(t *testing.T) {
		// INetSim's HTTP answers for 192.0.2.10, whatever the address.
		body := httpGet(t, g1.NS, "192.0.2.10:80")
		if !strings.Contains(body, "INetSim") && !strings.Contains(strings.ToLower(body), "html") {
			t.Fatalf("unexpected answer from the sinkhole: %.200q", body)
		}
		sink.Wait(t, "SYN at the sinkhole", wait, func(p labtest.Packet) bool {
			return fromG1(p) && p.Dst == sinkhole && p.Proto == "tcp" && p.DstPort == 80
		})
	})
	probes := []struct{ name, addr string }{
		{"private range", "10.0.0.5:9999"},
		{"private 192.168", "192.168.1.1:9999"},
		{"metadata service", "169.254.169.254:80"},
		{"documentation range", "203.0.113.77:9999"},
		{"smtp to the c2", labtest.C2.String() + ":25"},
		{"c2 on a port not allowed", labtest.C2.String() + ":8081"},
	}
	for _, p := range probes {
		t.Run(p.name+" lands on the sinkhole", func(t *testing.T) {
			payload := []byte("probe-" + p.name)
			sendUDP(t, g1.NS, p.addr, payload)
			// No port probed has a UDP service in the sinkhole: each lands
			// on INetSim's catch-all, dummy_udp on port 1.
			sink.Wait(t, p.name, wait, func(q labtest.Packet) bool {
				return fromG1(q) && q.Dst == sinkhole && q.DstPort == 1 && string(q.Payload) == string(payload)
			})
		})
	}
	t.Run("dns to an arbitrary resolver is answered by the sinkhole", func(t *testing.T) {
		a := resolve(t, g1.NS, "8.8.8.8:53", "evil.example.")
		if a != sinkhole {
			t.Fatalf("evil.example resolved to %s, want the sinkhole %s", a, sinkhole)
		}
		a = resolve(t, g1.NS, labtest.Resolver.String()+":53", "c2.example.")
		if a != sinkhole {
			t.Fatalf("c2.example (not allow-listed) resolved to %s, want the sinkhole", a)
		}
		sink.Wait(t, "dns query at the sinkhole", wait, func(p labtest.Packet) bool {
			return fromG1(p) && p.Dst == sinkhole && p.DstPort == 53
		})
		if n := upstreamQueries.Load(); n != 0 {
			t.Fatalf("the upstream resolver got %d queries for names that are not allow-listed", n)
		}
	})
	t.Run("allow-listed name is forwarded upstream", func(t *testing.T) {
		if err := netlab.SetAllowedNames(cfg.Dir, []string{"c2.example"}); err != nil {
			t.Fatal(err)
		}
		// dnsmasq re-reads its servers-file on SIGHUP; wait for the answer
		// to change rather than for a fixed time.
		deadline := time.Now().Add(wait)
		for {
			if resolve(t, g1.NS, "8.8.8.8:53", "c2.example.") == labtest.C2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("c2.example still sinkholed after allow-listing it")
			}
		}
		inet.Wait(t, "forwarded query at the upstream", wait, func(p labtest.Packet) bool {
			return p.Dst == labtest.Resolver && p.DstPort == 53 && p.Src == labtest.UplinkHost
		})
	})
	t.Run("allow-listed destination is reached", func(t *testing.T) {
		var c net.Conn
		labtest.In(t, g1.NS, func() (err error) {
			c, err = net.DialTimeout("tcp", labtest.C2.String()+":8080", wait)
			return err
		})
		c.Write([]byte("hello c2"))
		c.Close()
		inet.Wait(t, "allowed SYN at the c2", wait, func(p labtest.Packet) bool {
			return p.Dst == labtest.C2 && p.DstPort == 8080 && p.Src == labtest.UplinkHost
		})
	})
	t.Run("reflect sends the packet back to the guest", func(t *testing.T) {
		var pc net.PacketConn
		labtest.In(t, g1.NS, func() (err error) {
			pc, err = net.ListenPacket("udp4", "0.0.0.0:7777")
			return err
		})
		defer pc.Close()
		var client net.Conn
		labtest.In(t, g1.NS, func() (err error) {
			client, err = net.Dial("udp4", labtest.Other.String()+":7777")
			return err
		})
		defer client.Close()
		if _, err := client.Write([]byte("mirror")); err != nil {
			t.Fatal(err)
		}
		pc.SetReadDeadline(time.Now().Add(wait))
		buf := make([]byte, 100)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("reflected packet not received: %v", err)
		}
		if string(buf[:n]) != "mirror" || from.(*net.UDPAddr).IP.String() != labtest.Other.String() {
			t.Fatalf("got %q from %s", buf[:n], from)
		}
		// The guest's answer goes back to itself the same way.
		if _, err := pc.WriteTo([]byte("echo"), from); err != nil {
			t.Fatal(err)
		}
		client.SetReadDeadline(time.Now().Add(wait))
		if n, err := client.Read(buf); err != nil || string(buf[:n]) != "echo" {
			t.Fatalf("the guest's answer was not reflected back: %q %v", buf[:n], err)
		}
	})
	t.Run("rate limit holds", func(t *testing.T) {
		var c net.Conn
		labtest.In(t, g1.NS, func() (err error) {
			c, err = net.DialTimeout("tcp", labtest.C2.String()+":9090", wait)
			return err
		})
		before := c2Bytes.Load()
		start := time.Now()
		c.SetWriteDeadline(start.Add(2 * time.Second))
		chunk := make([]byte, 16<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				break
			}
		}
		c.Close()
		elapsed := time.Since(start)
		got := c2Bytes.Load() - before
		// The bucket starts full (one second's worth), then refills at the rate.
		limit := int64(float64(rate.Value)*(elapsed.Seconds()+1)) + 64<<10
		t.Logf("rate-limited flow: %d bytes in %s (limit %d bytes/s)", got, elapsed, rate.Value)
		if got == 0 || got > limit {
			t.Fatalf("c2 received %d bytes in %s through a %s limit (at most %d allowed)", got, elapsed, rate, limit)
		}
		inet.Wait(t, "rate-limited flow at the c2", wait, func(p labtest.Packet) bool { return p.DstPort == 9090 })
	})
	t.Run("drop verdict", func(t *testing.T) {
		sendUDP(t, g1.NS, labtest.Other.String()+":8080", []byte("x")) // udp: not the dropped tcp element
		var err error
		labtest.In(t, g1.NS, func() error {
			var c net.Conn
			c, err = net.DialTimeout("tcp", labtest.Other.String()+":8080", 300*time.Millisecond)
			if err == nil {
				c.Close()
			}
			return nil
		})
		if err == nil {
			t.Fatal("connected to a dropped destination")
		}
	})
	t.Run("guest to host is dropped", func(t *testing.T) {
		sendUDP(t, g1.NS, cfg.Gateway().String()+":9999", []byte("to-host"))
		waitCounter(t, fw, "input", "guest to host")
	})
	t.Run("guest to guest is dropped", func(t *testing.T) {
		// A static neighbour entry, so that a frame is sent even though
		// ARP between guests never resolves; g2's sniffer checks below
		// that it did not arrive.
		h := l.Handle(g1.NS)
		in, _ := h.LinkByName("eth0")
		if err := h.NeighAdd(&netlink.Neigh{LinkIndex: in.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: g2.IP.AsSlice(), HardwareAddr: g2.MAC}); err != nil {
			t.Fatal(err)
		}
		sendUDP(t, g1.NS, g2.IP.String()+":9999", []byte("to-g2"))
	})
	t.Run("ipv6 is dropped", func(t *testing.T) {
		// Give g1 an IPv6 address and a route out through the bridge's MAC:
		// the host has no IPv6 on the bridge and forwards none.
		h := l.Handle(g1.NS)
		gw := l.Handle(cfg.HostNS)
		br, _ := gw.LinkByName(cfg.Bridge)
		if err := ipv6Route(h, br.Attrs().HardwareAddr); err != nil {
			t.Fatal(err)
		}
		sendUDP(t, g1.NS, "[2001:db8::1]:9999", []byte("v6"))
		sendUDP(t, g1.NS, "[fe80::1%eth0]:9999", []byte("v6-ll"))
	})

	// Markers: one more packet down each path; everything sent before it
	// has been delivered (or not) by the time it arrives.
	sendUDP(t, g1.NS, "192.0.2.99:4444", []byte("marker"))
	sink.Wait(t, "sinkhole marker", wait, func(p labtest.Packet) bool { return string(p.Payload) == "marker" })
	var mc net.Conn
	labtest.In(t, g1.NS, func() (err error) {
		mc, err = net.DialTimeout("tcp", labtest.C2.String()+":8080", wait)
		return err
	})
	mc.Write([]byte("marker"))
	mc.Close()
	inet.Wait(t, "internet marker", wait, func(p labtest.Packet) bool { return string(p.Payload) == "marker" })
	labtest.In(t, cfg.HostNSPath(), func() error {
		c, err := net.Dial("udp", g2.IP.String()+":9")
		if err != nil {
			return err
		}
		_, err = c.Write([]byte("host-marker"))
		c.Close()
		return err
	})
	other.Wait(t, "guest 2 marker", wait, func(p labtest.Packet) bool { return string(p.Payload) == "host-marker" })

	if leaked := inet.Seen(func(p labtest.Packet) bool {
		allowed := p.Src == labtest.UplinkHost && ((p.Dst == labtest.C2 && (p.DstPort == 8080 || p.DstPort == 9090)) ||
			(p.Dst == labtest.Resolver && p.DstPort == 53))
		// The host's own IPv6 neighbour discovery on the uplink is not a guest's.
		noise := p.Proto == "icmp6" && p.Dst.IsMulticast()
		return !allowed && !noise && p.Proto != "other"
	}); len(leaked) > 0 {
		t.Errorf("packets reached the internet that were not allowed: %v", leaked)
	}
	// A sinkholed SYN fails to connect too: the drop verdict is proven by
	// the SYN reaching neither the sinkhole nor the internet.
	if leaked := sink.Seen(func(p labtest.Packet) bool { return fromG1(p) && p.Proto == "tcp" && p.DstPort == 8080 }); len(leaked) > 0 {
		t.Errorf("the dropped destination's SYN reached the sinkhole: %v", leaked)
	}
	if leaked := other.Seen(func(p labtest.Packet) bool { return p.Src == g1.IP || p.IPv6 && p.Proto == "udp" }); len(leaked) > 0 {
		t.Errorf("guest 2 received packets from guest 1: %v", leaked)
	}
	if leaked := sink.Seen(func(p labtest.Packet) bool { return p.IPv6 && p.Proto == "udp" }); len(leaked) > 0 {
		t.Errorf("ipv6 reached the sinkhole: %v", leaked)
	}
	if n := hostGot.Load(); n != 0 {
		t.Errorf("the host received %d packets from a guest", n)
	}

	// Teardown removes the lease's rules exactly, then the lab.
	if err := fw.RemoveLease(ctx, lease); err != nil {
		t.Fatal(err)
	}
	st, err := fw.Status(ctx)
	if err != nil || len(st.Leases) != 0 {
		t.Fatalf("after RemoveLease: %+v %v", st, err)
	}
	if err := netlab.Down(ctx, cfg.Dir); err != nil {
		t.Fatal(err)
	}
	if up, _ := fw.Present(); up {
		t.Fatal("table still there after down")
	}
	if netns.Exists(cfg.SinkNS) {
		t.Fatal("sinkhole namespace still there after down")
	}
	h := l.Handle(cfg.HostNS)
	if _, err := h.LinkByName(cfg.Bridge); err == nil {
		t.Fatal("bridge still there after down")
	}
}

func serveCount(ln net.Listener, n *atomic.Int64) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 64<<10)
			for {
				k, err := c.Read(buf)
				n.Add(int64(k))
				if err != nil {
					return
				}
			}
		}()
	}
}

func serveDNS(pc net.PacketConn, name string, addr netip.Addr, queries *atomic.Int64) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		queries.Add(1)
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionAvailable: true})
		b.StartQuestions()
		b.Question(q)
		b.StartAnswers()
		if strings.EqualFold(q.Name.String(), name) && q.Type == dnsmessage.TypeA {
			b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 0}, dnsmessage.AResource{A: addr.As4()})
		}
		out, _ := b.Finish()
		pc.WriteTo(out, from)
	}
}

func resolve(t *testing.T, ns, server, name string) netip.Addr {
	t.Helper()
	var got netip.Addr
	labtest.In(t, ns, func() error {
		c, err := net.Dial("udp", server)
		if err != nil {
			return err
		}
		defer c.Close()
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 4242, RecursionDesired: true})
		b.StartQuestions()
		b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		q, _ := b.Finish()
		c.SetDeadline(time.Now().Add(wait))
		if _, err := c.Write(q); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		var p dnsmessage.Parser
		if _, err := p.Start(buf[:n]); err != nil {
			return err
		}
		p.SkipAllQuestions()
		for {
			h, err := p.AnswerHeader()
			if err != nil {
				return nil
			}
			if h.Type == dnsmessage.TypeA {
				a, _ := p.AResource()
				got = netip.AddrFrom4(a.A)
				return nil
			}
			p.SkipAnswer()
		}
	})
	return got
}

func sendUDP(t *testing.T, ns, addr string, payload []byte) {
	t.Helper()
	labtest.In(t, ns, func() error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(payload)
		return err
	})
}

func httpGet(t *testing.T, ns, addr string) string {
	t.Helper()
	var body []byte
	labtest.In(t, ns, func() error {
		c, err := net.DialTimeout("tcp", addr, wait)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(wait))
		if _, err := io.WriteString(c, "GET / HTTP/1.0\r\nHost: example.com\r\n\r\n"); err != nil {
			return err
		}
		body, err = io.ReadAll(c)
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return err
	})
	return string(body)
}

// waitCounter waits for a rule's counter to count a packet: the kernel saw
// the packet and dropped it there.
func waitCounter(t *testing.T, fw *firewall.NFT, chain, rule string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		st, err := fw.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range st.Lab {
			if r.Chain == chain && r.Rule == rule && r.Packets > 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("rule %q in %s never counted a packet", rule, chain)
		}
		time.Sleep(5 * time.Millisecond) // polling the counter; no event for it
	}
}

// ipv6Route gives the guest an IPv6 address and a default route whose
// next hop is the bridge's MAC, so its IPv6 packets reach the host.
func ipv6Route(h *netlink.Handle, brMAC net.HardwareAddr) error {
	in, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	a, _ := netlink.ParseAddr("2001:db8:1::10/64")
	a.Flags = unix.IFA_F_NODAD
	if err := h.AddrAdd(in, a); err != nil {
		return err
	}
	gw := net.ParseIP("fe80::1")
	if err := h.NeighAdd(&netlink.Neigh{LinkIndex: in.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT, IP: gw, HardwareAddr: brMAC}); err != nil {
		return err
	}
	return h.RouteAdd(&netlink.Route{LinkIndex: in.Attrs().Index, Gw: gw, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}})
}
