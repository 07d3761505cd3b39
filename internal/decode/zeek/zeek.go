// Package zeek reads Zeek logs, TSV (with its #fields header) or JSON lines,
// and turns conn, dns, http, ssl, files and notice entries into
// observables. Other logs are read and skipped.
package zeek

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/talkbox-sandbox/talkbox/internal/decode"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/lines"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// row gives access to one log entry's fields by Zeek name ("id.orig_h").
type row interface {
	str(name string) (string, bool) // false when absent or unset
	list(name string) []string
}

// Read reads one Zeek log (TSV or JSON lines) and passes observables to sink.
// Malformed lines are counted and skipped; the error is for the stream
// itself (a read error).
func Read(ctx context.Context, br *bufio.Reader, o observe.Origin, sink decode.Sink) (lines.Stats, error) {
	var st lines.Stats
	t := &tsv{sep: "\t", setSep: ",", empty: "(empty)", unset: "-"}
	err := lines.Each(ctx, br, &st, func(line []byte, n int64) error {
		switch {
		case line[0] == '#':
			return t.header(line)
		case line[0] == '{':
			if !gjson.ValidBytes(line) {
				return errors.New("invalid JSON")
			}
			j := jsonRow{line}
			return entry(guessPath(j), j, o, n, sink)
		case t.fields == nil:
			return errors.New("data before the #fields header")
		}
		if err := t.row(line); err != nil {
			return err
		}
		return entry(t.path, t, o, n, sink)
	})
	return st, err
}

// tsv is the state of a TSV log: its header and the current row.
type tsv struct {
	sep, setSep, empty, unset string
	path                      string
	fields                    map[string]int
	vals                      []string
}

