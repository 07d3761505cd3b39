package beacon

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// hostileArgs are a full set of -hostile flags on a lab link 10.213.1.0/24.
var hostileArgs = []string{"-hostile", "names,spoof,arp,aim,spray", "-gateway", "10.213.1.1",
	"-neighbour", "10.213.1.3", "-neighbour-mac", "52:54:00:00:00:03", "-neighbour-c2", "198.51.100.18:80"}

func TestParseRefusesHostileTargetsOutsideTheLab(t *testing.T) {
	h := parseHostile(t, hostileArgs...)
	if !slices.Equal(h.Modes, HostileModes) || h.Aim != netip.MustParseAddrPort("203.0.113.77:8443") || h.NeighbourC2.Port() != 80 {
		t.Fatalf("hostile = %+v", h)
	}
	for _, bad := range [][]string{
		{"-neighbour", "8.8.8.8"}, {"-neighbour", "192.168.1.3"}, {"-gateway", "172.16.0.1"}, {"-gateway", "::1"},
		{"-neighbour-c2", "8.8.8.8:80"}, {"-neighbour-c2", "10.213.1.1:80"}, {"-neighbour-c2", "198.51.100.18"},
		{"-hostile-http", "1.1.1.1:80"}, {"-hostile-aim", "8.8.4.4:443"}, {"-hostile-aim", "[2001:db8::1]:443"},
		{"-hostile-spray", "127.0.0.1"}, {"-hostile-spray", "10.213.1.1"},
		{"-neighbour-mac", "nonsense"}, {"-hostile-spray-ports", "1000"}, {"-hostile-dns", "100000"},
		{"-hostile-aim-count", "1000"}, {"-hostile-aim-interval", "1ms"}, {"-hostile-dns-domain", "a b"},
	} {
		args := append(slices.Clone(hostileArgs), bad...)
		if _, err := Parse(args, io.Discard); err == nil {
			t.Errorf("Parse(... %q) accepted", bad)
		}
	}
	for _, bad := range [][]string{{"-hostile", "flood"}, {"-hostile", "spoof"}, {"-hostile", "arp", "-gateway", "10.213.1.1"}, {"-hostile", "spray"}} {
		if _, err := Parse(bad, io.Discard); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	// Without -hostile, -c2 is still required; with it, it is not.
	if _, err := Parse([]string{"-hostile-aim", "203.0.113.9:1"}, io.Discard); err == nil {
		t.Error("no -c2 and no -hostile accepted")
	}
	if h := parseHostile(t, "-hostile", "names,aim"); h.Gateway.IsValid() {
		t.Fatalf("hostile = %+v", h)
	}
}

func parseHostile(t *testing.T, args ...string) *Hostile {
	t.Helper()
	c, err := Parse(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Hostile == nil || c.C2 != "" {
		t.Fatalf("config = %+v", c)
	}
	return c.Hostile
}

var attackerMAC = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 2}

func attackerLink() guestLink {
	return guestLink{Index: 2, MAC: attackerMAC, Prefix: netip.MustParsePrefix("10.213.1.2/24")}
}

func TestRawFramesStayOnTheLabLink(t *testing.T) {
	h := parseHostile(t, hostileArgs...)
	for _, l := range []string{"192.168.1.2/24", "10.213.2.2/24", "10.0.0.2/7", "172.16.1.2/16"} {
		bad := guestLink{Index: 2, MAC: attackerMAC, Prefix: netip.MustParsePrefix(l)}
		if _, err := h.SpoofFrames(bad, attackerMAC); err == nil {
			t.Errorf("spoof frames on %s built", l)
		}
		if _, err := h.ARPFrames(bad); err == nil {
			t.Errorf("ARP frames on %s built", l)
		}
	}
	// A Hostile built in code is checked too.
	h.NeighbourC2 = netip.MustParseAddrPort("8.8.8.8:80")
	if _, err := h.SpoofFrames(attackerLink(), attackerMAC); err == nil {
		t.Error("spoof frames to 8.8.8.8 built")
	}
}

func TestSpoofFramesForgeTheNeighboursSourceAndMAC(t *testing.T) {
	h := parseHostile(t, hostileArgs...)
	gwMAC := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	frames, err := h.SpoofFrames(attackerLink(), gwMAC)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ mac, src, dst string }{
		{attackerMAC.String(), "10.213.1.3", "198.51.100.18"},
		{"52:54:00:00:00:03", "10.213.1.2", "198.51.100.18"},
		{"52:54:00:00:00:03", "10.213.1.3", "198.51.100.18"},
		{attackerMAC.String(), "2001:db8::ad5:103", "2001:db8::c633:6412"},
		{attackerMAC.String(), "0.0.0.0", "198.51.100.18"},
	}
	if len(frames) != len(want) || len(SpoofVariants) != len(want) {
		t.Fatalf("%d frames, %d variants", len(frames), len(SpoofVariants))
	}
	for i, f := range frames {
		p := gopacket.NewPacket(f.Frame, layers.LayerTypeEthernet, gopacket.Default)
		eth, _ := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		tcp, _ := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if eth == nil || p.NetworkLayer() == nil || tcp == nil || p.ErrorLayer() != nil {
			t.Fatalf("frame %d does not decode: %v", i, p)
		}
		src, dst := p.NetworkLayer().NetworkFlow().Endpoints()
		if f.Variant != SpoofVariants[i] || eth.SrcMAC.String() != want[i].mac || eth.DstMAC.String() != gwMAC.String() ||
			src.String() != want[i].src || dst.String() != want[i].dst ||
			!tcp.SYN || tcp.ACK || tcp.DstPort != 80 || tcp.Seq != SpoofSeq+uint32(i) {
			t.Errorf("frame %d (%s): %v", i, f.Variant, p)
		}
		if ip, ok := p.NetworkLayer().(*layers.IPv4); ok && ip.Checksum == 0 {
			t.Errorf("frame %d: no IPv4 checksum", i)
		}
		if tcp.Checksum == 0 {
			t.Errorf("frame %d: no TCP checksum", i)
		}
	}
}

