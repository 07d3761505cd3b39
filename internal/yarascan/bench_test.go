package yarascan

import (
	"context"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// corpus writes n files of size bytes each (random, one in eight holding
// the beacon's User-Agent) and returns their directory: the shape of a
// cycle's drops and of a batch of samples.
func corpus(b *testing.B, n, size int) string {
	b.Helper()
	dir := b.TempDir()
	r := rand.New(rand.NewSource(1))
	buf := make([]byte, size)
	for i := range n {
		r.Read(buf)
		if i%8 == 0 {
			copy(buf[size/2:], "User-Agent: tb-beacon/1")
		}
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// BenchmarkScanFiles is yarascan's Scan over each of 64 files of 1 MiB
// with the beacon rules (testdata/yara at the repository root), one yara
// process per file as tb-plan and tb-run scan; BenchmarkYaraItself is
// the yara program over the same files in one process (-r), the peer.
// Run: go test -run '^$' -bench 'ScanFiles|YaraItself' ./internal/yarascan/
func BenchmarkScanFiles(b *testing.B) {
	dir := corpus(b, 64, 1<<20)
	rules, err := Compile(context.Background(), []string{"../../testdata/yara"})
	if err != nil {
		b.Fatal(err)
	}
	defer rules.Close()
	b.SetBytes(64 << 20)
	for b.Loop() {
		matched := 0
		for i := range 64 {
			ms, err := rules.Scan(context.Background(), filepath.Join(dir, strconv.Itoa(i)))
			if err != nil {
				b.Fatal(err)
			}
			matched += len(ms)
		}
		if matched != 8 {
			b.Fatalf("%d matches", matched)
		}
	}
}

func BenchmarkYaraItself(b *testing.B) {
	dir := corpus(b, 64, 1<<20)
	b.SetBytes(64 << 20)
	for b.Loop() {
		if out, err := exec.Command("yara", "-r", "-w", "../../testdata/yara/talkbox-beacon.yar", dir).CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
	}
}
