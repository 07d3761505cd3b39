// Package eve reads Suricata EVE JSON (one event per line) with gjson and
// turns dns, http, tls, flow, alert and fileinfo events into observables.
// Other event types are read and skipped.
package eve

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/talkbox-sandbox/talkbox/internal/decode"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/lines"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Read reads EVE events and passes observables to sink. Malformed lines are
// counted and skipped; the error is for the stream itself.
func Read(ctx context.Context, br *bufio.Reader, o observe.Origin, sink decode.Sink) (lines.Stats, error) {
	var st lines.Stats
	err := lines.Each(ctx, br, &st, func(line []byte, n int64) error {
		return Event(line, o, n, sink)
	})
	return st, err
}

// timeLayouts are the forms of EVE's timestamp.
var timeLayouts = []string{"2006-01-02T15:04:05.999999999-0700", time.RFC3339Nano, "2006-01-02T15:04:05.999999999"}

func parseTime(s string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("bad timestamp %q", s)
}

type ev struct {
	line     []byte
	ts       time.Time
	src, dst netip.Addr
	sp, dp   uint16
	proto    string
	hasAddrs bool
}

func (e *ev) get(path string) gjson.Result { return gjson.GetBytes(e.line, path) }

// Event turns one EVE line into observables.
func Event(line []byte, o observe.Origin, n int64, sink decode.Sink) error {
	if !gjson.ValidBytes(line) {
		return errors.New("invalid JSON")
	}
	e := &ev{line: line}
	typ := e.get("event_type").String()
	if typ == "" {
		return errors.New("no event_type")
	}
	ts, err := parseTime(e.get("timestamp").String())
	if err != nil {
		return err
	}
	e.ts = ts
	if s, d := e.get("src_ip").String(), e.get("dest_ip").String(); s != "" && d != "" {
		if e.src, err = netip.ParseAddr(s); err != nil {
			return fmt.Errorf("bad src_ip %q", s)
		}
		if e.dst, err = netip.ParseAddr(d); err != nil {
			return fmt.Errorf("bad dest_ip %q", d)
		}
		e.src, e.dst = e.src.Unmap(), e.dst.Unmap()
		e.hasAddrs = true
	}
	e.sp, e.dp = port(e.get("src_port")), port(e.get("dest_port"))
	// Suricata names a flow's events by its flow_id, as Zeek by a uid.
	if id := e.get("flow_id"); id.Type == gjson.Number && flowlog.ValidUID(id.Raw) {
		o = o.OfConn(id.Raw)
	}
	e.proto = protoName(e.get("proto").String())
	switch typ {
	case "dns":
		return e.dns(o, n, sink)
	case "http":
		return e.http(o, n, sink)
	case "tls":
		return e.tls(o, n, sink)
	case "flow":
		return e.flow(o, n, sink)
	case "alert":
		return e.alert(o, n, sink)
	case "fileinfo":
		return e.fileinfo(o, n, sink)
	}
	return nil
}

func port(r gjson.Result) uint16 {
	v := r.Int()
	if v < 0 || v > 65535 {
		return 0
	}
	return uint16(v)
}

func protoName(p string) string {
	switch strings.ToUpper(p) {
	case "TCP", "6":
		return "tcp"
	case "UDP", "17":
		return "udp"
	case "ICMP", "IPV6-ICMP", "ICMPV6", "1", "58":
		return "icmp"
	}
	return strings.ToLower(p)
}

func (e *ev) needAddrs() error {
	if !e.hasAddrs {
		return errors.New("no src_ip/dest_ip")
	}
	return nil
}

