// Package flowlog is the flow log: every connection of a capture, one JSON
// line each in Zeek conn.log's field names and semantics, compressed with
// zstd, so that `zstdcat | jq` and Zeek's JSON tooling read it as it is.
// tb-parse writes one per capture artifact into the blob store; the
// observables keep only what is meaningful. The package owns the flow
// record: the connection as the decoders make it (Conn) and its uid
// (UIDs, ValidUID), which every observable seen on it names in its
// provenance, its writer, the one reader of its lines (Reader, Record), the
// query over a lease's logs (by uid too), the Zeek TSV written from them,
// and the summary of a cycle's connections into endpoint and scan
// observables (Dests).
package flowlog

import (
	"crypto/sha256"
	"encoding/binary"
	"io"
	"strconv"

	"github.com/klauspost/compress/zstd"
)

// ArtifactType is the type of the artifact record of a flow log, and
// ContentType its content type.
const (
	ArtifactType = "flow-log"
	ContentType  = "application/x-ndjson+zstd"
)

// Writer compresses connections into a flow log.
type Writer struct {
	zw    *zstd.Encoder
	buf   []byte
	n     int64
	first int64
	last  int64
}

// NewWriter writes a flow log to w.
func NewWriter(w io.Writer) (*Writer, error) {
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(2),
		zstd.WithWindowSize(1<<18))
	if err != nil {
		return nil, err
	}
	return &Writer{zw: zw, buf: make([]byte, 0, 256<<10)}, nil
}

// UIDs names the connections of one input. Zeek's uids are random; these
// are "C", a prefix from the input and a counter, which compress to almost
// nothing, differ between the inputs of a lease, and are the same each
// time one input is parsed (a merge of the same capture twice finds the
// same provenance).
type UIDs struct {
	prefix []byte
	n      int64
}

// NewUIDs names the connections of the input key (its artifact ID, else
// its name).
func NewUIDs(key string) *UIDs {
	sum := sha256.Sum256([]byte(key))
	return &UIDs{prefix: strconv.AppendUint([]byte{'C'}, binary.BigEndian.Uint64(sum[:])>>24, 36)}
}

// Next numbers the next connection: its uid is At of the number, made
// only when something keeps it (a scan's connections are written to the
// flow log by AppendAt and never made into strings).
func (u *UIDs) Next() int64 {
	u.n++
	return u.n
}

// At is the uid of the n-th connection (also for a log whose line number
// n names a connection whose sensor gave it no uid).
func (u *UIDs) At(n int64) string {
	var buf [32]byte
	return string(u.AppendAt(buf[:0], n))
}

// AppendAt appends the uid of the n-th connection.
func (u *UIDs) AppendAt(b []byte, n int64) []byte {
	return strconv.AppendInt(append(b, u.prefix...), n, 36)
}

// MaxUID bounds the uid taken from a sensor's log.
const MaxUID = 64

// ValidUID reports whether a sensor's uid can stand as a connection's uid
// here: letters, digits, '-' and '_', at most MaxUID, so that it needs no
// escaping in JSON, TSV or a command line. Zeek's uids and Suricata's
// flow_ids are.
func ValidUID(s string) bool {
	if s == "" || len(s) > MaxUID {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Write appends one connection.
func (w *Writer) Write(c *Conn) error {
	w.n++
	if w.n == 1 || c.Start < w.first {
		w.first = c.Start
	}
	w.last = max(w.last, c.End)
	w.buf = AppendJSON(w.buf, c)
	w.buf = append(w.buf, '\n')
	if len(w.buf) >= 240<<10 {
		return w.flush()
	}
	return nil
}

func (w *Writer) flush() error {
	_, err := w.zw.Write(w.buf)
	w.buf = w.buf[:0]
	return err
}

// Conns is the number of connections written; First and Last the earliest
// start and the latest end (Unix nanoseconds).
func (w *Writer) Conns() int64 { return w.n }
func (w *Writer) First() int64 { return w.first }
func (w *Writer) Last() int64  { return w.last }

// Close ends the compressed stream (not the underlying writer).
func (w *Writer) Close() error {
	if err := w.flush(); err != nil {
		w.zw.Close()
		return err
	}
	return w.zw.Close()
}

// AppendJSON appends a connection as a Zeek conn.log JSON object: ts and
// duration in seconds with microseconds, unset fields left out as Zeek
// leaves them out (service, history). The uid is the decoder's (UIDs, or a
// sensor's that passed ValidUID, so it needs no escaping).
func AppendJSON(b []byte, c *Conn) []byte {
	b = append(b, `{"ts":`...)
	b = appendSeconds(b, c.Start)
	b = append(b, `,"uid":"`...)
	b = c.AppendUID(b)
	b = append(b, `","id.orig_h":"`...)
	b = c.OrigH.AppendTo(b)
	b = append(b, `","id.orig_p":`...)
	b = strconv.AppendUint(b, uint64(c.OrigP), 10)
	b = append(b, `,"id.resp_h":"`...)
	b = c.RespH.AppendTo(b)
	b = append(b, `","id.resp_p":`...)
	b = strconv.AppendUint(b, uint64(c.RespP), 10)
	b = append(b, `,"proto":"`...)
	b = append(b, c.Proto...)
	b = append(b, '"')
	if c.Service != "" {
		b = append(b, `,"service":"`...)
		b = append(b, c.Service...)
		b = append(b, '"')
	}
	b = append(b, `,"duration":`...)
	b = appendSeconds(b, max(c.End-c.Start, 0))
	b = append(b, `,"orig_bytes":`...)
	b = strconv.AppendInt(b, c.OrigBytes, 10)
	b = append(b, `,"resp_bytes":`...)
	b = strconv.AppendInt(b, c.RespBytes, 10)
	b = append(b, `,"conn_state":"`...)
	b = append(b, c.ConnState...)
	b = append(b, '"')
	if c.History != "" {
		b = append(b, `,"history":"`...)
		b = append(b, c.History...)
		b = append(b, '"')
	}
	b = append(b, `,"orig_pkts":`...)
	b = strconv.AppendInt(b, c.OrigPkts, 10)
	b = append(b, `,"orig_ip_bytes":`...)
	b = strconv.AppendInt(b, c.OrigIPBytes, 10)
	b = append(b, `,"resp_pkts":`...)
	b = strconv.AppendInt(b, c.RespPkts, 10)
	b = append(b, `,"resp_ip_bytes":`...)
	b = strconv.AppendInt(b, c.RespIPBytes, 10)
	return append(b, '}')
}

// appendSeconds writes nanoseconds as seconds with six decimals.
func appendSeconds(b []byte, ns int64) []byte {
	us := ns / 1e3
	if us < 0 {
		b = append(b, '-')
		us = -us
	}
	b = strconv.AppendInt(b, us/1e6, 10)
	frac := us % 1e6
	return append(b, '.', byte('0'+frac/1e5), byte('0'+frac/1e4%10), byte('0'+frac/1e3%10),
		byte('0'+frac/100%10), byte('0'+frac/10%10), byte('0'+frac%10))
}
