// Command crosscheck compares what tb-parse extracts from a capture with what
// tshark's dissectors see in it: per-connection TCP payload bytes in each
// direction, each connection's direction (who originated it) and Zeek
// conn_state, DNS query names with their query counts and address answers,
// HTTP requests (method, host, URI) and TLS ClientHellos (SNI and JA3). It
// prints a summary and the first disagreements, and exits 1 if there are any.
//
//	go run ./bench/tb-parse/crosscheck [-tb-parse bin/tb-parse] capture.pcap
//
// TCP byte counts agree exactly only on captures without loss: tb-parse
// counts sequence space as Zeek does, so the payload of the segments
// tshark marks as retransmissions is left out of tshark's sums.
//
// Direction is checked where tshark's dissectors establish it: a TCP
// conversation's originator sent its SYN, or received a SYN-ACK that an
// ACK or data followed; a UDP conversation's is the side that asked (the
// first DNS message's QR bit, NTP's mode 3 or 4, DHCP's BOOTREQUEST or
// BOOTREPLY). Conversations whose direction only a port guess could tell
// are counted apart, not checked. conn_state is Zeek's conn_state function
// over each TCP side's last state (SYN, SYN-ACK, FIN, RST or other
// packets, from tshark's flags); for UDP, which sides sent. Both are
// compared on the 5-tuples that tshark and tb-parse each see as one
// conversation (tcp.stream, udp.stream); the rest are counted apart.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
)

func main() {
	bin := flag.String("tb-parse", "bin/tb-parse", "tb-parse binary")
	show := flag.Int("show", 5, "disagreements to print per kind")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: crosscheck [-tb-parse BIN] CAPTURE")
		os.Exit(2)
	}
	for _, r := range crosscheck(os.Stdout, *bin, flag.Arg(0), *show) {
		if r[1] > 0 {
			os.Exit(1)
		}
	}
}

// crosscheck compares what tb-parse and tshark see in a capture, prints the
// summary and the first show disagreements of each kind to w, and returns
// each kind's counts: checked, disagreeing.
func crosscheck(w io.Writer, bin, file string, show int) map[string][2]int {
	ck := &checker{w: w, show: show, res: map[string][2]int{}}
	obs, bytes, flows := tbParse(bin, file)
	tcp := tcpConvs(file)
	ck.check("tcp bytes", tcpBytes(tcp), func(k string) (string, bool) {
		c, ok := bytes[k]
		if !ok {
			return "", false
		}
		return fmt.Sprintf("%d/%d", c[0], c[1]), true
	})
	queries, answers := dns(file)
	ck.check("dns queries", queries, func(k string) (string, bool) {
		o, ok := obs["domain "+k]
		if !ok {
			return "", false
		}
		return strconv.Itoa(int(o["domain"].(map[string]any)["queries"].(float64))), true
	})
	ck.check("dns answers", answers, func(k string) (string, bool) {
		o, ok := obs["domain "+k]
		if !ok {
			return "", false
		}
		return joinSorted(o["domain"].(map[string]any)["addrs"]), true
	})
	ck.check("http requests", fields(file, "http.request", "http.request.method", "http.host", "http.request.uri"), func(k string) (string, bool) {
		o, ok := obs["http "+k]
		if !ok {
			return "", false
		}
		return strconv.Itoa(int(o["count"].(float64))), true
	})
	ck.check("tls hellos", tlsHellos(file), func(k string) (string, bool) {
		o, ok := obs["tls "+k]
		if !ok {
			return "", false
		}
		return fmt.Sprintf("%d %s", int(o["count"].(float64)), joinSorted(o["tls"].(map[string]any)["ja3"])), true
	})
	convs := append(tcp, udpConvs(file)...)
	dirs, states, guessed, reused := expect(convs, flows)
	ck.check("direction", dirs, func(k string) (string, bool) { return flowField(flows, k, "dir") })
	fmt.Fprintf(w, "%-14s %7d a port guess, not checked\n", "", guessed)
	ck.check("conn_state", states, func(k string) (string, bool) { return flowField(flows, k, "state") })
	fmt.Fprintf(w, "%-14s %7d in reused 5-tuples, not checked\n", "", reused)
	return ck.res
}

