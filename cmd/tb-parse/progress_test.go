package main

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/progress/ptytest"
)

// TestProgressOnTerminal runs tb-parse on a capture twice: with stderr on a
// terminal it draws the input's bar (name, bytes, percentage); with stderr
// on a pipe it draws nothing, and stdout is records either way.
func TestProgressOnTerminal(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	g, err := pcapgen.New(&buf, pcapgen.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		g.UDP(netip.AddrPortFrom(lab, 40000), netip.AddrPortFrom(other, uint16(1000+i)), make([]byte, 200))
	}
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
	pcap := filepath.Join(dir, "scan.pcap")
	if err := os.WriteFile(pcap, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	tool := filepath.Join(dir, "tb-parse")
	if err := os.Symlink(os.Args[0], tool); err != nil {
		t.Fatal(err)
	}
	run := func(stderr *os.File) string {
		var out bytes.Buffer
		cmd := exec.Command(tool, "--no-store", "--log-level", "error", pcap)
		cmd.Stdout, cmd.Stderr = &out, stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("tb-parse: %v", err)
		}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if !strings.Contains(line, `"kind":`) {
				t.Fatalf("stdout line without a kind: %q", line)
			}
		}
		return out.String()
	}

	ptm, pts := ptytest.Open(t)
	defer ptm.Close()
	var screen bytes.Buffer
	read := make(chan struct{})
	go func() {
		screen.ReadFrom(ptm) // ends with EIO once the last writer is gone
		close(read)
	}()
	run(pts)
	pts.Close()
	<-read
	for _, want := range []string{"scan.pcap", "KiB / ", "100 %"} {
		if !strings.Contains(screen.String(), want) {
			t.Errorf("terminal shows no %q: %q", want, screen.String())
		}
	}

	pipe := filepath.Join(dir, "stderr")
	f, err := os.Create(pipe)
	if err != nil {
		t.Fatal(err)
	}
	run(f)
	f.Close()
	if b, _ := os.ReadFile(pipe); len(b) != 0 {
		t.Errorf("stderr to a file holds %q", b)
	}
}
