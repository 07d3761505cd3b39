package cycle

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
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

// TestToolsDoNotDecodeOutputTheyDoNotUse: Keep, Release and the allow
// set's apply send the tools' stdout nowhere, unread: a stand-in tool whose
// output no record reader takes (one line past records.MaxLine) changes
// nothing.
func TestToolsDoNotDecodeOutputTheyDoNotUse(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dir := t.TempDir()
	script := fmt.Sprintf("#!/bin/sh\nhead -c %d /dev/zero | tr '\\0' x\n", records.MaxLine+1)
	for _, name := range []string{"tb-lease", "tb-allow"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tools := &Tools{Dir: dir, St: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	lease := records.NewID("lease", time.Now())
	if err := tools.Keep(ctx, lease); err != nil {
		t.Errorf("Keep: %v", err)
	}
	if err := tools.Release(ctx, lease); err != nil {
		t.Errorf("Release: %v", err)
	}
	// The lease's capture is running: EnsureCapture only applies the set.
	c := &records.Capture{Lease: lease, State: "running"}
	records.Init(c, records.KindCapture, time.Now())
	if err := st.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	if id, err := tools.EnsureCapture(ctx, lease); err != nil || id != c.ID {
		t.Errorf("EnsureCapture: %q, %v; want %s", id, err, c.ID)
	}
}
