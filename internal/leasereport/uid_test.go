package leasereport_test

import (
	"context"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/endpoint"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/leasereport"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// The report links what it shows to the connections of the flow logs: a
// C2 names its first check-ins by uid, each a connection to that C2 in the
// lease's flow logs, among them the connection its endpoint observable's
// provenance names.
func TestReportNamesTheConnections(t *testing.T) {
	st, b := twoCycles(t)
	ctx := context.Background()
	r := collect(t, st, leasereport.Target{Lease: b.Lease})
	logs, err := flowlog.Logs(st, flowlog.Query{Lease: b.Lease})
	if err != nil {
		t.Fatal(err)
	}
	respOf := map[string]string{} // uid -> endpoint
	q := flowlog.Query{Lease: b.Lease}
	err = q.Each(ctx, st, logs, func(_ *records.Artifact, rec *flowlog.Record) error {
		respOf[string(rec.UID)] = string(endpoint.Append(nil, rec.RespH, rec.RespP, rec.Proto))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, c2 := range r.C2s {
		if c2.CheckIns == 0 {
			continue
		}
		if len(c2.UIDs) == 0 || len(c2.UIDs) > 8 {
			t.Fatalf("C2 %s, %d check-ins: uids %q", c2.Value, c2.CheckIns, c2.UIDs)
		}
		for _, u := range c2.UIDs {
			if respOf[u] != c2.Value {
				t.Errorf("C2 %s names %s, a connection to %q", c2.Value, u, respOf[u])
			}
		}
		eps, err := state.FindBy(st, records.KindObservable, records.KeyLease, b.Lease, func(o *records.Observable) bool {
			return o.Type == records.ObsEndpoint && o.Value == c2.Value
		})
		if err != nil || len(eps) == 0 {
			t.Fatalf("%s: %d endpoint observables, %v", c2.Value, len(eps), err)
		}
		for _, p := range eps[0].Provenance {
			if respOf[p.UID] != c2.Value {
				t.Errorf("%s's provenance names %q, a connection to %q", c2.Value, p.UID, respOf[p.UID])
			}
		}
		// The first sighting is the first check-in.
		if first := eps[0].Provenance[0].UID; c2.UIDs[0] != first {
			t.Errorf("%s: first check-in %s, the endpoint first seen on %s", c2.Value, c2.UIDs[0], first)
		}
		named++
	}
	if named == 0 {
		t.Fatalf("no C2 with check-ins in the flow logs: %+v", r.C2s)
	}
}