// checker compares tshark's values with tb-parse's, kind by kind.
type checker struct {
	w    io.Writer
	show int
	res  map[string][2]int
}

// check compares one kind, key by key.
func (c *checker) check(kind string, want map[string]string, got func(string) (string, bool)) {
	bad := 0
	for _, k := range slices.Sorted(maps.Keys(want)) {
		g, ok := got(k)
		if ok && g == want[k] {
			continue
		}
		if bad++; bad <= c.show {
			if !ok {
				g = "(none)"
			}
			fmt.Fprintf(c.w, "  %s %q: tshark %s, tb-parse %s\n", kind, k, want[k], g)
		}
	}
	fmt.Fprintf(c.w, "%-14s %7d checked, %d disagree\n", kind, len(want), bad)
	c.res[kind] = [2]int{len(want), bad}
}

// flow is a connection of tb-parse's flow log.
type flow struct {
	orig, resp, state, history string
}

// tbParse runs tb-parse with a state of its own and returns its observables
// by "type value" and, from its flow log, each 5-tuple's payload bytes sent
// by its lower and its higher endpoint (by convKey), summed over the
// connections that reused it, and each 5-tuple's connections.
func tbParse(bin, file string) (map[string]map[string]any, map[string][2]int64, map[string][]flow) {
	dir, err := os.MkdirTemp("", "crosscheck-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	obs := map[string]map[string]any{}
	for _, o := range run(bin, "--state", dir, "--max-held", "10000000", file) {
		if o["kind"] == "observable" {
			obs[o["type"].(string)+" "+o["value"].(string)] = o
		}
	}
	bytes := map[string][2]int64{}
	flows := map[string][]flow{}
	for _, c := range run(bin, "--state", dir, "flows") {
		port := func(k string) string { return strconv.Itoa(int(c[k].(float64))) }
		orig, resp := hostPort(c["id.orig_h"].(string), port("id.orig_p")), hostPort(c["id.resp_h"].(string), port("id.resp_p"))
		proto := c["proto"].(string)
		ob, rb := int64(c["orig_bytes"].(float64)), int64(c["resp_bytes"].(float64))
		ck := convKey(proto, orig, resp)
		if ck != proto+" "+orig+">"+resp {
			ob, rb = rb, ob
		}
		v := bytes[ck]
		bytes[ck] = [2]int64{v[0] + ob, v[1] + rb}
		h, _ := c["history"].(string)
		flows[ck] = append(flows[ck], flow{orig: orig, resp: resp, state: c["conn_state"].(string), history: h})
	}
	return obs, bytes, flows
}

// convKey names a conversation whichever way it goes: "proto a>b" with the
// lower endpoint first.
func convKey(proto, a, b string) string {
	if b < a {
		a, b = b, a
	}
	return proto + " " + a + ">" + b
}

// flowField is tb-parse's direction ("orig>resp") or conn_state of the one
// connection of a conversation.
func flowField(flows map[string][]flow, k, field string) (string, bool) {
	fs := flows[k]
	if len(fs) != 1 {
		return "", false
	}
	if field == "dir" {
		return fs[0].orig + ">" + fs[0].resp, true
	}
	return fs[0].state, true
}

// run runs tb-parse and decodes its JSON lines.
func run(bin string, args ...string) []map[string]any {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		fail(fmt.Errorf("tb-parse %s: %w", strings.Join(args, " "), err))
	}
	var lines []map[string]any
	for _, line := range bytes.Split(out, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var o map[string]any
		if err := json.Unmarshal(line, &o); err != nil {
			fail(fmt.Errorf("tb-parse output: %w", err))
		}
		lines = append(lines, o)
	}
	return lines
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "crosscheck:", err)
	os.Exit(1)
}

