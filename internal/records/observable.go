package records

import (
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// KindObservable is what tb-parse extracts from captures and sensor logs.
const KindObservable = "observable"

// Observable types. Value conventions (the dedupe key with the lease):
//
//	domain  a DNS name, lower case, no trailing dot ("c2.example.com")
//	ip      a contacted (responder) address, canonical text ("203.0.113.7", "2001:db8::1")
//	endpoint a contacted destination "resp_h:resp_p/proto", IPv6 in brackets ("203.0.113.7:443/tcp")
//	scan    a cycle's scan: "proto/port" for one port across many addresses ("tcp/23"),
//	        "addr/proto" for many ports of one address ("203.0.113.9/tcp"); one per cycle
//	http    "METHOD http://host/uri" with the Host header as sent ("GET http://c2.example.com/gate.php?id=1")
//	tls     the ClientHello's server name, or "resp_h:resp_p" without SNI
//	icmp    "orig_h>resp_h type/code" ("10.13.37.5>198.51.100.1 8/0")
//	file    the file's sha256 (md5, sha1 or sensor file id when that is all there is)
//	notice  Zeek notice name, alert Suricata signature text
//	c2-channel "protocol resp_h:resp_p" of a bot's command channel ("mirai 203.0.113.7:23"),
//	        "http METHOD http://host/path" for HTTP polling (the query left out)
//	c2-command "family order" as the C2 sent it: Mirai's decoded ("mirai syn 198.51.100.9/32 30s dport=80"),
//	        a text order's line ("gafgyt !* UDP 198.51.100.9 80 60"), an IRC message's text ("irc !udp 198.51.100.9")
//	attack  "vector target", the target as its address ("syn 198.51.100.9"); for reflection, the victim the
//	        requests claim to come from ("amp-ssdp 198.51.100.9")
const (
	ObsDomain    = "domain"
	ObsIP        = "ip"
	ObsEndpoint  = "endpoint"
	ObsScan      = "scan"
	ObsHTTP      = "http"
	ObsTLS       = "tls"
	ObsICMP      = "icmp"
	ObsFile      = "file"
	ObsNotice    = "notice"
	ObsAlert     = "alert"
	ObsC2Channel = "c2-channel"
	ObsC2Command = "c2-command"
	ObsAttack    = "attack"
)

// Observable is one thing the sensors saw, deduplicated by (lease, type,
// value). Exactly one of the per-type context objects is set, named after
// the type. Lists inside them are sets, bounded (see tb-parse(1)), in order
// of first sighting.
type Observable struct {
	Meta
	Type  string `json:"type"`
	Value string `json:"value"`
	Lease string `json:"lease,omitempty"`
	// Cycle is the latest cycle that saw it; Cycles every cycle (bounded).
	Cycle  string   `json:"cycle,omitempty"`
	Cycles []string `json:"cycles,omitempty"`
	// FirstSeen and LastSeen are capture (or log) times, not parse times.
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	// Count is how many times it was seen: DNS transactions, connections,
	// HTTP requests, TLS handshakes, ICMP exchanges, log lines.
	Count int64 `json:"count"`
	// Sources are the kinds of input it came from: pcap, zeek, eve.
	Sources    []string     `json:"sources,omitempty"`
	Provenance []Provenance `json:"provenance,omitempty"`

	Domain   *DomainInfo   `json:"domain,omitempty"`
	IP       *IPInfo       `json:"ip,omitempty"`
	Endpoint *EndpointInfo `json:"endpoint,omitempty"`
	Scan     *ScanInfo     `json:"scan,omitempty"`
	HTTP     *HTTPInfo     `json:"http,omitempty"`
	TLS      *TLSInfo      `json:"tls,omitempty"`
	ICMP     *ICMPInfo     `json:"icmp,omitempty"`
	File     *FileInfo     `json:"file,omitempty"`
	Notice   *NoticeInfo   `json:"notice,omitempty"`
	Alert    *AlertInfo    `json:"alert,omitempty"`

	C2Channel *C2ChannelInfo `json:"c2_channel,omitempty"`
	C2Command *C2CommandInfo `json:"c2_command,omitempty"`
	Attack    *AttackInfo    `json:"attack,omitempty"`

	Process     *ProcessInfo   `json:"process,omitempty"`
	Path        *PathInfo      `json:"path,omitempty"`
	Netcall     *NetcallInfo   `json:"netcall,omitempty"`
	Persistence *TechniqueInfo `json:"persistence,omitempty"`
	Evasion     *TechniqueInfo `json:"evasion,omitempty"`
	Trace       *TraceInfo     `json:"trace,omitempty"`

	Yara *YaraInfo `json:"yara,omitempty"`
}

// Provenance says where one sighting came from: the artifact record (when
// the input was one), its cycle, the file or blob URI, the 1-based packet
// number (pcaps) or line number (logs), and the uid of the connection it
// was seen on, the uid of that connection's line in the input's flow log
// (Zeek's conn.log model: everything joins on the connection's uid).
type Provenance struct {
	Artifact string `json:"artifact,omitempty"`
	Cycle    string `json:"cycle,omitempty"`
	Input    string `json:"input"`
	Packet   int64  `json:"packet,omitempty"`
	Line     int64  `json:"line,omitempty"`
	UID      string `json:"uid,omitempty"`
}

// DomainInfo is what DNS said about a name.
type DomainInfo struct {
	Queries   int64       `json:"queries"`
	Responses int64       `json:"responses"`
	QTypes    []string    `json:"qtypes,omitempty"` // A, AAAA, TXT, … or TYPE<n>
	RCodes    []string    `json:"rcodes,omitempty"` // NOERROR, NXDOMAIN, …
	Answers   []DNSAnswer `json:"answers,omitempty"`
	// Addrs are the A and AAAA answers (for "resolved, then contacted").
	Addrs      []string `json:"addrs,omitempty"`
	CNAMEs     []string `json:"cnames,omitempty"`
	Resolvers  []string `json:"resolvers,omitempty"`
	Clients    []string `json:"clients,omitempty"`
	Transports []string `json:"transports,omitempty"` // udp, tcp
	// Unsolicited counts answer records seen outside a response to a query
	// of the same flow (in a query, an unmatched response, an
	// announcement): recorded, never taken as resolutions.
	Unsolicited int64 `json:"unsolicited,omitempty"`
}

// DNSAnswer is one resource record of an answer section.
type DNSAnswer struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Data string `json:"data"`
	TTL  uint32 `json:"ttl"`
}

