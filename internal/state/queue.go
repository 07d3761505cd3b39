package state

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// A fleet's cycles are of two sorts for its workers: queued (pending, with
// no lease yet: any host that boots the plan's platform and that the cycle
// is not pinned away from may take it) and active (every other open one: a
// host leases, runs or post-processes it). A worker asks for the first few
// queued cycles it may take and for its own host's active ones on every
// look, for every active one only now and then (a sweep for dead hosts'),
// never for every open cycle: on PostgreSQL these are index reads whose
// cost does not grow with the queue, and the look's not with the fleet;
// the directory reads its open cycles, as it always did.

// QueueFilter says which queued cycles a host may take.
type QueueFilter struct {
	// Host: cycles pinned to no host or to this one ("": pinned anywhere).
	Host string
	// Platforms the host leases guests of; a plan that names none is
	// taken by a host that leases any (as records.Worker.Boots says). Nil:
	// every platform, for a worker that does not say what it boots.
	Platforms []string
	// Lock, when set, names a cycle's lock, which whoever drives the
	// cycle holds: on PostgreSQL the cycles whose lock is held are left
	// out, in one round trip for them all. Claims made at once would
	// otherwise each ask, one lock at a time, about the cycles another
	// has just started driving, which stay queued until it has leased.
	// Twice n are read, so that as many as n of those may be passed over
	// and still n returned. A cycle may still be taken between this read
	// and its caller's lock.
	Lock func(cycleID string) string
}

// takes tells whether a host under f may take a queued cycle of a plan of
// the platform, pinned to pin.
func (f QueueFilter) takes(platform, pin string) bool {
	if f.Host != "" && pin != "" && pin != f.Host {
		return false
	}
	if f.Platforms == nil {
		return true
	}
	if platform == "" {
		return len(f.Platforms) > 0
	}
	return slices.Contains(f.Platforms, platform)
}

// fleetBackend is a store that keeps its cycles' queue in an index.
type fleetBackend interface {
	queued(ctx context.Context, f QueueFilter, n int) ([][]byte, error)
	unlocked(ctx context.Context, names []string) ([]bool, error)
	activeRefs(ctx context.Context, host *string) ([]ActiveRef, error)
}

// Queued returns up to n queued cycles a host under f may take, oldest
// first. It does not claim them: the cycle's lock taken by whoever drives
// it does; on PostgreSQL, claims made at the same moment skip each other's
// rows (FOR UPDATE SKIP LOCKED), so that they do not all return the oldest.
func Queued(ctx context.Context, st *Store, f QueueFilter, n int) ([]*records.Cycle, error) {
	if n <= 0 {
		return nil, nil
	}
	if fb, ok := st.rec.(fleetBackend); ok {
		read := n
		if f.Lock != nil {
			read = 2 * n
		}
		raw, err := fb.queued(ctx, f, read)
		if err != nil {
			return nil, err
		}
		cs, err := decodeCycles(raw)
		if err != nil || f.Lock == nil || len(cs) == 0 {
			return cs, err
		}
		names := make([]string, len(cs))
		for i, c := range cs {
			names[i] = f.Lock(c.ID)
		}
		free, err := fb.unlocked(ctx, names)
		if err != nil {
			return nil, err
		}
		out := cs[:0]
		for i, c := range cs {
			if free[i] && len(out) < n {
				out = append(out, c)
			}
		}
		return out, nil
	}
	platforms := map[string]string{}
	var out []*records.Cycle
	open, err := FindBy(st, records.KindCycle, records.KeyOpen, "1", func(c *records.Cycle) bool {
		return c.State == records.CyclePending && c.Lease == ""
	})
	if err != nil {
		return nil, err
	}
	for _, c := range open {
		plat, err := planPlatform(st, platforms, c.Plan)
		if err != nil {
			return nil, err
		}
		if !f.takes(plat, c.PinnedTo) {
			continue
		}
		if out = append(out, c); len(out) == n {
			break
		}
	}
	return out, nil
}

