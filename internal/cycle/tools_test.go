package cycle

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// TestToolsKeepTheDatabaseURLOffTheCommandLine: a tool tb-run starts for a
// fleet gets the database URL, password and all, in its environment, where
// only its user reads it, and not in /proc/PID/cmdline, where every user
// does.
func TestToolsKeepTheDatabaseURLOffTheCommandLine(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Start(t, pgtest.WithoutFsync()).NewDatabase(t)
	st, err := state.Open(ctx, t.TempDir(), state.WithShared(url))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// A stand-in tool that prints its own command line as the kernel
	// shows it to everyone, then the TB_STATE it was given.
	dir := t.TempDir()
	script := "#!/bin/sh\ntr '\\0' ' ' </proc/$$/cmdline\nprintf '\\n%s\\n' \"$TB_STATE\"\n"
	if err := os.WriteFile(filepath.Join(dir, "tb-capture"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	tools := &Tools{Dir: dir, St: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	out, err := tools.output(ctx, nil, "tb-capture", "status")
	if err != nil {
		t.Fatal(err)
	}
	cmdline, env, _ := strings.Cut(string(out), "\n")
	if strings.Contains(cmdline, url) || strings.Contains(cmdline, "postgres") || !strings.Contains(cmdline, "--local "+st.Root()) {
		t.Fatalf("command line: %s", cmdline)
	}
	if strings.TrimSpace(env) != url {
		t.Fatalf("TB_STATE in the tool's environment: %q, want %q", env, url)
	}
}
