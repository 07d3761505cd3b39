package leasereport_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/leasereport"
	"github.com/talkbox-sandbox/talkbox/internal/leasereport/reporttest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// twoCycles is a state holding reporttest.TwoCycles: the records of two
// cycles of a lease, made through the state store by the code that makes
// them in production (tb-parse's parse, tb-allow's classify, promote,
// approve and expire).
func twoCycles(t *testing.T) (*state.Store, *reporttest.Built) {
	t.Helper()
	ctx := context.Background()
	st, clk, err := reporttest.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, err := reporttest.Build(ctx, st, clk, reporttest.TwoCycles())
	if err != nil {
		t.Fatal(err)
	}
	return st, b
}

func collect(t *testing.T, st *state.Store, target leasereport.Target) *leasereport.Report {
	t.Helper()
	r, err := leasereport.Collect(context.Background(), st, target)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// endpointStarts are the connection starts tb-parse kept for an endpoint
// of the lease: every one of them, in a lease this short.
func endpointStarts(t *testing.T, st *state.Store, lease, value string) []time.Time {
	t.Helper()
	obs, err := state.FindBy(st, records.KindObservable, records.KeyLease, lease, func(o *records.Observable) bool {
		return o.Type == records.ObsEndpoint && o.Value == value
	})
	if err != nil || len(obs) != 1 {
		t.Fatalf("endpoint observable %s: %d, %v", value, len(obs), err)
	}
	if int64(len(obs[0].Endpoint.Starts)) != obs[0].Endpoint.Conns {
		t.Fatalf("%s: %d starts kept of %d connections", value, len(obs[0].Endpoint.Starts), obs[0].Endpoint.Conns)
	}
	return obs[0].Endpoint.Starts
}

func countAfter(ts []time.Time, at time.Time) (after int64) {
	for _, s := range ts {
		if s.After(at) {
			after++
		}
	}
	return after
}

func TestCollectLease(t *testing.T) {
	st, b := twoCycles(t)
	r := collect(t, st, leasereport.Target{Lease: b.Lease})
	if r.Target != leasereport.TargetLease || r.ID != b.Lease || r.Sample != b.SampleSHA256 || len(r.Notes) > 0 {
		t.Fatalf("target %s %s sample %s notes %q", r.Target, r.ID, r.Sample, r.Notes)
	}
	if len(r.Cycles) != 2 || r.Cycles[0].ID != b.Cycles[0] || r.Cycles[1].ID != b.Cycles[1] ||
		r.Cycles[0].State != records.CycleCompleted || r.Cycles[0].Revision != "" || r.Cycles[1].Revision != b.Revisions[1] {
		t.Fatalf("cycles %+v", r.Cycles)
	}
	if len(r.Leases) != 1 || r.Leases[0].Health != records.HealthHealthy || r.Leases[0].State != records.LeaseIdle {
		t.Fatalf("leases %+v", r.Leases)
	}
	// What tb-run's own analysis (cycle.Analyse) says of each cycle: the
	// first leaves the paste site pending approval; the second confirms the
	// C2 (not a new candidate) and its trace shows persistence, a
	// self-delete, dropped files and a listener.
	for i, want := range []struct{ class, reasons []string }{
		{[]string{"running", "network-active", "c2-candidate", "scanning"},
			[]string{"allow-list entries wait for approval: domain drop.pastebin.com, endpoint 203.0.113.50:443/tcp", "scan traffic refused"}},
		{[]string{"running", "network-active", "scanning", "persistence", "evasion", "dropper", "backdoor"},
			[]string{"persistence or tampering in the guest: cron /etc/crontab",
				"confirmed endpoint 198.51.100.18:80/tcp: its far side answered as a C2 while let through on probation", "scan traffic refused"}},
	} {
		c := r.Cycles[i]
		if !slices.Equal(c.Classification, want.class) || c.Recommendation != records.RecommendEscalate || !slices.Equal(c.Reasons, want.reasons) {
			t.Errorf("cycle %d: %q, %s: %q", i+1, c.Classification, c.Recommendation, c.Reasons)
		}
	}
	// The span runs from the lease's start to its last revision, the
	// expiry after the last cycle.
	if !r.From.Equal(time.Date(2026, 11, 20, 8, 57, 0, 0, time.UTC)) || !r.To.Equal(time.Date(2026, 11, 20, 12, 35, 30, 0, time.UTC)) {
		t.Errorf("span %s to %s", r.From, r.To)
	}

	var causes []string
	for _, rv := range r.Revisions {
		causes = append(causes, rv.Cause)
	}
	if !slices.Equal(causes, []string{"promote", "approve", "promote", "expire"}) || r.Revisions[0].ID != b.Revisions[0] {
		t.Fatalf("revisions %q", causes)
	}
	promote, approve := r.Revisions[0].At, r.Revisions[1].At

	events := map[string]leasereport.AllowEvent{}
	for _, e := range r.Events {
		events[e.Action+" "+e.Key] = e
	}
	// Both C2s go on probation after the first cycle (everything it saw of
	// them was the sample's side); the C2 answered in the second, while
	// let through, and is promoted; the fallback, not heard from while on
	// probation, is revoked; the paste site, approved and not fetched
	// again, expires.
	for _, want := range []string{
		"promoted domain c2.example", "probation endpoint 198.51.100.18:80/tcp", "probation endpoint 198.51.100.77:8080/tcp",
		"promoted endpoint 198.51.100.18:80/tcp", "revoked endpoint 198.51.100.77:8080/tcp",
		"pending-approval domain drop.pastebin.com", "pending-approval endpoint 203.0.113.50:443/tcp",
		"approved endpoint 203.0.113.50:443/tcp", "refused udp/53", "refused scan of tcp/23", "refused scan of tcp/2323",
		"expired endpoint 203.0.113.50:443/tcp",
	} {
		if _, ok := events[want]; !ok {
			t.Errorf("no event %q", want)
		}
	}
	if len(events) != len(r.Events) {
		t.Errorf("%d events, %d distinct", len(r.Events), len(events))
	}
	if e := events["promoted endpoint 198.51.100.18:80/tcp"]; e.Class != "c2" || !strings.Contains(e.Why, "periodic every") || e.Entry == "" {
		t.Errorf("promoted C2: %+v", e)
	}
	if e := events["approved endpoint 203.0.113.50:443/tcp"]; e.Note != reporttest.TwoCycles().Note || e.From != records.StatusPending || e.Cause != "approve" {
		t.Errorf("approved: %+v", e)
	}
	// The scan refused after each cycle is one event, repeated.
	if e := events["refused scan of tcp/23"]; e.Repeats != 1 || e.LastRevision != r.Revisions[2].ID || e.Class != "scan" || len(e.Examples) == 0 {
		t.Errorf("refused scan: %+v", e)
	}
	if e := events["promoted endpoint 198.51.100.18:80/tcp"]; e.From != records.StatusProbation || e.Revision != r.Revisions[2].ID {
		t.Errorf("promoted off probation: %+v", e)
	}
	if e := events["revoked endpoint 198.51.100.77:8080/tcp"]; !strings.Contains(e.Why, "probation") || e.Revision != r.Revisions[2].ID {
		t.Errorf("revoked on probation: %+v", e)
	}
	if e := events["expired endpoint 203.0.113.50:443/tcp"]; e.Why != "its time was up at 2026-11-20T12:29:30Z" {
		t.Errorf("expired: %+v", e)
	}

	// Check-ins: every connection to a C2 the flow logs hold, answered
	// once a revision in force forwarded it.
	if len(r.C2s) != 3 {
		t.Fatalf("C2s %+v", r.C2s)
	}
	want := map[string]struct{ forwardedFrom time.Time }{
		reporttest.C2.String() + "/tcp":       {promote},
		reporttest.Drop.String() + "/tcp":     {approve},
		reporttest.Fallback.String() + "/tcp": {time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)}, // only ever seen before its promotion
	}
	for _, v := range r.C2s {
		w, ok := want[v.Value]
		if !ok {
			t.Errorf("unexpected C2 %s", v.Value)
			continue
		}
		starts := endpointStarts(t, st, b.Lease, v.Value)
		if v.CheckIns != int64(len(starts)) || v.Answered != countAfter(starts, w.forwardedFrom) || v.Answered+v.Sinkholed != v.CheckIns {
			t.Errorf("%s: %d check-ins, %d answered, %d sinkholed; want %d, %d answered", v.Value, v.CheckIns, v.Answered, v.Sinkholed,
				len(starts), countAfter(starts, w.forwardedFrom))
		}
		if v.Beacon == nil || v.Intervals != len(starts)-1 || v.EstimatedIn == "" || len(v.Observables) != 1 {
			t.Errorf("%s: beacon %+v, %d intervals of %d starts", v.Value, v.Beacon, v.Intervals, len(starts))
		}
		sum := 0
		for _, bin := range v.Histogram {
			sum += bin.Count
		}
		if sum != v.Intervals {
			t.Errorf("%s: histogram holds %d of %d intervals", v.Value, sum, v.Intervals)
		}
	}
	main := r.C2s[0]
	if main.Value != "198.51.100.18:80/tcp" || main.Status != records.StatusActive || main.Names[0] != reporttest.C2Name ||
		main.Median < 54 || main.Median > 66 || main.Beacon.Interval.D() < 54*time.Second || main.Beacon.Interval.D() > 66*time.Second {
		t.Errorf("main C2 %+v", main)
	}

	// Hours: the flow logs' connections, all of them, by hour.
	var conns int64
	arts, err := flowlog.Logs(st, flowlog.Query{Lease: b.Lease})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range arts {
		conns += a.Conns
	}
	var got int64
	var hours []string
	for _, h := range r.Hours {
		got += h.Connections
		hours = append(hours, h.Hour.Format("15"))
		for _, ci := range h.CheckIns {
			if ci.C2 == main.Value && (h.Hour.Hour() == 9 && ci.Answered != 0 || h.Hour.Hour() == 11 && ci.Sinkholed != 0) {
				t.Errorf("hour %s: %+v", h.Hour, ci)
			}
		}
		if h.Estimated {
			t.Errorf("hour %s estimated", h.Hour)
		}
	}
	if got != conns || conns == 0 || !slices.Equal(hours, []string{"09", "10", "11"}) {
		t.Errorf("hours %q: %d connections, flow logs %d", hours, got, conns)
	}
	if !slices.Equal(r.ScanTargets, []string{"tcp/23", "tcp/2323"}) {
		t.Errorf("scan targets %q", r.ScanTargets)
	}
	last := r.Hours[2]
	if len(last.Scans) != 2 || last.Scans[1].Target != "tcp/2323" || last.Scans[1].Rate < 0.45 || last.Scans[1].Rate > 0.55 ||
		last.Scans[1].Conns != 180 || !slices.Contains(last.NewNames, reporttest.Hostile) {
		t.Errorf("last hour %+v", last)
	}

	var names []string
	for _, n := range r.Names {
		names = append(names, n.Name)
	}
	if !slices.Equal(names, []string{reporttest.C2Name, reporttest.DropName, "update.example.net", reporttest.Hostile}) {
		t.Errorf("names %q", names)
	}

	// The behaviour is what tb-parse found in the second cycle's trace.
	bh := r.Behaviour
	if bh == nil || bh.Cycle != b.Cycles[1] || len(bh.Processes) != 3 || bh.Processes[1].Depth != 1 || bh.Processes[2].Exit != "SIGKILL" ||
		bh.Items[0].First != b.Cycles[1] {
		t.Fatalf("behaviour %+v", bh)
	}
	var items []string
	for _, it := range bh.Items {
		items = append(items, it.What+" "+it.Value)
	}
	if !slices.Equal(items, []string{"dropped /etc/crontab", "dropped /tmp/.x/<b>bot</b>", "dropped /tmp/.x/run", "persistence cron /etc/crontab",
		"evasion self-delete", "tried connect 198.51.100.18:80/tcp", "listening listen 0.0.0.0:2323/tcp"}) {
		t.Errorf("behaviour items %q", items)
	}
	book := &allowlist.Book{St: st}
	for _, id := range r.Records() {
		if records.KindOf(id) == records.KindAllow {
			if _, _, err := book.FindEntry(t.Context(), id); err != nil {
				t.Errorf("entry %s: %v", id, err)
			}
		} else if !st.Exists(id) {
			t.Errorf("record %s does not exist", id)
		}
	}
}

