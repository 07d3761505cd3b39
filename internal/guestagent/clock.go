package guestagent

import (
	"context"
	"time"
)

// Clock reads the guest's wall clock (guest-get-time: nanoseconds since
// the epoch). Root in the guest sets that clock as it likes: the time read
// is the guest's word, used only to tell how far it is from the host's.
func (c *Client) Clock(ctx context.Context) (time.Time, error) {
	var ns int64
	if err := c.call(ctx, "guest-get-time", "", nil, &ns); err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, ns), nil
}

// SetClock sets the guest's wall clock to t (guest-set-time). qemu-ga
// sets the system clock, then runs /sbin/hwclock -w for the guest's RTC,
// and reports that command's failure (Debian 12 moved hwclock to
// util-linux-extra, which the images leave out) after the clock was set:
// a caller that needs to know reads the clock again (Clock).
func (c *Client) SetClock(ctx context.Context, t time.Time) error {
	return c.call(ctx, "guest-set-time", "", struct {
		Time int64 `json:"time"`
	}{t.UnixNano()}, nil)
}
