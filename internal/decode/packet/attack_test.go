package packet

import (
	"bytes"
	"math/rand"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// spoofed is a source from 192.0.2.0/24 or 198.51.100.0/24, as a bot
// forging its sources would pick at random.
func spoofed(r *rand.Rand) netip.Addr {
	return netip.AddrFrom4([4]byte{192, 0, 2, byte(r.Intn(256))})
}

func attackOf(t *testing.T, r result, value string) *records.AttackInfo {
	t.Helper()
	return r.get(t, records.ObsAttack, value).Attack
}

func TestFloodVectors(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	res := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		// 1000 packets a second of each, one vector after another.
		for i := 0; i < 1000; i++ {
			g.TCP(ap(client, uint16(1024+r.Intn(60000))), ap(victim, 80), r.Uint32(), 0, pcapgen.SYN, nil)
		}
		for i := 0; i < 1000; i++ {
			g.TCP(ap(spoofed(r), uint16(1024+r.Intn(60000))), ap(victim, 443), r.Uint32(), r.Uint32(), pcapgen.ACK|pcapgen.PSH,
				make([]byte, 32))
		}
		for i := 0; i < 1000; i++ {
			g.UDP(ap(client, 40000), ap(victim, uint16(1000+i%50)), make([]byte, 512))
		}
		other := netip.MustParseAddr("198.51.100.10")
		for i := 0; i < 1000; i++ {
			p := make([]byte, 512)
			r.Read(p)
			g.UDP(ap(client, 40001), ap(other, 9), p)
		}
		for i := 0; i < 1000; i++ {
			g.ICMPEcho(client, victim, false, 1, uint16(i), make([]byte, 56))
		}
		for i := 0; i < 1000; i++ {
			g.IPPacket(client, other, layers.IPProtocolGRE, &layers.GRE{Protocol: layers.EthernetTypeIPv4}, gopacket.Payload(make([]byte, 64)))
		}
		// SSDP requests sent in the victim's name to many reflectors.
		for i := 0; i < 1000; i++ {
			g.UDP(ap(victim, 1900), ap(netip.AddrFrom4([4]byte{203, 0, 113, byte(i % 200)}), 1900),
				[]byte("M-SEARCH * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nMAN: \"ssdp:discover\"\r\nMX: 1\r\nST: ssdp:all\r\n\r\n"))
		}
	})
	syn := attackOf(t, res, "syn 198.51.100.9")
	if syn.Packets != 1000 || syn.Spoofed || !slices.Equal(syn.Ports, []string{"80"}) || syn.PPS < 900 || syn.PPS > 1100 ||
		!slices.Equal(syn.Sources, []string{client.String()}) {
		t.Fatalf("syn %+v", syn)
	}
	if ack := attackOf(t, res, "ack 198.51.100.9"); ack.Packets != 1000 || !ack.Spoofed || ack.SourceCount < 200 {
		t.Fatalf("ack %+v", ack)
	}
	if udp := attackOf(t, res, "udpplain 198.51.100.9"); udp.Packets != 1000 || udp.PortCount < 40 || udp.PortCount > 60 ||
		udp.Bytes != 1000*(20+8+512) {
		t.Fatalf("udpplain %+v", udp)
	}
	attackOf(t, res, "udp 198.51.100.10")
	attackOf(t, res, "icmp 198.51.100.9")
	attackOf(t, res, "gre 198.51.100.10")
	amp := attackOf(t, res, "amp-ssdp 198.51.100.9")
	if amp.Packets != 1000 || len(amp.Reflectors) != 8 || len(amp.Sources) != 0 {
		t.Fatalf("amp %+v", amp)
	}
	if n := res.count(records.ObsAttack); n != 7 {
		t.Fatalf("%d attacks", n)
	}
}

// TestUDPServiceVectors: VSE queries to a game server, and requests sent
// in the victim's name to the reflectors of each amplifying service tb-parse
// names (NTP's monlist, memcached, chargen, CLDAP, SNMP), each a flood of
// its own vector against the victim.
func TestUDPServiceVectors(t *testing.T) {
	reflected := []struct {
		vector  string
		port    uint16
		payload []byte
	}{
		{"amp-ntp", 123, append([]byte{0x17, 0x00, 0x03, 0x2a}, make([]byte, 4)...)},
		{"amp-memcached", 11211, []byte("\x00\x01\x00\x00\x00\x01\x00\x00stats\r\n")},
		{"amp-chargen", 19, []byte{0x01}},
		{"amp-cldap", 389, []byte{0x30, 0x25, 0x02, 0x01, 0x01, 0x63, 0x20}},
		{"amp-snmp", 161, []byte{0x30, 0x26, 0x02, 0x01, 0x01, 0x04, 0x06, 'p', 'u', 'b', 'l', 'i', 'c', 0xa5}},
	}
	vse := []byte("\xff\xff\xff\xffTSource Engine Query\x00")
	res := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		for i := 0; i < 1000; i++ {
			g.UDP(ap(client, 40000), ap(victim, 27015), vse)
		}
		for _, v := range reflected {
			for i := 0; i < 1000; i++ {
				g.UDP(ap(victim, 40001), ap(netip.AddrFrom4([4]byte{203, 0, 113, byte(1 + i%100)}), v.port), v.payload)
			}
		}
	})
	if a := attackOf(t, res, "vse 198.51.100.9"); a.Packets != 1000 || !slices.Equal(a.Ports, []string{"27015"}) {
		t.Errorf("vse %+v", a)
	}
	for _, v := range reflected {
		a := attackOf(t, res, v.vector+" 198.51.100.9")
		if a.Packets != 1000 || len(a.Reflectors) == 0 || !slices.Equal(a.Ports, []string{strconv.Itoa(int(v.port))}) {
			t.Errorf("%s %+v", v.vector, a)
		}
	}
	if n := res.count(records.ObsAttack); n != 1+len(reflected) {
		t.Errorf("%d attacks, want %d", n, 1+len(reflected))
	}
}

