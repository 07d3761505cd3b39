package flowlog

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tidwall/gjson"

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

// match reports whether a conn.log line passes the address and port
// filters.
func (q *Query) match(line []byte) bool {
	if len(q.Addrs) == 0 && len(q.Ports) == 0 {
		return true
	}
	r := gjson.GetManyBytes(line, `id\.orig_h`, `id\.resp_h`, `id\.orig_p`, `id\.resp_p`)
	if len(q.Addrs) > 0 {
		ok := false
		for _, s := range []string{r[0].Str, r[1].Str} {
			if a, err := netip.ParseAddr(s); err == nil && slices.Contains(q.Addrs, a.Unmap()) {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	if len(q.Ports) > 0 {
		return slices.Contains(q.Ports, uint16(r[2].Uint())) || slices.Contains(q.Ports, uint16(r[3].Uint()))
	}
	return true
}

// Each calls fn with every connection the query selects, log by log, as
// its conn.log JSON line.
func (q *Query) Each(ctx context.Context, st *state.Store, logs []*records.Artifact, fn func(a *records.Artifact, line []byte) error) error {
	for _, a := range logs {
		f, err := st.OpenBlob(a.SHA256)
		if err != nil {
			return fmt.Errorf("%s: %w", a.ID, err)
		}
		err = Each(f, func(n int64, line []byte) error {
			if n&0xfff == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			if !q.match(line) {
				return nil
			}
			return fn(a, line)
		})
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", a.ID, err)
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
	w     *bufio.Writer
	paths []string
}

// NewTSVWriter writes the header, opened at now.
func NewTSVWriter(w io.Writer, now time.Time) (*TSVWriter, error) {
	t := &TSVWriter{w: bufio.NewWriterSize(w, 256<<10)}
	fmt.Fprintf(t.w, "#separator \\x09\n#set_separator\t,\n#empty_field\t(empty)\n#unset_field\t-\n#path\tconn\n#open\t%s\n",
		now.UTC().Format("2006-01-02-15-04-05"))
	names, types := make([]string, len(zeekFields)), make([]string, len(zeekFields))
	for i, f := range zeekFields {
		t.paths = append(t.paths, strings.ReplaceAll(f.name, ".", `\.`))
		names[i], types[i] = f.name, f.typ
	}
	_, err := fmt.Fprintf(t.w, "#fields\t%s\n#types\t%s\n", strings.Join(names, "\t"), strings.Join(types, "\t"))
	return t, err
}

// Write writes one conn.log JSON line as a TSV row: fields it lacks are
// unset ("-").
func (t *TSVWriter) Write(line []byte) error {
	vals := gjson.GetManyBytes(line, t.paths...)
	for i, v := range vals {
		if i > 0 {
			t.w.WriteByte('\t')
		}
		switch {
		case !v.Exists():
			t.w.WriteByte('-')
		case v.Type == gjson.String && v.Str == "":
			t.w.WriteString("(empty)")
		case v.Type == gjson.String:
			t.w.WriteString(strings.NewReplacer("\t", `\x09`, "\n", `\x0a`).Replace(v.Str))
		case v.Type == gjson.True:
			t.w.WriteByte('T')
		case v.Type == gjson.False:
			t.w.WriteByte('F')
		default:
			t.w.WriteString(v.Raw)
		}
	}
	return t.w.WriteByte('\n')
}

// Close writes the footer.
func (t *TSVWriter) Close(now time.Time) error {
	fmt.Fprintf(t.w, "#close\t%s\n", now.UTC().Format("2006-01-02-15-04-05"))
	return t.w.Flush()
}
