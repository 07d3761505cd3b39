package cli

import (
	"strings"
	"testing"
	"unicode"
)

// TestPrintable: an error quoting a sample's bytes has nothing a terminal
// acts on; a plain one, and the lines errors.Join makes, are printed as
// they are.
func TestPrintable(t *testing.T) {
	for _, plain := range []string{`sample "a.exe": port tb1: not bound — exit 65`, "first\nsecond"} {
		if got := printable(plain); got != plain {
			t.Errorf("printable(%q) = %q", plain, got)
		}
	}
	for hostile, want := range map[string]string{
		"name \x1b[2J\x1b]0;t\x07 all clean": `name \x1b[2J\x1b]0;t\a all clean`,
		"x\rforged":                          `x\rforged`,
		"bad \xff utf-8":                     `bad \xff utf-8`,
		"rtl \u202e":                         `rtl \u202e`,
	} {
		got := printable(hostile)
		if got != want || strings.IndexFunc(got, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			t.Errorf("printable(%q) = %q, want %q", hostile, got, want)
		}
	}
}
