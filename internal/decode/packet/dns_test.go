package packet

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func TestDNSOverUDPAndTCP(t *testing.T) {
	cname := "edge.cdn.example"
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c, s := ap(client, 40000), ap(dnssrv, 53)
		g.DNSOverUDP(c, s, pcapgen.DNSQuery(1, "WWW.Example.COM", layers.DNSTypeA),
			pcapgen.DNSResponse(1, "WWW.Example.COM", layers.DNSTypeA, 0, []layers.DNSResourceRecord{
				pcapgen.CNAME("WWW.Example.COM", cname, 300),
				pcapgen.A(cname, netip.MustParseAddr("203.0.113.9"), 60),
			}))
		g.DNSOverUDP(c, s, pcapgen.DNSQuery(2, "www.example.com", layers.DNSTypeAAAA),
			pcapgen.DNSResponse(2, "www.example.com", layers.DNSTypeAAAA, 0, []layers.DNSResourceRecord{
				pcapgen.A("www.example.com", netip.MustParseAddr("2001:db8::9"), 60)}))
		g.DNSOverUDP(c, s, pcapgen.DNSQuery(3, "nope.example", layers.DNSTypeA),
			pcapgen.DNSResponse(3, "nope.example", layers.DNSTypeA, layers.DNSResponseCodeNXDomain, nil))
		g.DNSOverUDP(c, s, pcapgen.DNSQuery(4, "t.example", layers.DNSTypeTXT),
			pcapgen.DNSResponse(4, "t.example", layers.DNSTypeTXT, 0, []layers.DNSResourceRecord{pcapgen.TXT("t.example", 5, "v=spf1", "-all")}))
		g.DNSOverUDP(c, s, pcapgen.DNSQuery(5, "mail.example", layers.DNSTypeMX),
			pcapgen.DNSResponse(5, "mail.example", layers.DNSTypeMX, 0, []layers.DNSResourceRecord{pcapgen.MX("mail.example", 10, "MX1.mail.example", 5)}))
		// DNS over TCP, the query split across two segments.
		conn := g.Dial(ap(client, 40001), s, 10, 20)
		conn.MSS = 7
		conn.Send(pcapgen.TCPDNS(pcapgen.DNSQuery(6, "tcp.example", layers.DNSTypeA)))
		conn.MSS = 1460
		conn.Reply(pcapgen.TCPDNS(pcapgen.DNSResponse(6, "tcp.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{
			pcapgen.A("tcp.example", netip.MustParseAddr("192.0.2.66"), 30)})))
		conn.Close()
	})
	www := r.get(t, "domain", "www.example.com")
	d := www.Domain
	if www.Count != 2 || d.Queries != 2 || d.Responses != 2 {
		t.Errorf("count %d queries %d responses %d", www.Count, d.Queries, d.Responses)
	}
	if !slices.Equal(d.QTypes, []string{"A", "AAAA"}) || !slices.Equal(d.RCodes, []string{"NOERROR"}) {
		t.Errorf("qtypes %v rcodes %v", d.QTypes, d.RCodes)
	}
	if !slices.Equal(d.Addrs, []string{"203.0.113.9", "2001:db8::9"}) || !slices.Equal(d.CNAMEs, []string{cname}) {
		t.Errorf("addrs %v cnames %v", d.Addrs, d.CNAMEs)
	}
	want := records.DNSAnswer{Name: "www.example.com", Type: "CNAME", Data: cname, TTL: 300}
	if d.Answers[0] != want {
		t.Errorf("first answer %+v", d.Answers[0])
	}
	if !slices.Equal(d.Resolvers, []string{dnssrv.String()}) || !slices.Equal(d.Clients, []string{client.String()}) {
		t.Errorf("resolvers %v clients %v", d.Resolvers, d.Clients)
	}
	if n := r.get(t, "domain", "nope.example").Domain; !slices.Equal(n.RCodes, []string{"NXDOMAIN"}) || len(n.Answers) != 0 {
		t.Errorf("%+v", n)
	}
	if a := r.get(t, "domain", "t.example").Domain.Answers; len(a) != 1 || a[0].Type != "TXT" || a[0].Data != "v=spf1 -all" {
		t.Errorf("%+v", a)
	}
	if a := r.get(t, "domain", "mail.example").Domain.Answers; len(a) != 1 || a[0].Type != "MX" || a[0].Data != "mx1.mail.example" {
		t.Errorf("%+v", a)
	}
	tcp := r.get(t, "domain", "tcp.example")
	if !slices.Equal(tcp.Domain.Transports, []string{"tcp"}) || !slices.Equal(tcp.Domain.Addrs, []string{"192.0.2.66"}) || tcp.Count != 1 {
		t.Errorf("%+v", tcp.Domain)
	}
	// The resolved address, then contacted, carries the name.
	if ip := r.get(t, "ip", dnssrv.String()); !slices.Contains(ip.IP.Ports, "udp/53") || !slices.Contains(ip.IP.Ports, "tcp/53") {
		t.Errorf("resolver ports %v", ip.IP.Ports)
	}
}