// tshark runs tshark -T fields and returns its rows.
func tshark(file, filter string, fields ...string) [][]string {
	args := []string{"-n", "-r", file, "-Y", filter, "-T", "fields", "-E", "separator=/t", "-E", "aggregator=,"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	cmd := exec.Command("tshark", args...)
	out, err := cmd.Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "crosscheck: tshark:", err)
		os.Exit(1)
	}
	var rows [][]string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		rows = append(rows, strings.Split(sc.Text(), "\t"))
	}
	return rows
}

func hostPort(h, p string) string {
	if strings.Contains(h, ":") {
		return "[" + h + "]:" + p
	}
	return h + ":" + p
}

// The headers quoted in ICMP errors are not packets of the conversations
// they quote (tshark would count them in): the filters leave them out.

// side is what one side of a conversation sent, from tshark's flags.
type side struct {
	syn, synAck, fin, rst, other bool
	pkts, bytes                  int64
}

// conv is a TCP or UDP conversation as tshark sees it: a tcp.stream or
// udp.stream.
type conv struct {
	proto  string
	stream string
	a, b   string // the first packet's sender and receiver
	ab, ba side
	// asker is the side that asked (UDP), from the first message a
	// dissector could read: "a", "b" or "" when none.
	asker string
	// synAckFirst: the first packet was a SYN-ACK; answered: the next
	// packet other than a SYN-ACK from a was an ACK or data without SYN or
	// RST (decided once that packet came).
	synAckFirst, decided, answered bool
}

func set(v string) bool { return v == "1" || v == "True" }

// tcpConvs reads every TCP conversation's packets.
func tcpConvs(file string) []*conv {
	convs := map[string]*conv{}
	var order []*conv
	for _, r := range tshark(file, "tcp && !icmp && !icmpv6", "tcp.stream", "ip.src", "ipv6.src", "tcp.srcport", "ip.dst", "ipv6.dst", "tcp.dstport", "tcp.len",
		"tcp.flags.syn", "tcp.flags.ack", "tcp.flags.fin", "tcp.flags.reset", "tcp.analysis.retransmission") {
		if len(r) < 13 {
			continue
		}
		src, dst := hostPort(r[1]+r[2], r[3]), hostPort(r[4]+r[5], r[6])
		c := convs[r[0]]
		n, _ := strconv.ParseInt(r[7], 10, 64)
		syn, ack, fin, rst := set(r[8]), set(r[9]), set(r[10]), set(r[11])
		if c == nil {
			c = &conv{proto: "tcp", stream: r[0], a: src, b: dst, synAckFirst: syn && ack}
			convs[r[0]] = c
			order = append(order, c)
		} else if c.synAckFirst && !c.decided && !(src == c.a && syn && ack) {
			c.decided, c.answered = true, !syn && !rst && (ack || n > 0)
		}
		s := &c.ab
		if src != c.a {
			s = &c.ba
		}
		s.pkts++
		if r[12] == "" {
			s.bytes += n
		}
		switch {
		case syn && ack:
			s.synAck = true
		case syn:
			s.syn = true
		}
		s.fin = s.fin || fin
		s.rst = s.rst || rst
		s.other = s.other || !syn && !fin && !rst
	}
	return order
}

// tcpBytes sums the payload each endpoint of a TCP 5-tuple sent, the lower
// endpoint's first (by convKey): the direction is checked apart.
func tcpBytes(convs []*conv) map[string]string {
	sum := map[string][2]int64{}
	for _, c := range convs {
		k, ab, ba := convKey("tcp", c.a, c.b), c.ab.bytes, c.ba.bytes
		if k != "tcp "+c.a+">"+c.b {
			ab, ba = ba, ab
		}
		v := sum[k]
		sum[k] = [2]int64{v[0] + ab, v[1] + ba}
	}
	out := map[string]string{}
	for k, v := range sum {
		out[k] = fmt.Sprintf("%d/%d", v[0], v[1])
	}
	return out
}