func (e *ev) dns(o observe.Origin, n int64, sink decode.Sink) error {
	if err := e.needAddrs(); err != nil {
		return err
	}
	d := e.get("dns")
	if !d.IsObject() {
		return errors.New("dns event without dns object")
	}
	kind := d.Get("type").String()
	response := kind == "answer" || kind == "response"
	client, resolver := e.src, e.dst
	if response {
		client, resolver = e.dst, e.src
	}
	type q struct{ name, typ string }
	var qs []q
	if qa := d.Get("queries"); qa.IsArray() { // EVE version 3
		qa.ForEach(func(_, v gjson.Result) bool {
			qs = append(qs, q{v.Get("rrname").String(), v.Get("rrtype").String()})
			return len(qs) < 16
		})
	} else if name := d.Get("rrname"); name.Exists() {
		qs = append(qs, q{name.String(), d.Get("rrtype").String()})
	}
	if len(qs) == 0 {
		return nil
	}
	info := &records.DomainInfo{Resolvers: []string{resolver.String()}, Clients: []string{client.String()}, Transports: []string{e.proto}}
	if response {
		info.Responses = 1
		if rc := d.Get("rcode").String(); rc != "" {
			info.RCodes = []string{rc}
		}
	} else {
		info.Queries = 1
	}
	add := func(name, typ, data string, ttl int64) {
		switch typ {
		case "A", "AAAA":
			if a, err := netip.ParseAddr(data); err == nil {
				data = a.Unmap().String()
				info.Addrs = append(info.Addrs, data)
			}
		case "CNAME":
			data = observe.NormName(data)
			info.CNAMEs = append(info.CNAMEs, data)
		}
		if len(info.Answers) < observe.MaxAnswers {
			info.Answers = append(info.Answers, records.DNSAnswer{Name: observe.NormName(name), Type: typ, Data: data, TTL: uint32(min(max(ttl, 0), 1<<32-1))})
		}
	}
	if ans := d.Get("answers"); ans.IsArray() {
		ans.ForEach(func(_, v gjson.Result) bool {
			add(v.Get("rrname").String(), v.Get("rrtype").String(), v.Get("rdata").String(), v.Get("ttl").Int())
			return len(info.Answers) < observe.MaxAnswers
		})
	} else if kind == "answer" && d.Get("rdata").Exists() { // EVE version 1: one answer per event
		add(d.Get("rrname").String(), d.Get("rrtype").String(), d.Get("rdata").String(), d.Get("ttl").Int())
	} else if g := d.Get("grouped"); g.IsObject() {
		g.ForEach(func(k, v gjson.Result) bool {
			v.ForEach(func(_, x gjson.Result) bool {
				add(qs[0].name, k.String(), x.String(), 0)
				return true
			})
			return true
		})
	}
	for i, q := range qs {
		obs := o.New(records.ObsDomain, observe.NormName(q.name), e.ts, 0, n)
		c := *info
		if q.typ != "" {
			c.QTypes = []string{q.typ}
		}
		if i > 0 {
			c.Answers, c.Addrs, c.CNAMEs = nil, nil, nil
		}
		obs.Domain = &c
		// An answer line pairs with its query line: count transactions once.
		if response && kind == "answer" {
			obs.Count = 0
		}
		sink.Add(obs)
	}
	return nil
}

func (e *ev) http(o observe.Origin, n int64, sink decode.Sink) error {
	if err := e.needAddrs(); err != nil {
		return err
	}
	h := e.get("http")
	if !h.IsObject() {
		return errors.New("http event without http object")
	}
	host := h.Get("hostname").String()
	uri := h.Get("url").String()
	method := h.Get("http_method").String()
	server := observe.HostPort(e.dst, e.dp)
	vhost := cmp.Or(host, server)
	status := 0
	if s := h.Get("status").Int(); s > 0 && s < 1000 {
		status = int(s)
	}
	obs, _ := o.NewHTTP(observe.HTTPValue(method, vhost, uri), e.ts, 0, n, method, host, uri, h.Get("http_user_agent").String(), status,
		server, e.src.String())
	sink.Add(obs)
	return nil
}

// tlsVersion maps Suricata's "TLS 1.2" to Zeek's "TLSv12".
func tlsVersion(v string) string {
	switch v {
	case "TLS 1.0", "TLSv1":
		return "TLSv10"
	case "TLS 1.1":
		return "TLSv11"
	case "TLS 1.2":
		return "TLSv12"
	case "TLS 1.3":
		return "TLSv13"
	case "SSLv2", "SSLv3":
		return v
	}
	return v
}

func (e *ev) tls(o observe.Origin, n int64, sink decode.Sink) error {
	if err := e.needAddrs(); err != nil {
		return err
	}
	t := e.get("tls")
	if !t.IsObject() {
		return errors.New("tls event without tls object")
	}
	sni := strings.ToLower(t.Get("sni").String())
	server := observe.HostPort(e.dst, e.dp)
	obs, _ := o.NewTLS(cmp.Or(sni, server), e.ts, 0, n, sni, tlsVersion(t.Get("version").String()), t.Get("ja3.hash").String(),
		t.Get("ja4").String(), "", server, e.src.String())
	sink.Add(obs)
	return nil
}

