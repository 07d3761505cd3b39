package cycle

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/files"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// durationBuckets are the cycle-duration histogram's upper bounds, s.
var durationBuckets = []float64{1, 5, 15, 30, 60, 300, 900, 3600}

// WriteMetrics writes Prometheus textfile metrics (for node_exporter's
// textfile collector) computed from the state: cycles by state, cycle and
// step durations, lease health, parser throughput and allow-list sizes. The
// file is replaced atomically, so a scrape never sees half of it.
func WriteMetrics(st *state.Store, path string) error {
	var b strings.Builder
	cycles, err := state.Find[records.Cycle](st, records.KindCycle, nil)
	if err != nil {
		return err
	}
	byState := map[string]int{}
	for _, s := range []string{records.CyclePending, records.CycleLeasing, records.CyclePreparing, records.CycleExecuting,
		records.CyclePostProcessing, records.CycleCompleted, records.CycleFailed, records.CycleTimedOut, records.CycleCancelled} {
		byState[s] = 0
	}
	buckets := make([]int, len(durationBuckets))
	var durSum float64
	var durCount int
	steps := map[string][2]float64{}
	var parseSecs float64
	for _, c := range cycles {
		byState[c.State]++
		if c.StartedAt != nil && c.CompletedAt != nil {
			d := c.CompletedAt.Sub(*c.StartedAt).Seconds()
			durSum += d
			durCount++
			for i, ub := range durationBuckets {
				if d <= ub {
					buckets[i]++
				}
			}
		}
		for k, v := range c.Timings {
			s := steps[k]
			s[0] += v.D().Seconds()
			s[1]++
			steps[k] = s
			if k == StepParse {
				parseSecs += v.D().Seconds()
			}
		}
	}
	metric(&b, "talkbox_cycles", "gauge", "Cycles by state.")
	for _, s := range slices.Sorted(maps.Keys(byState)) {
		fmt.Fprintf(&b, "talkbox_cycles{state=%q} %d\n", s, byState[s])
	}
	metric(&b, "talkbox_cycle_duration_seconds", "histogram", "Duration of finished cycles, from leasing to their end.")
	for i, ub := range durationBuckets {
		fmt.Fprintf(&b, "talkbox_cycle_duration_seconds_bucket{le=\"%g\"} %d\n", ub, buckets[i])
	}
	fmt.Fprintf(&b, "talkbox_cycle_duration_seconds_bucket{le=\"+Inf\"} %d\ntalkbox_cycle_duration_seconds_sum %g\ntalkbox_cycle_duration_seconds_count %d\n", durCount, durSum, durCount)
	metric(&b, "talkbox_cycle_step_seconds", "summary", "Time spent in each cycle step (lease, ready, push, verify, run, rotate, parse, promote).")
	stepNames := make([]string, 0, len(steps))
	for k := range steps {
		stepNames = append(stepNames, k)
	}
	sort.Strings(stepNames)
	for _, k := range stepNames {
		fmt.Fprintf(&b, "talkbox_cycle_step_seconds_sum{step=%q} %g\ntalkbox_cycle_step_seconds_count{step=%q} %g\n", k, steps[k][0], k, steps[k][1])
	}
	// Lease health.
	leases, err := state.Find(st, records.KindLease, func(l *records.SandboxLease) bool { return !records.LeaseGone(l.State) })
	if err != nil {
		return err
	}
	metric(&b, "talkbox_lease_healthy", "gauge", "1 if a live lease is healthy, 0 otherwise.")
	for _, l := range leases {
		h := 0
		if l.Health == records.HealthHealthy {
			h = 1
		}
		fmt.Fprintf(&b, "talkbox_lease_healthy{lease=%q,state=%q,health=%q} %d\n", l.ID, l.State, l.Health, h)
	}
	// Parser throughput: bytes of parsed pcaps and observables per second
	// of parse steps.
	arts, err := state.Find[records.Artifact](st, records.KindArtifact, nil)
	if err != nil {
		return err
	}
	var parsedBytes, parsedPackets, flowBytes, flowConns float64
	for _, a := range arts {
		switch a.Type {
		case "pcap":
			parsedBytes += float64(a.Size)
			parsedPackets += float64(a.Packets)
		case flowlog.ArtifactType:
			if a.PrunedAt == nil {
				flowBytes += float64(a.Size)
			}
			flowConns += float64(a.Conns)
		}
	}
	oids, err := st.List(records.KindObservable)
	if err != nil {
		return err
	}
	metric(&b, "talkbox_parse_seconds_total", "counter", "Time cycles spent parsing captures.")
	fmt.Fprintf(&b, "talkbox_parse_seconds_total %g\n", parseSecs)
	metric(&b, "talkbox_capture_bytes_total", "counter", "Bytes of captures registered as artifacts.")
	fmt.Fprintf(&b, "talkbox_capture_bytes_total %g\n", parsedBytes)
	metric(&b, "talkbox_capture_packets_total", "counter", "Packets of captures registered as artifacts.")
	fmt.Fprintf(&b, "talkbox_capture_packets_total %g\n", parsedPackets)
	metric(&b, "talkbox_observables", "gauge", "Observables in the state.")
	fmt.Fprintf(&b, "talkbox_observables %d\n", len(oids))
	metric(&b, "talkbox_flowlog_connections_total", "counter", "Connections written to flow logs.")
	fmt.Fprintf(&b, "talkbox_flowlog_connections_total %g\n", flowConns)
	metric(&b, "talkbox_flowlog_bytes", "gauge", "Bytes of the flow logs retention has kept.")
	fmt.Fprintf(&b, "talkbox_flowlog_bytes %g\n", flowBytes)
	// The health monitor: the state's free space against the default
	// bound, and the captures and parses it stopped.
	if f, err := diskspace.Check(st.Root()); err == nil {
		if err := diskspace.WriteMetrics(&b, f, diskspace.DefaultThreshold()); err != nil {
			return err
		}
	}
	lowSpace, err := state.Find(st, records.KindEvent, func(e *records.Event) bool { return strings.HasSuffix(e.Type, ".low-space") })
	if err != nil {
		return err
	}
	stops := map[string]int{"capture.low-space": 0, "parse.low-space": 0}
	for _, e := range lowSpace {
		stops[e.Type]++
	}
	metric(&b, "talkbox_low_space_stops_total", "counter", "Captures and parses the health monitor stopped because the state's file system ran low.")
	for _, k := range slices.Sorted(maps.Keys(stops)) {
		fmt.Fprintf(&b, "talkbox_low_space_stops_total{type=%q} %d\n", k, stops[k])
	}
	// Allow-list size: the active entries of each chain's latest revision.
	revs, err := state.Find[records.AllowRevision](st, records.KindRevision, nil)
	if err != nil {
		return err
	}
	latest := map[string]*records.AllowRevision{}
	for _, rv := range revs {
		if cur, ok := latest[rv.Chain]; !ok || rv.Seq > cur.Seq {
			latest[rv.Chain] = rv
		}
	}
	metric(&b, "talkbox_allowlist_entries", "gauge", "Entries of the current revision of each allow-list chain, by status.")
	chains := make([]string, 0, len(latest))
	for k := range latest {
		chains = append(chains, k)
	}
	sort.Strings(chains)
	for _, k := range chains {
		fmt.Fprintf(&b, "talkbox_allowlist_entries{chain=%q,status=\"active\"} %d\ntalkbox_allowlist_entries{chain=%q,status=\"all\"} %d\n", k, latest[k].Active, k, latest[k].Entries)
	}
	return files.WriteAtomic(path, []byte(b.String()), 0o644)
}

func metric(b *strings.Builder, name, typ, help string) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}
