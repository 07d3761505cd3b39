// Package flowlog is the flow log: every connection of a capture, one JSON
// line each in Zeek conn.log's field names and semantics, compressed with
// zstd, so that `zstdcat | jq` and Zeek's JSON tooling read it as it is.
// tb-parse writes one per capture artifact into the blob store; the
// observables keep only what is meaningful. The package owns the flow
// record: the connection as the decoders make it (Conn), its writer, the
// one reader of its lines (Reader, Record), the query over a lease's logs,
// the Zeek TSV written from them, and the summary of a cycle's connections
// into endpoint and scan observables (Dests).
package flowlog

import (
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
	zw     *zstd.Encoder
	buf    []byte
	prefix string
	n      int64
	first  int64
	last   int64
}

// NewWriter writes a flow log to w. uidPrefix starts every connection's
// uid, so that uids differ between flow logs (Zeek's are random; these are
// "C", the prefix and a counter, which compress to almost nothing).
func NewWriter(w io.Writer, uidPrefix string) (*Writer, error) {
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(2),
		zstd.WithWindowSize(1<<18))
	if err != nil {
		return nil, err
	}
	return &Writer{zw: zw, prefix: "C" + uidPrefix, buf: make([]byte, 0, 256<<10)}, nil
}

// Write appends one connection.
func (w *Writer) Write(c *Conn) error {
	w.n++
	if w.n == 1 || c.Start < w.first {
		w.first = c.Start
	}
	w.last = max(w.last, c.End)
	w.buf = AppendJSON(w.buf, c, w.prefix, w.n)
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
// leaves them out (service, history).
func AppendJSON(b []byte, c *Conn, uidPrefix string, seq int64) []byte {
	b = append(b, `{"ts":`...)
	b = appendSeconds(b, c.Start)
	b = append(b, `,"uid":"`...)
	b = append(b, uidPrefix...)
	b = strconv.AppendInt(b, seq, 36)
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
