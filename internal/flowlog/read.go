package flowlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"

	"github.com/talkbox-sandbox/talkbox/internal/lines"
)

// MaxLine bounds one line of a flow log: a line as AppendJSON writes it is
// under 400 bytes, so a longer one is not a flow log's.
const MaxLine = 256 << 10

// Record is one connection as a flow log holds it, read from its conn.log
// JSON line. Its byte slices point into Line (or into the reader) and hold
// until the reader's next line. Service and History are nil when the line
// has no such field; a count the line lacks reads as 0.
type Record struct {
	Line []byte
	// TS is the start in Unix nanoseconds and Duration its length, both
	// read from conn.log's seconds without a float's rounding.
	TS, Duration                                          int64
	UID, OrigH, RespH, Proto, Service, ConnState, History []byte
	OrigP, RespP                                          uint16
	OrigBytes, RespBytes                                  int64
	OrigPkts, OrigIPBytes, RespPkts, RespIPBytes          int64
}

// Established follows Conn.Established: a TCP handshake completed,
// or a reply.
func (r *Record) Established() bool {
	if string(r.Proto) != "tcp" {
		return r.RespPkts > 0
	}
	switch string(r.ConnState) {
	case "S1", "S2", "S3", "SF", "SHR":
		return true
	}
	return false
}

// Reader reads flow logs one after the other with one decoder and one
// buffer: for the small log of a cycle, making them is most of the work.
type Reader struct {
	zr      *zstd.Decoder
	lr      *lines.Reader
	rec     Record
	scratch []byte
}

// NewReader makes a reader; Close releases its decoder.
func NewReader() (*Reader, error) {
	zr, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	return &Reader{zr: zr, lr: lines.NewReader(nil, MaxLine)}, nil
}

// Close releases the decoder.
func (r *Reader) Close() { r.zr.Close() }

// Each calls fn with every connection of the flow log src, numbered by its
// line from 1. Blank lines are passed over; any other line that is not a
// connection stops it with an error naming the line.
func (r *Reader) Each(src io.Reader, fn func(n int64, rec *Record) error) error {
	if err := r.zr.Reset(src); err != nil {
		return err
	}
	r.lr.Reset(r.zr)
	for {
		line, err := r.lr.Next()
		n := r.lr.Line()
		switch {
		case err == io.EOF:
			return nil
		case errors.Is(err, lines.ErrTooLong):
			return fmt.Errorf("line %d: longer than %d bytes", n, MaxLine)
		case err != nil:
			return fmt.Errorf("line %d: %w", n+1, err)
		}
		if line = bytes.TrimSuffix(line, []byte{'\n'}); len(line) == 0 {
			continue
		}
		if !r.parse(line) {
			return fmt.Errorf("line %d: not a conn.log connection (ts, id.resp_h, proto)", n)
		}
		if err := fn(n, &r.rec); err != nil {
			return err
		}
	}
}

// Each reads one flow log with a reader of its own.
func Each(src io.Reader, fn func(n int64, rec *Record) error) error {
	r, err := NewReader()
	if err != nil {
		return err
	}
	defer r.Close()
	return r.Each(src, fn)
}

// parse reads a conn.log JSON line into r.rec without a JSON decoder (a
// lease's flow logs hold millions of lines): a line in AppendJSON's layout
// by that layout, any other with encoding/json.
func (r *Reader) parse(line []byte) bool {
	r.rec = Record{Line: line}
	if r.rec.parseLayout() {
		return true
	}
	r.rec = Record{Line: line}
	return r.parseJSON(line)
}

// The keys of AppendJSON's layout, each with the punctuation around it.
const (
	kTS        = `{"ts":`
	kUID       = `,"uid":"`
	kOrigH     = `","id.orig_h":"`
	kOrigP     = `","id.orig_p":`
	kRespH     = `,"id.resp_h":"`
	kRespP     = `","id.resp_p":`
	kProto     = `,"proto":"`
	kService   = `","service":"`
	kDuration  = `","duration":`
	kOrigBytes = `,"orig_bytes":`
	kRespBytes = `,"resp_bytes":`
	kState     = `,"conn_state":"`
	kHistory   = `","history":"`
	kOrigPkts  = `","orig_pkts":`
	kOrigIP    = `,"orig_ip_bytes":`
	kRespPkts  = `,"resp_pkts":`
	kRespIP    = `,"resp_ip_bytes":`
)

