// Package firewall programs talkbox's containment rules into nftables over
// netlink (github.com/google/nftables; the changes and reads of allow sets
// as nfnetlink messages of its own, wire.go): the lab-wide tables that
// sinkhole every guest packet bound outside, and per-lease rule sets
// (allow, rate limit, redirect, reflect, drop) that tb-capture applies at
// start, tb-allow updates live, and tb-capture removes at teardown.
package firewall

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Verdict is what happens to a guest packet that matches an element. The
// names are those of the GQ malware farm's containment policies.
type Verdict string

const (
	// Forward sends the packet to its real destination through the uplink.
	Forward Verdict = "forward"
	// RateLimit forwards within the lease's rate limit and drops the excess.
	RateLimit Verdict = "rate-limit"
	// Redirect sends the packet to the sinkhole (what every unlisted
	// destination gets anyway; listed to pin it against later promotion).
	Redirect Verdict = "redirect"
	// Reflect sends the packet back to the guest itself, as if the
	// destination answered from the guest's own services.
	Reflect Verdict = "reflect"
	// Drop discards the packet.
	Drop Verdict = "drop"
)

// Verdicts lists every verdict in the order of its rules.
var Verdicts = []Verdict{Forward, RateLimit, Redirect, Reflect, Drop}

// ParseVerdict accepts the verdict names (and "ratelimit", "sinkhole").
func ParseVerdict(s string) (Verdict, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "forward", "allow":
		return Forward, nil
	case "rate-limit", "ratelimit", "limit":
		return RateLimit, nil
	case "redirect", "sinkhole":
		return Redirect, nil
	case "reflect":
		return Reflect, nil
	case "drop":
		return Drop, nil
	}
	return "", fmt.Errorf("unknown verdict %q (forward, rate-limit, redirect, reflect, drop)", s)
}

// Element is one entry of a lease's allow set: guest packets to Dst, Proto,
// Port get Verdict.
type Element struct {
	Dst     netip.Addr `json:"dst"`
	Proto   string     `json:"proto"` // tcp or udp
	Port    uint16     `json:"port"`
	Verdict Verdict    `json:"verdict"`
}

// Key is the element's identity without its verdict.
func (e Element) Key() string { return fmt.Sprintf("%s/%s/%d", e.Dst, e.Proto, e.Port) }

func (e Element) String() string { return e.Key() + " " + string(e.Verdict) }

// ParseElement reads "IP:PORT/PROTO[=VERDICT]", e.g. "198.51.100.7:443/tcp"
// or "203.0.113.5:53/udp=rate-limit".
func ParseElement(s string) (Element, error) {
	body, v, _ := strings.Cut(strings.TrimSpace(s), "=")
	verdict, err := ParseVerdict(v)
	if err != nil {
		return Element{}, err
	}
	// The one protocol-less form the command line takes: tcp.
	if !strings.Contains(body, "/") {
		body += "/tcp"
	}
	ep, err := endpoint.Parse(strings.ToLower(body))
	if err != nil {
		return Element{}, fmt.Errorf("element %q: want IP:PORT/PROTO[=VERDICT], PROTO tcp or udp", s)
	}
	return Element{Dst: ep.Addr, Proto: ep.Proto, Port: ep.Port, Verdict: verdict}, nil
}

func protoNum(p string) byte {
	if p == "udp" {
		return 17
	}
	return 6
}

// Rate is a token-bucket limit: Value units per Per seconds, in bytes or
// packets.
type Rate struct {
	Value uint64 `json:"value"`
	Bytes bool   `json:"bytes"`
	Per   uint64 `json:"per"` // seconds: 1, 60, 3600, 86400
}

func (r Rate) String() string {
	if r.Value == 0 {
		return ""
	}
	unit := "packets"
	if r.Bytes {
		unit = "bytes"
	}
	per := map[uint64]string{1: "second", 60: "minute", 3600: "hour", 86400: "day"}[r.Per]
	return fmt.Sprintf("%d %s/%s", r.Value, unit, per)
}