func (e *ev) flow(o observe.Origin, n int64, sink decode.Sink) error {
	if err := e.needAddrs(); err != nil {
		return err
	}
	f := e.get("flow")
	if !f.IsObject() {
		return errors.New("flow event without flow object")
	}
	start, last := e.ts, e.ts
	if s := f.Get("start").String(); s != "" {
		if t, err := parseTime(s); err == nil {
			start = t
		}
	}
	if s := f.Get("end").String(); s != "" {
		if t, err := parseTime(s); err == nil && !t.Before(start) {
			last = t
		}
	}
	service := e.get("app_proto").String()
	if service == "failed" {
		service = ""
	}
	if o.UID == "" {
		// The flow log names every connection: one by its line.
		o = o.OfConn(flowlog.NewUIDs(o.Key()).At(n))
	}
	c := flowlog.Conn{UID: o.UID, Start: start.UnixNano(), End: last.UnixNano(), Proto: e.proto, OrigH: e.src, OrigP: e.sp, RespH: e.dst, RespP: e.dp,
		Service:  service,
		OrigPkts: max(f.Get("pkts_toserver").Int(), 0), OrigIPBytes: max(f.Get("bytes_toserver").Int(), 0),
		RespPkts: max(f.Get("pkts_toclient").Int(), 0), RespIPBytes: max(f.Get("bytes_toclient").Int(), 0), Line: n}
	c.ConnState = e.connState(c.RespPkts)
	sink.Conn(&c)
	return nil
}

// connState approximates Zeek's conn_state from Suricata's TCP summary.
func (e *ev) connState(respPkts int64) string {
	if e.proto != "tcp" {
		if e.proto != "udp" {
			return "OTH"
		}
		if respPkts > 0 {
			return "SF"
		}
		return "S0"
	}
	t := e.get("tcp")
	syn, rst, fin := t.Get("syn").Bool(), t.Get("rst").Bool(), t.Get("fin").Bool()
	state := t.Get("state").String()
	switch {
	case rst && (state == "syn_sent" || state == "new" || respPkts <= 1):
		return "REJ"
	case rst:
		return "RSTO"
	case syn && respPkts == 0:
		return "S0"
	case fin && state == "closed":
		return "SF"
	case state == "established" || state == "closed" || fin:
		return "S1"
	}
	return "OTH"
}

func (e *ev) alert(o observe.Origin, n int64, sink decode.Sink) error {
	a := e.get("alert")
	if !a.IsObject() {
		return errors.New("alert event without alert object")
	}
	sig := a.Get("signature").String()
	if sig == "" {
		sig = "sid:" + a.Get("signature_id").String()
	}
	info := &records.AlertInfo{Signature: sig, SignatureID: a.Get("signature_id").Int(), Category: a.Get("category").String(),
		Severity: int(a.Get("severity").Int())}
	if e.hasAddrs {
		info.Src, info.Dst = []string{e.src.String()}, []string{e.dst.String()}
	}
	obs := o.New(records.ObsAlert, sig, e.ts, 0, n)
	obs.Alert = info
	sink.Add(obs)
	return nil
}

func (e *ev) fileinfo(o observe.Origin, n int64, sink decode.Sink) error {
	fi := e.get("fileinfo")
	if !fi.IsObject() {
		return errors.New("fileinfo event without fileinfo object")
	}
	f := &records.FileInfo{SHA256: fi.Get("sha256").String(), SHA1: fi.Get("sha1").String(), MD5: fi.Get("md5").String(),
		MIMEType: fi.Get("mimetype").String(), Size: max(fi.Get("size").Int(), 0)}
	if fn := fi.Get("filename").String(); fn != "" {
		f.Filenames = []string{fn}
	}
	if e.hasAddrs {
		f.Hosts = []string{e.src.String()}
	}
	value := f.SHA256
	for _, v := range []string{f.SHA1, f.MD5, fi.Get("file_id").String()} {
		if value == "" {
			value = v
		}
	}
	if value == "" {
		return nil // no hash computed: nothing to name it by
	}
	obs := o.New(records.ObsFile, strings.ToLower(value), e.ts, 0, n)
	obs.File = f
	sink.Add(obs)
	return nil
}