// udpConvs reads every UDP conversation and who asked in it.
func udpConvs(file string) []*conv {
	convs := map[string]*conv{}
	var order []*conv
	for _, r := range tshark(file, "udp && !icmp && !icmpv6", "udp.stream", "ip.src", "ipv6.src", "udp.srcport", "ip.dst", "ipv6.dst", "udp.dstport",
		"dns.flags.response", "ntp.flags.mode", "dhcp.type") {
		if len(r) < 10 {
			continue
		}
		src, dst := hostPort(r[1]+r[2], r[3]), hostPort(r[4]+r[5], r[6])
		c := convs[r[0]]
		if c == nil {
			c = &conv{proto: "udp", stream: r[0], a: src, b: dst}
			convs[r[0]] = c
			order = append(order, c)
		}
		s, sender, peer := &c.ab, "a", "b"
		if src != c.a {
			s, sender, peer = &c.ba, "b", "a"
		}
		s.pkts++
		if c.asker == "" {
			switch {
			case r[7] != "":
				c.asker = map[bool]string{false: sender, true: peer}[set(r[7])]
			case r[8] == "3" || r[9] == "1":
				c.asker = sender
			case r[8] == "4" || r[9] == "2":
				c.asker = peer
			}
		}
	}
	return order
}

// expect returns, for each conversation tshark and tb-parse both see as
// one, the direction tshark's dissectors establish ("orig>resp") and the
// conn_state its flags give; and how many conversations had a direction
// only a port guess could tell, and how many were in a 5-tuple reused
// (more than one conversation, for either tool).
func expect(convs []*conv, flows map[string][]flow) (dirs, states map[string]string, guessed, reused int) {
	n := map[string]int{}
	for _, c := range convs {
		n[convKey(c.proto, c.a, c.b)]++
	}
	dirs, states = map[string]string{}, map[string]string{}
	for _, c := range convs {
		k := convKey(c.proto, c.a, c.b)
		if n[k] != 1 || len(flows[k]) != 1 {
			reused++
			continue
		}
		orig, resp, o, r := c.a, c.b, c.ab, c.ba
		known := true
		switch {
		case c.proto == "udp":
			known = c.asker != ""
			if c.asker == "b" {
				orig, resp, o, r = c.b, c.a, c.ba, c.ab
			}
		case c.ab.syn:
		case c.ba.syn:
			orig, resp, o, r = c.b, c.a, c.ba, c.ab
		case c.answered:
			orig, resp, o, r = c.b, c.a, c.ba, c.ab
		default:
			known = false
		}
		if known {
			dirs[k] = orig + ">" + resp
		} else {
			guessed++
			// The state of a conversation whose direction is a guess is
			// checked the way tb-parse oriented it.
			if f := flows[k][0]; f.orig != orig {
				o, r = r, o
			}
		}
		states[k] = connState(c.proto, o, r)
	}
	return dirs, states, guessed, reused
}

// TCP endpoint states, as Zeek's analyzer names them.
const (
	inactive = iota
	synSent
	synAckSent
	partial
	established
	closed
	reset
)

// endpointState is a side's last state from what it sent and what its peer
// sent.
func endpointState(s, peer side) int {
	switch {
	case s.rst && !(s.fin && peer.fin):
		return reset
	case s.fin:
		return closed
	case s.synAck:
		return established
	case s.syn && (peer.synAck || peer.other || peer.fin):
		return established
	case s.syn:
		return synSent
	case s.other && (peer.syn || peer.synAck):
		return established
	case s.pkts > 0:
		return partial
	}
	return inactive
}