// IPInfo is a destination the lab contacted.
type IPInfo struct {
	Conns int64 `json:"conns"`
	// Ports are "proto/port" ("tcp/443", "udp/53", "icmp/8").
	Ports     []string `json:"ports,omitempty"`
	Clients   []string `json:"clients,omitempty"`
	OrigBytes int64    `json:"orig_bytes"`
	RespBytes int64    `json:"resp_bytes"`
	// Starts are connection start times, the most recent ones (bounded),
	// for beacon detection.
	Starts []time.Time `json:"starts,omitempty"`
	// Domains are names whose DNS answers carried this address.
	Domains []string `json:"domains,omitempty"`
}

// EndpointInfo sums up the connections to one destination (address,
// protocol, port) that had something to say: carried by name, repeated,
// long, or not part of a scan.
type EndpointInfo struct {
	Proto string `json:"proto"`
	Addr  string `json:"addr"`
	Port  uint16 `json:"port"`
	Conns int64  `json:"conns"`
	// Established counts TCP connections that completed a handshake and
	// UDP exchanges the destination answered.
	Established int64    `json:"established"`
	ConnStates  []string `json:"conn_states,omitempty"` // Zeek conn_states seen
	Services    []string `json:"services,omitempty"`    // dns, http, ssl
	OrigPkts    int64    `json:"orig_pkts"`
	OrigBytes   int64    `json:"orig_bytes"`
	RespPkts    int64    `json:"resp_pkts"`
	RespBytes   int64    `json:"resp_bytes"`
	// MaxDuration is the longest connection, in seconds.
	MaxDuration float64  `json:"max_duration"`
	Clients     []string `json:"clients,omitempty"`
	// Starts are connection start times, the most recent ones (bounded).
	Starts []time.Time `json:"starts,omitempty"`
	// Domains are names whose DNS answers carried the address.
	Domains []string `json:"domains,omitempty"`
	// AnsweredIn are the cycles in which the responder sent payload (the
	// most recent, bounded): an observable merged across cycles keeps
	// which of them had an answer, which tb-allow's probation needs.
	AnsweredIn []string `json:"answered_in,omitempty"`
	// SpokeIn are the cycles in which the responder's first payload on a
	// connection was in the protocol the sample spoke (a status line to an
	// HTTP request, a ServerHello to a ClientHello, a bot channel's own
	// framing); ConfirmedIn those in which, besides, the sample sent new
	// payload after it on that connection while the responder held it
	// open, or a bot channel's C2 sent an order (both the most recent,
	// bounded). Conversations counts such connections, which an offline
	// capture, without cycles, has only as a count. Any server answers
	// something: tb-allow's probation confirms an endpoint only on a
	// conversation.
	SpokeIn       []string `json:"spoke_in,omitempty"`
	ConfirmedIn   []string `json:"confirmed_in,omitempty"`
	Conversations int64    `json:"conversations,omitempty"`
}

