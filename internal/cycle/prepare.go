package cycle

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func (r *Runner) connect(ctx context.Context, c *records.Cycle) (Guest, error) {
	var l records.SandboxLease
	if err := r.St.Get(c.Lease, &l); err != nil {
		return nil, fmt.Errorf("lease %s: %w", c.Lease, err)
	}
	if records.LeaseGone(l.State) {
		return nil, fmt.Errorf("lease %s is %s", l.ID, l.State)
	}
	g, err := r.Connect(ctx, &l)
	if err != nil {
		return nil, &retry{err}
	}
	return g, nil
}

// prepare checks the guest is ready, sets its clock to the host's, makes
// sure the capture runs, and pushes the sample (or finds the detached one
// of the previous cycle).
func (r *Runner) prepare(ctx context.Context, c *records.Cycle, g Guest) (*records.Cycle, error) {
	var l records.SandboxLease
	if err := r.St.Get(c.Lease, &l); err != nil {
		return c, err
	}
	start := time.Now()
	if err := waitPing(ctx, g, 30*time.Second); err != nil {
		return c, fmt.Errorf("guest of lease %s is not ready: %w", l.ID, err)
	}
	addrs, err := g.Addresses(ctx)
	if err != nil {
		return c, fmt.Errorf("guest of lease %s: %w", l.ID, err)
	}
	if l.IP != "" && !slices.ContainsFunc(addrs, func(a string) bool { return strings.SplitN(a, "/", 2)[0] == l.IP }) {
		return c, fmt.Errorf("guest of lease %s: network not up (want %s, has %v)", l.ID, l.IP, addrs)
	}
	if c, err = r.timed(ctx, c, "ready", start, nil); err != nil {
		return c, err
	}
	if c, err = r.syncClock(ctx, c, g); err != nil {
		return c, err
	}
	if slices.Contains(c.Post, StepRotate) && r.Post != nil {
		start = time.Now()
		capID, err := r.Post.EnsureCapture(ctx, c.Lease)
		if err != nil {
			return c, fmt.Errorf("capture on lease %s: %w", c.Lease, err)
		}
		if c, err = r.timed(ctx, c, "capture", start, func(n *records.Cycle) error { n.Capture = capID; return nil }); err != nil {
			return c, err
		}
	}
	if c.Detach && c.Previous != "" {
		if att, err := r.attachable(ctx, c, g); err != nil {
			return c, err
		} else if att != nil {
			return r.transition(ctx, c, records.CycleExecuting, "observing the sample of "+att.ID, func(n *records.Cycle) error {
				n.Attached, n.GuestPID, n.GuestPath, n.GuestOut = att.ID, att.GuestPID, att.GuestPath, att.GuestOut
				n.StdoutFrom, n.StderrFrom = att.StdoutTo, att.StderrTo
				n.Tracer, n.TraceFrom = att.Tracer, att.TraceTo
				if n.Workdir == "" {
					n.Workdir = att.Workdir
				}
				return nil
			})
		}
	}
	// The sample runs from the lease's sample cache, named by its sha256:
	// pushed by the first cycle, hashed again in the guest by every cycle
	// (a sample may rewrite or delete its own file; it is then pushed
	// again).
	sample := GuestRoot + "/samples/" + c.Sample
	start = time.Now()
	got, err := guestSHA256(ctx, g, sample)
	if err != nil {
		return c, err
	}
	if got != c.Sample {
		if res, err := g.Run(ctx, "/bin/mkdir", "-p", "-m", "0700", GuestRoot+"/samples"); err != nil {
			return c, err
		} else if res.ExitCode != 0 {
			return c, fmt.Errorf("mkdir in the guest: %s", strings.TrimSpace(string(res.Stderr)))
		}
		// In a fleet, a sample planned on another host is fetched from it.
		if err := r.St.EnsureBlob(ctx, c.Sample); err != nil {
			return c, fmt.Errorf("sample %s: %w", c.Sample, err)
		}
		f, err := r.St.OpenBlob(c.Sample)
		if err != nil {
			return c, fmt.Errorf("sample %s: %w", c.Sample, err)
		}
		n, err := g.WriteFile(ctx, sample, f)
		f.Close()
		if err != nil {
			return c, fmt.Errorf("pushing the sample: %w", err)
		}
		if c, err = r.timed(ctx, c, "push", start, nil); err != nil {
			return c, err
		}
		start = time.Now()
		if got, err = guestSHA256(ctx, g, sample); err != nil {
			return c, err
		}
		if got != c.Sample {
			return c, fmt.Errorf("sample pushed to %s does not verify in the guest: sha256 %q, want %s (%d bytes written)", sample, got, c.Sample, n)
		}
	}
	if c, err = r.timed(ctx, c, "verify", start, nil); err != nil {
		return c, err
	}
	return r.transition(ctx, c, records.CycleExecuting, "", func(n *records.Cycle) error {
		n.GuestPath, n.GuestOut = sample, GuestRoot+"/"+n.ID
		if n.Workdir == "" {
			n.Workdir = GuestRoot
		}
		return nil
	})
}

// guestSHA256 hashes a file inside the guest ("" if it is not there). One
// process, no shell: each fork costs tens of milliseconds under TCG.
func guestSHA256(ctx context.Context, g Guest, path string) (string, error) {
	res, err := g.Run(ctx, "/usr/bin/sha256sum", path)
	if err != nil {
		return "", fmt.Errorf("hashing the sample in the guest: %w", err)
	}
	if res.ExitCode != 0 {
		return "", nil
	}
	sum, _, _ := strings.Cut(strings.TrimSpace(string(res.Stdout)), " ")
	return sum, nil
}

func waitPing(ctx context.Context, g Guest, max time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, max)
	defer cancel()
	wait := 10 * time.Millisecond
	for {
		err := g.Ping(ctx)
		if err == nil {
			return nil
		}
		if guestagent.Pause(ctx, wait) != nil {
			return err
		}
		wait = min(2*wait, time.Second)
	}
}
