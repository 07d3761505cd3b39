package plan

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
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
	env := &cli.Env{Ctx: context.Background(), Tool: "tb-plan", Stdin: bytes.NewReader(nil), Stdout: io.Discard, Stderr: io.Discard,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), G: &cli.Globals{State: stateDir}}
	b.ResetTimer()
	if err := Run(env, Request{Inputs: []string{dir}, Profile: "default"}); err != nil {
		b.Fatal(err)
	}
}