// ScanInfo is a cycle's scan: connections to many addresses on one port
// (Port set), or to many ports of one address (Addr set).
type ScanInfo struct {
	Proto string `json:"proto"`
	Port  uint16 `json:"port,omitempty"`
	Addr  string `json:"addr,omitempty"`
	Conns int64  `json:"conns"`
	// Open counts connections the destination accepted (a SYN-ACK, a UDP
	// reply), Rejected those it refused (RST, ICMP unreachable),
	// Unanswered the rest.
	Open       int64 `json:"open"`
	Rejected   int64 `json:"rejected"`
	Unanswered int64 `json:"unanswered"`
	// Dests are the distinct destinations (addresses, or ports of Addr):
	// exact up to 4096, beyond that (or after a merge) a HyperLogLog
	// estimate (Estimated), whose 4096 registers Sketch holds in base64.
	Dests     int64  `json:"dests"`
	Estimated bool   `json:"estimated,omitempty"`
	Sketch    string `json:"sketch,omitempty"`
	// Rate is connections per second between first and last seen.
	Rate float64 `json:"rate"`
	// Sample holds the first destinations, OpenSample the first that
	// accepted ("addr" or "port" as text), both bounded.
	Sample     []string `json:"sample,omitempty"`
	OpenSample []string `json:"open_sample,omitempty"`
	Clients    []string `json:"clients,omitempty"`
}

// HTTPInfo is an HTTP request and the status of its response.
type HTTPInfo struct {
	Method     string   `json:"method"`
	Host       string   `json:"host"`
	URI        string   `json:"uri"`
	UserAgents []string `json:"user_agents,omitempty"`
	Statuses   []int    `json:"statuses,omitempty"`
	Servers    []string `json:"servers,omitempty"` // resp_h:resp_p
	Clients    []string `json:"clients,omitempty"`
}

// TLSInfo is what ClientHellos (and ServerHellos) showed for a server name.
type TLSInfo struct {
	ServerName string `json:"server_name,omitempty"`
	// Versions are the negotiated versions (ServerHello, as Zeek's ssl.log
	// version: TLSv12, TLSv13, …), or the client's highest when no
	// ServerHello was seen.
	Versions []string `json:"versions,omitempty"`
	// JA3 holds JA3 hashes (md5), JA4 JA4 fingerprints, one per distinct
	// ClientHello.
	JA3     []string `json:"ja3,omitempty"`
	JA4     []string `json:"ja4,omitempty"`
	ALPN    []string `json:"alpn,omitempty"`
	Servers []string `json:"servers,omitempty"` // resp_h:resp_p
	Clients []string `json:"clients,omitempty"`
}