func TestResolvedThenContacted(t *testing.T) {
	c2 := netip.MustParseAddr("203.0.113.77")
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.DNSOverUDP(ap(client, 40000), ap(dnssrv, 53), pcapgen.DNSQuery(9, "c2.example", layers.DNSTypeA),
			pcapgen.DNSResponse(9, "c2.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("c2.example", c2, 60)}))
		g.Dial(ap(client, 40001), ap(c2, 443), 1, 1).Close()
	})
	if ip := r.get(t, "ip", c2.String()); !slices.Equal(ip.IP.Domains, []string{"c2.example"}) {
		t.Errorf("domains %v", ip.IP.Domains)
	}
}

// NetBIOS name service queries are named as Zeek names them.
func TestNetBIOSNames(t *testing.T) {
	enc := func(name string, suffix byte) string {
		b := []byte(name + "               ")[:15]
		b = append(b, suffix)
		var out []byte
		for _, c := range b {
			out = append(out, 'A'+c>>4, 'A'+c&15)
		}
		return string(out)
	}
	bcast := netip.MustParseAddr("10.13.37.255")
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.UDP(ap(client, 137), ap(bcast, 137), pcapgen.DNSQuery(1, enc("WORKGROUP", 0x1d), layers.DNSType(32)))
		g.UDP(ap(client, 137), ap(bcast, 137), pcapgen.DNSQuery(2, enc("WPAD", 0), layers.DNSType(32)))
	})
	for _, name := range []string{"WORKGROUP", "WPAD"} {
		if d := r.get(t, "domain", name).Domain; !slices.Equal(d.QTypes, []string{"NB"}) {
			t.Errorf("%s: %+v", name, d)
		}
	}
	if NetBIOSName("not.netbios.example") != "not.netbios.example" || NetBIOSName(enc("A B", 0)) != "A" {
		t.Error("NetBIOSName")
	}
}

// A sample cannot forge a resolution: answers in its own query, in a
// response to no query of the flow, or in a response whose name or type
// differ from the query's are counted as unsolicited and never link the
// name to the address (which would be "resolved, then contacted" evidence
// for tb-allow). The genuine response on the same flow still does.
func TestForgedAnswersAreNotResolutions(t *testing.T) {
	decoy, real := netip.MustParseAddr("203.0.113.66"), netip.MustParseAddr("203.0.113.77")
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		s := ap(dnssrv, 53)
		// A query carrying an answer record.
		q := pcapgen.DNSResponse(1, "decoy.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("decoy.example", decoy, 60)})
		q[2] &^= 0x80 // the QR bit: a query
		g.UDP(ap(client, 40000), s, q)
		// A response to a query never sent on its flow.
		g.UDP(s, ap(client, 40001), pcapgen.DNSResponse(2, "unasked.example", layers.DNSTypeA, 0,
			[]layers.DNSResourceRecord{pcapgen.A("unasked.example", decoy, 60)}))
		// A response whose name differs from the query's.
		g.DNSOverUDP(ap(client, 40002), s, pcapgen.DNSQuery(3, "asked.example", layers.DNSTypeA),
			pcapgen.DNSResponse(3, "swapped.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("swapped.example", decoy, 60)}))
		// The genuine resolution.
		g.DNSOverUDP(ap(client, 40003), s, pcapgen.DNSQuery(4, "real.example", layers.DNSTypeA),
			pcapgen.DNSResponse(4, "real.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("real.example", real, 60)}))
		for i, dst := range []netip.Addr{decoy, real} {
			c := g.Dial(ap(client, uint16(41000+i)), ap(dst, 443), 1, 2)
			c.Send([]byte("hello"))
			c.Close()
		}
	})
	for _, name := range []string{"decoy.example", "unasked.example", "swapped.example"} {
		if d := r.get(t, "domain", name).Domain; len(d.Addrs) != 0 || len(d.Answers) != 0 || d.Unsolicited != 1 {
			t.Errorf("%s: addrs %v answers %v unsolicited %d, want none, none, 1", name, d.Addrs, d.Answers, d.Unsolicited)
		}
	}
	if e := r.get(t, "endpoint", "203.0.113.66:443/tcp").Endpoint; len(e.Domains) != 0 {
		t.Errorf("the decoy address is named %v", e.Domains)
	}
	if d := r.get(t, "domain", "real.example").Domain; !slices.Equal(d.Addrs, []string{real.String()}) || d.Unsolicited != 0 {
		t.Errorf("real.example: %+v", d)
	}
	if e := r.get(t, "endpoint", "203.0.113.77:443/tcp").Endpoint; !slices.Equal(e.Domains, []string{"real.example"}) {
		t.Errorf("the resolved address is named %v", e.Domains)
	}
}

// A response repeated (a resolver's retransmission, or a guest replaying
// one) is a sighting of its own: only the first answers the query, which
// the flow then no longer holds open.
func TestDNSResponseAnswersItsQueryOnce(t *testing.T) {
	resp := pcapgen.DNSResponse(7, "again.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{
		pcapgen.A("again.example", netip.MustParseAddr("192.0.2.77"), 60)})
	r := run(t, pcapgen.Options{}, func(g *pcapgen.Gen) {
		c, s := ap(client, 40007), ap(dnssrv, 53)
		g.DNSOverUDP(c, s, pcapgen.DNSQuery(7, "again.example", layers.DNSTypeA), resp)
		g.UDP(s, c, resp)
	})
	if o := r.get(t, "domain", "again.example"); o.Count != 2 || o.Domain.Queries != 1 || o.Domain.Responses != 2 {
		t.Errorf("count %d queries %d responses %d, want 2 1 2", o.Count, o.Domain.Queries, o.Domain.Responses)
	}
}