// connState is Zeek's conn_state function (base/protocols/conn) over the
// sides' states; for UDP, which sides sent.
func connState(proto string, o, r side) string {
	if proto == "udp" {
		switch {
		case o.pkts > 0 && r.pkts > 0:
			return "SF"
		case o.pkts > 0:
			return "S0"
		case r.pkts > 0:
			return "SHR"
		}
		return "OTH"
	}
	os, rs := endpointState(o, r), endpointState(r, o)
	oInactive := os == inactive || os == partial
	rInactive := rs == inactive || rs == partial
	switch {
	case rs == reset:
		if os == synSent || os == synAckSent || os == reset && o.bytes == 0 && r.bytes == 0 {
			return "REJ"
		}
		if oInactive {
			return "RSTRH"
		}
		return "RSTR"
	case os == reset:
		if rInactive {
			return "RSTOS0"
		}
		return "RSTO"
	case rs == closed && os == closed:
		return "SF"
	case os == closed:
		if rInactive {
			return "SH"
		}
		return "S2"
	case rs == closed:
		if oInactive {
			return "SHR"
		}
		return "S3"
	case os == synSent && rs == inactive:
		return "S0"
	case os == established && rs == established:
		return "S1"
	}
	return "OTH"
}

// dns counts each name's queries, and collects the addresses answered for
// it in responses to a query seen before (the same id, name and type, from
// the endpoint the response goes to): tb-parse takes no other answer as a
// resolution.
func dns(file string) (queries, answers map[string]string) {
	q, a := map[string]int{}, map[string][]string{}
	open := map[string]bool{}
	for _, r := range tshark(file, "dns && !icmp && !icmpv6", "dns.flags.response", "dns.qry.name", "dns.a", "dns.aaaa", "dns.id", "dns.qry.type",
		"ip.src", "ipv6.src", "udp.srcport", "tcp.srcport", "ip.dst", "ipv6.dst", "udp.dstport", "tcp.dstport") {
		if len(r) < 14 || r[1] == "" {
			continue
		}
		name := strings.ToLower(strings.Split(r[1], ",")[0])
		src, dst := hostPort(r[6]+r[7], r[8]+r[9]), hostPort(r[10]+r[11], r[12]+r[13])
		qtype := strings.Split(r[5], ",")[0]
		if !set(r[0]) {
			q[name]++
			open[src+" "+dst+" "+r[4]+" "+qtype+" "+name] = true
			continue
		}
		k := dst + " " + src + " " + r[4] + " " + qtype + " " + name
		if !open[k] {
			continue
		}
		delete(open, k)
		for _, x := range append(strings.Split(r[2], ","), strings.Split(r[3], ",")...) {
			if x != "" && !slices.Contains(a[name], x) {
				a[name] = append(a[name], x)
			}
		}
	}
	queries, answers = map[string]string{}, map[string]string{}
	for k, v := range q {
		queries[k] = strconv.Itoa(v)
	}
	for k, v := range a {
		sort.Strings(v)
		answers[k] = strings.Join(v, ",")
	}
	return queries, answers
}

func fields(file, filter string, f ...string) map[string]string {
	n := map[string]int{}
	for _, r := range tshark(file, filter, f...) {
		if len(r) < 3 {
			continue
		}
		n[r[0]+" http://"+strings.ToLower(r[1])+r[2]]++
	}
	out := map[string]string{}
	for k, v := range n {
		out[k] = strconv.Itoa(v)
	}
	return out
}

func tlsHellos(file string) map[string]string {
	n, ja3 := map[string]int{}, map[string][]string{}
	for _, r := range tshark(file, "tls.handshake.type == 1", "tls.handshake.extensions_server_name", "tls.handshake.ja3") {
		if len(r) < 2 || r[0] == "" {
			continue
		}
		sni := strings.ToLower(r[0])
		n[sni]++
		if !slices.Contains(ja3[sni], r[1]) {
			ja3[sni] = append(ja3[sni], r[1])
		}
	}
	out := map[string]string{}
	for k, v := range n {
		sort.Strings(ja3[k])
		out[k] = fmt.Sprintf("%d %s", v, strings.Join(ja3[k], ","))
	}
	return out
}

func joinSorted(v any) string {
	var s []string
	if l, ok := v.([]any); ok {
		for _, x := range l {
			s = append(s, x.(string))
		}
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}