// ICMPInfo is ICMP between two hosts of one type and code.
type ICMPInfo struct {
	OrigH   string `json:"orig_h"`
	RespH   string `json:"resp_h"`
	Type    uint8  `json:"type"`
	Code    uint8  `json:"code"`
	V6      bool   `json:"v6,omitempty"`
	Packets int64  `json:"packets"`
	Bytes   int64  `json:"bytes"` // ICMP payload bytes
}

// FileInfo is a file a sensor saw on the wire.
type FileInfo struct {
	MIMEType  string   `json:"mime_type,omitempty"`
	Filenames []string `json:"filenames,omitempty"`
	SHA256    string   `json:"sha256,omitempty"`
	SHA1      string   `json:"sha1,omitempty"`
	MD5       string   `json:"md5,omitempty"`
	Size      int64    `json:"size,omitempty"`
	Hosts     []string `json:"hosts,omitempty"` // the sending hosts
}

// NoticeInfo is a Zeek notice.
type NoticeInfo struct {
	Note string   `json:"note"`
	Msgs []string `json:"msgs,omitempty"`
	Src  []string `json:"src,omitempty"`
	Dst  []string `json:"dst,omitempty"`
}

// AlertInfo is a Suricata alert.
type AlertInfo struct {
	Signature   string   `json:"signature"`
	SignatureID int64    `json:"signature_id"`
	Category    string   `json:"category,omitempty"`
	Severity    int      `json:"severity,omitempty"`
	Src         []string `json:"src,omitempty"`
	Dst         []string `json:"dst,omitempty"`
}

// C2ChannelInfo is a bot's command channel as recognised from the bytes of
// its connections. Everything in it is what a sample sent, as sent.
type C2ChannelInfo struct {
	// Family is the guess of the bot family (mirai, gafgyt, irc-bot,
	// http-poll); Protocol the channel's protocol (mirai, mirai-report,
	// gafgyt, irc, http).
	Family   string `json:"family"`
	Protocol string `json:"protocol"`
	// Server is the C2's endpoint, resp_h:resp_p unless the bytes showed
	// the originator to be the C2.
	Server  string   `json:"server"`
	Clients []string `json:"clients,omitempty"`
	// Identities are what the bot announced: Mirai's ID, IRC's NICK and
	// USER, a Gafgyt registration line.
	Identities []string `json:"identities,omitempty"`
	// Channels are the IRC channels joined, with their key ("#c key").
	Channels []string `json:"channels,omitempty"`
	// KeepAlives counts keep-alive messages (Mirai's two zero bytes, PING);
	// KeepAlivePeriod is their mean interval in seconds, or for HTTP
	// polling the requests'.
	KeepAlives      int64   `json:"keepalives"`
	KeepAlivePeriod float64 `json:"keepalive_period"`
	// Commands counts the orders decoded on the channel (c2-command).
	Commands int64 `json:"commands"`
	// Reports are a Mirai scanner's credential reports: "addr:port user:password".
	Reports []string `json:"reports,omitempty"`
}

// C2CommandInfo is one order a C2 sent, decoded.
type C2CommandInfo struct {
	Family   string `json:"family"`
	Protocol string `json:"protocol"`
	// Vector is the attack or command named (syn, udpplain, UDP, !udp, …).
	Vector  string   `json:"vector"`
	Targets []string `json:"targets,omitempty"` // addresses, prefixes or names
	Ports   []string `json:"ports,omitempty"`
	// Duration is the attack's duration in seconds, as ordered.
	Duration int64 `json:"duration,omitempty"`
	// Options are the order's other settings, "key=value".
	Options []string `json:"options,omitempty"`
	// Raw is the order as sent: the text line, or Mirai's bytes in hex.
	Raw     string   `json:"raw"`
	Servers []string `json:"servers,omitempty"`
	Clients []string `json:"clients,omitempty"`
}