func unescape(s string) string {
	if !strings.Contains(s, `\x`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s)+0 && i+3 <= len(s)-1 && s[i+1] == 'x' {
			if v, err := strconv.ParseUint(s[i+2:i+4], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (t *tsv) header(line []byte) error {
	s := string(line)
	switch {
	case strings.HasPrefix(s, "#separator "):
		sep := unescape(strings.TrimPrefix(s, "#separator "))
		if sep == "" {
			return errors.New("empty separator")
		}
		t.sep = sep
		return nil
	}
	key, val, _ := strings.Cut(s, t.sep)
	switch key {
	case "#set_separator":
		t.setSep = unescape(val)
	case "#empty_field":
		t.empty = val
	case "#unset_field":
		t.unset = val
	case "#path":
		t.path = val
	case "#fields":
		names := strings.Split(val, t.sep)
		if len(names) > 512 {
			return errors.New("too many fields")
		}
		t.fields = make(map[string]int, len(names))
		for i, n := range names {
			t.fields[n] = i
		}
	}
	return nil
}

func (t *tsv) row(line []byte) error {
	t.vals = strings.Split(string(line), t.sep)
	if len(t.vals) != len(t.fields) {
		return fmt.Errorf("%d fields, the header has %d", len(t.vals), len(t.fields))
	}
	return nil
}

func (t *tsv) str(name string) (string, bool) {
	i, ok := t.fields[name]
	if !ok || i >= len(t.vals) {
		return "", false
	}
	v := t.vals[i]
	if v == t.unset {
		return "", false
	}
	if v == t.empty {
		return "", true
	}
	return unescape(v), true
}

func (t *tsv) list(name string) []string {
	v, ok := t.str(name)
	if !ok || v == "" {
		return nil
	}
	parts := strings.Split(v, t.setSep)
	if len(parts) > observe.MaxAnswers {
		parts = parts[:observe.MaxAnswers]
	}
	return parts
}

type jsonRow struct{ line []byte }

func jpath(name string) string { return strings.ReplaceAll(name, ".", `\.`) }

func (j jsonRow) str(name string) (string, bool) {
	r := gjson.GetBytes(j.line, jpath(name))
	if !r.Exists() || r.Type == gjson.Null {
		return "", false
	}
	if r.Type == gjson.Number {
		return r.Raw, true
	}
	return r.String(), true
}

func (j jsonRow) list(name string) []string {
	r := gjson.GetBytes(j.line, jpath(name))
	if !r.IsArray() {
		if s, ok := j.str(name); ok {
			return []string{s}
		}
		return nil
	}
	var out []string
	r.ForEach(func(_, v gjson.Result) bool {
		out = append(out, v.String())
		return len(out) < observe.MaxAnswers
	})
	return out
}

// guessPath names the log a JSON entry comes from by its fields.
func guessPath(r row) string {
	has := func(n string) bool { _, ok := r.str(n); return ok }
	switch {
	case has("conn_state") || has("orig_ip_bytes"):
		return "conn"
	case has("query") || has("trans_id") && has("rcode"):
		return "dns"
	case has("note"):
		return "notice"
	case has("method") || has("status_code") || has("trans_depth"):
		return "http"
	case has("server_name") || has("cipher") || has("ssl_history"):
		return "ssl"
	case has("fuid") && (has("mime_type") || has("seen_bytes") || has("sha256") || has("md5")):
		return "files"
	}
	return ""
}

// parseTS reads Zeek's ts: epoch seconds, or ISO 8601 in JSON logs.
func parseTS(s string) (time.Time, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e11 {
			return time.Time{}, fmt.Errorf("bad ts %q", s)
		}
		sec, frac := math.Modf(f)
		return time.Unix(int64(sec), int64(math.Round(frac*1e6))*1e3).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("bad ts %q", s)
	}
	return t.UTC(), nil
}

func num(r row, name string) int64 {
	s, ok := r.str(name)
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

func addrOf(r row, name string) (netip.Addr, error) {
	s, _ := r.str(name)
	a, err := netip.ParseAddr(s)
	if err != nil {
		return a, fmt.Errorf("field %s: bad address %q", name, s)
	}
	return a.Unmap(), nil
}

func portOf(r row, name string) (uint16, error) {
	s, _ := r.str(name)
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("field %s: bad port %q", name, s)
	}
	return uint16(p), nil
}

type conn struct {
	oh, rh netip.Addr
	op, rp uint16
}

func connID(r row) (conn, error) {
	var c conn
	var err error
	if c.oh, err = addrOf(r, "id.orig_h"); err != nil {
		return c, err
	}
	if c.rh, err = addrOf(r, "id.resp_h"); err != nil {
		return c, err
	}
	if c.op, err = portOf(r, "id.orig_p"); err != nil {
		return c, err
	}
	if c.rp, err = portOf(r, "id.resp_p"); err != nil {
		return c, err
	}
	return c, nil
}

func one(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// entry turns one log entry into observables.
func entry(path string, r row, o observe.Origin, line int64, sink decode.Sink) error {
	tss, ok := r.str("ts")
	if !ok {
		return errors.New("no ts")
	}
	ts, err := parseTS(tss)
	if err != nil {
		return err
	}
	// Every log of a connection names it by its uid, as conn.log does.
	if uid, _ := r.str("uid"); flowlog.ValidUID(uid) {
		o = o.OfConn(uid)
	}
	switch path {
	case "conn":
		return connEntry(r, o, ts, line, sink)
	case "dns":
		return dnsEntry(r, o, ts, line, sink)
	case "http":
		return httpEntry(r, o, ts, line, sink)
	case "ssl":
		return sslEntry(r, o, ts, line, sink)
	case "files":
		return filesEntry(r, o, ts, line, sink)
	case "notice":
		return noticeEntry(r, o, ts, line, sink)
	}
	return nil
}

func connEntry(r row, o observe.Origin, ts time.Time, line int64, sink decode.Sink) error {
	c, err := connID(r)
	if err != nil {
		return err
	}
	proto, _ := r.str("proto")
	var dur float64
	if s, ok := r.str("duration"); ok {
		if dur, err = strconv.ParseFloat(s, 64); err != nil || dur < 0 || dur > 1e9 || math.IsNaN(dur) {
			return fmt.Errorf("bad duration %q", s)
		}
	}
	last := ts.Add(time.Duration(dur * 1e9))
	state, _ := r.str("conn_state")
	service, _ := r.str("service")
	history, _ := r.str("history")
	if o.UID == "" {
		// The flow log names every connection: one by its line.
		o = o.OfConn(flowlog.NewUIDs(o.Key()).At(line))
	}
	conn := flowlog.Conn{UID: o.UID, Start: ts.UnixNano(), End: last.UnixNano(), Proto: proto, OrigH: c.oh, OrigP: c.op, RespH: c.rh, RespP: c.rp,
		Service: service, ConnState: state, History: history,
		OrigPkts: num(r, "orig_pkts"), OrigBytes: num(r, "orig_bytes"), OrigIPBytes: num(r, "orig_ip_bytes"),
		RespPkts: num(r, "resp_pkts"), RespBytes: num(r, "resp_bytes"), RespIPBytes: num(r, "resp_ip_bytes"), Line: line}
	sink.Conn(&conn)
	fi := &conn
	if proto == "icmp" {
		v := c.oh.String() + ">" + c.rh.String() + " " + strconv.Itoa(int(c.op)) + "/" + strconv.Itoa(int(c.rp))
		ic := o.New(records.ObsICMP, v, ts, 0, line)
		ic.LastSeen = last
		ic.ICMP = &records.ICMPInfo{OrigH: c.oh.String(), RespH: c.rh.String(), Type: uint8(c.op), Code: uint8(c.rp),
			V6: c.oh.Is6(), Packets: fi.OrigPkts + fi.RespPkts, Bytes: fi.OrigBytes + fi.RespBytes}
		sink.Add(ic)
	}
	return nil
}

func dnsEntry(r row, o observe.Origin, ts time.Time, line int64, sink decode.Sink) error {
	c, err := connID(r)
	if err != nil {
		return err
	}
	q, ok := r.str("query")
	if !ok || q == "" {
		return nil // a response Zeek could not pair with a question
	}
	proto, _ := r.str("proto")
	qtype, _ := r.str("qtype_name")
	rcode, hasRcode := r.str("rcode_name")
	name := observe.NormName(q)
	obs, d := o.NewDomain(name, ts, 0, line, qtype, rcode, proto, c.rh.String(), c.oh.String())
	d.Queries = 1
	if hasRcode {
		d.Responses = 1
	}
	answers, ttls := r.list("answers"), r.list("TTLs")
	for i, a := range answers {
		var ttl uint32
		if i < len(ttls) {
			if f, err := strconv.ParseFloat(ttls[i], 64); err == nil && f >= 0 && f < math.MaxUint32 {
				ttl = uint32(f)
			}
		}
		typ := qtype
		if ip, err := netip.ParseAddr(a); err == nil {
			typ = "A"
			if ip.Is6() && !ip.Is4In6() {
				typ = "AAAA"
			}
			d.Addrs = append(d.Addrs, ip.Unmap().String())
			a = ip.Unmap().String()
		} else if strings.HasPrefix(a, "TXT ") {
			typ = "TXT"
			if _, rest, ok := strings.Cut(a[4:], " "); ok {
				a = rest
			}
		} else if typ == "A" || typ == "AAAA" || typ == "" {
			typ = "CNAME"
			a = observe.NormName(a)
			d.CNAMEs = append(d.CNAMEs, a)
		}
		if len(d.Answers) < observe.MaxAnswers {
			d.Answers = append(d.Answers, records.DNSAnswer{Name: name, Type: typ, Data: a, TTL: ttl})
		}
	}
	sink.Add(obs)
	return nil
}

func httpEntry(r row, o observe.Origin, ts time.Time, line int64, sink decode.Sink) error {
	c, err := connID(r)
	if err != nil {
		return err
	}
	method, _ := r.str("method")
	host, _ := r.str("host")
	uri, _ := r.str("uri")
	if method == "" && uri == "" {
		return nil // a response without a request
	}
	server := observe.HostPort(c.rh, c.rp)
	vhost := cmp.Or(host, server)
	ua, _ := r.str("user_agent")
	status := 0
	if s := num(r, "status_code"); s > 0 && s < 1000 {
		status = int(s)
	}
	obs, _ := o.NewHTTP(observe.HTTPValue(method, vhost, uri), ts, 0, line, method, host, uri, ua, status, server, c.oh.String())
	sink.Add(obs)
	return nil
}

func sslEntry(r row, o observe.Origin, ts time.Time, line int64, sink decode.Sink) error {
	c, err := connID(r)
	if err != nil {
		return err
	}
	sni, _ := r.str("server_name")
	sni = strings.ToLower(sni)
	server := observe.HostPort(c.rh, c.rp)
	version, _ := r.str("version")
	ja3, _ := r.str("ja3")
	ja4, _ := r.str("ja4")
	alpn, _ := r.str("next_protocol")
	obs, _ := o.NewTLS(cmp.Or(sni, server), ts, 0, line, sni, version, ja3, ja4, alpn, server, c.oh.String())
	sink.Add(obs)
	return nil
}

func filesEntry(r row, o observe.Origin, ts time.Time, line int64, sink decode.Sink) error {
	f := &records.FileInfo{}
	f.MIMEType, _ = r.str("mime_type")
	f.SHA256, _ = r.str("sha256")
	f.SHA1, _ = r.str("sha1")
	f.MD5, _ = r.str("md5")
	f.Size = max(num(r, "total_bytes"), num(r, "seen_bytes"))
	if fn, ok := r.str("filename"); ok && fn != "" {
		f.Filenames = []string{fn}
	}
	f.Hosts = r.list("tx_hosts")
	if len(f.Hosts) == 0 {
		// Zeek 5+: the connection's responder sent it unless is_orig.
		name := "id.resp_h"
		if s, _ := r.str("is_orig"); s == "T" || s == "true" {
			name = "id.orig_h"
		}
		if h, ok := r.str(name); ok {
			f.Hosts = []string{h}
		}
	}
	value := f.SHA256
	for _, v := range []string{f.SHA1, f.MD5} {
		if value == "" {
			value = v
		}
	}
	if value == "" {
		value, _ = r.str("fuid")
	}
	if value == "" {
		return errors.New("file entry without hash or fuid")
	}
	obs := o.New(records.ObsFile, strings.ToLower(value), ts, 0, line)
	obs.File = f
	sink.Add(obs)
	return nil
}

func noticeEntry(r row, o observe.Origin, ts time.Time, line int64, sink decode.Sink) error {
	note, ok := r.str("note")
	if !ok || note == "" {
		return errors.New("notice without note")
	}
	n := &records.NoticeInfo{Note: note}
	if m, ok := r.str("msg"); ok {
		n.Msgs = one(m)
	}
	for _, k := range []string{"src", "id.orig_h"} {
		if s, ok := r.str(k); ok && len(n.Src) == 0 {
			n.Src = one(s)
		}
	}
	for _, k := range []string{"dst", "id.resp_h"} {
		if s, ok := r.str(k); ok && len(n.Dst) == 0 {
			n.Dst = one(s)
		}
	}
	obs := o.New(records.ObsNotice, note, ts, 0, line)
	obs.Notice = n
	sink.Add(obs)
	return nil
}
