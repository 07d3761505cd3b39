package records

import "time"

// KindObservable is what tb-parse extracts from captures and sensor logs.
const KindObservable = "observable"

// Observable types. Value conventions (the dedupe key with the lease):
//
//	domain  a DNS name, lower case, no trailing dot ("c2.example.com")
//	ip      a contacted (responder) address, canonical text ("203.0.113.7", "2001:db8::1")
//	flow    "proto orig_h:orig_p>resp_h:resp_p", IPv6 in brackets ("tcp 10.13.37.5:49152>203.0.113.7:443")
//	http    "METHOD http://host/uri" with the Host header as sent ("GET http://c2.example.com/gate.php?id=1")
//	tls     the ClientHello's server name, or "resp_h:resp_p" without SNI
//	icmp    "orig_h>resp_h type/code" ("10.13.37.5>198.51.100.1 8/0")
//	file    the file's sha256 (md5, sha1 or sensor file id when that is all there is)
//	notice  Zeek notice name, alert Suricata signature text
const (
	ObsDomain = "domain"
	ObsIP     = "ip"
	ObsFlow   = "flow"
	ObsHTTP   = "http"
	ObsTLS    = "tls"
	ObsICMP   = "icmp"
	ObsFile   = "file"
	ObsNotice = "notice"
	ObsAlert  = "alert"
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

	Domain *DomainInfo `json:"domain,omitempty"`
	IP     *IPInfo     `json:"ip,omitempty"`
	Flow   *FlowInfo   `json:"flow,omitempty"`
	HTTP   *HTTPInfo   `json:"http,omitempty"`
	TLS    *TLSInfo    `json:"tls,omitempty"`
	ICMP   *ICMPInfo   `json:"icmp,omitempty"`
	File   *FileInfo   `json:"file,omitempty"`
	Notice *NoticeInfo `json:"notice,omitempty"`
	Alert  *AlertInfo  `json:"alert,omitempty"`
}

// Provenance says where one sighting came from: the artifact record (when
// the input was one), its cycle, the file or blob URI, and the 1-based
// packet number (pcaps) or line number (logs).
type Provenance struct {
	Artifact string `json:"artifact,omitempty"`
	Cycle    string `json:"cycle,omitempty"`
	Input    string `json:"input"`
	Packet   int64  `json:"packet,omitempty"`
	Line     int64  `json:"line,omitempty"`
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

// FlowInfo is one connection, or the sum of the connections that reused
// one 5-tuple (Count of them). Byte counts follow Zeek's conn.log.
type FlowInfo struct {
	Proto string `json:"proto"` // tcp, udp, icmp, or an IP protocol number
	OrigH string `json:"orig_h"`
	OrigP uint16 `json:"orig_p"`
	RespH string `json:"resp_h"`
	RespP uint16 `json:"resp_p"`
	// Service is what was recognised in the payload: dns, http, ssl.
	Service string `json:"service,omitempty"`
	// ConnState is Zeek's conn_state (S0, S1, SF, REJ, RSTO, RSTR, …);
	// Outcome its summary: attempted, established, rejected, reset, closed
	// (TCP), or active (UDP and others).
	ConnState   string  `json:"conn_state"`
	Outcome     string  `json:"outcome"`
	OrigPkts    int64   `json:"orig_pkts"`
	OrigBytes   int64   `json:"orig_bytes"`
	OrigIPBytes int64   `json:"orig_ip_bytes"`
	RespPkts    int64   `json:"resp_pkts"`
	RespBytes   int64   `json:"resp_bytes"`
	RespIPBytes int64   `json:"resp_ip_bytes"`
	Duration    float64 `json:"duration"` // seconds
	// Starts are the connection start times when a 5-tuple was reused.
	Starts []time.Time `json:"starts,omitempty"`
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