// AttackInfo is a flood the lab sent, classified from its packets whether
// or not its order was seen.
type AttackInfo struct {
	// Vector is syn, ack, udp (random payload), udpplain (constant
	// payload), vse, gre, icmp, http, dns (queries for random names under
	// one domain, the target), or amp-PROTO for requests shaped to draw an
	// amplified answer (amp-ntp, amp-ssdp, amp-memcached, …).
	Vector string `json:"vector"`
	Target string `json:"target"`
	// Names estimates the distinct names a dns flood asked.
	Names int64 `json:"names,omitempty"`
	// Ports are the first destination ports (of the reflectors for amp-*);
	// PortCount estimates how many there were.
	Ports     []string `json:"ports,omitempty"`
	PortCount int64    `json:"port_count"`
	Packets   int64    `json:"packets"`
	Bytes     int64    `json:"bytes"` // IP bytes
	// PPS and BPS are packets and bytes per second between first and last
	// seen.
	PPS float64 `json:"pps"`
	BPS float64 `json:"bps"`
	// Spoofed says the packets came from more than one source address
	// (for amp-*: were sent in the target's name); Sources are the first.
	Spoofed     bool     `json:"spoofed,omitempty"`
	Sources     []string `json:"sources,omitempty"`
	SourceCount int64    `json:"source_count"`
	// Reflectors are the first servers amp-* requests (or dns queries)
	// went to.
	Reflectors []string `json:"reflectors,omitempty"`
	// Order is the value of the c2-command observable this attack
	// carried out, and OrderDelay the seconds from the order to the
	// attack's start: the latest order in the same capture, at most 30 s
	// before, aimed at the target, of a vector the attack's carries out
	// (order_delay is left out when 0). A sample can forge both sides of a
	// sinkholed channel: this describes, it proves nothing.
	Order      string  `json:"order,omitempty"`
	OrderDelay float64 `json:"order_delay,omitempty"`
}