// CountLiveWorkers counts the workers alive at now: on PostgreSQL from
// their keys alone (one range of an index), no record read, and so with
// those dead for less than their DeadAfter (the keys are coarse); on the
// directory, from every worker record.
func CountLiveWorkers(ctx context.Context, st *Store, now time.Time) (int, error) {
	if pg, ok := st.rec.(*pgStore); ok {
		return pg.countLiveWorkers(ctx, now)
	}
	live, err := LiveWorkers(ctx, st, now)
	return len(live), err
}

// ActiveRef is an active cycle as a fleet's worker weighs it: where it
// must go on, and since when it has not changed; not the record.
type ActiveRef struct {
	ID string
	// Host is the fleet host whose runner drove it last ("" none yet).
	Host string
	// Lease is its lease, LeaseHost that lease's host, and LeaseFound
	// whether the lease's record is there.
	Lease      string
	LeaseHost  string
	LeaseFound bool
	UpdatedAt  time.Time
}

// ActiveRefs returns every active cycle, by ID, with its lease's host: on
// PostgreSQL in one query that sends no record (a sweep of the fleet for
// dead hosts' cycles).
func ActiveRefs(ctx context.Context, st *Store) ([]ActiveRef, error) {
	return activeRefs(ctx, st, nil)
}

// ActiveRefsOn returns the active cycles last driven on the host (their
// Host), and those no host has driven yet (a cycle submitted onto a lease),
// by ID: what a worker's look reads, as many as its host drives, whatever
// the fleet's size. A cycle's lease, not this, says which host goes on
// with it.
func ActiveRefsOn(ctx context.Context, st *Store, host string) ([]ActiveRef, error) {
	return activeRefs(ctx, st, &host)
}

func activeRefs(ctx context.Context, st *Store, host *string) ([]ActiveRef, error) {
	if fb, ok := st.rec.(fleetBackend); ok {
		return fb.activeRefs(ctx, host)
	}
	cs, err := FindBy(st, records.KindCycle, records.KeyOpen, "1", func(c *records.Cycle) bool {
		return activeCycle(c) && (host == nil || c.Host == *host || c.Host == "")
	})
	if err != nil {
		return nil, err
	}
	out := make([]ActiveRef, 0, len(cs))
	for _, c := range cs {
		ref := ActiveRef{ID: c.ID, Host: c.Host, Lease: c.Lease, UpdatedAt: c.UpdatedAt}
		if c.Lease != "" {
			var l records.SandboxLease
			err := st.Get(c.Lease, &l)
			if err != nil && !errors.Is(err, ErrNotFound) {
				return nil, err
			}
			ref.LeaseHost, ref.LeaseFound = l.Host, err == nil
		}
		out = append(out, ref)
	}
	return out, nil
}

func activeCycle(c *records.Cycle) bool { return !records.CycleTerminal(c.State) && !queuedCycle(c) }

// queuedCycle tells whether a cycle waits for a host to take it.
func queuedCycle(c *records.Cycle) bool { return c.State == records.CyclePending && c.Lease == "" }

// planPlatform is the platform of a plan's guest ("" when the plan is
// gone: any host may try, and the cycle fails naming it), cached in seen.
func planPlatform(st *Store, seen map[string]string, plan string) (string, error) {
	if p, ok := seen[plan]; ok {
		return p, nil
	}
	var p records.Plan
	if err := st.Get(plan, &p); err != nil && !errors.Is(err, ErrNotFound) {
		return "", err
	}
	seen[plan] = p.Image.Platform
	return p.Image.Platform, nil
}

func decodeCycles(raw [][]byte) ([]*records.Cycle, error) {
	out := make([]*records.Cycle, 0, len(raw))
	for _, b := range raw {
		var c records.Cycle
		if err := records.Unmarshal(b, &c); err != nil {
			return nil, fmt.Errorf("a stored cycle does not decode: %w", err)
		}
		out = append(out, &c)
	}
	return out, nil
}
