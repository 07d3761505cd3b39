package parsejob

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode/packet"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

const rotLease = "lease_01JD0000000000000000000000"

var (
	rotClient = netip.AddrPortFrom(netip.MustParseAddr("10.13.37.5"), 50123)
	rotServer = netip.AddrPortFrom(netip.MustParseAddr("203.0.113.66"), 7777) // not a likely server port
)

// rotatedFiles writes one connection split across three rotated files:
// the handshake and a request in the first, more of it in the second, and
// in the third the server's answer first, the rest and the close.
func rotatedFiles(t *testing.T, dir string) []string {
	t.Helper()
	c, s := rotClient, rotServer
	return []string{
		writeCapture(t, dir, "capture-1.pcap", 0, func(g *pcapgen.Gen) {
			g.Dial(c, s, 100, 900).Send([]byte("first half;"))
		}),
		writeCapture(t, dir, "capture-2.pcap", 15*time.Second, func(g *pcapgen.Gen) {
			g.TCP(c, s, 112, 901, pcapgen.PSH|pcapgen.ACK, []byte("middle"))
		}),
		writeCapture(t, dir, "capture-3.pcap", 30*time.Second, func(g *pcapgen.Gen) {
			g.TCP(s, c, 901, 118, pcapgen.PSH|pcapgen.ACK, []byte("the answer"))
			g.TCP(c, s, 118, 911, pcapgen.PSH|pcapgen.ACK, []byte("second half"))
			g.TCP(c, s, 129, 911, pcapgen.FIN|pcapgen.ACK, nil)
			g.TCP(s, c, 911, 130, pcapgen.FIN|pcapgen.ACK, nil)
			g.TCP(c, s, 130, 912, pcapgen.ACK, nil)
		}),
	}
}

