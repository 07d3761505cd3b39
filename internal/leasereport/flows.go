package leasereport

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"io"
	"strconv"
	"time"

	"github.com/klauspost/compress/zstd"
)

// flowReader reads flow logs (flowlog's format: zstd-compressed conn.log
// JSON lines) one after the other with one decoder and one buffer: for
// the small log of a cycle, making them is most of the work.
type flowReader struct {
	zr *zstd.Decoder
	br *bufio.Reader
	c  conn
}

func newFlowReader() (*flowReader, error) {
	zr, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	return &flowReader{zr: zr, br: bufio.NewReaderSize(nil, 256<<10)}, nil
}

// each calls fn with every connection of the flow log r, numbered from 1,
// as flowlog.Each does with its lines.
func (fr *flowReader) each(r io.Reader, fn func(n int64, c *conn) error) error {
	if err := fr.zr.Reset(r); err != nil {
		return err
	}
	fr.br.Reset(fr.zr)
	var n int64
	for {
		line, err := fr.br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("line %d: longer than %d bytes", n+1, fr.br.Size())
		}
		if line = bytes.TrimSuffix(line, []byte{'\n'}); len(line) > 0 {
			n++
			if !fr.c.parse(line) {
				return fmt.Errorf("line %d: not a conn.log JSON object with ts", n)
			}
			if ferr := fn(n, &fr.c); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("line %d: %w", n+1, err)
		}
	}
}

// conn is what the report reads of a conn.log line; the slices point into
// the line.
type conn struct {
	ns                int64
	host, proto, stat []byte
	port              uint16
	respPkts          int64
}

// parse reads a conn.log JSON line without a JSON decoder: a lease's flow
// logs hold millions of lines. A line as flowlog writes it is read by its
// known layout, any other field by field.
func (c *conn) parse(line []byte) bool {
	return c.parseLayout(line) || c.parseFields(line)
}

// parseLayout reads a line in flowlog.AppendJSON's layout: ts first,
// id.resp_h, id.resp_p and proto in a row later, then conn_state, then
// resp_pkts. Each is found by searching on from the one before, the
// values in between (a uid, service names, history letters, numbers)
// holding no quotes. Anything else is left to parseFields.
func (c *conn) parseLayout(line []byte) bool {
	if !bytes.HasPrefix(line, []byte(`{"ts":`)) {
		return false
	}
	p := len(`{"ts":`)
	ts, p := number(line, p)
	ns, ok := unixNanos(ts)
	if !ok {
		return false
	}
	host, p := after(line, p, `,"id.resp_h":"`, '"')
	port, p := after(line, p, `,"id.resp_p":`, ',')
	proto, p := after(line, p, `,"proto":"`, '"')
	stat, p := after(line, p, `,"conn_state":"`, '"')
	resp, _ := after(line, p, `,"resp_pkts":`, ',')
	if host == nil || proto == nil || stat == nil || bytes.IndexByte(host, '\\') >= 0 {
		return false
	}
	pn, err := strconv.ParseUint(string(port), 10, 16)
	if err != nil {
		return false
	}
	rp, err := strconv.ParseInt(string(resp), 10, 64)
	if err != nil {
		return false
	}
	*c = conn{ns: ns, host: host, proto: proto, stat: stat, port: uint16(pn), respPkts: rp}
	return true
}

// number is the number at p and the index after it.
func number(b []byte, p int) ([]byte, int) {
	i := p
	for p < len(b) && (b[p] >= '0' && b[p] <= '9' || b[p] == '.' || b[p] == '-') {
		p++
	}
	return b[i:p], p
}

// after finds key from p on and returns the value after it, up to end
// (a closing quote, or the comma after a number), and the index past it;
// nil when either is missing.
func after(b []byte, p int, key string, end byte) ([]byte, int) {
	if p < 0 || p > len(b) {
		return nil, -1
	}
	i := bytes.Index(b[p:], []byte(key))
	if i < 0 {
		return nil, -1
	}
	i += p + len(key)
	j := bytes.IndexByte(b[i:], end)
	if j < 0 {
		return nil, -1
	}
	return b[i : i+j], i + j
}