// parseLayout reads the line as AppendJSON writes it: every field in its
// place, strings without escapes. Each key is compared where it is named,
// as a constant, which the compiler turns into a few loads instead of a
// call: a third of the cost of the parse.
func (r *Record) parseLayout() bool {
	p := layout{b: r.Line}
	ok := p.at(len(kTS)) && string(p.b[:p.i]) == kTS && p.secs(&r.TS) &&
		p.at(len(kUID)) && string(p.b[p.i-len(kUID):p.i]) == kUID && p.str(&r.UID) &&
		p.at(len(kOrigH)) && string(p.b[p.i-len(kOrigH):p.i]) == kOrigH && p.str(&r.OrigH) &&
		p.at(len(kOrigP)) && string(p.b[p.i-len(kOrigP):p.i]) == kOrigP && p.port(&r.OrigP) &&
		p.at(len(kRespH)) && string(p.b[p.i-len(kRespH):p.i]) == kRespH && p.str(&r.RespH) &&
		p.at(len(kRespP)) && string(p.b[p.i-len(kRespP):p.i]) == kRespP && p.port(&r.RespP) &&
		p.at(len(kProto)) && string(p.b[p.i-len(kProto):p.i]) == kProto && p.str(&r.Proto)
	if !ok {
		return false
	}
	// service, unset, is left out with its key: the string ends here.
	if len(p.b)-p.i >= len(kService) && string(p.b[p.i:p.i+len(kService)]) == kService {
		ok = p.at(len(kService)) && p.str(&r.Service)
	}
	ok = ok && p.at(len(kDuration)) && string(p.b[p.i-len(kDuration):p.i]) == kDuration && p.secs(&r.Duration) &&
		p.at(len(kOrigBytes)) && string(p.b[p.i-len(kOrigBytes):p.i]) == kOrigBytes && p.int(&r.OrigBytes) &&
		p.at(len(kRespBytes)) && string(p.b[p.i-len(kRespBytes):p.i]) == kRespBytes && p.int(&r.RespBytes) &&
		p.at(len(kState)) && string(p.b[p.i-len(kState):p.i]) == kState && p.str(&r.ConnState)
	if !ok {
		return false
	}
	if len(p.b)-p.i >= len(kHistory) && string(p.b[p.i:p.i+len(kHistory)]) == kHistory {
		ok = p.at(len(kHistory)) && p.str(&r.History)
	}
	ok = ok && p.at(len(kOrigPkts)) && string(p.b[p.i-len(kOrigPkts):p.i]) == kOrigPkts && p.int(&r.OrigPkts) &&
		p.at(len(kOrigIP)) && string(p.b[p.i-len(kOrigIP):p.i]) == kOrigIP && p.int(&r.OrigIPBytes) &&
		p.at(len(kRespPkts)) && string(p.b[p.i-len(kRespPkts):p.i]) == kRespPkts && p.int(&r.RespPkts) &&
		p.at(len(kRespIP)) && string(p.b[p.i-len(kRespIP):p.i]) == kRespIP && p.int(&r.RespIPBytes)
	return ok && p.i == len(p.b)-1 && p.b[p.i] == '}' && len(r.RespH) > 0 && len(r.Proto) > 0
}

// layout reads a line from the start, field after field.
type layout struct {
	b []byte
	i int
}

// at advances over n bytes, if the line has them.
func (p *layout) at(n int) bool {
	if len(p.b)-p.i < n {
		return false
	}
	p.i += n
	return true
}

// str reads up to the closing quote; an escape leaves the line to
// encoding/json. The strings are short (an address at most), so one loop
// beats two searches.
func (p *layout) str(v *[]byte) bool {
	for j := p.i; j < len(p.b); j++ {
		switch p.b[j] {
		case '"':
			*v = p.b[p.i:j:j]
			p.i = j
			return true
		case '\\':
			return false
		}
	}
	return false
}

func (p *layout) int(v *int64) bool {
	n, i, ok := digits(p.b, p.i)
	*v, p.i = n, i
	return ok
}

func (p *layout) port(v *uint16) bool {
	n, i, ok := digits(p.b, p.i)
	*v, p.i = uint16(n), i
	return ok && n <= 0xffff && n >= 0
}

