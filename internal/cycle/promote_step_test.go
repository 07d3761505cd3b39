package cycle

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// decoyRevision is what the stand-in tb-allow prints: a revision record
// that is not in the state.
const decoyRevision = "revision_01JD00000000000000000000DE"

// allowTools is a Tools whose tb-allow is the real one run with --no-apply
// (no lab is up here) and its output thrown away, then a decoy revision
// printed: what Promote returns can only come from the state.
func allowTools(t *testing.T, st *state.Store) *Tools {
	t.Helper()
	dir := t.TempDir()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if out, err := exec.Command(goBin, "build", "-o", filepath.Join(dir, "tb-allow.real"), "../../cmd/tb-allow").CombinedOutput(); err != nil {
		t.Fatalf("building tb-allow: %v: %s", err, out)
	}
	script := "#!/bin/sh\n\"$(dirname \"$0\")/tb-allow.real\" \"$@\" --no-apply >/dev/null || exit $?\n" +
		"echo '{\"kind\":\"revision\",\"id\":\"" + decoyRevision + "\",\"chain\":\"x\"}'\n"
	if err := os.WriteFile(filepath.Join(dir, "tb-allow"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return &Tools{Dir: dir, St: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// endpointSeen stores an endpoint observable of a lease's cycle: a
// periodic contact, as tb-parse writes one.
func endpointSeen(t *testing.T, ctx context.Context, st *state.Store, lease, cycle, addr string) {
	t.Helper()
	first := time.Date(2026, 11, 21, 0, 0, 10, 0, time.UTC)
	o := &records.Observable{Type: records.ObsEndpoint, Value: addr + ":443/tcp", Lease: lease, Cycle: cycle, Cycles: []string{cycle},
		FirstSeen: first, LastSeen: first.Add(5 * time.Minute), Count: 6,
		Endpoint: &records.EndpointInfo{Proto: "tcp", Addr: addr, Port: 443, Conns: 6, Established: 6}}
	records.Init(o, records.KindObservable, st.Now())
	if err := st.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	if err := st.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestPromoteFindsItsRevisionInTheState: the promote step runs the real
// tb-allow promote and finds the revision it left in force in the state,
// by the cycle's key on the revision, not in tb-allow's output: a
// promote run again for a cycle (tb-run recovering after a crash) finds
// the revision that cycle wrote though a later one is the head, one that
// changed nothing leaves the head, and a cycle without observables
// promoted nothing.
func TestPromoteFindsItsRevisionInTheState(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tools := allowTools(t, st)
	const lease = "lease_01JD00000000000000000000K1"
	c1, c2, c3, c4 := "cycle_01JD00000000000000000000C1", "cycle_01JD00000000000000000000C2", "cycle_01JD00000000000000000000C3", "cycle_01JD00000000000000000000C4"
	promote := func(cycle string) string {
		t.Helper()
		rev, err := tools.Promote(ctx, lease, cycle)
		if err != nil {
			t.Fatalf("promote %s: %v", cycle, err)
		}
		return rev
	}
	endpointSeen(t, ctx, st, lease, c1, "45.155.205.17")
	r1 := promote(c1)
	var rev records.AllowRevision
	if err := st.Get(r1, &rev); err != nil || rev.Cycle != c1 || rev.Chain != "lease:"+lease {
		t.Fatalf("cycle 1 promoted %q (%+v, %v), want its own revision of the lease's chain", r1, rev.Meta, err)
	}
	endpointSeen(t, ctx, st, lease, c2, "45.155.205.18")
	r2 := promote(c2)
	if err := st.Get(r2, &rev); err != nil || rev.Cycle != c2 || rev.Previous != r1 {
		t.Fatalf("cycle 2 promoted %q (%v), want a revision of its own after %s", r2, err, r1)
	}
	if again := promote(c1); again != r1 {
		t.Errorf("cycle 1's promote run again: %q, want the revision it wrote, %s", again, r1)
	}
	if again := promote(c2); again != r2 {
		t.Errorf("cycle 2's promote run again: %q, want %s", again, r2)
	}
	endpointSeen(t, ctx, st, lease, c4, "45.155.205.18")
	if r4 := promote(c4); r4 != r2 {
		t.Errorf("a cycle whose promote changed nothing: %q, want the head, %s", r4, r2)
	}
	if none := promote(c3); none != "" {
		t.Errorf("a cycle without observables promoted %q", none)
	}
}
