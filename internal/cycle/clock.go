package cycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// syncClock sets the guest's wall clock to the host's before the sample
// runs: a revert restores the clock of the saved state (as old as the
// lease's clean state), a guest under TCG gains minutes under load, and
// root in the guest sets it where it likes (a sample of the lease's
// earlier cycle, to hide from date checks or to break the timeline). A
// sample whose domains (a DGA), certificates or time bombs go by the date
// would otherwise run on the wrong one. What was found, and what the
// sample starts with, go in the cycle record (GuestClock); a clock that
// cannot be set is said there and in the log, and the cycle goes on: the
// sample then runs on the guest's clock, as it would without tb-run.
func (r *Runner) syncClock(ctx context.Context, c *records.Cycle, g Guest) (*records.Cycle, error) {
	start := time.Now()
	found, err := clockSkew(ctx, g)
	if err != nil {
		return c, fmt.Errorf("guest of lease %s: reading its clock: %w", c.Lease, err)
	}
	gc := &records.GuestClock{Found: records.Duration(found), Left: records.Duration(found)}
	if found.Abs() > records.ClockTolerance {
		serr := g.SetClock(ctx, time.Now())
		left, err := clockSkew(ctx, g)
		if err != nil {
			return c, fmt.Errorf("guest of lease %s: reading its clock: %w", c.Lease, err)
		}
		gc.Left = records.Duration(left)
		if left.Abs() > records.ClockTolerance {
			if serr == nil {
				serr = errors.New("the agent set it, and it did not move")
			}
			gc.Error = serr.Error()
			r.Log.Warn("the guest's clock could not be set to the host's; the sample runs on the guest's", "cycle", c.ID, "skew", left, "err", serr)
		}
	}
	return r.timed(ctx, c, "clock", start, func(n *records.Cycle) error { n.GuestClock = gc; return nil })
}

// clockSkew is the guest's clock minus the host's, the host's read halfway
// through the agent's round trip.
func clockSkew(ctx context.Context, g Guest) (time.Duration, error) {
	before := time.Now()
	t, err := g.Clock(ctx)
	if err != nil {
		return 0, err
	}
	return t.Sub(before.Add(time.Since(before) / 2)), nil
}
