package tlsfp

import (
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

// A published Chrome 143 fingerprint (browserleaks.com): the ClientHello is
// rebuilt from its JA4_ro (original order) and JA3 texts, with GREASE added
// where Chrome puts it; the expected JA3 hash, JA3 text and JA4 are the
// published ones.
const (
	chromeJA3Text = "771,4865-4866-4867-49195-49199-49196-49200-52393-52392-49171-49172-156-157-47-53,45-51-16-65037-23-17613-0-11-10-43-65281-35-18-5-13-27,4588-29-23-24,0"
	chromeJA3     = "98487aa16281980e7d1120d399efb6a4"
	chromeJA4     = "t13d1516h2_8daaf6152771_d8a2da3f94cd"
	chromeJA4r    = "t13d1516h2_002f,0035,009c,009d,1301,1302,1303,c013,c014,c02b,c02c,c02f,c030,cca8,cca9_0005,000a,000b,000d,0012,0017,001b,0023,002b,002d,0033,44cd,fe0d,ff01_0403,0804,0401,0503,0805,0501,0806,0601"
)

func chromeHello() pcapgen.Hello {
	return pcapgen.Hello{
		Version: 0x0303,
		Ciphers: []uint16{0x3a3a, 0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, 0xc013, 0xc014, 0x009c, 0x009d, 0x002f, 0x0035},
		Order: []uint16{0xdada, 0x002d, 0x0033, 0x0010, 0xfe0d, 0x0017, 0x44cd, 0x0000, 0x000b, 0x000a, 0x002b, 0xff01, 0x0023, 0x0012,
			0x0005, 0x000d, 0x001b, 0x4a4a},
		SNI: "tls.browserleaks.com", Groups: []uint16{0x8a8a, 4588, 29, 23, 24}, PointFormats: []uint8{0},
		SigAlgs: []uint16{0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601}, ALPN: []string{"h2", "http/1.1"},
		SupportedVersions: []uint16{0x2a2a, 0x0304, 0x0303},
	}
}

// independentJA3 recomputes JA3 from the published text with nothing but md5.
func TestPublishedVectorsAreConsistent(t *testing.T) {
	sum := md5.Sum([]byte(chromeJA3Text))
	if hex.EncodeToString(sum[:]) != chromeJA3 {
		t.Fatal("the published JA3 text and hash disagree")
	}
	parts := strings.Split(chromeJA4r, "_")
	h := func(s string) string { s2 := sha256.Sum256([]byte(s)); return hex.EncodeToString(s2[:])[:12] }
	if got := parts[0] + "_" + h(parts[1]) + "_" + h(parts[2]+"_"+parts[3]); got != chromeJA4 {
		t.Fatalf("the published JA4_r hashes to %s", got)
	}
}

func TestChromeFingerprints(t *testing.T) {
	rec := pcapgen.ClientHelloRecord(chromeHello())
	var ch ClientHello
	if err := ParseClientHello(rec, &ch, nil); err != nil {
		t.Fatal(err)
	}
	if ch.ServerName != "tls.browserleaks.com" {
		t.Errorf("sni %q", ch.ServerName)
	}
	if got := ch.JA3String(); got != chromeJA3Text {
		t.Errorf("JA3 text\n got %s\nwant %s", got, chromeJA3Text)
	}
	if got := ch.JA3(); got != chromeJA3 {
		t.Errorf("JA3 %s", got)
	}
	if got := ch.JA4(); got != chromeJA4 {
		t.Errorf("JA4 %s, want %s", got, chromeJA4)
	}
}

// A hello split over several records and delivered a few bytes at a time
// parses once complete, and only then.
func TestSplitHello(t *testing.T) {
	h := chromeHello()
	h.Order = append(h.Order, 21)
	h.Pad = 20000 // forces two records
	rec := pcapgen.ClientHelloRecord(h)
	var ch ClientHello
	for _, cut := range []int{0, 3, 5, 100, 16389, len(rec) - 1} {
		if err := ParseClientHello(rec[:cut], &ch, nil); !errors.Is(err, ErrIncomplete) {
			t.Fatalf("cut at %d: %v", cut, err)
		}
	}
	if err := ParseClientHello(rec, &ch, nil); err != nil || ch.JA4()[:10] != "t13d1517h2" {
		t.Fatalf("%v %s", err, ch.JA4())
	}
}

func TestNotTLSAndMalformed(t *testing.T) {
	var ch ClientHello
	for in, want := range map[string]error{
		"GET / HTTP/1.1\r\n":                                   ErrNotTLS,
		"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00":             ErrNotTLS, // a ServerHello
		"\x16\x03\x01\x00\x00":                                 ErrMalformed,
		"\x16\x03\x01\x00\x08\x01\x00\x00\x04\x03\x03\x00\x00": ErrMalformed,
	} {
		if err := ParseClientHello([]byte(in), &ch, nil); !errors.Is(err, want) {
			t.Errorf("%q: %v, want %v", in, err, want)
		}
	}
}

func TestJA4Details(t *testing.T) {
	for _, tc := range []struct {
		h    pcapgen.Hello
		want string
	}{
		// No SNI, no ALPN, TLS 1.2, no extensions hash part when none.
		{pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x002f}}, "t12i010000_" + sha12("002f") + "_000000000000"},
		// An ALPN whose ends are not alphanumeric uses hex digits.
		{pcapgen.Hello{Version: 0x0301, Ciphers: []uint16{0x0035}, Order: []uint16{16}, ALPN: []string{"\x01x\xff"}}, "t10i0101" + "0f_" + sha12("0035") + "_000000000000"},
		{pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0xc02f, 0x0035}, Order: []uint16{0, 10, 13}, SNI: "a", Groups: []uint16{29}, SigAlgs: []uint16{0x0804, 0x0403}},
			"t12d0203" + "00_" + sha12("0035,c02f") + "_" + sha12("000a,000d_0804,0403")},
	} {
		var ch ClientHello
		if err := ParseClientHello(pcapgen.ClientHelloRecord(tc.h), &ch, nil); err != nil {
			t.Fatal(err)
		}
		if got := ch.JA4(); got != tc.want {
			t.Errorf("JA4 %s, want %s", got, tc.want)
		}
	}
}