func TestCollectCycleAndSample(t *testing.T) {
	st, b := twoCycles(t)
	r := collect(t, st, leasereport.Target{Cycle: b.Cycles[1]})
	if r.Target != leasereport.TargetCycle || len(r.Cycles) != 1 || r.Cycles[0].ID != b.Cycles[1] || !r.From.Equal(r.Cycles[0].RequestedAt) ||
		!r.To.Equal(*r.Cycles[0].CompletedAt) {
		t.Fatalf("cycle report: %s %d cycles %s to %s", r.Target, len(r.Cycles), r.From, r.To)
	}
	// Only the cycle's own revision; its check-ins all answered.
	if len(r.Revisions) != 1 || r.Revisions[0].Cycle != b.Cycles[1] {
		t.Errorf("revisions %+v", r.Revisions)
	}
	for _, v := range r.C2s {
		if v.Sinkholed != 0 || v.Value == reporttest.Fallback.String()+"/tcp" && v.CheckIns != 0 {
			t.Errorf("%s: %d check-ins, %d sinkholed", v.Value, v.CheckIns, v.Sinkholed)
		}
	}
	if len(r.Names) != 1 || r.Names[0].Name != reporttest.Hostile {
		t.Errorf("names first seen in the cycle: %+v", r.Names)
	}

	for _, s := range []string{b.SampleSHA256, b.Sample, strings.ToUpper(b.SampleSHA256)} {
		r := collect(t, st, leasereport.Target{Sample: s})
		if r.Target != leasereport.TargetSample || r.ID != b.Sample || len(r.Cycles) != 2 || len(r.Leases) != 1 || len(r.Revisions) != 4 {
			t.Errorf("sample %s: %s %s, %d cycles, %d leases, %d revisions", s, r.Target, r.ID, len(r.Cycles), len(r.Leases), len(r.Revisions))
		}
	}
}

