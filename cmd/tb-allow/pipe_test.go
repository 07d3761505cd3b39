package main

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

// TestPipeFromTbParse runs the pipe README, tb-allow(1) and talkbox(7)
// show, "tb-parse --lease L capture.pcap | tb-allow promote", with the real
// tools and the state: tb-parse prints its flow log's artifact record
// before the observables, and the pipe must still exit 0 under pipefail.
func TestPipeFromTbParse(t *testing.T) {
	dir := t.TempDir()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, tool := range []string{"tb-parse", "tb-allow"} {
		if out, err := exec.Command(goBin, "build", "-o", filepath.Join(dir, tool), "../"+tool).CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", tool, err, out)
		}
	}
	guest, resolver, c2 := netip.MustParseAddr("10.13.37.5"), netip.MustParseAddr("10.13.37.1"), netip.MustParseAddr("203.0.113.7")
	var buf bytes.Buffer
	g, err := pcapgen.New(&buf, pcapgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g.DNSOverUDP(netip.AddrPortFrom(guest, 40000), netip.AddrPortFrom(resolver, 53),
		pcapgen.DNSQuery(7, "c2.example", layers.DNSTypeA),
		pcapgen.DNSResponse(7, "c2.example", layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A("c2.example", c2, 300)}))
	for i := range 6 {
		c := g.Dial(netip.AddrPortFrom(guest, uint16(41000+i)), netip.AddrPortFrom(c2, 80), uint32(i*1000), 77)
		c.Send(pcapgen.HTTPGet("c2.example", "/gate.php?bot=1", "tb-test-agent"))
		c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("sleep 60")))
		c.Close()
		g.T = g.T.Add(60e9)
	}
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
	pcap := filepath.Join(dir, "capture.pcap")
	policy := filepath.Join(dir, "policy.json")
	for p, data := range map[string][]byte{pcap: buf.Bytes(), policy: []byte(`{"documentation": true}` + "\n")} {
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "-o", "pipefail", "-c", `tb-parse --lease lease_01JD0000000000000000000001 "$1" | tb-allow promote --no-apply`, "pipe", pcap)
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "TB_STATE="+filepath.Join(dir, "state"), "TB_ALLOW_POLICY="+policy)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the pipe: %v\nstderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), `"kind":"revision"`) || !strings.Contains(stdout.String(), "203.0.113.7:80/tcp") {
		t.Fatalf("the pipe wrote no revision with the C2:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), "passed over records it does not use") {
		t.Errorf("tb-allow did not say it passed over tb-parse's artifact record:\n%s", stderr.String())
	}
}
