package allowlist_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// TestReadObservablesOfOneCycle: tb-allow promote --lease L --cycle C finds
// C's observables by the cycle and reads none of the lease's other cycles:
// one of them, unreadable here, would fail a read of the whole lease.
func TestReadObservablesOfOneCycle(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := state.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const lease, other = "lease_01JD0000000000000000000000", "lease_01JD0000000000000000000009"
	const cycle, earlier = "cycle_01JD0000000000000000000002", "cycle_01JD0000000000000000000001"
	at := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	store := func(lease, cycle, value string) *records.Observable {
		o := &records.Observable{Type: records.ObsEndpoint, Value: value, Lease: lease, Cycle: cycle, Cycles: []string{cycle},
			FirstSeen: at, LastSeen: at, Count: 1, Endpoint: &records.EndpointInfo{Conns: 1}}
		records.Init(o, records.KindObservable, at)
		if err := st.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		return o
	}
	mine := store(lease, cycle, "203.0.113.5:80/tcp")
	store(other, cycle, "198.51.100.9:80/tcp")
	old := store(lease, earlier, "192.0.2.7:443/tcp")
	if err := os.WriteFile(filepath.Join(dir, "records", records.KindObservable, old.ID+".json"), []byte("{not json"), 0o640); err != nil {
		t.Fatal(err)
	}

	var batch fault.Batch
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	groups, order, err := allowlist.ReadObservables(&allowlist.Book{St: st}, allowlist.Input{Lease: lease, Cycle: cycle}, log, t.Errorf, &batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != 1 || order[0] != lease || len(groups[lease]) != 1 || groups[lease][0].ID != mine.ID {
		t.Fatalf("leases %q, observables %+v", order, groups[lease])
	}
	// Without --cycle the whole lease is read, and the damage is found.
	if _, _, err := allowlist.ReadObservables(&allowlist.Book{St: st}, allowlist.Input{Lease: lease}, log, t.Errorf, &batch); fault.Code(err) != fault.ExitDataErr {
		t.Fatalf("reading the whole lease: %v (exit %d)", err, fault.Code(err))
	}
}
