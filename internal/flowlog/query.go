package flowlog

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Query selects connections from the flow logs of the state.
type Query struct {
	Lease, Cycle string
	// Artifacts are flow-log artifacts or the capture artifacts they were
	// parsed from; none means every flow log of the lease and cycle.
	Artifacts []string
	// Addrs match either side of a connection, Ports either port.
	Addrs []netip.Addr
	Ports []uint16
	// UIDs are connections named by their uid, as an observable's
	// provenance names the connection it was seen on.
	UIDs []string
}

// Logs are the flow-log artifacts a query reads, oldest first. A pruned
// flow log (its content deleted by retention) is left out.
func Logs(st *state.Store, q Query) ([]*records.Artifact, error) {
	keep := func(a *records.Artifact) bool {
		return a.Type == ArtifactType && a.PrunedAt == nil && (q.Lease == "" || a.Lease == q.Lease) && (q.Cycle == "" || a.Cycle == q.Cycle) &&
			(len(q.Artifacts) == 0 || slices.Contains(q.Artifacts, a.ID) || slices.Contains(q.Artifacts, a.Source))
	}
	var out []*records.Artifact
	var err error
	switch {
	case q.Cycle != "":
		out, err = state.FindBy(st, records.KindArtifact, records.KeyCycle, q.Cycle, keep)
	case q.Lease != "":
		out, err = state.FindBy(st, records.KindArtifact, records.KeyLease, q.Lease, keep)
	default:
		out, err = state.Find(st, records.KindArtifact, keep)
	}
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b *records.Artifact) int {
		if c := a.FirstTS.Compare(*b.FirstTS); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// match reports whether a connection passes the uid, address and port
// filters.
func (q *Query) match(rec *Record) bool {
	if len(q.UIDs) > 0 && !slices.ContainsFunc(q.UIDs, func(u string) bool { return u == string(rec.UID) }) {
		return false
	}
	if len(q.Addrs) > 0 && !q.matchAddr(rec.OrigH) && !q.matchAddr(rec.RespH) {
		return false
	}
	return len(q.Ports) == 0 || slices.Contains(q.Ports, rec.OrigP) || slices.Contains(q.Ports, rec.RespP)
}

func (q *Query) matchAddr(text []byte) bool {
	a, err := netip.ParseAddr(string(text))
	return err == nil && slices.Contains(q.Addrs, a.Unmap())
}

// Each calls fn with every connection the query selects, log by log.
func (q *Query) Each(ctx context.Context, st *state.Store, logs []*records.Artifact, fn func(a *records.Artifact, rec *Record) error) error {
	r, err := NewReader()
	if err != nil {
		return err
	}
	defer r.Close()
	for _, a := range logs {
		f, err := st.OpenBlob(a.SHA256)
		if err != nil {
			return fmt.Errorf("flow log %s: %w", a.ID, err)
		}
		err = r.Each(f, func(n int64, rec *Record) error {
			if n&0xfff == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			if !q.match(rec) {
				return nil
			}
			return fn(a, rec)
		})
		f.Close()
		if err != nil {
			return fmt.Errorf("flow log %s: %w", a.ID, err)
		}
	}
	return nil
}

// RecordLine turns a conn.log line into an output line: the same object
// with "kind":"flow-conn" first, which Zeek's JSON readers and jq ignore.
func RecordLine(b, line []byte) []byte {
	b = append(b, `{"kind":"`+records.LineFlowConn+`"`...)
	if len(line) > 2 {
		b = append(b, ',')
	}
	return append(b, line[1:]...)
}

// zeekFields are conn.log's columns and types, as Zeek writes them.
var zeekFields = []struct{ name, typ string }{
	{"ts", "time"}, {"uid", "string"}, {"id.orig_h", "addr"}, {"id.orig_p", "port"}, {"id.resp_h", "addr"},
	{"id.resp_p", "port"}, {"proto", "enum"}, {"service", "string"}, {"duration", "interval"}, {"orig_bytes", "count"},
	{"resp_bytes", "count"}, {"conn_state", "string"}, {"local_orig", "bool"}, {"local_resp", "bool"},
	{"missed_bytes", "count"}, {"history", "string"}, {"orig_pkts", "count"}, {"orig_ip_bytes", "count"},
	{"resp_pkts", "count"}, {"resp_ip_bytes", "count"}, {"tunnel_parents", "set[string]"},
}

// TSVWriter writes conn.log in Zeek's TSV format, header and footer
// included, so that zeek-cut and Zeek's readers take it.
type TSVWriter struct {
	w   *bufio.Writer
	buf []byte
}

// NewTSVWriter writes the header, opened at now.
func NewTSVWriter(w io.Writer, now time.Time) (*TSVWriter, error) {
	t := &TSVWriter{w: bufio.NewWriterSize(w, 256<<10)}
	fmt.Fprintf(t.w, "#separator \\x09\n#set_separator\t,\n#empty_field\t(empty)\n#unset_field\t-\n#path\tconn\n#open\t%s\n",
		now.UTC().Format("2006-01-02-15-04-05"))
	names, types := make([]string, len(zeekFields)), make([]string, len(zeekFields))
	for i, f := range zeekFields {
		names[i], types[i] = f.name, f.typ
	}
	_, err := fmt.Fprintf(t.w, "#fields\t%s\n#types\t%s\n", strings.Join(names, "\t"), strings.Join(types, "\t"))
	return t, err
}

// Write writes one connection as a TSV row in zeekFields' order: the
// fields flowlog does not write (local_orig, local_resp, missed_bytes,
// tunnel_parents) and a missing service or history are unset ("-").
func (t *TSVWriter) Write(rec *Record) error {
	b := appendSeconds(t.buf[:0], rec.TS)
	b = appendTSVString(append(b, '\t'), rec.UID)
	b = appendTSVString(append(b, '\t'), rec.OrigH)
	b = strconv.AppendUint(append(b, '\t'), uint64(rec.OrigP), 10)
	b = appendTSVString(append(b, '\t'), rec.RespH)
	b = strconv.AppendUint(append(b, '\t'), uint64(rec.RespP), 10)
	b = appendTSVString(append(b, '\t'), rec.Proto)
	b = appendTSVString(append(b, '\t'), rec.Service)
	b = appendSeconds(append(b, '\t'), rec.Duration)
	b = strconv.AppendInt(append(b, '\t'), rec.OrigBytes, 10)
	b = strconv.AppendInt(append(b, '\t'), rec.RespBytes, 10)
	b = appendTSVString(append(b, '\t'), rec.ConnState)
	b = append(b, "\t-\t-\t-"...)
	b = appendTSVString(append(b, '\t'), rec.History)
	b = strconv.AppendInt(append(b, '\t'), rec.OrigPkts, 10)
	b = strconv.AppendInt(append(b, '\t'), rec.OrigIPBytes, 10)
	b = strconv.AppendInt(append(b, '\t'), rec.RespPkts, 10)
	b = strconv.AppendInt(append(b, '\t'), rec.RespIPBytes, 10)
	b = append(b, "\t-\n"...)
	t.buf = b
	_, err := t.w.Write(b)
	return err
}

// appendTSVString writes a string field: unset when absent, "(empty)"
// when empty, tabs and newlines escaped as Zeek escapes them.
func appendTSVString(b, s []byte) []byte {
	switch {
	case s == nil:
		return append(b, '-')
	case len(s) == 0:
		return append(b, "(empty)"...)
	}
	for _, c := range s {
		switch c {
		case '\t':
			b = append(b, `\x09`...)
		case '\n':
			b = append(b, `\x0a`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// Close writes the footer.
func (t *TSVWriter) Close(now time.Time) error {
	fmt.Fprintf(t.w, "#close\t%s\n", now.UTC().Format("2006-01-02-15-04-05"))
	return t.w.Flush()
}
