package behave

import (
	"bytes"
	"strconv"
	"strings"
	"time"
)

// lineKind is what one line of a trace holds.
type lineKind uint8

const (
	lineOther      lineKind = iota // a signal, a note, a fragment
	lineCall                       // a complete call: name(args) = ret
	lineUnfinished                 // name(args <unfinished ...>
	lineResumed                    // <... name resumed>rest
	lineExited                     // +++ exited with N +++
	lineKilled                     // +++ killed by SIG +++
	lineBad                        // not a trace line
)

// line is one lexed line: the process, the time, and the call or event.
type line struct {
	kind lineKind
	pid  int
	ts   time.Time
	name string // the call's name
	body string // call: "args) = ret <dur>"; unfinished: "args"; resumed: the rest
	code int    // exit code
	sig  string // killed by
	core bool
}

// lexStrace reads one line of strace output (-f, -ttt or none, -T, -y).
func lexStrace(b []byte) line {
	var l line
	s := string(b)
	if n := leadingDigits(s); n > 0 && n < len(s) && s[n] == ' ' {
		pid, _ := strconv.Atoi(s[:n])
		l.pid, s = pid, strings.TrimLeft(s[n:], " ")
	}
	if n := leadingDigits(s); n > 0 && n < len(s) && s[n] == '.' {
		m := n + 1 + leadingDigits(s[n+1:])
		if m < len(s) && s[m] == ' ' {
			l.ts = parseEpoch(s[:m])
			s = s[m+1:]
		}
	}
	return lexEvent(l, s)
}

// lexEvent reads what follows the pid and time.
func lexEvent(l line, s string) line {
	switch {
	case strings.HasPrefix(s, "+++ exited with "):
		code, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(s, "+++ exited with "), " +++"))
		if err != nil {
			l.kind = lineBad
			return l
		}
		l.kind, l.code = lineExited, code
	case strings.HasPrefix(s, "+++ killed by "):
		rest := strings.TrimSuffix(strings.TrimPrefix(s, "+++ killed by "), " +++")
		l.core = strings.HasSuffix(rest, " (core dumped)")
		l.kind, l.sig = lineKilled, strings.TrimSuffix(rest, " (core dumped)")
	case strings.HasPrefix(s, "+++ "), strings.HasPrefix(s, "--- "), strings.HasPrefix(s, "[ "):
		l.kind = lineOther // other notes, signals delivered, personality changes
	case strings.HasPrefix(s, "<... "):
		i := strings.Index(s, " resumed>")
		if i < len("<... ") { // none, or one that names no call
			l.kind = lineBad
			return l
		}
		l.kind, l.name, l.body = lineResumed, s[5:i], s[i+len(" resumed>"):]
	default:
		n := nameLen(s)
		if strings.HasPrefix(s, "???(") {
			n = 3 // a call strace could not name (a thread ending as it entered one)
		}
		if n == 0 || n >= len(s) || s[n] != '(' {
			l.kind = lineBad
			return l
		}
		l.name = s[:n]
		body := s[n+1:]
		if u := strings.LastIndex(body, "<unfinished ...>"); u >= 0 && strings.TrimSpace(body[u+len("<unfinished ...>"):]) == "" {
			l.kind, l.body = lineUnfinished, body[:u]
			return l
		}
		l.kind, l.body = lineCall, body
	}
	return l
}

func leadingDigits(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}

// nameLen is the length of a system call name at the start of s.
func nameLen(s string) int {
	n := 0
	for n < len(s) {
		c := s[n]
		if c == '_' || c >= 'a' && c <= 'z' || n > 0 && (c >= '0' && c <= '9' || c >= 'A' && c <= 'Z') {
			n++
			continue
		}
		break
	}
	return n
}

// parseEpoch reads seconds.fraction since the epoch (strace -ttt).
func parseEpoch(s string) time.Time {
	sec, frac, _ := strings.Cut(s, ".")
	secs, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}
	}
	var ns int64
	for i := 0; i < 9; i++ {
		ns *= 10
		if i < len(frac) {
			ns += int64(frac[i] - '0')
		}
	}
	return time.Unix(secs, ns).UTC()
}

// call is a complete call's arguments and result.
type call struct {
	args  []string
	ret   string  // "0", "3", "0x7f..", "?" (no result), "" (none printed)
	errno string  // the error's name when ret is -1
	dur   float64 // seconds (strace -T), -1 when not printed
	ok    bool    // the arguments' closing parenthesis was found
}

