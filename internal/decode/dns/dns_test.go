package dns

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

// msg builds a message by hand so that compression can be placed exactly.
func msg(flags uint16, qd, an int, body ...byte) []byte {
	h := []byte{0x12, 0x34, byte(flags >> 8), byte(flags), 0, byte(qd), 0, byte(an), 0, 0, 0, 0}
	return append(h, body...)
}

func TestCompressedAnswers(t *testing.T) {
	// Question "www.example.com" A IN at offset 12; answers point back to it.
	q := []byte{3, 'w', 'w', 'w', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm', 0, 0, 1, 0, 1}
	cname := []byte{0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 6, 3, 'c', 'd', 'n', 0xc0, 16} // cdn.example.com
	a := []byte{0xc0, 12 + 21 + 12, 0, 1, 0, 1, 0, 0, 1, 0, 0, 4, 192, 0, 2, 1}          // owner: the CNAME target
	b := msg(0x8180, 1, 2, append(append(q, cname...), a...)...)
	var m Msg
	if err := Parse(b, &m); err != nil {
		t.Fatal(err)
	}
	if !m.Response || m.RCode != 0 || len(m.Questions) != 1 || m.Questions[0].Name != "www.example.com" {
		t.Fatalf("%+v", m)
	}
	if m.Answers[0].Data != "cdn.example.com" || m.Answers[0].Type != TypeCNAME || m.Answers[0].TTL != 60 {
		t.Errorf("%+v", m.Answers[0])
	}
	if m.Answers[1].Name != "cdn.example.com" || m.Answers[1].Data != "192.0.2.1" || m.Answers[1].TTL != 256 {
		t.Errorf("%+v", m.Answers[1])
	}
}

func TestHostileNames(t *testing.T) {
	for name, b := range map[string][]byte{
		"self loop":      msg(0, 1, 0, 0xc0, 12, 0, 1, 0, 1),
		"forward":        msg(0, 1, 0, 0xc0, 20, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0),
		"two-step loop":  msg(0, 1, 0, 1, 'a', 0xc0, 12, 0, 1, 0, 1),
		"truncated":      msg(0, 1, 0, 5, 'a', 'b'),
		"reserved label": msg(0, 1, 0, 0x80, 0),
		"no question":    msg(0, 1, 0),
	} {
		var m Msg
		err := Parse(b, &m)
		if err == nil {
			t.Errorf("%s: parsed as %+v", name, m)
		}
		if name == "self loop" && !errors.Is(err, ErrPtrLoop) {
			t.Errorf("self loop: %v", err)
		}
	}
	// 300 bytes of labels: over the 255-byte limit.
	var long []byte
	for i := 0; i < 10; i++ {
		long = append(long, 30)
		for j := 0; j < 30; j++ {
			long = append(long, 'x')
		}
	}
	long = append(long, 0, 0, 1, 0, 1)
	var m Msg
	if err := Parse(msg(0, 1, 0, long...), &m); !errors.Is(err, ErrTooLarge) {
		t.Errorf("long name: %v", err)
	}
	// An absurd answer count is bounded by the data, not trusted.
	if err := Parse(msg(0x8000, 0, 255), &m); !errors.Is(err, ErrShort) {
		t.Errorf("absurd count: %v", err)
	}
}

func TestEscapesAndNames(t *testing.T) {
	b := msg(0, 1, 0, 3, 'a', '.', 0xff, 0, 0, 16, 0, 1)
	var m Msg
	if err := Parse(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Questions[0].Name != `a\x2e\xff` || TypeName(m.Questions[0].Type) != "TXT" {
		t.Errorf("%q %s", m.Questions[0].Name, TypeName(m.Questions[0].Type))
	}
	if TypeName(65) != "HTTPS" || TypeName(4242) != "TYPE4242" || RCodeName(3) != "NXDOMAIN" || RCodeName(15) != "RCODE15" {
		t.Error("names")
	}
}

func FuzzDNS(f *testing.F) {
	f.Add(pcapgen.DNSQuery(1, "example.com", layers.DNSTypeA))
	f.Add(pcapgen.DNSResponse(1, "example.com", layers.DNSTypeA, 0, []layers.DNSResourceRecord{
		pcapgen.A("example.com", netip.MustParseAddr("192.0.2.1"), 1), pcapgen.CNAME("example.com", "x.example", 1),
		pcapgen.TXT("example.com", 1, "t"), pcapgen.MX("example.com", 1, "m.example", 1)}))
	f.Add(msg(0, 1, 0, 0xc0, 12, 0, 1, 0, 1))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Msg
		if Parse(b, &m) != nil {
			return
		}
		if len(m.Questions) > MaxQuestions || len(m.Answers) > MaxAnswers {
			t.Fatalf("bounds exceeded: %d questions, %d answers", len(m.Questions), len(m.Answers))
		}
		for _, q := range m.Questions {
			if len(q.Name) > 4*maxNameLen {
				t.Fatalf("name of %d bytes", len(q.Name))
			}
		}
	})
}

// One bad record does not make a message unreadable: an empty CNAME (legal
// in a dynamic update) keeps its place in RFC 3597 form, an unknown type is
// kept as hex, a record cut short ends the message after what was read;
// each unreadable record is counted.
func TestBadRecordsKeepTheRest(t *testing.T) {
	q := []byte{1, 'a', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0, 0, 1, 0, 1}
	emptyCNAME := []byte{0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 0}
	unknown := []byte{0xc0, 12, 0x10, 0x92, 0, 1, 0, 0, 0, 60, 0, 2, 0xbe, 0xef}
	a := []byte{0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 7}
	short := []byte{0xc0, 12, 0, 1, 0, 1, 0, 0}
	b := msg(0x8180, 1, 4, append(append(append(append(q, emptyCNAME...), unknown...), a...), short...)...)
	var m Msg
	if err := Parse(b, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Questions) != 1 || len(m.Answers) != 3 || m.Bad != 2 {
		t.Fatalf("questions %d answers %d bad %d, want 1, 3, 2: %+v", len(m.Questions), len(m.Answers), m.Bad, m)
	}
	if m.Answers[0].Data != `\# 0` || m.Answers[1].Data != `\# 2 beef` || TypeName(m.Answers[1].Type) != "TYPE4242" || m.Answers[2].Data != "192.0.2.7" {
		t.Errorf("answers %+v", m.Answers)
	}
}
