package allowlist

import (
	endpt "github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"strings"
	"unicode/utf8"

	"github.com/talkbox-sandbox/talkbox/internal/dnsname"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Every string that reaches a revision or an export started, somewhere,
// as bytes a guest chose. These functions are the boundary: what a
// revision stores is what it reads back (its hash and enforced list hold),
// and what an export writes stays one field of one line.

// asStored is s as a JSON round trip returns it: each byte that is not
// UTF-8 becomes U+FFFD, as encoding/json writes it. A revision hashes
// what it stores, so that it verifies when read back.
func asStored(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// storable makes a revision's entries and refusals what they will read
// back as, and takes out of the enforced set any entry whose value is not
// a valid endpoint or a name that may be forwarded (content written
// before values were checked, brought back by a rollback): such an entry
// is revoked, saying why, rather than fail the write or the apply.
func storable(es []*records.AllowEntry, rs []records.Refusal) {
	for _, e := range es {
		e.Type, e.Value, e.Reason, e.Note = asStored(e.Type), asStored(e.Value), asStored(e.Reason), asStored(e.Note)
		e.Observable, e.Class, e.Verdict, e.Cycle = asStored(e.Observable), asStored(e.Class), asStored(e.Verdict), asStored(e.Cycle)
		for i, n := range e.Names {
			e.Names[i] = asStored(n)
		}
		for i, u := range e.UIDs {
			e.UIDs[i] = asStored(u)
		}
		if enforced(e.Status) {
			if why := invalidValue(e); why != "" {
				e.Status, e.Reason = records.StatusRevoked, "not enforced: "+why
			}
		}
	}
	for i := range rs {
		r := &rs[i]
		r.Target, r.Class, r.Reason = asStored(r.Target), asStored(r.Class), asStored(r.Reason)
		for j, x := range r.Examples {
			r.Examples[j] = asStored(x)
		}
		for j, u := range r.UIDs {
			r.UIDs[j] = asStored(u)
		}
	}
}

// invalidValue is why an entry's value cannot be enforced ("" when it
// can): an endpoint that does not parse, a name that may not be forwarded.
func invalidValue(e *records.AllowEntry) string {
	switch e.Type {
	case records.AllowEndpoint:
		if _, err := endpt.Parse(e.Value); err != nil {
			return err.Error()
		}
	case records.AllowDomain:
		if _, err := dnsname.Forwardable(e.Value); err != nil {
			return err.Error()
		}
	default:
		return "unknown type " + dnsname.Display(e.Type)
	}
	return ""
}

// oneField is s as one field of a line-oriented export (Zeek's
// tab-separated intel, a Suricata rule's message): control characters
// become spaces, bytes that are not UTF-8 U+FFFD, and the characters the
// format gives meaning (sep) are replaced by repl.
func oneField(s string, sep, repl string) string {
	s = asStored(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r < 0x20 || r == 0x7f || r == '\u2028' || r == '\u2029':
			b.WriteByte(' ')
		case strings.ContainsRune(sep, r):
			b.WriteString(repl)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