// failed reports whether the call returned an error.
func (c *call) failed() bool { return c.errno != "" || strings.HasPrefix(c.ret, "-") }

// succeeded reports whether the call returned a result that is not an
// error (QEMU's log may miss a result: not a success).
func (c *call) succeeded() bool { return c.ret != "" && c.ret != "?" && !c.failed() }

// result names a call's outcome for counts: "0", the error name, or "?".
func (c *call) result() string {
	switch {
	case c.errno != "":
		return c.errno
	case c.ret == "" || c.ret == "?":
		return "?"
	case strings.HasPrefix(c.ret, "-"):
		return c.ret
	}
	return "0"
}

// retInt is the result as a number (file descriptors, pids).
func (c *call) retInt() (int, bool) {
	if c.failed() {
		return 0, false
	}
	v, _, _ := strings.Cut(c.ret, "<") // strace -y: 3</path>
	n, err := strconv.Atoi(v)
	return n, err == nil
}

// parseCall splits "args) = ret" into arguments and result. qemu selects
// QEMU's quoting (no escapes) and error form ("-1 errno=N (message)").
func parseCall(body string, qemu bool) call {
	c := call{dur: -1}
	end := closeParen(body, qemu)
	if end < 0 {
		return c
	}
	c.ok = true
	c.args = splitArgs(body[:end], qemu)
	rest := strings.TrimSpace(body[end+1:])
	if i := strings.LastIndexByte(rest, '<'); i >= 0 && strings.HasSuffix(rest, ">") {
		if d, err := strconv.ParseFloat(rest[i+1:len(rest)-1], 64); err == nil {
			c.dur = d
			rest = strings.TrimSpace(rest[:i])
		}
	}
	// QEMU's log can carry a second " = " when a forked child printed its
	// own return after the parent's call: the last one is the result.
	for strings.HasPrefix(rest, "=") {
		rest = strings.TrimLeft(rest[1:], " ")
	}
	ret, more, _ := strings.Cut(rest, " ")
	c.ret = ret
	if strings.HasPrefix(ret, "-") {
		more = strings.TrimSpace(more)
		switch {
		case qemu && strings.HasPrefix(more, "errno="):
			c.errno = qemuErrno(more)
		case !qemu && len(more) > 1 && more[0] == 'E':
			c.errno, _, _ = strings.Cut(more, " ")
		}
	} else if ret == "?" && !qemu {
		// "= ? ERESTARTSYS (...)": interrupted, restarted later.
		more = strings.TrimSpace(more)
		if strings.HasPrefix(more, "ERESTART") {
			c.errno, _, _ = strings.Cut(more, " ")
		}
	}
	return c
}

// closeParen finds the parenthesis closing a call's arguments, skipping
// quoted strings and nested brackets; -1 when the line ends first.
func closeParen(s string, qemu bool) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			j := endQuote(s, i, qemu)
			if j < 0 {
				return -1
			}
			i = j
		case '<':
			i = skipAnnotation(s, i)
		case '(', '[', '{':
			depth++
		case ']', '}':
			depth--
		case ')':
			if depth == 0 {
				return i
			}
			depth--
		}
	}
	return -1
}

// skipAnnotation skips strace -y's "<path>" after a file descriptor
// (whose path may hold parentheses): the index of its '>', or i.
func skipAnnotation(s string, i int) int {
	if i == 0 || s[i-1] < '0' || s[i-1] > '9' {
		return i
	}
	if j := strings.IndexByte(s[i:], '>'); j >= 0 {
		return i + j
	}
	return i
}

// endQuote is the index of the quote closing the string opened at i.
// QEMU prints strings as they are, without escapes: its string ends at the
// first quote followed by what may follow an argument.
func endQuote(s string, i int, qemu bool) int {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			if !qemu {
				j++
			}
		case '"':
			if !qemu || j+1 == len(s) || strings.IndexByte(",)}]. ", s[j+1]) >= 0 {
				return j
			}
		}
	}
	return -1
}

// splitArgs splits at the commas outside strings and brackets.
func splitArgs(s string, qemu bool) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			if j := endQuote(s, i, qemu); j >= 0 {
				i = j
			}
		case '<':
			i = skipAnnotation(s, i)
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	if rest := strings.TrimSpace(s[start:]); rest != "" || len(out) > 0 {
		out = append(out, rest)
	}
	return out
}