// ParseRate reads nft-style rates: "64kbytes/second", "1 mbytes/second",
// "100/second" (packets). "" is no limit.
func ParseRate(s string) (Rate, error) {
	s = strings.ReplaceAll(strings.TrimSpace(strings.ToLower(s)), " ", "")
	if s == "" {
		return Rate{}, nil
	}
	amount, per, ok := strings.Cut(s, "/")
	if !ok {
		return Rate{}, fmt.Errorf("rate %q: want AMOUNT[UNIT]/PERIOD, e.g. 64kbytes/second", s)
	}
	r := Rate{}
	switch per {
	case "second", "s":
		r.Per = 1
	case "minute", "m":
		r.Per = 60
	case "hour", "h":
		r.Per = 3600
	case "day", "d":
		r.Per = 86400
	default:
		return Rate{}, fmt.Errorf("rate %q: period must be second, minute, hour or day", s)
	}
	i := 0
	for i < len(amount) && amount[i] >= '0' && amount[i] <= '9' {
		i++
	}
	n, err := strconv.ParseUint(amount[:i], 10, 64)
	if err != nil || n == 0 {
		return Rate{}, fmt.Errorf("rate %q: amount must be a positive integer", s)
	}
	mult := map[string]uint64{"": 1, "packets": 1, "bytes": 1, "kbytes": 1 << 10, "mbytes": 1 << 20, "gbytes": 1 << 30}
	unit := amount[i:]
	m, ok := mult[unit]
	if !ok {
		return Rate{}, fmt.Errorf("rate %q: unit must be packets, bytes, kbytes, mbytes or gbytes", s)
	}
	r.Value = n * m
	r.Bytes = unit != "" && unit != "packets"
	return r, nil
}

// Policy is what the validator accepts as a destination.
type Policy struct {
	// Documentation lets 192.0.2.0/24, 198.51.100.0/24 and 203.0.113.0/24
	// stand in for the internet (tests and the demo).
	Documentation bool
	// AllowSMTP lets SMTP ports through (forced by the plan).
	AllowSMTP bool
	// SMTPPorts are the ports refused unless AllowSMTP.
	SMTPPorts []uint16
	// Lab are the lab's own networks (guests, sinkhole).
	Lab []netip.Prefix
	// Host are the host's own addresses.
	Host []netip.Addr
}

// DefaultSMTPPorts are submission and relay ports spam bots use.
var DefaultSMTPPorts = []uint16{25, 465, 587, 2525}

// documentation ranges (RFC 5737).
var documentation = []netip.Prefix{
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
}

// reserved are the IPv4 special-purpose ranges (RFC 6890 and successors)
// that are never "the internet".
var reserved = []struct {
	p    netip.Prefix
	what string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (CGN)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation"},
	{netip.MustParsePrefix("192.88.99.0/24"), "6to4 relay"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
}

// CheckDst refuses destinations that are not the public internet.
func (p Policy) CheckDst(a netip.Addr) error {
	if !a.IsValid() {
		return errors.New("no destination address")
	}
	if !a.Is4() {
		// The lab has no IPv6 path: guests' IPv6 is dropped outright.
		return fmt.Errorf("%s: only IPv4 destinations can be forwarded", a)
	}
	for _, l := range p.Lab {
		if l.Contains(a) {
			return fmt.Errorf("%s: a lab address (%s)", a, l)
		}
	}
	for _, h := range p.Host {
		if h.Unmap() == a {
			return fmt.Errorf("%s: an address of the host", a)
		}
	}
	if a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return fmt.Errorf("%s: broadcast", a)
	}
	for _, r := range reserved {
		if !r.p.Contains(a) {
			continue
		}
		if r.what == "documentation" && p.Documentation {
			return nil
		}
		return fmt.Errorf("%s: %s address (%s)", a, r.what, r.p)
	}
	return nil
}

// Check validates one element against the policy.
func (p Policy) Check(e Element) error {
	if err := p.CheckDst(e.Dst); err != nil {
		return err
	}
	if e.Proto != "tcp" && e.Proto != "udp" {
		return fmt.Errorf("%s: protocol must be tcp or udp", e.Key())
	}
	if e.Port == 0 {
		return fmt.Errorf("%s: port 0", e.Key())
	}
	switch e.Verdict {
	case Forward, RateLimit, Redirect, Reflect, Drop:
	default:
		return fmt.Errorf("%s: unknown verdict %q", e.Key(), e.Verdict)
	}
	if !p.AllowSMTP && e.Proto == "tcp" && (e.Verdict == Forward || e.Verdict == RateLimit) {
		for _, sp := range p.SMTPPorts {
			if e.Port == sp {
				return fmt.Errorf("%s: SMTP port %d is never forwarded unless forced (--allow-smtp)", e.Key(), sp)
			}
		}
	}
	return nil
}

