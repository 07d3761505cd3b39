package state

import (
	"context"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// WatchFleet signals on the channel it returns (at most one signal
// waiting) when a worker that found no work may find some: a cycle was
// queued (or submitted onto a lease), or a worker stopped, lost slots or
// changed what its host boots. A cycle leaving the queue, being driven or
// ending signals nothing on PostgreSQL, nor a worker taking a cycle or
// freeing a slot. A signal may come with no change; a watcher that must
// not miss one also looks now and then (a worker, every heartbeat). The channel is closed when ctx ends, which
// must come before the store is closed: the watcher holds a connection.
//
// On PostgreSQL, those commits notify a channel of their own, and the watcher listens to it
// and reads nothing; the directory's watcher follows the journal for
// cycles and workers.
func (s *Store) WatchFleet(ctx context.Context) (<-chan struct{}, error) {
	if pg, ok := s.rec.(*pgStore); ok {
		return pg.watchFleet(ctx)
	}
	fl, err := s.FollowJournal(ctx, false)
	if err != nil {
		return nil, err
	}
	changed := make(chan struct{}, 1)
	go func() {
		defer close(changed)
		defer fl.Close()
		for ctx.Err() == nil {
			e, err := fl.Next()
			if err == nil && e == nil {
				err = fl.Wait(ctx)
			}
			if err != nil && ctx.Err() == nil {
				// Whatever was missed, the watcher looks again.
				signal(changed)
				sleepOrDone(ctx, time.Second)
			}
			if e != nil && (e.Kind == records.KindCycle || e.Kind == records.KindWorker) {
				signal(changed)
			}
		}
	}()
	return changed, nil
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
