package netlab_test

import (
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
)

func TestDNSName(t *testing.T) {
	for in, want := range map[string]string{
		"Good.Example.": "good.example", " c2.example ": "c2.example", "_dmarc.example": "_dmarc.example",
		"xn--bcher-kva.example": "xn--bcher-kva.example", "localhost": "localhost",
	} {
		if got, err := netlab.DNSName(in); err != nil || got != want {
			t.Errorf("DNSName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	// Each of these would change what the servers-file says: another
	// server, a wildcard, a comment, a second line.
	for _, in := range []string{"", ".", "a..b", "bad/name", "*.example", "#", "a b.example", "x.example\nserver=/#/198.51.100.9",
		"-x.example", "x-.example", "ex\u00e4mple.example", strings.Repeat("a", 64) + ".example"} {
		if got, err := netlab.DNSName(in); err == nil {
			t.Errorf("DNSName(%q) = %q, want an error", in, got)
		}
	}
}