func writeCapture(t *testing.T, dir, name string, at time.Duration, build func(g *pcapgen.Gen)) string {
	t.Helper()
	var buf bytes.Buffer
	g, err := pcapgen.New(&buf, pcapgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g.T = pcapgen.Start.Add(at)
	build(g)
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// register stores the files as the pcap artifacts tb-capture registers
// for a capture of the lease, and returns their records.
func register(t *testing.T, root string, reasons []string, paths ...string) []*records.Artifact {
	t.Helper()
	ctx := context.Background()
	st, err := state.Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	capRec := &records.Capture{Lease: rotLease, Iface: "tap0", State: "running"}
	records.Init(capRec, records.KindCapture, st.Now())
	var arts []*records.Artifact
	for i, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		blob, err := st.PutBlob(ctx, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		a := &records.Artifact{Cycle: "cycle_01JD000000000000000000000" + string(rune('A'+i)), Lease: rotLease, Capture: capRec.ID,
			Type: "pcap", URI: blob.URI(), SHA256: blob.SHA256, Size: blob.Size, ParserStatus: "pending", Reason: reasons[i]}
		records.Init(a, records.KindArtifact, st.Now())
		if err := st.Create(ctx, a); err != nil {
			t.Fatal(err)
		}
		capRec.Artifacts = append(capRec.Artifacts, a.ID)
		arts = append(arts, a)
	}
	if err := st.Create(ctx, capRec); err != nil {
		t.Fatal(err)
	}
	return arts
}

func parseArtifacts(t *testing.T, root string, arts ...*records.Artifact) {
	t.Helper()
	var in bytes.Buffer
	for _, a := range arts {
		b, err := records.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		in.Write(append(b, '\n'))
	}
	var out, errb bytes.Buffer
	if err := tbParse(root, &in, Request{FromStdin: true, Merge: true}, &out, &errb); err != nil {
		t.Fatalf("tb-parse: %v: %s", err, &errb)
	}
}

// conn is a flow log line, as "tb-parse flows" prints it.
type conn struct {
	OrigH     string `json:"id.orig_h"`
	OrigP     uint16 `json:"id.orig_p"`
	RespH     string `json:"id.resp_h"`
	RespP     uint16 `json:"id.resp_p"`
	ConnState string `json:"conn_state"`
	History   string `json:"history"`
	OrigBytes int64  `json:"orig_bytes"`
	RespBytes int64  `json:"resp_bytes"`
	OrigPkts  int64  `json:"orig_pkts"`
	RespPkts  int64  `json:"resp_pkts"`
}

func (c conn) roles() string {
	return netip.AddrPortFrom(netip.MustParseAddr(c.OrigH), c.OrigP).String() + ">" +
		netip.AddrPortFrom(netip.MustParseAddr(c.RespH), c.RespP).String()
}

// flowsOf reads the connections of the flow logs parsed from inputs (all
// of the lease's when none).
func flowsOf(t *testing.T, root string, inputs ...string) []conn {
	t.Helper()
	var out, errb bytes.Buffer
	if err := tbFlows(root, FlowsRequest{Query: flowlog.Query{Lease: rotLease, Artifacts: inputs}}, &out, &errb); err != nil {
		t.Fatalf("flows: %v: %s", err, &errb)
	}
	var cs []conn
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if line == "" {
			continue
		}
		var c conn
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	return cs
}

func onlyConn(t *testing.T, cs []conn) conn {
	t.Helper()
	if len(cs) != 1 {
		t.Fatalf("%d connections, want 1: %+v", len(cs), cs)
	}
	return cs[0]
}

var wantRoles = rotClient.String() + ">" + rotServer.String()

// The last file's record of the connection: continued, it has the roles
// and state the first file established, and counts its own share, though
// its first packet is the server's.
func checkContinued(t *testing.T, c conn) {
	t.Helper()
	if c.roles() != wantRoles || c.ConnState != "SF" || strings.Contains(c.History, "^") {
		t.Errorf("roles %s, state %s, history %q: want %s, SF, no flip", c.roles(), c.ConnState, c.History, wantRoles)
	}
	if c.OrigBytes != 11 || c.RespBytes != 10 || c.OrigPkts != 3 || c.RespPkts != 2 {
		t.Errorf("%d/%d bytes in %d/%d packets, want 11/10 in 3/2", c.OrigBytes, c.RespBytes, c.OrigPkts, c.RespPkts)
	}
}

func notContinued(t *testing.T, c conn, why string) {
	t.Helper()
	if c.roles() == wantRoles {
		t.Errorf("%s: the connection was continued (%s, %s)", why, c.roles(), c.ConnState)
	}
}

// Rotated files of one capture, each parsed by its own run as tb-capture
// hands them over, continue each other's connections; parsing an older
// file again does not break the chain. The state keeps what the capture
// left open in one file, gone once its last file (closed by the capture's
// stop) is parsed. A file whose predecessor was not parsed starts afresh.
func TestRotatedCaptureKeepsRolesAcrossRuns(t *testing.T) {
	dir := t.TempDir()
	files := rotatedFiles(t, dir)
	root := filepath.Join(dir, "state")
	arts := register(t, root, []string{"rotate", "rotate", "stop"}, files...)
	carryDir := filepath.Join(root, "parse", "carry")

	parseArtifacts(t, root, arts[0])
	if kept, _ := os.ReadDir(carryDir); len(kept) != 1 {
		t.Fatalf("after the first file, the state keeps %d carries, want 1", len(kept))
	}
	c1 := onlyConn(t, flowsOf(t, root, arts[0].ID))
	if c1.roles() != wantRoles || c1.ConnState != "S1" || c1.OrigBytes != 11 {
		t.Errorf("first file: %+v", c1)
	}
	parseArtifacts(t, root, arts[1])
	parseArtifacts(t, root, arts[0]) // again
	parseArtifacts(t, root, arts[2])
	checkContinued(t, onlyConn(t, flowsOf(t, root, arts[2].ID)))
	if kept, _ := os.ReadDir(carryDir); len(kept) != 0 {
		t.Errorf("after the capture's last file, the state keeps %d carries", len(kept))
	}

	root = filepath.Join(dir, "skipped")
	arts = register(t, root, []string{"rotate", "rotate", "stop"}, files...)
	parseArtifacts(t, root, arts[0])
	parseArtifacts(t, root, arts[2])
	notContinued(t, onlyConn(t, flowsOf(t, root, arts[2].ID)), "the second file not parsed")

	root = filepath.Join(dir, "alone")
	parseArtifacts(t, root, register(t, root, []string{"stop"}, files[2])...)
	notContinued(t, onlyConn(t, flowsOf(t, root)), "the last file alone")

	// A capture that ended after its first file: its connection is still
	// open, and nothing is kept for a file that will not come.
	for _, reason := range []string{"stop", "low-space", "disk-full", "error", "recovered"} {
		root = filepath.Join(dir, "ended-"+reason)
		parseArtifacts(t, root, register(t, root, []string{reason}, files[0])...)
		if kept, _ := os.ReadDir(filepath.Join(root, "parse", "carry")); len(kept) != 0 {
			t.Errorf("a capture ended by %s left %d carries", reason, len(kept))
		}
	}
}

// Within one run, the rotated files of a capture chain in the capture's
// order, and paths given for one lease chain in the order given, unless a
// file starts before the previous one ended.
func TestRotatedFilesInOneRun(t *testing.T) {
	dir := t.TempDir()
	files := rotatedFiles(t, dir)

	root := filepath.Join(dir, "artifacts")
	arts := register(t, root, []string{"rotate", "rotate", "rotate"}, files...)
	parseArtifacts(t, root, arts...)
	checkContinued(t, onlyConn(t, flowsOf(t, root, arts[2].ID)))
	root = filepath.Join(dir, "skipped")
	arts = register(t, root, []string{"rotate", "rotate", "rotate"}, files...)
	parseArtifacts(t, root, arts[0], arts[2])
	notContinued(t, onlyConn(t, flowsOf(t, root, arts[2].ID)), "the second file not in the run")
	// A file without packets (a quiet rotation) passes the connections on.
	empty := writeCapture(t, dir, "empty.pcap", 0, func(*pcapgen.Gen) {})
	root = filepath.Join(dir, "quiet")
	arts = register(t, root, []string{"rotate", "rotate", "rotate"}, files[0], empty, files[2])
	parseArtifacts(t, root, arts...)
	if c := onlyConn(t, flowsOf(t, root, arts[2].ID)); c.roles() != wantRoles || c.ConnState != "SF" {
		t.Errorf("after a quiet file: %s %s", c.roles(), c.ConnState)
	}

	parsePaths := func(root string, paths ...string) []conn {
		var out, errb bytes.Buffer
		if err := tbParse(root, strings.NewReader(""), Request{Inputs: paths, Lease: rotLease}, &out, &errb); err != nil {
			t.Fatalf("tb-parse: %v: %s", err, &errb)
		}
		return flowsOf(t, root)
	}
	root = filepath.Join(dir, "paths")
	cs := parsePaths(root, files...)
	if len(cs) != 3 {
		t.Fatalf("%d connections, want 3: %+v", len(cs), cs)
	}
	checkContinued(t, cs[2])

	early := writeCapture(t, dir, "early.pcap", 0, func(g *pcapgen.Gen) {
		g.TCP(rotServer, rotClient, 901, 118, pcapgen.PSH|pcapgen.ACK, []byte("the answer"))
	})
	root = filepath.Join(dir, "overlap")
	cs = parsePaths(root, files[1], early)
	notContinued(t, cs[0], "a file from before the previous one") // the flow logs come by time
	if kept, _ := os.ReadDir(filepath.Join(root, "parse", "carry")); len(kept) != 0 {
		t.Errorf("paths left %d carries in the state", len(kept))
	}
}

// A run holds what maxCarried streams left open: inputs of more leases
// than that, interleaved, continue only the most recent ones' connections.
func TestCarriedStreamsInMemoryAreBounded(t *testing.T) {
	dir := t.TempDir()
	files := rotatedFiles(t, dir)
	root := filepath.Join(dir, "state")
	st, err := state.Open(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	art := func(lease, path string) *records.Artifact {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		blob, err := st.PutBlob(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		a := &records.Artifact{Lease: lease, Type: "pcap", URI: blob.URI(), SHA256: blob.SHA256}
		records.Init(a, records.KindArtifact, st.Now())
		return a
	}
	lease := func(i int) string { return rotLease[:len(rotLease)-1] + string(rune('A'+i)) }
	var in []*records.Artifact
	for i := range maxCarried + 1 {
		in = append(in, art(lease(i), files[0]))
	}
	last, first := art(lease(maxCarried), files[2]), art(lease(0), files[2])
	st.Close()
	parseArtifacts(t, root, append(in, last, first)...)
	for _, tc := range []struct {
		a    *records.Artifact
		cont bool
	}{{last, true}, {first, false}} {
		var out, errb bytes.Buffer
		if err := tbFlows(root, FlowsRequest{Query: flowlog.Query{Lease: tc.a.Lease, Artifacts: []string{tc.a.ID}}}, &out, &errb); err != nil {
			t.Fatalf("flows: %v: %s", err, &errb)
		}
		var c conn
		if err := json.Unmarshal(out.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		if (c.roles() == wantRoles) != tc.cont {
			t.Errorf("lease %s: roles %s, continued should be %v", tc.a.Lease, c.roles(), tc.cont)
		}
	}
}

// What a file leaves open for the next is bounded: packet.DefaultMaxCarry
// connections at most.
func TestCarryIsBoundedInTheState(t *testing.T) {
	dir := t.TempDir()
	path := writeCapture(t, dir, "many.pcap", 0, func(g *pcapgen.Gen) {
		g.Step = 10 * time.Microsecond
		for i := range packet.DefaultMaxCarry + 100 {
			c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 13, byte(i >> 8), byte(i)}), 40000)
			g.Dial(c, rotServer, uint32(i), 7)
		}
	})
	root := filepath.Join(dir, "state")
	arts := register(t, root, []string{"rotate"}, path)
	parseArtifacts(t, root, arts...)
	st, err := state.Open(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, err := readCarry(st, streamOf(input{lease: arts[0].Lease, capture: arts[0].Capture, typ: "pcap"}))
	if err != nil || c == nil {
		t.Fatalf("carry %v, err %v", c, err)
	}
	if len(c.Conns) != packet.DefaultMaxCarry {
		t.Errorf("%d connections kept for the next file, want %d", len(c.Conns), packet.DefaultMaxCarry)
	}
	if fi, err := os.Stat(carryPath(st, streamOf(input{lease: arts[0].Lease, capture: arts[0].Capture, typ: "pcap"}))); err == nil {
		t.Logf("%d connections kept in %d bytes", len(c.Conns), fi.Size())
	}
}
