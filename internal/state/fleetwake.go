package state

import (
	"context"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// FleetSignals are a worker's wake-ups (WatchFleet). Each channel holds
// at most one signal waiting; a signal may come with no change.
type FleetSignals struct {
	// Work: a worker that found no work may find some: a cycle was queued
	// (or submitted onto a lease), or a worker stopped, lost slots or
	// changed what its host boots. A cycle leaving the queue, being driven
	// or ending signals nothing on PostgreSQL, nor a worker taking a cycle
	// or freeing a slot. A watcher that must not miss one also looks now
	// and then (a worker, every heartbeat).
	Work <-chan struct{}
	// Cancels: a cancel of a cycle driven on the watched host may have
	// been committed. Only that host's watchers hear it, so that a cancel
	// costs no look to the rest of the fleet, and a cycle being driven
	// need not read its record every second to learn of one. A driver that
	// must not miss one also reads now and then (Runner.CancelRecheck).
	Cancels <-chan struct{}
}

// WatchFleet watches for a worker of host (FleetSignals). Both channels
// are closed when ctx ends, which must come before the store is closed:
// the watcher holds a connection.
//
// On PostgreSQL, those commits notify channels of their own (the fleet's,
// the host's cancels), and the watcher listens to them and reads nothing;
// the directory's watcher follows the journal for cycles and workers.
func (s *Store) WatchFleet(ctx context.Context, host string) (FleetSignals, error) {
	work, cancels := make(chan struct{}, 1), make(chan struct{}, 1)
	sig := FleetSignals{Work: work, Cancels: cancels}
	if pg, ok := s.rec.(*pgStore); ok {
		return sig, pg.watchFleet(ctx, host, work, cancels)
	}
	fl, err := s.FollowJournal(ctx, false)
	if err != nil {
		return FleetSignals{}, err
	}
	go func() {
		defer close(work)
		defer close(cancels)
		defer fl.Close()
		for ctx.Err() == nil {
			e, err := fl.Next()
			if err == nil && e == nil {
				err = fl.Wait(ctx)
			}
			if err != nil && ctx.Err() == nil {
				// Whatever was missed, the watcher looks again.
				signal(work)
				signal(cancels)
				sleepOrDone(ctx, time.Second)
			}
			if e == nil || e.Kind != records.KindCycle && e.Kind != records.KindWorker {
				continue
			}
			signal(work)
			if e.Kind == records.KindCycle && cancelOn(e.Record) == host {
				signal(cancels)
			}
		}
	}()
	return sig, nil
}

// cancelOn is the host a cycle's version asks to cancel it on: where it
// is driven, if it is flagged and not ended ("" if none).
func cancelOn(data []byte) string {
	var c records.Cycle
	if records.Unmarshal(data, &c) != nil || !c.Cancel || records.CycleTerminal(c.State) {
		return ""
	}
	return c.Host
}

func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func sleepOrDone(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
