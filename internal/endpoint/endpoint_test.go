package endpoint

import (
	"net/netip"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, s := range []string{"198.51.100.7:443/tcp", "[2001:db8::1]:53/udp", "0.0.0.0:0/tcp"} {
		e, err := Parse(s)
		if err != nil || e.String() != s {
			t.Errorf("%s: %v %q", s, err, e)
		}
		if f, ok := ParseIPv4([]byte(s)); ok != e.Addr.Is4() || ok && f != e {
			t.Errorf("%s: fast %v %v", s, f, ok)
		}
	}
	for _, s := range []string{"198.51.100.7:443", "198.51.100.7:443/icmp", "198.51.100.7/tcp", "host:80/tcp", "1.2.3.04:1/tcp", "1.2.3.4:65536/tcp"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("%s parsed", s)
		}
		if _, ok := ParseIPv4([]byte(s)); ok {
			t.Errorf("%s parsed fast", s)
		}
	}
	if e := New(netip.MustParseAddr("::ffff:198.51.100.7"), 80, "tcp"); e.String() != "198.51.100.7:80/tcp" {
		t.Errorf("mapped: %s", e)
	}
	if got := string(Append([]byte("x "), []byte("2001:db8::2"), 8080, []byte("tcp"))); got != "x [2001:db8::2]:8080/tcp" {
		t.Errorf("append: %s", got)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("198.51.100.7:443/tcp")
	f.Add("[2001:db8::1]:53/udp")
	f.Fuzz(func(t *testing.T, s string) {
		e, err := Parse(s)
		if err != nil {
			return
		}
		again, err := Parse(e.String())
		if err != nil || again != e {
			t.Fatalf("%q -> %s -> %v %v", s, e, again, err)
		}
		if fast, ok := ParseIPv4([]byte(e.String())); ok && fast != e {
			t.Fatalf("fast %v != %v", fast, e)
		}
	})
}
