package records

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"testing"
	"time"
)

// plain has Observable's fields without its MarshalJSON.
type plain Observable

func randString(r *rand.Rand) string {
	alphabet := []string{"a", "Z", "0", " ", "<", ">", "&", `"`, `\`, "\n", "\t", "\r", "\b", "\f", "\x00", "\x1f", "é", "\u2028", "\u2029", "\xff", "\xe2\x82", "😀", ".", "/"}
	n := r.Intn(12)
	s := ""
	for i := 0; i < n; i++ {
		s += alphabet[r.Intn(len(alphabet))]
	}
	return s
}

func randStrings(r *rand.Rand) []string {
	if r.Intn(3) == 0 {
		return nil
	}
	out := make([]string, r.Intn(4))
	for i := range out {
		out[i] = randString(r)
	}
	return out
}

func randTime(r *rand.Rand) time.Time {
	t := time.Unix(r.Int63n(4e9), r.Int63n(1e9)*int64(r.Intn(2))).UTC()
	switch r.Intn(4) {
	case 0:
		return t.In(time.FixedZone("", 3600+1800))
	case 1:
		return t.Truncate(time.Millisecond)
	}
	return t
}

func randObservable(r *rand.Rand) *Observable {
	o := &Observable{Type: randString(r), Value: randString(r), Lease: randString(r), Cycle: randString(r), Cycles: randStrings(r),
		FirstSeen: randTime(r), LastSeen: randTime(r), Count: r.Int63n(1000), Sources: randStrings(r)}
	Init(o, KindObservable, randTime(r))
	o.Rev = r.Int63n(3)
	for i := 0; i < r.Intn(3); i++ {
		o.Provenance = append(o.Provenance, Provenance{Artifact: randString(r), Cycle: randString(r), Input: randString(r), Packet: r.Int63n(3), Line: r.Int63n(3), UID: randString(r)})
	}
	switch r.Intn(18) {
	case 0:
		o.Domain = &DomainInfo{Queries: r.Int63n(5), Responses: r.Int63n(5), QTypes: randStrings(r), RCodes: randStrings(r),
			Addrs: randStrings(r), CNAMEs: randStrings(r), Resolvers: randStrings(r), Clients: randStrings(r), Transports: randStrings(r)}
		for i := 0; i < r.Intn(3); i++ {
			o.Domain.Answers = append(o.Domain.Answers, DNSAnswer{Name: randString(r), Type: randString(r), Data: randString(r), TTL: r.Uint32()})
		}
	case 1:
		o.IP = &IPInfo{Conns: r.Int63n(9), Ports: randStrings(r), Clients: randStrings(r), OrigBytes: r.Int63(), RespBytes: r.Int63n(9), Domains: randStrings(r)}
		for i := 0; i < r.Intn(3); i++ {
			o.IP.Starts = append(o.IP.Starts, randTime(r))
		}
	case 3:
		o.HTTP = &HTTPInfo{Method: randString(r), Host: randString(r), URI: randString(r), UserAgents: randStrings(r), Servers: randStrings(r), Clients: randStrings(r)}
		if r.Intn(2) == 0 {
			o.HTTP.Statuses = []int{200, 404}
		}
	case 4:
		o.TLS = &TLSInfo{ServerName: randString(r), Versions: randStrings(r), JA3: randStrings(r), JA4: randStrings(r), ALPN: randStrings(r), Servers: randStrings(r), Clients: randStrings(r)}
	case 5:
		o.ICMP = &ICMPInfo{OrigH: randString(r), RespH: randString(r), Type: uint8(r.Intn(256)), Code: uint8(r.Intn(256)), V6: r.Intn(2) == 0, Packets: r.Int63n(9), Bytes: r.Int63n(9)}
	case 6:
		o.File = &FileInfo{MIMEType: randString(r), Filenames: randStrings(r), SHA256: randString(r), SHA1: randString(r), MD5: randString(r), Size: r.Int63n(3), Hosts: randStrings(r)}
	case 7:
		o.Notice = &NoticeInfo{Note: randString(r), Msgs: randStrings(r), Src: randStrings(r), Dst: randStrings(r)}
	case 8:
		o.Alert = &AlertInfo{Signature: randString(r), SignatureID: r.Int63n(9), Category: randString(r), Severity: r.Intn(3), Src: randStrings(r), Dst: randStrings(r)}
	case 2, 9:
		durs := []float64{0, 1.5, 0.000001, 0.0000001234, 123456.789, 3e21, 1e-9}
		o.Endpoint = &EndpointInfo{Proto: randString(r), Addr: randString(r), Port: uint16(r.Intn(65536)), Conns: r.Int63n(9), Established: r.Int63n(9),
			ConnStates: randStrings(r), Services: randStrings(r), OrigPkts: r.Int63n(9), OrigBytes: r.Int63n(9), RespPkts: r.Int63n(9),
			RespBytes: r.Int63n(9), MaxDuration: durs[r.Intn(len(durs))], Clients: randStrings(r), Domains: randStrings(r),
			AnsweredIn: randStrings(r), SpokeIn: randStrings(r), ConfirmedIn: randStrings(r), Conversations: r.Int63n(3)}
		for i := 0; i < r.Intn(3); i++ {
			o.Endpoint.Starts = append(o.Endpoint.Starts, randTime(r))
		}
	case 10:
		o.Scan = &ScanInfo{Proto: randString(r), Port: uint16(r.Intn(3)), Addr: randString(r), Conns: r.Int63n(9), Open: r.Int63n(9),
			Rejected: r.Int63n(9), Unanswered: r.Int63n(9), Dests: r.Int63n(9), Estimated: r.Intn(2) == 0, Sketch: randString(r),
			Rate: float64(r.Intn(1000)) / 7, Sample: randStrings(r), OpenSample: randStrings(r), Clients: randStrings(r)}
	case 11:
		o.Process = &ProcessInfo{PID: r.Int63n(9), PPID: r.Int63n(9), Exe: randString(r), FailedExecs: r.Int63n(3), Names: randStrings(r),
			Start: randTime(r), Threads: r.Int63n(3)}
		for i := 0; i < r.Intn(3); i++ {
			o.Process.Execs = append(o.Process.Execs, ProcExec{Path: randString(r), Argv: randStrings(r), At: randTime(r)})
		}
		if r.Intn(2) == 0 {
			uid := r.Int63n(2) * 1000
			o.Process.UID = &uid
		}
		if r.Intn(2) == 0 {
			o.Process.Exit = &ProcExit{At: randTime(r), Code: r.Int63n(3), Signal: randString(r), Core: r.Intn(2) == 0}
		}
	case 12:
		o.Path = &PathInfo{Ops: randStrings(r), RenamedTo: randStrings(r), RenamedFrom: randStrings(r), Mode: randString(r),
			Dropped: r.Intn(2) == 0, SelfDelete: r.Intn(2) == 0, Procs: randStrings(r)}
	case 13:
		o.Netcall = &NetcallInfo{Call: randString(r), Family: randString(r), Proto: randString(r), Addr: randString(r), Port: uint16(r.Intn(3)),
			Calls: r.Int63n(9), Accepted: r.Int63n(3), Peers: randStrings(r), Dests: r.Int63n(3), Sample: randStrings(r), Procs: randStrings(r)}
		for i := 0; i < r.Intn(3); i++ {
			o.Netcall.Results = append(o.Netcall.Results, CallCount{Name: randString(r), Count: r.Int63n(9)})
		}
	case 14, 15:
		secs := []float64{0, 1.5, 0.000001, 3600}
		t := &TechniqueInfo{Technique: randString(r), Paths: randStrings(r), Targets: randStrings(r), Procs: randStrings(r),
			Longest: secs[r.Intn(len(secs))], Total: secs[r.Intn(len(secs))]}
		if r.Intn(2) == 0 {
			o.Persistence = t
		} else {
			o.Evasion = t
		}
	case 16:
		o.Trace = &TraceInfo{Format: randString(r), Lines: r.Int63n(9), Root: r.Int63n(9), Processes: r.Int63n(9), Threads: r.Int63n(9),
			Execs: r.Int63n(9), FailedExecs: r.Int63n(9), Dropped: randStrings(r), Unfinished: r.Int63n(3), Truncated: r.Intn(2) == 0,
			Garbled: r.Int63n(3), OmittedProcesses: r.Int63n(3), OmittedPaths: r.Int63n(3), OmittedNetcalls: r.Int63n(3),
			LongestSleep: float64(r.Intn(3)) / 3, TotalSleep: float64(r.Intn(3)) * 1.5}
		for i := 0; i < r.Intn(3); i++ {
			o.Trace.Calls = append(o.Trace.Calls, CallCount{Name: randString(r), Count: r.Int63n(9)})
		}
	case 17:
		o.Yara = &YaraInfo{YaraMatch: YaraMatch{Rule: randString(r), Namespace: randString(r), Tags: randStrings(r),
			Meta: map[string]string{randString(r): randString(r)}, Strings: []YaraString{{ID: "$" + randString(r), Offset: r.Int63n(1 << 40)}}},
			Target: randString(r), SHA256: randString(r), Artifact: randString(r)}
	}
	return o
}

// The hand-written encoder writes exactly what encoding/json would.
func TestObservableJSONMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	for i := 0; i < 5000; i++ {
		o := randObservable(r)
		got := o.AppendJSON([]byte("["))[1:]
		want, err := json.Marshal((*plain)(o))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d:\n got %s\nwant %s", i, got, want)
		}
		// What the records contract writes and reads back.
		line, err := Marshal(o)
		if err != nil || !bytes.Equal(line, got) {
			t.Fatalf("Marshal: %v\n%s", err, line)
		}
		var back Observable
		if err := Unmarshal(line, &back); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		again := back.AppendJSON(nil)
		if want, _ := json.Marshal((*plain)(&back)); !bytes.Equal(again, want) {
			t.Fatalf("decoded record:\n got %s\nwant %s", again, want)
		}
	}
}