// Plan validates a whole change: each element, and no element added twice
// with different verdicts or both added and deleted. The returned error
// lists every problem.
func (p Policy) Plan(add, del []Element) error {
	var errs []string
	pass := p.passes()
	// Each valid addition as its identity and verdict in one number,
	// sorted: a conflict is two neighbours (cheaper than a map of 100,000).
	ids := make([]uint64, 0, len(add))
	for _, e := range add {
		if !pass(e) {
			if err := p.Check(e); err != nil {
				errs = append(errs, err.Error())
				continue
			}
		}
		k, _ := e.id64()
		ids = append(ids, k<<8|uint64(verdictNum(e.Verdict)))
	}
	slices.Sort(ids)
	for i := 1; i < len(ids); i++ {
		if ids[i]>>8 == ids[i-1]>>8 && ids[i] != ids[i-1] {
			e := elementOf(ids[i] >> 8)
			errs = append(errs, fmt.Sprintf("%s: conflicting verdicts %s and %s", e.Key(), Verdicts[ids[i-1]&0xff], Verdicts[ids[i]&0xff]))
		}
	}
	for _, e := range del {
		if k, ok := e.id64(); ok {
			i, _ := slices.BinarySearch(ids, k<<8)
			if i < len(ids) && ids[i]>>8 == k {
				errs = append(errs, fmt.Sprintf("%s: both added and deleted", e.Key()))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	sort.Strings(errs)
	if len(errs) > 5 {
		errs = append(errs[:5], fmt.Sprintf("and %d more", len(errs)-5))
	}
	return &InvalidError{Reasons: errs}
}

// verdictNum is a valid verdict's index in Verdicts.
func verdictNum(v Verdict) int { return slices.Index(Verdicts, v) }

// elementOf is the element (without verdict) of an id64.
func elementOf(id uint64) Element {
	proto := "tcp"
	if byte(id>>16) == 17 {
		proto = "udp"
	}
	return Element{Dst: netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, uint32(id>>24)))), Proto: proto, Port: uint16(id)}
}

// id64 is the identity of an IPv4 TCP or UDP element as one number (ok
// false for any other, which Check refuses).
func (e Element) id64() (uint64, bool) {
	if !e.Dst.Is4() || (e.Proto != "tcp" && e.Proto != "udp") {
		return 0, false
	}
	a := e.Dst.As4()
	return uint64(binary.BigEndian.Uint32(a[:]))<<24 | uint64(protoNum(e.Proto))<<16 | uint64(e.Port), true
}

// passes is a quick form of Check for the common case, an element Check
// accepts: true only when Check would return nil (false: ask Check, which
// says why or accepts it). Plan runs it on every element of a change of
// 100,000.
func (p Policy) passes() func(Element) bool {
	type net4 struct{ addr, mask uint32 }
	var deny []net4
	prefix := func(pf netip.Prefix) {
		if pf.Addr().Is4() {
			a := pf.Masked().Addr().As4()
			deny = append(deny, net4{binary.BigEndian.Uint32(a[:]), ^uint32(0) << (32 - pf.Bits())})
		}
	}
	for _, l := range p.Lab {
		prefix(l)
	}
	for _, r := range reserved {
		prefix(r.p) // documentation included: Check decides
	}
	for _, h := range p.Host {
		if h = h.Unmap(); h.Is4() {
			prefix(netip.PrefixFrom(h, 32))
		}
	}
	prefix(netip.MustParsePrefix("255.255.255.255/32"))
	return func(e Element) bool {
		if !e.Dst.Is4() || e.Port == 0 || (e.Proto != "tcp" && e.Proto != "udp") {
			return false
		}
		switch e.Verdict {
		case Forward, RateLimit:
			if !p.AllowSMTP && e.Proto == "tcp" && slices.Contains(p.SMTPPorts, e.Port) {
				return false
			}
		case Redirect, Reflect, Drop:
		default:
			return false
		}
		a4 := e.Dst.As4()
		a := binary.BigEndian.Uint32(a4[:])
		for _, d := range deny {
			if a&d.mask == d.addr {
				return false
			}
		}
		return true
	}
}

// InvalidError is a refused plan; nothing was changed.
type InvalidError struct{ Reasons []string }

func (e *InvalidError) Error() string { return "invalid rules: " + strings.Join(e.Reasons, "; ") }
