package dnsname

import (
	"strings"
	"testing"
)

func TestForwardable(t *testing.T) {
	for name, want := range map[string]string{
		"C2.Example.com.":  "c2.example.com",
		"c2.example":       "c2.example",
		"xn--bcher-kva.de": "xn--bcher-kva.de",
		"a-b.example.org":  "a-b.example.org",
	} {
		if got, err := Forwardable(name); err != nil || got != want {
			t.Errorf("Forwardable(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for name, why := range map[string]string{
		"com":                             "single label",
		"gov.":                            "single label",
		"co.uk":                           "public suffix",
		"github.io":                       "public suffix",
		"a/b#c":                           "single label",
		"a/b#c.example.com":               "letters, digits and hyphens",
		"x y.example.com":                 "letters, digits and hyphens",
		"evil.com\nserver=/x/1.1":         "letters, digits and hyphens",
		"q\"uote.com":                     "letters, digits and hyphens",
		"semi;colon.com":                  "letters, digits and hyphens",
		"\xff\xfe.com":                    "letters, digits and hyphens",
		"under_score.com":                 "letters, digits and hyphens",
		"-lead.com":                       "hyphen",
		"*.example.com":                   "letters, digits and hyphens",
		"x.example.com#":                  "letters, digits and hyphens",
		"a..com":                          "empty",
		"":                                "empty",
		"198.51.100.7":                    "all-numeric",
		strings.Repeat("a", 64) + ".com":  "63",
		strings.Repeat("a.", 130) + "com": "longer than 253",
	} {
		got, err := Forwardable(name)
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("Forwardable(%q) = %q, %v; want an error saying %q", name, got, err, why)
		}
		if err != nil && strings.ContainsAny(err.Error(), "\n\r\t\xff") {
			t.Errorf("the error for %q is not one printable line: %q", name, err)
		}
	}
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"*.gov", "gov", true},
		{"*.gov", "www.nasa.gov.", true},
		{"*.gov", "notgov", false},
		{"*.gov", "gov.example.com", false},
		{"time.*", "time.windows.com", true},
		{"time.*", "timex.com", false},
		{"*.time.*", "a.time.b", true},
		{"github.com", "GitHub.com", true},
		{"github.com", "api.github.com", false},
		{"wpad", "wpad", true},
	} {
		if got := Match(c.pattern, c.name); got != c.want {
			t.Errorf("Match(%q, %q) = %v", c.pattern, c.name, got)
		}
	}
}

func TestDisplay(t *testing.T) {
	if got := Display("a\nb\"\xff"); got != `"a\nb\"\xff"` {
		t.Errorf("Display = %s", got)
	}
	if got := Display(strings.Repeat("x", 500)); len(got) > maxDisplay+8 {
		t.Errorf("Display of 500 bytes is %d long", len(got))
	}
}