// AppendJSON appends the JSON encoding of o to b: the same bytes Marshal
// writes for it when it has no Extra fields, without reflection (tb-parse
// prints hundreds of thousands of observables per capture).
func (o *Observable) AppendJSON(b []byte) []byte {
	e := jsonAppender{b: b}
	e.b = append(e.b, '{')
	m := &o.Meta
	e.str("kind", m.Kind, false)
	e.str("id", m.ID, false)
	e.int("v", int64(m.V), false)
	e.int("rev", m.Rev, true)
	e.time("created_at", m.CreatedAt)
	e.time("updated_at", m.UpdatedAt)
	e.str("type", o.Type, false)
	e.str("value", o.Value, false)
	e.str("lease", o.Lease, true)
	e.str("cycle", o.Cycle, true)
	e.strs("cycles", o.Cycles)
	e.time("first_seen", o.FirstSeen)
	e.time("last_seen", o.LastSeen)
	e.int("count", o.Count, false)
	e.strs("sources", o.Sources)
	if len(o.Provenance) > 0 {
		e.key("provenance")
		e.b = append(e.b, '[')
		for i, p := range o.Provenance {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.open()
			e.str("artifact", p.Artifact, true)
			e.str("cycle", p.Cycle, true)
			e.str("input", p.Input, false)
			e.int("packet", p.Packet, true)
			e.int("line", p.Line, true)
			e.str("uid", p.UID, true)
			e.close()
		}
		e.b = append(e.b, ']')
	}
	if d := o.Domain; d != nil {
		e.key("domain")
		e.open()
		e.int("queries", d.Queries, false)
		e.int("responses", d.Responses, false)
		e.strs("qtypes", d.QTypes)
		e.strs("rcodes", d.RCodes)
		if len(d.Answers) > 0 {
			e.key("answers")
			e.b = append(e.b, '[')
			for i, a := range d.Answers {
				if i > 0 {
					e.b = append(e.b, ',')
				}
				e.open()
				e.str("name", a.Name, false)
				e.str("type", a.Type, false)
				e.str("data", a.Data, false)
				e.int("ttl", int64(a.TTL), false)
				e.close()
			}
			e.b = append(e.b, ']')
		}
		e.strs("addrs", d.Addrs)
		e.strs("cnames", d.CNAMEs)
		e.strs("resolvers", d.Resolvers)
		e.strs("clients", d.Clients)
		e.strs("transports", d.Transports)
		e.int("unsolicited", d.Unsolicited, true)
		e.close()
	}
	if ip := o.IP; ip != nil {
		e.key("ip")
		e.open()
		e.int("conns", ip.Conns, false)
		e.strs("ports", ip.Ports)
		e.strs("clients", ip.Clients)
		e.int("orig_bytes", ip.OrigBytes, false)
		e.int("resp_bytes", ip.RespBytes, false)
		e.times("starts", ip.Starts)
		e.strs("domains", ip.Domains)
		e.close()
	}
	if p := o.Endpoint; p != nil {
		e.key("endpoint")
		e.open()
		e.str("proto", p.Proto, false)
		e.str("addr", p.Addr, false)
		e.int("port", int64(p.Port), false)
		e.int("conns", p.Conns, false)
		e.int("established", p.Established, false)
		e.strs("conn_states", p.ConnStates)
		e.strs("services", p.Services)
		e.int("orig_pkts", p.OrigPkts, false)
		e.int("orig_bytes", p.OrigBytes, false)
		e.int("resp_pkts", p.RespPkts, false)
		e.int("resp_bytes", p.RespBytes, false)
		e.key("max_duration")
		e.b = appendFloat(e.b, p.MaxDuration)
		e.strs("clients", p.Clients)
		e.times("starts", p.Starts)
		e.strs("domains", p.Domains)
		e.strs("answered_in", p.AnsweredIn)
		e.strs("spoke_in", p.SpokeIn)
		e.strs("confirmed_in", p.ConfirmedIn)
		e.int("conversations", p.Conversations, true)
		e.close()
	}
	if c := o.Scan; c != nil {
		e.key("scan")
		e.open()
		e.str("proto", c.Proto, false)
		e.int("port", int64(c.Port), true)
		e.str("addr", c.Addr, true)
		e.int("conns", c.Conns, false)
		e.int("open", c.Open, false)
		e.int("rejected", c.Rejected, false)
		e.int("unanswered", c.Unanswered, false)
		e.int("dests", c.Dests, false)
		if c.Estimated {
			e.key("estimated")
			e.b = append(e.b, "true"...)
		}
		e.str("sketch", c.Sketch, true)
		e.key("rate")
		e.b = appendFloat(e.b, c.Rate)
		e.strs("sample", c.Sample)
		e.strs("open_sample", c.OpenSample)
		e.strs("clients", c.Clients)
		e.close()
	}
	if h := o.HTTP; h != nil {
		e.key("http")
		e.open()
		e.str("method", h.Method, false)
		e.str("host", h.Host, false)
		e.str("uri", h.URI, false)
		e.strs("user_agents", h.UserAgents)
		if len(h.Statuses) > 0 {
			e.key("statuses")
			e.b = append(e.b, '[')
			for i, s := range h.Statuses {
				if i > 0 {
					e.b = append(e.b, ',')
				}
				e.b = strconv.AppendInt(e.b, int64(s), 10)
			}
			e.b = append(e.b, ']')
		}
		e.strs("servers", h.Servers)
		e.strs("clients", h.Clients)
		e.close()
	}
	if t := o.TLS; t != nil {
		e.key("tls")
		e.open()
		e.str("server_name", t.ServerName, true)
		e.strs("versions", t.Versions)
		e.strs("ja3", t.JA3)
		e.strs("ja4", t.JA4)
		e.strs("alpn", t.ALPN)
		e.strs("servers", t.Servers)
		e.strs("clients", t.Clients)
		e.close()
	}
	if c := o.ICMP; c != nil {
		e.key("icmp")
		e.open()
		e.str("orig_h", c.OrigH, false)
		e.str("resp_h", c.RespH, false)
		e.int("type", int64(c.Type), false)
		e.int("code", int64(c.Code), false)
		if c.V6 {
			e.key("v6")
			e.b = append(e.b, "true"...)
		}
		e.int("packets", c.Packets, false)
		e.int("bytes", c.Bytes, false)
		e.close()
	}
	if f := o.File; f != nil {
		e.key("file")
		e.open()
		e.str("mime_type", f.MIMEType, true)
		e.strs("filenames", f.Filenames)
		e.str("sha256", f.SHA256, true)
		e.str("sha1", f.SHA1, true)
		e.str("md5", f.MD5, true)
		e.int("size", f.Size, true)
		e.strs("hosts", f.Hosts)
		e.close()
	}
	if n := o.Notice; n != nil {
		e.key("notice")
		e.open()
		e.str("note", n.Note, false)
		e.strs("msgs", n.Msgs)
		e.strs("src", n.Src)
		e.strs("dst", n.Dst)
		e.close()
	}
	if a := o.Alert; a != nil {
		e.key("alert")
		e.open()
		e.str("signature", a.Signature, false)
		e.int("signature_id", a.SignatureID, false)
		e.str("category", a.Category, true)
		e.int("severity", int64(a.Severity), true)
		e.strs("src", a.Src)
		e.strs("dst", a.Dst)
		e.close()
	}
	if c := o.C2Channel; c != nil {
		e.key("c2_channel")
		e.open()
		e.str("family", c.Family, false)
		e.str("protocol", c.Protocol, false)
		e.str("server", c.Server, false)
		e.strs("clients", c.Clients)
		e.strs("identities", c.Identities)
		e.strs("channels", c.Channels)
		e.int("keepalives", c.KeepAlives, false)
		e.key("keepalive_period")
		e.b = appendFloat(e.b, c.KeepAlivePeriod)
		e.int("commands", c.Commands, false)
		e.strs("reports", c.Reports)
		e.close()
	}
	if c := o.C2Command; c != nil {
		e.key("c2_command")
		e.open()
		e.str("family", c.Family, false)
		e.str("protocol", c.Protocol, false)
		e.str("vector", c.Vector, false)
		e.strs("targets", c.Targets)
		e.strs("ports", c.Ports)
		e.int("duration", c.Duration, true)
		e.strs("options", c.Options)
		e.str("raw", c.Raw, false)
		e.strs("servers", c.Servers)
		e.strs("clients", c.Clients)
		e.close()
	}
	if a := o.Attack; a != nil {
		e.key("attack")
		e.open()
		e.str("vector", a.Vector, false)
		e.str("target", a.Target, false)
		e.int("names", a.Names, true)
		e.strs("ports", a.Ports)
		e.int("port_count", a.PortCount, false)
		e.int("packets", a.Packets, false)
		e.int("bytes", a.Bytes, false)
		e.key("pps")
		e.b = appendFloat(e.b, a.PPS)
		e.key("bps")
		e.b = appendFloat(e.b, a.BPS)
		if a.Spoofed {
			e.key("spoofed")
			e.b = append(e.b, "true"...)
		}
		e.strs("sources", a.Sources)
		e.int("source_count", a.SourceCount, false)
		e.strs("reflectors", a.Reflectors)
		e.str("order", a.Order, true)
		if a.OrderDelay != 0 {
			e.key("order_delay")
			e.b = appendFloat(e.b, a.OrderDelay)
		}
		e.close()
	}
	e.behaviour(o)
	if y := o.Yara; y != nil {
		e.yara(y)
	}
	e.b = append(e.b, '}')
	return e.b
}

