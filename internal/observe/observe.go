// Package observe is the observable model tb-parse builds: constructors for
// each type and the formats of their values, the bounds on what one
// observable holds, the merge of two sightings of one observable (a scan's
// with its distinct destinations united), and the bounded in-run set that
// deduplicates them. The decoders (internal/decode) make observables with
// it; the connections they see belong to the flow record (flowlog).
package observe

import (
	"cmp"
	"slices"
	"sort"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/distinct"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Bounds on what one observable accumulates, so that a chatty sample cannot
// grow a record without limit.
const (
	MaxList       = 32  // set-valued fields (user agents, ports, clients, …)
	MaxAnswers    = 64  // DNS answers per name
	MaxStarts     = 256 // connection start times (most recent kept)
	MaxProvenance = 16  // provenance entries (earliest kept)
	MaxCycles     = 64  // cycles (most recent kept)
	MaxSample     = 32  // destinations a scan lists
)

// ScanMinDests distinct addresses on one (protocol, port), or ports of one
// address, make a scan, in a capture (flowlog.Dests) as in a trace's calls
// (behave): from there on its destinations are summarised by one scan
// observable, and only those with something to say keep an observable of
// their own.
const ScanMinDests = 64

// Origin is the input a decoder reads: the artifact record it came from (if
// any), the artifact's cycle, the path or blob URI, and the source kind
// (pcap, zeek, eve); for the sightings of one connection, also the
// connection's uid (OfConn).
type Origin struct {
	Artifact string
	Cycle    string
	Input    string
	Source   string
	UID      string
}

// Key names the input among a lease's: its artifact ID, else its path or
// URI (the flow log's index and its uids are keyed by it).
func (o Origin) Key() string { return cmp.Or(o.Artifact, o.Input) }

// OfConn is the origin of what was seen on the connection uid: its
// observables' provenance names the connection's line in the flow log.
func (o Origin) OfConn(uid string) Origin {
	o.UID = uid
	return o
}

// Prov is the provenance of a sighting at a packet or line number.
func (o Origin) Prov(packet, line int64) records.Provenance {
	return records.Provenance{Artifact: o.Artifact, Cycle: o.Cycle, Input: o.Input, Packet: packet, Line: line, UID: o.UID}
}

// New returns an observable seen once at t.
func (o Origin) New(typ, value string, t time.Time, packet, line int64) *records.Observable {
	b := new(block)
	o.fill(b, typ, value, t, packet, line)
	return &b.obs
}

// block holds an observable and the backing arrays of its one-element
// slices, so that a sighting costs one allocation instead of four (a
// capture yields hundreds of thousands). Merging appends to the slices,
// which then move out of the block.
type block struct {
	obs     records.Observable
	sources [1]string
	cycles  [1]string
	prov    [1]records.Provenance
}

func (o Origin) fill(b *block, typ, value string, t time.Time, packet, line int64) {
	t = t.UTC()
	b.sources[0] = o.Source
	b.prov[0] = o.Prov(packet, line)
	b.obs = records.Observable{
		Type: typ, Value: value, FirstSeen: t, LastSeen: t, Count: 1,
		Cycle: o.Cycle, Sources: b.sources[:], Provenance: b.prov[:],
	}
	if o.Cycle != "" {
		b.cycles[0] = o.Cycle
		b.obs.Cycles = b.cycles[:]
	}
}

// NewHTTP is New for an HTTP request (status 0: no response seen), with
// its HTTPInfo in the same allocation.
func (o Origin) NewHTTP(value string, t time.Time, packet, line int64, method, host, uri, userAgent string, status int,
	server, client string) (*records.Observable, *records.HTTPInfo) {
	b := new(struct {
		block
		info                 records.HTTPInfo
		uas, servers, client [1]string
		statuses             [1]int
	})
	o.fill(&b.block, records.ObsHTTP, value, t, packet, line)
	b.servers[0], b.client[0] = server, client
	b.info = records.HTTPInfo{Method: method, Host: host, URI: uri, Servers: b.servers[:], Clients: b.client[:]}
	if userAgent != "" {
		b.uas[0] = userAgent
		b.info.UserAgents = b.uas[:]
	}
	if status != 0 {
		b.statuses[0] = status
		b.info.Statuses = b.statuses[:]
	}
	b.obs.HTTP = &b.info
	return &b.obs, &b.info
}

// NewTLS is New for a TLS handshake, with its TLSInfo in the same
// allocation.
func (o Origin) NewTLS(value string, t time.Time, packet, line int64, serverName, version, ja3, ja4, alpn, server, client string) (*records.Observable, *records.TLSInfo) {
	b := new(struct {
		block
		info                                       records.TLSInfo
		versions, ja3, ja4, alpn, servers, clients [1]string
	})
	o.fill(&b.block, records.ObsTLS, value, t, packet, line)
	one := func(a *[1]string, v string) []string {
		if v == "" {
			return nil
		}
		a[0] = v
		return a[:]
	}
	b.info = records.TLSInfo{ServerName: serverName, Versions: one(&b.versions, version), JA3: one(&b.ja3, ja3), JA4: one(&b.ja4, ja4),
		ALPN: one(&b.alpn, alpn), Servers: one(&b.servers, server), Clients: one(&b.clients, client)}
	b.obs.TLS = &b.info
	return &b.obs, &b.info
}

// NewDomain is New for a domain, with its DomainInfo and the one-element
// lists of a DNS message in the same allocation.
func (o Origin) NewDomain(value string, t time.Time, packet, line int64, qtype, rcode, transport, resolver, client string) (*records.Observable, *records.DomainInfo) {
	b := new(struct {
		block
		info                                           records.DomainInfo
		qtypes, rcodes, transports, resolvers, clients [1]string
	})
	o.fill(&b.block, records.ObsDomain, value, t, packet, line)
	one := func(a *[1]string, v string) []string {
		if v == "" {
			return nil
		}
		a[0] = v
		return a[:]
	}
	b.info = records.DomainInfo{QTypes: one(&b.qtypes, qtype), RCodes: one(&b.rcodes, rcode), Transports: one(&b.transports, transport),
		Resolvers: one(&b.resolvers, resolver), Clients: one(&b.clients, client)}
	b.obs.Domain = &b.info
	return &b.obs, &b.info
}

// Merge folds src into dst, two sightings of the same (type, value): counts
// and byte totals add up, the time span widens, sets are united (bounded),
// and dst's cycle becomes that of the later sighting (src's on a tie).
func Merge(dst, src *records.Observable) {
	if dst.FirstSeen.IsZero() || (!src.FirstSeen.IsZero() && src.FirstSeen.Before(dst.FirstSeen)) {
		dst.FirstSeen = src.FirstSeen
	}
	if !src.LastSeen.Before(dst.LastSeen) && src.Cycle != "" || dst.Cycle == "" {
		dst.Cycle = src.Cycle
	}
	if src.LastSeen.After(dst.LastSeen) {
		dst.LastSeen = src.LastSeen
	}
	dst.Count += src.Count
	dst.Cycles = unionTail(dst.Cycles, src.Cycles, MaxCycles)
	dst.Sources = union(dst.Sources, src.Sources, MaxList)
	for _, p := range src.Provenance {
		if len(dst.Provenance) >= MaxProvenance {
			break
		}
		if !slices.Contains(dst.Provenance, p) {
			dst.Provenance = append(dst.Provenance, p)
		}
	}
	mergeDomain(&dst.Domain, src.Domain)
	mergeIP(&dst.IP, src.IP)
	mergeEndpoint(&dst.Endpoint, src.Endpoint)
	mergeScan(&dst.Scan, src.Scan)
	mergeHTTP(&dst.HTTP, src.HTTP)
	mergeTLS(&dst.TLS, src.TLS)
	mergeICMP(&dst.ICMP, src.ICMP)
	mergeFile(&dst.File, src.File)
	mergeBehaviour(dst, src)
	mergeC2(dst, src)
	if s := src.Notice; s != nil {
		if dst.Notice == nil {
			dst.Notice = &records.NoticeInfo{Note: s.Note}
		}
		d := dst.Notice
		d.Msgs = union(d.Msgs, s.Msgs, MaxList)
		d.Src = union(d.Src, s.Src, MaxList)
		d.Dst = union(d.Dst, s.Dst, MaxList)
	}
	if s := src.Alert; s != nil {
		if dst.Alert == nil {
			dst.Alert = &records.AlertInfo{Signature: s.Signature, SignatureID: s.SignatureID, Category: s.Category, Severity: s.Severity}
		}
		d := dst.Alert
		d.Src = union(d.Src, s.Src, MaxList)
		d.Dst = union(d.Dst, s.Dst, MaxList)
	}
}

func mergeDomain(dp **records.DomainInfo, s *records.DomainInfo) {
	if s == nil {
		return
	}
	if *dp == nil {
		*dp = &records.DomainInfo{}
	}
	d := *dp
	d.Queries += s.Queries
	d.Responses += s.Responses
	d.QTypes = union(d.QTypes, s.QTypes, MaxList)
	d.RCodes = union(d.RCodes, s.RCodes, MaxList)
	for _, a := range s.Answers {
		if len(d.Answers) >= MaxAnswers {
			break
		}
		if i := slices.IndexFunc(d.Answers, func(b records.DNSAnswer) bool {
			return b.Name == a.Name && b.Type == a.Type && b.Data == a.Data
		}); i >= 0 {
			d.Answers[i].TTL = a.TTL // the latest TTL
			continue
		}
		d.Answers = append(d.Answers, a)
	}
	d.Addrs = union(d.Addrs, s.Addrs, MaxAnswers)
	d.CNAMEs = union(d.CNAMEs, s.CNAMEs, MaxList)
	d.Resolvers = union(d.Resolvers, s.Resolvers, MaxList)
	d.Clients = union(d.Clients, s.Clients, MaxList)
	d.Transports = union(d.Transports, s.Transports, MaxList)
	d.Unsolicited += s.Unsolicited
}

func mergeIP(dp **records.IPInfo, s *records.IPInfo) {
	if s == nil {
		return
	}
	if *dp == nil {
		*dp = &records.IPInfo{}
	}
	d := *dp
	d.Conns += s.Conns
	d.Ports = union(d.Ports, s.Ports, MaxList)
	d.Clients = union(d.Clients, s.Clients, MaxList)
	d.OrigBytes += s.OrigBytes
	d.RespBytes += s.RespBytes
	d.Starts = mergeTimes(d.Starts, s.Starts)
	d.Domains = union(d.Domains, s.Domains, MaxList)
}

func mergeEndpoint(dp **records.EndpointInfo, s *records.EndpointInfo) {
	if s == nil {
		return
	}
	if *dp == nil {
		*dp = &records.EndpointInfo{Proto: s.Proto, Addr: s.Addr, Port: s.Port}
	}
	d := *dp
	d.Conns += s.Conns
	d.Established += s.Established
	d.ConnStates = union(d.ConnStates, s.ConnStates, MaxList)
	d.Services = union(d.Services, s.Services, MaxList)
	d.OrigPkts += s.OrigPkts
	d.OrigBytes += s.OrigBytes
	d.RespPkts += s.RespPkts
	d.RespBytes += s.RespBytes
	d.MaxDuration = max(d.MaxDuration, s.MaxDuration)
	d.Clients = union(d.Clients, s.Clients, MaxList)
	d.Starts = mergeTimes(d.Starts, s.Starts)
	d.Domains = union(d.Domains, s.Domains, MaxList)
	d.AnsweredIn = unionTail(d.AnsweredIn, s.AnsweredIn, MaxCycles)
	d.SpokeIn = unionTail(d.SpokeIn, s.SpokeIn, MaxCycles)
	d.ConfirmedIn = unionTail(d.ConfirmedIn, s.ConfirmedIn, MaxCycles)
	d.Conversations += s.Conversations
}

// mergeScan unites two sightings of one cycle's scan: counts add up, and
// the distinct destinations become the estimate of the united sketches
// (two exact counts cannot be united without their members).
func mergeScan(dp **records.ScanInfo, s *records.ScanInfo) {
	if s == nil {
		return
	}
	if *dp == nil {
		c := *s
		c.Sample, c.OpenSample, c.Clients = slices.Clone(s.Sample), slices.Clone(s.OpenSample), slices.Clone(s.Clients)
		*dp = &c
		return
	}
	d := *dp
	span := 0.0
	if d.Rate > 0 {
		span = float64(d.Conns) / d.Rate
	}
	if s.Rate > 0 {
		span += float64(s.Conns) / s.Rate
	}
	d.Conns += s.Conns
	d.Open += s.Open
	d.Rejected += s.Rejected
	d.Unanswered += s.Unanswered
	if span > 0 {
		d.Rate = float64(int64(float64(d.Conns)/span*100+0.5)) / 100
	}
	ds, errD := distinct.ParseSketch(d.Sketch)
	ss, errS := distinct.ParseSketch(s.Sketch)
	switch {
	case errD == nil && errS == nil:
		ds.Union(ss)
		d.Sketch, d.Dests, d.Estimated = ds.String(), ds.Estimate(), true
	default:
		// No sketch to unite: the larger count is a lower bound.
		d.Dests, d.Estimated = max(d.Dests, s.Dests), true
	}
	d.Sample = union(d.Sample, s.Sample, MaxSample)
	d.OpenSample = union(d.OpenSample, s.OpenSample, MaxSample)
	d.Clients = union(d.Clients, s.Clients, MaxList)
}

// ScanDests is the distinct destinations of several sightings of a scan
// (the cycles of a lease): the estimate of their united sketches, or the
// largest count when one has no sketch.
func ScanDests(scans []*records.ScanInfo) int64 {
	union := distinct.NewSketch()
	var most int64
	united := true
	for _, s := range scans {
		most = max(most, s.Dests)
		sk, err := distinct.ParseSketch(s.Sketch)
		if err != nil {
			united = false
			continue
		}
		union.Union(sk)
	}
	if !united || len(scans) == 0 {
		return most
	}
	if len(scans) == 1 {
		return scans[0].Dests // exact up to distinct.Exact
	}
	return max(union.Estimate(), most)
}

func mergeHTTP(dp **records.HTTPInfo, s *records.HTTPInfo) {
	if s == nil {
		return
	}
	if *dp == nil {
		*dp = &records.HTTPInfo{Method: s.Method, Host: s.Host, URI: s.URI}
	}
	d := *dp
	d.UserAgents = union(d.UserAgents, s.UserAgents, MaxList)
	d.Statuses = union(d.Statuses, s.Statuses, MaxList)
	d.Servers = union(d.Servers, s.Servers, MaxList)
	d.Clients = union(d.Clients, s.Clients, MaxList)
}

func mergeTLS(dp **records.TLSInfo, s *records.TLSInfo) {
	if s == nil {
		return
	}
	if *dp == nil {
		*dp = &records.TLSInfo{ServerName: s.ServerName}
	}
	d := *dp
	d.Versions = union(d.Versions, s.Versions, MaxList)
	d.JA3 = union(d.JA3, s.JA3, MaxList)
	d.JA4 = union(d.JA4, s.JA4, MaxList)
	d.ALPN = union(d.ALPN, s.ALPN, MaxList)
	d.Servers = union(d.Servers, s.Servers, MaxList)
	d.Clients = union(d.Clients, s.Clients, MaxList)
}

func mergeICMP(dp **records.ICMPInfo, s *records.ICMPInfo) {
	if s == nil {
		return
	}
	if *dp == nil {
		c := *s
		*dp = &c
		return
	}
	(*dp).Packets += s.Packets
	(*dp).Bytes += s.Bytes
}

func mergeFile(dp **records.FileInfo, s *records.FileInfo) {
	if s == nil {
		return
	}
	if *dp == nil {
		*dp = &records.FileInfo{}
	}
	d := *dp
	d.MIMEType = cmp.Or(d.MIMEType, s.MIMEType)
	d.SHA256 = cmp.Or(d.SHA256, s.SHA256)
	d.SHA1 = cmp.Or(d.SHA1, s.SHA1)
	d.MD5 = cmp.Or(d.MD5, s.MD5)
	d.Size = max(d.Size, s.Size)
	d.Filenames = union(d.Filenames, s.Filenames, MaxList)
	d.Hosts = union(d.Hosts, s.Hosts, MaxList)
}

// union appends the members of b missing from a, keeping at most max.
func union[T comparable](a, b []T, max int) []T {
	for _, v := range b {
		if len(a) >= max {
			break
		}
		if !slices.Contains(a, v) {
			a = append(a, v)
		}
	}
	return a
}

// unionTail is union keeping the most recent max members.
func unionTail[T comparable](a, b []T, max int) []T {
	for _, v := range b {
		if !slices.Contains(a, v) {
			a = append(a, v)
		}
	}
	if len(a) > max {
		a = slices.Clone(a[len(a)-max:])
	}
	return a
}

// mergeTimes unites two lists of times in order, keeping the latest MaxStarts.
func mergeTimes(a, b []time.Time) []time.Time {
	if len(b) == 0 {
		return a
	}
	out := a
	switch {
	case len(a) == 0 || b[0].After(a[len(a)-1]) && slices.IsSortedFunc(b, time.Time.Compare):
		// The usual case, sightings in time order: no sort needed.
		out = append(out, b...)
	case len(b) == 1:
		// One connection ending out of order: insert it in place.
		i, found := slices.BinarySearchFunc(out, b[0], time.Time.Compare)
		if !found {
			out = slices.Insert(out, i, b[0])
		}
	default:
		out = append(out, b...)
		sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
		out = slices.CompactFunc(out, func(x, y time.Time) bool { return x.Equal(y) })
	}
	if n := len(out) - MaxStarts; n > 0 {
		out = out[:copy(out, out[n:])]
	}
	return out
}