// parseFields reads a conn.log JSON line in one pass, field by field,
// skipping what it does not need (nested arrays and objects included) and
// stopping once it has what it needs.
func (c *conn) parseFields(line []byte) bool {
	*c = conn{ns: -1}
	i := bytes.IndexByte(line, '{')
	if i < 0 {
		return false
	}
	const all = 1<<6 - 1
	seen := 0
	for i++; i < len(line) && seen != all; {
		k := bytes.IndexByte(line[i:], '"')
		if k < 0 {
			break
		}
		k += i + 1
		e := skipString(line, k)
		if e >= len(line) {
			return false
		}
		key := line[k:e]
		v := e + 1
		for v < len(line) && (line[v] == ':' || line[v] == ' ') {
			v++
		}
		var val []byte
		switch {
		case v >= len(line):
			return false
		case line[v] == '"':
			end := skipString(line, v+1)
			val, i = line[v+1:min(end, len(line))], end+1
		case line[v] == '[' || line[v] == '{':
			i = skipNested(line, v)
			continue
		default:
			end := v
			for end < len(line) && line[end] != ',' && line[end] != '}' {
				end++
			}
			val, i = line[v:end], end
		}
		switch string(key) {
		case "ts":
			ns, ok := unixNanos(val)
			if !ok {
				return false
			}
			c.ns, seen = ns, seen|1
		case "id.resp_h":
			c.host, seen = val, seen|2
		case "id.resp_p":
			p, _ := strconv.ParseUint(string(val), 10, 16)
			c.port, seen = uint16(p), seen|4
		case "proto":
			c.proto, seen = val, seen|8
		case "conn_state":
			c.stat, seen = val, seen|16
		case "resp_pkts":
			c.respPkts, _ = strconv.ParseInt(string(val), 10, 64)
			seen |= 32
		}
	}
	return c.ns >= 0
}

// skipString returns the index of the quote that ends the string starting
// at i (just past its opening quote).
func skipString(b []byte, i int) int {
	for i < len(b) && b[i] != '"' {
		if b[i] == '\\' {
			i++
		}
		i++
	}
	return i
}

// skipNested returns the index just past the array or object at i.
func skipNested(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			i = skipString(b, i+1)
		case '[', '{':
			depth++
		case ']', '}':
			if depth--; depth == 0 {
				return i + 1
			}
		}
	}
	return i
}

// established follows observe.Conn.Established: a TCP handshake completed,
// or a reply.
func (c *conn) established() bool {
	if string(c.proto) != "tcp" {
		return c.respPkts > 0
	}
	switch string(c.stat) {
	case "S1", "S2", "S3", "SF", "SHR":
		return true
	}
	return false
}

// unixNanos reads conn.log's ts ("1763629249.439863") as Unix nanoseconds,
// without the rounding of a float.
func unixNanos(raw []byte) (int64, bool) {
	whole, frac, _ := bytes.Cut(raw, []byte("."))
	s, err := strconv.ParseInt(string(whole), 10, 64)
	if err != nil {
		return 0, false
	}
	ns := s * 1e9
	for i, scale := 0, int64(1e8); i < len(frac) && i < 9; i, scale = i+1, scale/10 {
		d := frac[i]
		if d < '0' || d > '9' {
			return 0, false
		}
		ns += int64(d-'0') * scale
	}
	return ns, true
}

// readLog adds one flow log's connections to t.
func (c *collector) readLog(fr *flowReader, j flowJob, t *tally) error {
	if err := c.st.EnsureBlob(c.ctx, j.art.SHA256); err != nil {
		return fmt.Errorf("flow log %s: %w", j.art.ID, err)
	}
	f, err := c.st.OpenBlob(j.art.SHA256)
	if err != nil {
		return fmt.Errorf("flow log %s: %w", j.art.ID, err)
	}
	defer f.Close()
	var key []byte
	err = fr.each(f, func(n int64, cn *conn) error {
		if n&0xfff == 0 && c.ctx.Err() != nil {
			return c.ctx.Err()
		}
		key = endpoint.Append(key[:0], cn.host, cn.port, cn.proto)
		c.tallyConn(t, cn, j.lease, j.scans, key)
		return nil
	})
	if err != nil {
		return fmt.Errorf("flow log %s: %w", j.art.ID, err)
	}
	return nil
}

// tallyConn adds one connection of lease to t: to its hour, and to the
// check-ins of the C2 it went to (key is its endpoint) or to the scan it
// belongs to.
func (c *collector) tallyConn(t *tally, cn *conn, lease string, scans []scanKey, key []byte) {
	h := t.hour(cn.ns)
	h.conns++
	if cn.established() {
		h.est++
	}
	if c.isC2[string(key)] {
		v := string(key)
		t.checkIn(v, cn.ns, c.forwarded(lease, v, time.Unix(0, cn.ns)))
		return
	}
	for _, s := range scans {
		if s.proto == string(cn.proto) && (s.port != 0 && s.port == cn.port || s.addr != "" && s.addr == string(cn.host)) {
			t.scan(s.target, cn.ns, 1)
			return
		}
	}
}
