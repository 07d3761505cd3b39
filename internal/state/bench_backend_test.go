package state

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// BenchmarkTransition times what one cycle transition stores (see
// cycle.Runner.transition): an UpdateAndCreate of the cycle record that
// changes its state and of its event (one transaction on PostgreSQL). It runs on the directory
// under both durabilities and on PostgreSQL with fsync on (what a real
// server costs), with one writer and with four, each moving a cycle of its
// own, and on PostgreSQL with sixteen. Besides ns/op (wall time over all
// writers' transitions) it reports the median and 99th percentile of one
// transition's latency and the transitions a second (transitions/s). Under
// SyncOnFlush the Flush that a cycle's last transition adds is not timed. The PostgreSQL cluster is started once,
// before any timing (also when only the directory's sub-benchmarks are
// selected); each run of a sub-benchmark gets a new database or directory.
func BenchmarkTransition(b *testing.B) {
	cluster := pgtest.Start(b)
	for _, be := range []struct {
		name string
		opts func(b *testing.B) []Option
	}{
		{"dir/sync-each-write", func(*testing.B) []Option { return []Option{WithDurability(SyncEachWrite)} }},
		{"dir/sync-on-flush", func(*testing.B) []Option { return []Option{WithDurability(SyncOnFlush)} }},
		{"postgres/fsync-on", func(b *testing.B) []Option { return []Option{WithShared(cluster.NewDatabase(b))} }},
	} {
		for _, writers := range []int{1, 4, 16} {
			if writers == 16 && be.name != "postgres/fsync-on" {
				continue // the directory's writers of one host take turns at its journal
			}
			name := fmt.Sprintf("%s/%d-writers", be.name, writers)
			if writers == 1 {
				name = be.name + "/1-writer"
			}
			b.Run(name, func(b *testing.B) { benchTransition(b, be.opts(b), writers) })
		}
	}
}

// benchTransition runs b.N transitions, shared among writers goroutines,
// on a store opened with opts.
func benchTransition(b *testing.B, opts []Option, writers int) {
	ctx := context.Background()
	s := openT(b, b.TempDir(), opts...)
	b.Cleanup(func() { s.Close() })
	ids := make([]string, writers)
	for i := range ids {
		c := &records.Cycle{State: records.CyclePending, Plan: "plan_bench", Sample: "sha256-bench"}
		records.Init(c, records.KindCycle, s.Now())
		if err := s.Create(ctx, c); err != nil {
			b.Fatal(err)
		}
		ids[i] = c.ID
	}
	// Back and forth between two states, each a real change.
	states := [2]string{records.CycleLeasing, records.CyclePending}

	var next atomic.Int64 // transitions handed out so far
	lat := make([][]time.Duration, writers)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	begin := time.Now()
	for w := range writers {
		wg.Go(func() {
			var c records.Cycle
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				err := s.UpdateAndCreate(ctx, ids[w], &c, func(exists bool) ([]records.Record, error) {
					if !exists {
						return nil, fmt.Errorf("cycle %s: %w", ids[w], ErrNotFound)
					}
					from := c.State
					c.State = states[c.Seq%2]
					c.Seq++
					now := s.Now()
					e := &records.Event{Type: "cycle.state", Subject: c.ID, Cycle: c.ID, Seq: c.Seq, From: from, To: c.State, At: now}
					records.Init(e, records.KindEvent, now)
					return []records.Record{e}, nil
				})
				if err != nil {
					errs[w] = err
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(begin)
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	all := slices.Sorted(slices.Values(slices.Concat(lat...)))
	if len(all) == 0 {
		return
	}
	ms := func(q float64) float64 {
		i := int(q*float64(len(all))+0.999999) - 1 // nearest rank
		return float64(all[max(i, 0)]) / float64(time.Millisecond)
	}
	b.ReportMetric(ms(0.50), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "transitions/s")
}