func TestHTTPFlood(t *testing.T) {
	res := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c := g.Dial(ap(client, 40000), ap(victim, 80), 1, 1)
		for i := 0; i < 300; i++ {
			c.Send(pcapgen.HTTPGet("victim.example", "/", "Mozilla/5.0"))
			c.Reply(pcapgen.HTTPResponse(200, "OK", nil))
		}
		c.Close()
	})
	if h := attackOf(t, res, "http 198.51.100.9"); h.Packets != 300 {
		t.Fatalf("%+v", h)
	}
}

// A scan is no attack: of one address's ports, of many addresses' port,
// or of UDP ports; nor is a slow ping, or a download.
func TestNoAttack(t *testing.T) {
	res := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		for p := 1; p <= 2000; p++ {
			g.TCP(ap(client, 40000), ap(victim, uint16(p)), 1, 0, pcapgen.SYN, nil)
		}
		for i := 0; i < 2000; i++ {
			g.TCP(ap(client, uint16(41000+i%1000)), ap(netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), 23), 1, 0, pcapgen.SYN, nil)
		}
		for p := 1; p <= 2000; p++ {
			g.UDP(ap(client, 40000), ap(server, uint16(p)), []byte{1, 2, 3})
		}
		for i := 0; i < 600; i++ {
			g.ICMPEcho(client, server, false, 1, uint16(i), nil)
			g.T = g.T.Add(time.Second)
		}
		c := g.Dial(ap(client, 40001), ap(server, 80), 1, 1)
		c.Send(pcapgen.HTTPGet("www.example", "/big", "Mozilla/5.0"))
		c.Reply(pcapgen.HTTPResponse(200, "OK", bytes.Repeat([]byte("x"), 2<<20)))
		c.Close()
	})
	if n := res.count(records.ObsAttack); n != 0 {
		for k := range res.Obs {
			t.Log(k)
		}
		t.Fatalf("%d attacks", n)
	}
}

// However many targets a sample scans, the table of floods stays bounded
// and a flood after the scan is still seen.
func TestFloodTableBounded(t *testing.T) {
	var d *Decoder
	data := capture(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		targets := pcapgen.NewTargets(1)
		for i := 0; i < 3*maxFloods; i++ {
			dst, _ := targets.Next()
			for j := 0; j < hotPkts; j++ {
				g.TCP(ap(client, uint16(40000+j)), ap(dst, 23), 1, 0, pcapgen.SYN, nil)
			}
		}
		for i := 0; i < 1000; i++ {
			g.TCP(ap(client, uint16(1024+i)), ap(victim, 80), 7, 0, pcapgen.SYN, nil)
		}
	})
	d = decodeOpen(t, data)
	if len(d.floods) > maxFloods {
		t.Fatalf("%d floods held", len(d.floods))
	}
	sink := &collect{}
	d.cfg.Sink = sink
	d.Finish()
	if !slices.Contains(sink.values, "syn "+victim.String()) {
		t.Fatalf("the flood after the scan is lost: %v", sink.values)
	}
}

// collect keeps the values of the attack observables.
type collect struct{ values []string }

func (c *collect) Add(o *records.Observable) {
	if o.Type == records.ObsAttack {
		c.values = append(c.values, o.Value)
	}
}

func (c *collect) Conn(*flowlog.Conn) {}

// Queries for random names under one domain, through the lab's resolver,
// are Mirai's "dns" flood of that domain; the same name asked as often is
// not.
func TestDNSWaterTorture(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	res := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		for i := 0; i < 1000; i++ {
			label := strconv.FormatUint(r.Uint64(), 36)
			g.UDP(ap(client, uint16(30000+i)), ap(dnssrv, 53), pcapgen.DNSQuery(uint16(i), label+".victim.example", layers.DNSTypeA))
		}
		for i := 0; i < 1000; i++ {
			g.UDP(ap(client, uint16(31000+i)), ap(dnssrv, 53), pcapgen.DNSQuery(uint16(i), "www.busy.example", layers.DNSTypeA))
		}
	})
	a := attackOf(t, res, "dns victim.example")
	// Names is linear counting on a 512-bit map under the decoder's random
	// seed: for 1,000 names its standard error is about 4.6%, so ±20% is
	// more than 4 of them (±10% failed about one run in 30).
	if a.Packets != 1000 || a.Names < 800 || a.Names > 1200 || !slices.Equal(a.Reflectors, []string{dnssrv.String()}) {
		t.Fatalf("%+v", a)
	}
	if n := res.count(records.ObsAttack); n != 1 {
		t.Fatalf("%d attacks", n)
	}
}