// Without flow logs (pruned, or a state older than them), the hours come
// from the observables, and the report says so.
func TestCollectWithoutFlowLogs(t *testing.T) {
	st, b := twoCycles(t)
	full := collect(t, st, leasereport.Target{Lease: b.Lease})
	arts, err := flowlog.Logs(st, flowlog.Query{Lease: b.Lease})
	if err != nil || len(arts) != 2 {
		t.Fatal(len(arts), err)
	}
	for _, a := range arts {
		var art records.Artifact
		if err := st.Update(context.Background(), a.ID, &art, func(bool) error { now := st.Now(); art.PrunedAt = &now; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	r := collect(t, st, leasereport.Target{Lease: b.Lease})
	if len(r.Notes) != 2 || !strings.Contains(r.Notes[0], "2 flow log(s) were pruned") || !strings.Contains(r.Notes[1], "have no flow log") {
		t.Errorf("notes %q", r.Notes)
	}
	for i, v := range r.C2s {
		if v.CheckIns != full.C2s[i].CheckIns || v.Answered != full.C2s[i].Answered {
			t.Errorf("%s: %d check-ins, %d answered from the observables; %d, %d from the flow logs", v.Value, v.CheckIns, v.Answered,
				full.C2s[i].CheckIns, full.C2s[i].Answered)
		}
	}
	var scan23 int64
	for _, h := range r.Hours {
		if !h.Estimated || h.Connections != 0 {
			t.Errorf("hour %s: estimated %v, %d connections", h.Hour, h.Estimated, h.Connections)
		}
		for _, s := range h.Scans {
			if s.Target == "tcp/23" {
				scan23 += s.Conns
			}
		}
	}
	if scan23 != 960 {
		t.Errorf("tcp/23: %d connections spread over the hours, want 960", scan23)
	}
}

func TestCollectTargets(t *testing.T) {
	st, b := twoCycles(t)
	for name, target := range map[string]leasereport.Target{
		"none":           {},
		"two":            {Lease: b.Lease, Cycle: b.Cycles[0]},
		"unknown lease":  {Lease: "lease_01M7W2RQV0WH6QY9F4B6JX1MSY"},
		"not a lease":    {Lease: b.Cycles[0]},
		"unknown cycle":  {Cycle: "cycle_01M7W2RQV0WH6QY9F4B6JX1MSY"},
		"unknown sample": {Sample: strings.Repeat("ab", 32)},
		"bad sample":     {Sample: "beacon"},
	} {
		_, err := leasereport.Collect(context.Background(), st, target)
		if fault.Code(err) != fault.ExitUsage {
			t.Errorf("%s: %v (exit %d)", name, err, fault.Code(err))
		}
	}
}

// A cycle whose sample sends nothing and dies of a segmentation fault is
// what tb-run's analysis calls crashed and silent, and the report shows
// that analysis.
func TestCollectCrashedAndSilent(t *testing.T) {
	ctx := context.Background()
	st, clk, err := reporttest.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := reporttest.TwoCycles()
	s.Beacons = s.Beacons[:1]
	s.Beacons[0].To = 1
	s.Scans, s.Lookups, s.Trace, s.ApproveAfter, s.ExpireAfter = nil, nil, nil, 0, 0
	s.Crashed = map[int]bool{2: true}
	b, err := reporttest.Build(ctx, st, clk, s)
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, st, leasereport.Target{Lease: b.Lease})
	if len(r.Cycles) != 2 {
		t.Fatalf("%d cycles", len(r.Cycles))
	}
	c := r.Cycles[1]
	if c.ExitCode == nil || *c.ExitCode != 139 || !slices.Equal(c.Classification, []string{"crashed", "silent"}) ||
		c.Recommendation != records.RecommendEscalate || !slices.Equal(c.Reasons, []string{"the sample died with status 139"}) {
		t.Errorf("crashed cycle: exit %v, %q, %s: %q", c.ExitCode, c.Classification, c.Recommendation, c.Reasons)
	}
	if c := r.Cycles[0]; !slices.Equal(c.Classification, []string{"running", "network-active", "c2-candidate"}) || c.Recommendation != records.RecommendRerun {
		t.Errorf("first cycle: %q, %s: %q", c.Classification, c.Recommendation, c.Reasons)
	}
	var page bytes.Buffer
	if err := leasereport.WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "the sample died with status 139") {
		t.Error("the page does not say why the crashed cycle wants a person")
	}
}