func sha12(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:])[:12] }

func TestServerHelloVersion(t *testing.T) {
	for v, want := range map[uint16]string{0x0304: "TLSv13", 0x0303: "TLSv12", 0x0301: "TLSv10"} {
		var sh ServerHello
		if err := ParseServerHello(pcapgen.ServerHelloRecord(v, 0x1301), &sh, nil); err != nil {
			t.Fatal(err)
		}
		if VersionName(sh.Version) != want {
			t.Errorf("%#x: %s", v, VersionName(sh.Version))
		}
	}
}

func FuzzTLSClientHello(f *testing.F) {
	f.Add(pcapgen.ClientHelloRecord(chromeHello()))
	f.Add(pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0301}))
	f.Add(pcapgen.ServerHelloRecord(0x0304, 0x1301))
	f.Add([]byte("\x16\x03\x01\x00\x00"))
	scratch := make([]byte, 0, 1<<16)
	f.Fuzz(func(t *testing.T, b []byte) {
		var ch ClientHello
		if ParseClientHello(b, &ch, scratch) == nil {
			_ = ch.JA3()
			if j := ch.JA4(); len(j) != 36 {
				t.Fatalf("JA4 %q is not 36 characters", j)
			}
		}
		var sh ServerHello
		_ = ParseServerHello(b, &sh, scratch)
		_ = fmt.Sprint(VersionName(sh.Version))
	})
}

func TestFindClientHello(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", -1},
		{"\x16\x03\x01\x00\x10\x01", 0},
		{"\r\n\x16\x03\x03\x02\x00\x01rest", 2},
		{"\x16\x03\x01\x00\x10\x02\x16\x03\x01\x00\x10\x01", 6}, // a ServerHello first
		{"\x16\x02\x16\x03\x05\x00\x00\x01", -1},
		{"plain text\x16", 10},       // cut short: may be one
		{"plain\x16\x03\x01\x00", 5}, // cut short
		{"no hello here", -1},
	} {
		if got := FindClientHello([]byte(tc.in)); got != tc.want {
			t.Errorf("%q: %d, want %d", tc.in, got, tc.want)
		}
	}
}
