package cycle

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// TestLowSpaceKeepsTheExecution: when the blob store refuses the sample's
// output for low space (a sample can write gigabytes to stdout), the
// cycle fails for it, but what the sample did is recorded: the execution
// record, with its exit code, sizes and tails, and which outputs were not
// stored.
func TestLowSpaceKeepsTheExecution(t *testing.T) {
	e := setup(t, "out hello from the sample\nerr a warning\nexit 3")
	ctx := context.Background()
	free, err := diskspace.Check(e.st.Root())
	if err != nil {
		t.Fatal(err)
	}
	// The same state, opened as tb-run opens it, on a disk whose free space
	// is below the threshold: every blob write is refused.
	guarded, err := state.Open(ctx, e.st.Root(), state.WithMinFree(diskspace.Threshold{Bytes: free.Avail + 1<<40}))
	if err != nil {
		t.Fatal(err)
	}
	e.r.St = guarded
	c, err := e.r.Create(ctx, Request{Plan: e.plan, Lease: e.lease})
	if err != nil {
		t.Fatal(err)
	}
	c, _ = e.r.Drive(ctx, c.ID)
	if c.State != records.CycleFailed || !strings.Contains(c.Error, "not stored") || c.Execution == "" {
		t.Fatalf("cycle %s (%q), execution %q", c.State, c.Error, c.Execution)
	}
	ex := get(t, guarded, c.Execution, &records.ExecutionSnapshot{})
	if ex.ExitCode == nil || *ex.ExitCode != 3 || ex.Stdout != "" || ex.StdoutTail != "hello from the sample\n" || ex.StderrTail != "a warning\n" ||
		!slices.Equal(ex.NotStored, []string{ArtifactStdout, ArtifactStderr}) {
		t.Fatalf("execution %+v", ex)
	}
}
