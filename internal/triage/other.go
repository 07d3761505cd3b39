package triage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// maxShebang is the longest first line we look at; Linux reads 256 bytes.
const maxShebang = 512

func inspectScript(h []byte) records.Triage {
	t := records.Triage{Format: "script"}
	line := h[2:min(len(h), maxShebang)]
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	line = bytes.TrimRight(line, "\r")
	fields := strings.Fields(string(line))
	if len(fields) == 0 {
		t.Problem = "shebang without interpreter"
		return t
	}
	t.Interpreter = fields[0]
	name, args := baseName(fields[0]), fields[1:]
	if name == "env" {
		name, args = envTarget(args)
	}
	detail(&t, "interpreter", name)
	if len(args) > 0 {
		detail(&t, "args", strings.Join(args, " "))
	}
	return t
}

func baseName(p string) string {
	if i := strings.LastIndexAny(p, `/\`); i >= 0 {
		return p[i+1:]
	}
	return p
}

// envTarget finds the program /usr/bin/env will run, skipping its options
// and NAME=value assignments.
func envTarget(args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-u" || a == "--unset" || a == "-C" || a == "--chdir":
			i++ // option with a separate argument
		case a == "-S" || a == "--split-string" || strings.HasPrefix(a, "-"):
		case strings.Contains(a, "="):
		default:
			return baseName(a), args[i+1:]
		}
	}
	return "env", nil
}

// inspectZip counts entries from the end-of-central-directory record.
func inspectZip(s *src) records.Triage {
	t := records.Triage{Format: "zip"}
	// EOCD is the last 22 bytes plus a comment of up to 64 KiB: try a small
	// tail first, since comments are rare.
	for _, tail := range []int64{1 << 10, 22 + 0xffff} {
		tail = min(tail, s.size)
		b := s.at(s.size-tail, tail)
		i := bytes.LastIndex(b, []byte("PK\x05\x06"))
		if i < 0 || len(b)-i < 22 {
			if tail == s.size {
				break
			}
			continue
		}
		entries := uint64(binary.LittleEndian.Uint16(b[i+10:]))
		if entries == 0xffff && i >= 20 && bytes.HasPrefix(b[i-20:], []byte("PK\x06\x07")) {
			// Zip64: the locator points at the zip64 EOCD record.
			off := int64(binary.LittleEndian.Uint64(b[i-20+8:]))
			if r := s.at(off, 56); len(r) == 56 && bytes.HasPrefix(r, []byte("PK\x06\x06")) {
				entries = binary.LittleEndian.Uint64(r[32:])
			}
		}
		detail(&t, "entries", int64(min(entries, 1<<62)))
		return t
	}
	t.Problem = "no end of central directory: truncated zip"
	return t
}

func inspectGzip(s *src) records.Triage {
	t := records.Triage{Format: "gzip"}
	h := s.head
	if len(h) < 10 {
		t.Problem = fmt.Sprintf("truncated gzip header: %d bytes, need 10", len(h))
		return t
	}
	detail(&t, "method", "deflate")
	flg := h[3]
	rest := h[10:]
	if flg&4 != 0 { // FEXTRA
		if len(rest) < 2 {
			return t
		}
		n := int(binary.LittleEndian.Uint16(rest))
		if 2+n > len(rest) {
			return t
		}
		rest = rest[2+n:]
	}
	if flg&8 != 0 { // FNAME
		if i := bytes.IndexByte(rest, 0); i >= 0 {
			detail(&t, "name", string(rest[:i]))
		}
	}
	return t
}

// inspectTar accepts a POSIX/GNU ustar header, or an old v7 header whose
// checksum verifies.
func inspectTar(h []byte) (records.Triage, bool) {
	if len(h) < 512 {
		return records.Triage{}, false
	}
	t := records.Triage{Format: "tar"}
	switch string(h[257:265]) {
	case "ustar\x0000":
		detail(&t, "variant", "ustar")
		return t, true
	case "ustar  \x00":
		detail(&t, "variant", "gnu")
		return t, true
	}
	if h[0] == 0 || !tarChecksumOK(h[:512]) {
		return records.Triage{}, false
	}
	detail(&t, "variant", "v7")
	return t, true
}

func tarChecksumOK(b []byte) bool {
	field := bytes.Trim(b[148:156], " \x00")
	if len(field) == 0 {
		return false
	}
	var want int64
	for _, c := range field {
		if c < '0' || c > '7' {
			return false
		}
		want = want*8 + int64(c-'0')
	}
	var unsigned, signed int64
	for i, c := range b {
		if i >= 148 && i < 156 {
			c = ' '
		}
		unsigned += int64(c)
		signed += int64(int8(c))
	}
	return want == unsigned || want == signed
}