func TestARPFramesClaimTheGatewayAndTheNeighbour(t *testing.T) {
	h := parseHostile(t, hostileArgs...)
	frames, err := h.ARPFrames(attackerLink())
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ dst, claimed, target string }{
		{"ff:ff:ff:ff:ff:ff", "10.213.1.1", "10.213.1.1"},
		{"52:54:00:00:00:03", "10.213.1.1", "10.213.1.3"},
		{"ff:ff:ff:ff:ff:ff", "10.213.1.3", "10.213.1.3"},
	}
	if len(frames) != len(want) {
		t.Fatalf("%d frames", len(frames))
	}
	for i, f := range frames {
		p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
		eth, _ := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		arp, _ := p.Layer(layers.LayerTypeARP).(*layers.ARP)
		if eth == nil || arp == nil {
			t.Fatalf("frame %d does not decode: %v", i, p)
		}
		if eth.SrcMAC.String() != attackerMAC.String() || eth.DstMAC.String() != want[i].dst || arp.Operation != layers.ARPReply ||
			net.HardwareAddr(arp.SourceHwAddress).String() != attackerMAC.String() ||
			net.IP(arp.SourceProtAddress).String() != want[i].claimed || net.IP(arp.DstProtAddress).String() != want[i].target {
			t.Errorf("frame %d: %v", i, p)
		}
	}
}

// hostileNet is a test's network for the dialling modes: it records every
// dial, answers HTTP on the -hostile-http address with a status line and
// keeps the request, and refuses the rest.
type hostileNet struct {
	mu       sync.Mutex
	dials    []string
	requests []string
	httpAddr string
}

func (n *hostileNet) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	n.dials = append(n.dials, network+" "+addr)
	n.mu.Unlock()
	if network != "tcp" || addr != n.httpAddr {
		return nil, errors.New("connection refused (test)")
	}
	client, server := net.Pipe()
	go func() {
		defer server.Close()
		r := bufio.NewReader(server)
		var req strings.Builder
		for {
			line, err := r.ReadString('\n')
			req.WriteString(line)
			if err != nil || line == "\r\n" {
				break
			}
		}
		n.mu.Lock()
		n.requests = append(n.requests, req.String())
		n.mu.Unlock()
		io.WriteString(server, "HTTP/1.1 200 OK\r\n\r\n")
	}()
	return client, nil
}

func TestDiallingModesReachOnlyTheirDocumentationTargets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := parseHostile(t, append(slices.Clone(hostileArgs), "-hostile", "names,aim,spray", "-hostile-aim-count", "4",
			"-hostile-spray-ports", "40", "-hostile-dns", "30")...)
		hn := &hostileNet{httpAddr: "192.0.2.80:80"}
		var log bytes.Buffer
		b := &Beacon{Cfg: &Config{}, Dial: hn.dial, Log: &log, Rand: rand.New(rand.NewPCG(1, 2))}
		if err := b.RunHostile(context.Background(), h); err != nil {
			t.Fatal(err)
		}
		counts := map[string]int{}
		for _, d := range hn.dials {
			network, addr, _ := strings.Cut(d, " ")
			ap := netip.MustParseAddrPort(addr)
			switch {
			case network == "tcp" && addr == "192.0.2.80:80":
				counts["names"]++
			case network == "tcp" && addr == "203.0.113.77:8443":
				counts["aim"]++
			case network == "tcp" && ap.Addr() == netip.MustParseAddr("192.0.2.81") && ap.Port() >= 1 && ap.Port() <= 40:
				counts["spray"]++
			case network == "udp" && addr == "10.213.1.1:53":
				counts["dns"]++
			default:
				t.Errorf("dialled %s", d)
			}
		}
		if counts["names"] != len(UnresolvedHosts)*HostileRepeats || counts["aim"] != 4 || counts["spray"] != 40 || counts["dns"] != 30 {
			t.Fatalf("dials %v\n%s", counts, log.String())
		}
		for _, host := range UnresolvedHosts {
			n := 0
			for _, r := range hn.requests {
				if strings.Contains(r, "\r\nHost: "+host+"\r\n") {
					n++
				}
			}
			if n != HostileRepeats {
				t.Errorf("Host: %s sent %d times, want %d", host, n, HostileRepeats)
			}
		}
	})
}

func TestDNSQueryAsksForTheName(t *testing.T) {
	q := dnsQuery(7, "0badf00d.spray.example")
	var d layers.DNS
	if err := d.DecodeFromBytes(q, gopacket.NilDecodeFeedback); err != nil {
		t.Fatal(err)
	}
	if d.ID != 7 || d.QR || !d.RD || len(d.Questions) != 1 || string(d.Questions[0].Name) != "0badf00d.spray.example" || d.Questions[0].Type != layers.DNSTypeA {
		t.Fatalf("query = %+v", d)
	}
}
