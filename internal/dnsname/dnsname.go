// Package dnsname decides which DNS names Talkbox may forward to a real
// resolver: every name on an allow list, a DNS forward list or an export
// passes Forwardable first. Names come from guests, so the check is the
// boundary between attacker-chosen bytes and configuration files.
package dnsname

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// maxName is the longest name in presentation form without its final dot
// (RFC 1035: 255 octets on the wire).
const maxName = 253

// Forwardable returns a name in canonical form (lower case, no final dot)
// if it may be forwarded: letters, digits and hyphens in labels of 1 to 63
// characters that neither start nor end with a hyphen, at least two
// labels, a top-level label that is not all digits (an address is not a
// name), and a registrable domain: never a top-level domain or another
// public suffix ("com", "co.uk", "github.io"), whose forward would let every
// name under it through. Otherwise it says why not, quoting the name safely.
func Forwardable(name string) (string, error) {
	n := strings.ToLower(strings.TrimSuffix(name, "."))
	if err := ldh(n); err != nil {
		return "", fmt.Errorf("%s: %w", Display(name), err)
	}
	suffix, _ := publicsuffix.PublicSuffix(n)
	if suffix == n {
		return "", fmt.Errorf("%s: a public suffix, not a registrable domain", Display(name))
	}
	if _, err := publicsuffix.EffectiveTLDPlusOne(n); err != nil {
		return "", fmt.Errorf("%s: not a registrable domain", Display(name))
	}
	return n, nil
}

// ldh checks the syntax of a lower-cased name.
func ldh(n string) error {
	switch {
	case n == "":
		return errors.New("empty")
	case len(n) > maxName:
		return fmt.Errorf("longer than %d characters", maxName)
	}
	labels := strings.Split(n, ".")
	if len(labels) < 2 {
		return errors.New("a single label, not a domain")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return errors.New("a label is empty or longer than 63 characters")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return errors.New("a label starts or ends with a hyphen")
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return errors.New("not letters, digits and hyphens")
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return errors.New("an all-numeric top-level label (an address, not a name)")
	}
	return nil
}

// maxDisplay bounds a refused value as shown in a refusal or an error.
const maxDisplay = 80

// Display is a value from a guest as it may be shown in a record, a log or
// an error: quoted, printable ASCII, at most about maxDisplay characters.
// It is the same for the same value, so that refusals of one value group.
func Display(s string) string {
	if len(s) > maxDisplay {
		return strconv.QuoteToASCII(s[:maxDisplay]) + "…"
	}
	return strconv.QuoteToASCII(s)
}

// Match reports whether a name matches a policy pattern: "*.example.com"
// matches example.com and every name under it ("*.gov" matches "gov"),
// "time.*" any name whose first label is time, "*.time.*" any name with a
// label time inside it, anything else (with path.Match globs) the name
// itself. Case and a final dot do not matter.
func Match(pattern, name string) bool {
	pattern, name = strings.ToLower(pattern), strings.ToLower(strings.TrimSuffix(name, "."))
	wild := func(s string) bool { return strings.ContainsAny(s, "*?[") }
	if base, ok := strings.CutPrefix(pattern, "*."); ok && !wild(base) {
		return name == base || strings.HasSuffix(name, "."+base)
	}
	if first, ok := strings.CutSuffix(pattern, ".*"); ok && !wild(first) {
		return strings.HasPrefix(name, first+".")
	}
	if strings.HasPrefix(pattern, "*.") && strings.HasSuffix(pattern, ".*") {
		return strings.Contains(name, "."+strings.Trim(pattern, "*.")+".")
	}
	ok, _ := path.Match(pattern, name)
	return ok
}
