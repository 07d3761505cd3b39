package botproto

import (
	"slices"
	"strings"
	"testing"
)

// The order table ties each family's words for a vector to the floods
// that carry it out, in any case and with IRC's "!", and nothing else.
func TestCarries(t *testing.T) {
	for _, tc := range []struct {
		vector, attack string
		want           bool
	}{
		{"udpplain", "udp", true}, {"UDP", "udpplain", true}, {"!udp", "udp", true}, {"STD", "udp", true},
		{"stomp", "ack", true}, {"!tsunami", "ack", true}, {"TCP", "syn", true}, {"TCP", "ack", true}, {"!pan", "syn", true},
		{"greeth", "gre", true}, {"http", "http", true}, {"dns", "dns", true}, {"vse", "vse", true},
		{"syn", "udp", false}, {"udp", "syn", false}, {"proxy", "ack", false}, {"vector42", "udp", false}, {"sleep", "udp", false},
		{"udp", "amp-ntp", false},
	} {
		if got := Carries(tc.vector, tc.attack); got != tc.want {
			t.Errorf("Carries(%q, %q) = %v", tc.vector, tc.attack, got)
		}
	}
}

// An HTTP answer's order: the words as sent, a URL's or name's target,
// and of a JSON object's members the first by key that is an order.
func TestHTTPOrder(t *testing.T) {
	for body, want := range map[string]Command{
		`{"task":"udp 203.0.113.77 9 4"}`: {Vector: "udp", Targets: []string{"203.0.113.77"}, Ports: []string{"9"}, Duration: 4,
			Raw: "udp 203.0.113.77 9 4", Text: "udp 203.0.113.77 9 4"},
		`{"z":"syn 198.51.100.0/24 80","a":"http http://victim.example/ 80 60","n":3}`: {Vector: "http",
			Targets: []string{"http://victim.example/"}, Ports: []string{"80"}, Duration: 60,
			Raw: "http http://victim.example/ 80 60", Text: "http http://victim.example/ 80 60"},
		`{"cmd":"!UDPPLAIN 203.0.113.77 9"}`: {Vector: "!UDPPLAIN", Targets: []string{"203.0.113.77"}, Ports: []string{"9"},
			Raw: "!UDPPLAIN 203.0.113.77 9", Text: "!UDPPLAIN 203.0.113.77 9"},
		"  SYN victim.example\r\n": {Vector: "SYN", Targets: []string{"victim.example"}, Raw: "SYN victim.example",
			Text: "SYN victim.example"},
	} {
		got, ok := HTTPOrder([]byte(body))
		if !ok || got.Vector != want.Vector || !slices.Equal(got.Targets, want.Targets) || !slices.Equal(got.Ports, want.Ports) ||
			got.Duration != want.Duration || got.Raw != want.Raw || got.Text != want.Text {
			t.Errorf("%q: %+v, %v", body, got, ok)
		}
	}
	for _, body := range []string{"", "udp", "udp 1.2", "udp v2.0", "udp 203.0.113.77 99999", "udp 203.0.113.77 9 soon",
		`{"task":["udp 203.0.113.77"]}`, `{"task":"udp 203.0.113.77"`, "<p>udp 203.0.113.77</p>"} {
		if c, ok := HTTPOrder([]byte(body)); ok {
			t.Errorf("%q is no order: %+v", body, c)
		}
	}
	if got := TargetHost("https://victim.example:8443/x"); got != "victim.example" {
		t.Errorf("TargetHost: %q", got)
	}
}

// What reading an answer for an order costs: a poll's usual answer, a
// small page, an order.
func BenchmarkHTTPOrder(b *testing.B) {
	for name, body := range map[string]string{"sleep": `{"task":"sleep"}`, "page": "<html><body>" + strings.Repeat("<p>welcome</p>\n", 30) + "</body></html>",
		"order": `{"task":"udp 203.0.113.77 9 4"}`} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				HTTPOrder([]byte(body))
			}
		})
	}
}
