package plan

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/elftest"
)

// BenchmarkPlanFiles plans b.N small ELF files end to end (digest, triage,
// blob, sample and plan records). Set TB_BENCH_STATE to put the state on a
// particular filesystem (e.g. /dev/shm to leave file creation out).
func BenchmarkPlanFiles(b *testing.B) {
	dir := b.TempDir()
	for i := 0; i < b.N; i++ {
		elf := elftest.Build(elftest.Spec{Machine: 40, Bits: 32, Flags: 0x05000400, Interp: "/lib/ld-linux-armhf.so.3"})
		elf = append(elf, bytes.Repeat([]byte(fmt.Sprint(i)), 1024)...)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%07d", i)), elf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	stateDir := b.TempDir()
	if base := os.Getenv("TB_BENCH_STATE"); base != "" {
		var err error
		if stateDir, err = os.MkdirTemp(base, "bench"); err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(stateDir)
	}
	b.ResetTimer()
	if err := runRequest(context.Background(), stateDir, Request{Inputs: []string{dir}, Profile: "default"}, io.Discard, io.Discard); err != nil {
		b.Fatal(err)
	}
}
