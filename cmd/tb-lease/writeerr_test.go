package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// TestStdoutWriteErrorFails runs tb-lease list and expire with a lease to
// print and stdout on a full disk (/dev/full): each must exit 1 naming the
// failed write, never 0 with its output lost (a pipe's reader gone, a
// disk filled). Nothing here boots a guest.
func TestStdoutWriteErrorFails(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := state.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	l := &records.SandboxLease{State: records.LeaseBusy, ExpiresAt: &past}
	records.Init(l, records.KindLease, past)
	if err := st.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	st.Close()
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	for _, args := range [][]string{{"list"}, {"expire"}} {
		var stdout bytes.Buffer
		cmd := exec.Command("tb-lease", args...)
		cmd.Env = append(os.Environ(), "TB_STATE="+dir)
		cmd.Stdout = &stdout
		if err := cmd.Run(); err != nil || !strings.Contains(stdout.String(), l.ID) {
			t.Fatalf("tb-lease %s: %v, printed %q: want the lease %s", args[0], err, stdout.String(), l.ID)
		}
		var stderr bytes.Buffer
		cmd = exec.Command("tb-lease", args...)
		cmd.Env = append(os.Environ(), "TB_STATE="+dir)
		cmd.Stdout, cmd.Stderr = full, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "no space left on device") {
			t.Errorf("tb-lease %s > /dev/full: %v, stderr %q: want exit 1 naming the failed write", args[0], err, stderr.String())
		}
	}
}