// unquote decodes a string argument: strace's C escapes (\n, \t, \", \\,
// \xHH, octal \NNN), or QEMU's string as it is (a string strace cut at -s
// bytes, followed by "...", is what it holds); ok is false when s is no
// string.
func unquote(s string, qemu bool) (v string, ok bool) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "@\"") { // an abstract socket name
		v, ok = unquote(s[1:], qemu)
		return "@" + v, ok
	}
	if len(s) < 2 || s[0] != '"' {
		return "", false
	}
	end := endQuote(s, 0, qemu)
	if end < 0 {
		return "", false
	}
	if qemu {
		return s[1:end], true
	}
	body := s[1:end]
	if strings.IndexByte(body, '\\') < 0 {
		return body, true
	}
	var b bytes.Buffer
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c != '\\' || i+1 == len(body) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := body[i]; e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'v':
			b.WriteByte('\v')
		case 'f':
			b.WriteByte('\f')
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'x':
			n, v := 0, 0
			for n < 2 && i+1 < len(body) && isHex(body[i+1]) {
				i++
				v = v*16 + hexVal(body[i])
				n++
			}
			b.WriteByte(byte(v))
		default:
			if e >= '0' && e <= '7' {
				v := int(e - '0')
				for n := 1; n < 3 && i+1 < len(body) && body[i+1] >= '0' && body[i+1] <= '7'; n++ {
					i++
					v = v*8 + int(body[i]-'0')
				}
				b.WriteByte(byte(v))
				continue
			}
			b.WriteByte(e) // \" \\ and anything else
		}
	}
	return b.String(), true
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	}
	return int(c-'A') + 10
}

// qemuErrno names the error of "errno=N (message)" by its message: the
// numbers are the target architecture's (MIPS numbers differ), the message
// is the host's strerror.
func qemuErrno(s string) string {
	num, msg, _ := strings.Cut(strings.TrimPrefix(s, "errno="), " ")
	msg = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(msg), "("), ")")
	if name := errnoByMessage(msg); name != "" {
		return name
	}
	return "errno=" + num
}

// errnoByMessage names the errors that matter to the observables by
// glibc's strerror texts.
func errnoByMessage(msg string) string {
	switch msg {
	case "Operation not permitted":
		return "EPERM"
	case "No such file or directory":
		return "ENOENT"
	case "No such process":
		return "ESRCH"
	case "Interrupted system call":
		return "EINTR"
	case "Permission denied":
		return "EACCES"
	case "File exists":
		return "EEXIST"
	case "Not a directory":
		return "ENOTDIR"
	case "Is a directory":
		return "EISDIR"
	case "Read-only file system":
		return "EROFS"
	case "Function not implemented":
		return "ENOSYS"
	case "Bad file descriptor":
		return "EBADF"
	case "Invalid argument":
		return "EINVAL"
	case "Address already in use":
		return "EADDRINUSE"
	case "Cannot assign requested address":
		return "EADDRNOTAVAIL"
	case "Network is unreachable":
		return "ENETUNREACH"
	case "Connection refused":
		return "ECONNREFUSED"
	case "Connection timed out":
		return "ETIMEDOUT"
	case "No route to host":
		return "EHOSTUNREACH"
	case "Operation now in progress":
		return "EINPROGRESS"
	case "Operation already in progress":
		return "EALREADY"
	case "Resource temporarily unavailable":
		return "EAGAIN"
	case "Address family not supported by protocol":
		return "EAFNOSUPPORT"
	case "Transport endpoint is not connected":
		return "ENOTCONN"
	case "No child processes":
		return "ECHILD"
	}
	return ""
}

// qemuLexer reads QEMU's user-mode strace log ("PID name(args) = ret").
// Processes write their calls in pieces into one stream, so a line can
// hold several calls, pieces of them, or another process's call written
// into the middle of one: each call found is passed on, attributed to the
// pid before it (or to that of the line before).
type qemuLexer struct {
	pid int
	// partial is a call cut at the end of a line, and its pid, until a
	// piece that completes it.
	partial    string
	partialPID int
}

