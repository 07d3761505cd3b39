package cycle

import (
	"context"
	"fmt"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Cancel cancels cycles: one no process drives ends at once (its sample
// killed if it runs); one a tb-run drives is flagged, and that tb-run kills
// the sample and ends it. It returns those, which Watch waits for. A cycle
// that cannot be cancelled goes to warnf and the others still are; the
// error is then the batch's.
func (r *Runner) Cancel(ctx context.Context, ids []string, warnf func(format string, a ...any)) ([]string, error) {
	var batch fault.Batch
	var waitFor []string
	for _, id := range ids {
		if err := r.cancel(ctx, id, &waitFor); err != nil {
			warnf("%v", err)
			batch.Add(err)
		}
	}
	return waitFor, batch.Err()
}

func (r *Runner) cancel(ctx context.Context, id string, waitFor *[]string) error {
	c, err := r.Get(id)
	if err != nil {
		return err
	}
	if records.CycleTerminal(c.State) {
		return fault.Failure(fmt.Errorf("cycle %s already ended (%s)", id, c.State))
	}
	if c, err = r.update(ctx, id, func(n *records.Cycle) error { n.Cancel = true; return nil }); err != nil {
		return err
	}
	unlock, ok, err := r.St.TryLock(ctx, cycleLock(id))
	if err != nil {
		return err
	}
	if !ok {
		*waitFor = append(*waitFor, id)
		return nil
	}
	defer unlock()
	detail := "cancelled"
	if c.State == records.CycleExecuting && c.GuestPID != 0 && !c.Detach {
		g, err := r.connect(ctx, c)
		if err == nil {
			err = r.kill(ctx, g, c)
			g.Close()
		}
		if err != nil {
			return fmt.Errorf("cycle %s: %w (not cancelled)", id, err)
		}
		detail = "cancelled; the sample was killed"
	}
	_, err = r.transition(ctx, c, records.CycleCancelled, detail, nil)
	return err
}
