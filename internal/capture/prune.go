package capture

import (
	"fmt"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// RetentionFor is the retention a prune of a lease (or of a capture without
// one) applies: ret, or when ret keeps everything, the retention of its
// newest capture; a usage error when that keeps everything too.
func RetentionFor(st *state.Store, captureID, lease string, ret Retention) (Retention, error) {
	if err := ret.check(); err != nil {
		return ret, Fault(err)
	}
	if !ret.Zero() {
		return ret, nil
	}
	c, err := Find(st, captureID, lease)
	if err != nil {
		return ret, Fault(err)
	}
	ret = Retention{KeepDays: c.KeepDays, KeepBytes: c.KeepBytes}
	if ret.Zero() {
		return ret, fault.Usage(fmt.Errorf("capture %s has no retention: give --keep-days or --keep-bytes", c.ID))
	}
	return ret, nil
}