// line reads one line and reports whether part of it was no call.
func (q *qemuLexer) line(b []byte, fn func(line)) (garbled bool) {
	s := string(b)
	for {
		s = strings.TrimLeft(s, " ")
		if s == "" {
			return garbled
		}
		if n := leadingDigits(s); n == len(s) {
			return garbled // a return's number, its " = " on another line
		} else if n > 0 && s[n] == ' ' {
			q.pid, _ = strconv.Atoi(s[:n])
			s = s[n:]
			continue
		}
		if strings.HasPrefix(s, "=") {
			// A lone return: a forked child's half of its parent's call.
			s = strings.TrimLeft(s, "= ")
			s = s[leadingToken(s):]
			continue
		}
		if strings.HasPrefix(s, "Unknown syscall") || strings.HasPrefix(s, "--- ") || strings.HasPrefix(s, "+++ ") {
			return garbled
		}
		pid, n := q.pid, nameLen(s)
		if n == 0 || n == len(s) || s[n] != '(' {
			// No call: the rest of the call cut at the end of a line?
			if q.partial == "" {
				return true
			}
			s, pid = q.partial+s, q.partialPID
			q.partial = ""
			n = nameLen(s)
		}
		// Another process's call written into the middle of this one's
		// arguments: taken out, and read after it.
		var inner []line
		for {
			l, start, stop := embeddedCall(s[n+1:])
			if stop == 0 {
				break
			}
			inner = append(inner, l)
			s = s[:n+1+start] + s[n+1+stop:]
		}
		end := closeParen(s[n+1:], true)
		if end < 0 {
			// Cut: kept for a piece that completes it, without another
			// process's return written after it.
			p := s
			if i := strings.LastIndex(p, " = "); i > n && !strings.ContainsAny(p[i+3:], ",)\"") {
				p = p[:i]
			}
			garbled = garbled || q.partial != "" // the one before is lost
			q.partial, q.partialPID = p, pid
			for _, l := range inner {
				fn(l)
			}
			return garbled
		}
		stop := n + 1 + end + 1 + resultLen(s[n+1+end+1:])
		fn(line{kind: lineCall, pid: pid, name: s[:n], body: s[n+1 : stop]})
		for _, l := range inner {
			fn(l)
		}
		s = s[stop:]
	}
}

// embeddedCall finds a complete "PID name(args)" right after a comma or a
// parenthesis of s (outside strings): a call QEMU wrote for another
// process while this one's was half written. stop is 0 when there is
// none.
func embeddedCall(s string) (l line, start, stop int) {
	for i := 1; i < len(s); i++ {
		switch s[i-1] {
		case '"':
			if j := endQuote(s, i-1, true); j >= 0 {
				i = j + 1
				continue
			}
			return l, 0, 0
		case ',', '(':
		default:
			continue
		}
		d := leadingDigits(s[i:])
		if d == 0 || i+d >= len(s) || s[i+d] != ' ' {
			continue
		}
		rest := s[i+d+1:]
		n := nameLen(rest)
		if n == 0 || n >= len(rest) || rest[n] != '(' {
			continue
		}
		end := closeParen(rest[n+1:], true)
		if end < 0 {
			return l, 0, 0
		}
		pid, _ := strconv.Atoi(s[i : i+d])
		l = line{kind: lineCall, pid: pid, name: rest[:n], body: rest[n+1 : n+1+end+1]}
		return l, i, i + d + 1 + n + 1 + end + 1
	}
	return l, 0, 0
}

// resultLen is the length of a QEMU call's result at the start of s:
// " = ret", " = -1 errno=N (message)", and a "(...)" after it.
func resultLen(s string) int {
	i := 0
	for i < len(s) && (s[i] == ' ' || s[i] == '=') {
		i++
	}
	if i == 0 || !strings.Contains(s[:i], "=") {
		return 0
	}
	i += leadingToken(s[i:])
	if j := strings.Index(s[i:], " errno="); j == 0 {
		i += len(" errno=") + leadingToken(s[i+len(" errno="):])
	}
	if strings.HasPrefix(s[i:], " (") {
		if j := closeParen(s[i+2:], true); j >= 0 {
			i += 2 + j + 1
		}
	}
	return i
}

// leadingToken is the length of the word at the start of s.
func leadingToken(s string) int {
	n := strings.IndexAny(s, " (")
	if n < 0 {
		return len(s)
	}
	return n
}

// topComma is the index of the first comma outside strings and brackets.
func topComma(s string) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			if j := endQuote(s, i, false); j >= 0 {
				i = j
			}
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			depth--
			if depth < 0 {
				return -1
			}
		case ',':
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}