// secs reads seconds with a fraction as nanoseconds.
func (p *layout) secs(v *int64) bool {
	j := p.i
	for j < len(p.b) && (p.b[j] >= '0' && p.b[j] <= '9' || p.b[j] == '.' || p.b[j] == '-') {
		j++
	}
	ns, ok := unixNanos(p.b[p.i:j])
	*v, p.i = ns, j
	return ok
}

// digits reads an optionally negative decimal integer of at most 18
// digits at i.
func digits(b []byte, i int) (int64, int, bool) {
	neg := i < len(b) && b[i] == '-'
	if neg {
		i++
	}
	var n int64
	j := i
	for ; j < len(b) && b[j] >= '0' && b[j] <= '9'; j++ {
		n = n*10 + int64(b[j]-'0')
	}
	if j == i || j-i > 18 {
		return 0, j, false
	}
	if neg {
		n = -n
	}
	return n, j, true
}

// unixNanos reads conn.log's seconds ("1763629249.439863") as
// nanoseconds.
func unixNanos(raw []byte) (int64, bool) {
	whole, frac, _ := bytes.Cut(raw, []byte("."))
	s, i, ok := digits(whole, 0)
	if !ok || i != len(whole) || s > 9e9 || s < -9e9 {
		return 0, false
	}
	var f int64
	scale := int64(1e8)
	for _, d := range frac {
		if d < '0' || d > '9' {
			return 0, false
		}
		f += int64(d-'0') * scale
		scale /= 10
	}
	if len(whole) > 0 && whole[0] == '-' {
		return s*1e9 - f, true
	}
	return s*1e9 + f, true
}

// jsonRecord is a conn.log line in any order, with escapes, nested values
// and fields of Zeek's that flowlog does not write.
type jsonRecord struct {
	TS          json.Number `json:"ts"`
	UID         string      `json:"uid"`
	OrigH       string      `json:"id.orig_h"`
	OrigP       uint16      `json:"id.orig_p"`
	RespH       string      `json:"id.resp_h"`
	RespP       uint16      `json:"id.resp_p"`
	Proto       string      `json:"proto"`
	Service     *string     `json:"service"`
	Duration    json.Number `json:"duration"`
	OrigBytes   int64       `json:"orig_bytes"`
	RespBytes   int64       `json:"resp_bytes"`
	ConnState   string      `json:"conn_state"`
	History     *string     `json:"history"`
	OrigPkts    int64       `json:"orig_pkts"`
	OrigIPBytes int64       `json:"orig_ip_bytes"`
	RespPkts    int64       `json:"resp_pkts"`
	RespIPBytes int64       `json:"resp_ip_bytes"`
}

// parseJSON reads a line not in AppendJSON's layout; its strings go to the
// reader's scratch buffer.
func (r *Reader) parseJSON(line []byte) bool {
	var j jsonRecord
	if json.Unmarshal(line, &j) != nil || j.RespH == "" || j.Proto == "" {
		return false
	}
	rec := &r.rec
	var ok bool
	if rec.TS, ok = unixNanos([]byte(j.TS)); !ok {
		return false
	}
	if j.Duration != "" {
		if rec.Duration, ok = unixNanos([]byte(j.Duration)); !ok {
			return false
		}
	}
	r.scratch = r.scratch[:0]
	var strs [7][2]int
	for i, s := range []*string{&j.UID, &j.OrigH, &j.RespH, &j.Proto, j.Service, &j.ConnState, j.History} {
		if s == nil {
			strs[i] = [2]int{-1, -1}
			continue
		}
		strs[i][0] = len(r.scratch)
		r.scratch = append(r.scratch, *s...)
		strs[i][1] = len(r.scratch)
	}
	for i, v := range []*[]byte{&rec.UID, &rec.OrigH, &rec.RespH, &rec.Proto, &rec.Service, &rec.ConnState, &rec.History} {
		if strs[i][0] >= 0 {
			*v = r.scratch[strs[i][0]:strs[i][1]:strs[i][1]]
		}
	}
	rec.OrigP, rec.RespP = j.OrigP, j.RespP
	rec.OrigBytes, rec.RespBytes = j.OrigBytes, j.RespBytes
	rec.OrigPkts, rec.OrigIPBytes, rec.RespPkts, rec.RespIPBytes = j.OrigPkts, j.OrigIPBytes, j.RespPkts, j.RespIPBytes
	return true
}