// jsonAppender writes object members, managing the commas.
type jsonAppender struct{ b []byte }

func (e *jsonAppender) key(k string) {
	if n := len(e.b); n > 0 && e.b[n-1] != '{' && e.b[n-1] != '[' {
		e.b = append(e.b, ',')
	}
	e.b = append(e.b, '"')
	e.b = append(e.b, k...)
	e.b = append(e.b, '"', ':')
}

func (e *jsonAppender) open()  { e.b = append(e.b, '{') }
func (e *jsonAppender) close() { e.b = append(e.b, '}') }

func (e *jsonAppender) str(k, v string, omitEmpty bool) {
	if omitEmpty && v == "" {
		return
	}
	e.key(k)
	e.b = appendJSONString(e.b, v)
}

func (e *jsonAppender) int(k string, v int64, omitEmpty bool) {
	if omitEmpty && v == 0 {
		return
	}
	e.key(k)
	e.b = strconv.AppendInt(e.b, v, 10)
}

func (e *jsonAppender) time(k string, t time.Time) {
	e.key(k)
	e.b = appendTime(e.b, t)
}

// appendTime writes t quoted as time.Time's MarshalJSON does
// (RFC 3339 with trailing zeros of the fraction dropped), with a fast path
// for UTC times, which is all tb-parse writes.
func appendTime(b []byte, t time.Time) []byte {
	if y := t.Year(); y < 0 || y > 9999 {
		// Out of time.Time's JSON range: what encoding/json would refuse.
		t = time.Time{}
	}
	if t.Location() != time.UTC {
		return append(t.AppendFormat(append(b, '"'), time.RFC3339Nano), '"')
	}
	year, month, day := t.Date()
	hour, min, sec := t.Clock()
	b = append(b, '"')
	b = append4(b, year)
	b = append(b, '-')
	b = append2(b, int(month))
	b = append(b, '-')
	b = append2(b, day)
	b = append(b, 'T')
	b = append2(b, hour)
	b = append(b, ':')
	b = append2(b, min)
	b = append(b, ':')
	b = append2(b, sec)
	if ns := t.Nanosecond(); ns != 0 {
		var frac [9]byte
		for i := 8; i >= 0; i-- {
			frac[i] = byte('0' + ns%10)
			ns /= 10
		}
		n := 9
		for frac[n-1] == '0' {
			n--
		}
		b = append(append(b, '.'), frac[:n]...)
	}
	return append(b, 'Z', '"')
}

