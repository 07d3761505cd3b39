// Command crosscheck compares what tb-parse extracts from a capture with what
// tshark's dissectors see in it: per-connection TCP payload bytes in each
// direction, DNS query names with their query counts and address answers,
// HTTP requests (method, host, URI) and TLS ClientHellos (SNI and JA3). It
// prints a summary and the first disagreements, and exits 1 if there are any.
//
//	go run ./bench/tb-parse/crosscheck [-tb-parse bin/tb-parse] capture.pcap
//
// TCP byte counts agree exactly only on captures without loss or
// retransmission: tb-parse counts sequence space as Zeek does, tshark's
// tcp.len counts every copy.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
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
	file := flag.Arg(0)
	obs, conns := tbParse(*bin, file)
	bad := 0
	bad += check("tcp bytes", *show, tcpBytes(file), func(k string) (string, bool) {
		c, ok := conns[k]
		if !ok {
			return "", false
		}
		return fmt.Sprintf("%d/%d", c[0], c[1]), true
	})
	queries, answers := dns(file)
	bad += check("dns queries", *show, queries, func(k string) (string, bool) {
		o, ok := obs["domain "+k]
		if !ok {
			return "", false
		}
		return strconv.Itoa(int(o["domain"].(map[string]any)["queries"].(float64))), true
	})
	bad += check("dns answers", *show, answers, func(k string) (string, bool) {
		o, ok := obs["domain "+k]
		if !ok {
			return "", false
		}
		return joinSorted(o["domain"].(map[string]any)["addrs"]), true
	})
	bad += check("http requests", *show, fields(file, "http.request", "http.request.method", "http.host", "http.request.uri"), func(k string) (string, bool) {
		o, ok := obs["http "+k]
		if !ok {
			return "", false
		}
		return strconv.Itoa(int(o["count"].(float64))), true
	})
	bad += check("tls hellos", *show, tlsHellos(file), func(k string) (string, bool) {
		o, ok := obs["tls "+k]
		if !ok {
			return "", false
		}
		return fmt.Sprintf("%d %s", int(o["count"].(float64)), joinSorted(o["tls"].(map[string]any)["ja3"])), true
	})
	if bad > 0 {
		os.Exit(1)
	}
}

// check compares tshark's values with tb-parse's, key by key.
func check(kind string, show int, want map[string]string, got func(string) (string, bool)) int {
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	bad := 0
	for _, k := range keys {
		g, ok := got(k)
		if ok && g == want[k] {
			continue
		}
		if bad++; bad <= show {
			if !ok {
				g = "(none)"
			}
			fmt.Printf("  %s %q: tshark %s, tb-parse %s\n", kind, k, want[k], g)
		}
	}
	fmt.Printf("%-14s %7d checked, %d disagree\n", kind, len(want), bad)
	return bad
}

// tbParse runs tb-parse with a state of its own and returns its observables
// by "type value" and, from its flow log, each 5-tuple's payload bytes in
// each direction ("tcp a:p>b:q"), summed over the connections that reused
// it.
func tbParse(bin, file string) (map[string]map[string]any, map[string][2]int64) {
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
	conns := map[string][2]int64{}
	for _, c := range run(bin, "--state", dir, "flows") {
		port := func(k string) string { return strconv.Itoa(int(c[k].(float64))) }
		k := fmt.Sprintf("%s %s>%s", c["proto"], hostPort(c["id.orig_h"].(string), port("id.orig_p")), hostPort(c["id.resp_h"].(string), port("id.resp_p")))
		v := conns[k]
		v[0] += int64(c["orig_bytes"].(float64))
		v[1] += int64(c["resp_bytes"].(float64))
		conns[k] = v
	}
	return obs, conns
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

// tcpBytes sums payload per direction of each TCP 5-tuple, oriented by the
// first SYN (or the first packet).
func tcpBytes(file string) map[string]string {
	type conv struct {
		a, b   string
		ab, ba int64
	}
	convs := map[string]*conv{}
	for _, r := range tshark(file, "tcp", "ip.src", "ipv6.src", "tcp.srcport", "ip.dst", "ipv6.dst", "tcp.dstport", "tcp.len", "tcp.flags.syn", "tcp.flags.ack") {
		if len(r) < 9 {
			continue
		}
		src, dst := hostPort(r[0]+r[1], r[2]), hostPort(r[3]+r[4], r[5])
		k := src + ">" + dst
		if dst < src {
			k = dst + ">" + src
		}
		c := convs[k]
		if c == nil {
			c = &conv{a: src, b: dst}
			convs[k] = c
		}
		if r[7] == "1" && r[8] == "0" && c.a != src && c.ab == 0 && c.ba == 0 {
			c.a, c.b = src, dst
		}
		n, _ := strconv.ParseInt(r[6], 10, 64)
		if src == c.a {
			c.ab += n
		} else {
			c.ba += n
		}
	}
	out := map[string]string{}
	for _, c := range convs {
		out["tcp "+c.a+">"+c.b] = fmt.Sprintf("%d/%d", c.ab, c.ba)
	}
	return out
}

func dns(file string) (queries, answers map[string]string) {
	q, a := map[string]int{}, map[string][]string{}
	for _, r := range tshark(file, "dns", "dns.flags.response", "dns.qry.name", "dns.a", "dns.aaaa") {
		if len(r) < 4 || r[1] == "" {
			continue
		}
		name := strings.ToLower(strings.Split(r[1], ",")[0])
		if r[0] == "0" || r[0] == "False" {
			q[name]++
			continue
		}
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