func append2(b []byte, v int) []byte { return append(b, byte('0'+v/10), byte('0'+v%10)) }

func append4(b []byte, v int) []byte {
	return append(b, byte('0'+v/1000), byte('0'+v/100%10), byte('0'+v/10%10), byte('0'+v%10))
}

func (e *jsonAppender) strs(k string, vs []string) {
	if len(vs) == 0 {
		return
	}
	e.key(k)
	e.b = append(e.b, '[')
	for i, v := range vs {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.b = appendJSONString(e.b, v)
	}
	e.b = append(e.b, ']')
}

func (e *jsonAppender) times(k string, ts []time.Time) {
	if len(ts) == 0 {
		return
	}
	e.key(k)
	e.b = append(e.b, '[')
	for i, t := range ts {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.b = appendTime(e.b, t)
	}
	e.b = append(e.b, ']')
}

// appendFloat formats like encoding/json: shortest representation, with
// an exponent only for very small or large magnitudes.
func appendFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, '0')
	}
	abs := math.Abs(f)
	fmt := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		fmt = 'e'
	}
	b = strconv.AppendFloat(b, f, fmt, -1, 64)
	if fmt == 'e' {
		// clean up e-09 to e-9
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

const hexDigits = "0123456789abcdef"

// jsonPlainASCII marks ('1') the ASCII bytes a JSON string holds as they
// are: not the control characters, '"', '\\', and not '<', '>' and '&',
// which encoding/json escapes to be HTML-safe. One load per byte instead
// of six comparisons: strings are most of what tb-parse prints.
const jsonPlainASCII = "00000000000000000000000000000000110111011111111111111111111101011111111111111111111111111111011111111111111111111111111111111111"

// appendJSONString quotes s as encoding/json does, HTML-safe: <, > and &
// as \u003c, \u003e and \u0026, invalid UTF-8 as U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if jsonPlainASCII[c] == '1' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
