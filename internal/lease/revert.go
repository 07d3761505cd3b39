package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/files"
	"github.com/talkbox-sandbox/talkbox/internal/image"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// A guest serves one sample. Whatever a sample ran with root in its guest
// (an implant, a process left behind, a changed agent) must not answer for
// another sample's cycle, nor may the allow entries its cycles earned, or
// the capture rules compiled from its plan, apply to another's: a lease
// handed to a sample whose code the guest has not run is reverted first.

// planSample is the sample (sha256) a plan runs, "" when it names none.
func planSample(p *records.Plan) string {
	if p == nil {
		return ""
	}
	if p.SampleSHA256 != "" {
		return p.SampleSHA256
	}
	return p.Sample
}

// serves tells whether the lease's guest may run the plan's sample as it
// is: the sample is one the guest has run since it was last clean, or a
// file one of them dropped on this very lease (its lineage, written by
// tb-run from the cycle's own records, says so). A sample of the same
// content submitted elsewhere as well is still what the guest dropped.
func (m *Manager) serves(l *records.SandboxLease, p *records.Plan) (bool, error) {
	sample := planSample(p)
	if sample == "" || len(l.Samples) == 0 {
		return false, nil
	}
	if slices.Contains(l.Samples, sample) {
		return true, nil
	}
	if p.Sample == "" || records.KindOf(p.Sample) != records.KindSample || records.CheckID(p.Sample) != nil {
		return false, nil
	}
	var s records.Sample
	if err := m.St.Get(p.Sample, &s); err != nil {
		if errors.Is(err, state.ErrNotFound) {
			return false, nil
		}
		return false, err
	}
	if s.SHA256 != sample {
		return false, nil
	}
	for _, d := range s.DroppedBy {
		if d.Lease == l.ID && slices.Contains(l.Samples, d.Sample) {
			return true, nil
		}
	}
	return false, nil
}

// revert makes a claimed lease's guest clean for r's sample. The caller
// holds the lease's acquire lock and has written it "creating" (so that a
// tb-lease that dies here leaves it for reap to fail, and no one adopts
// the old guest): the lease's captures are stopped (their rules, compiled
// from the old plan, go with them), the domain is destroyed, the entries
// of its allow chain are revoked, and the guest comes back clean (clean).
// On failure the lease is failed.
func (m *Manager) revert(ctx context.Context, l *records.SandboxLease, r *Request) (*records.SandboxLease, error) {
	start := time.Now()
	fail := func(err error) (*records.SandboxLease, error) {
		m.finish(ctx, l.ID, records.LeaseFailed, "revert failed: "+err.Error())
		return nil, fault.Failure(fmt.Errorf("reverting lease %s for sample %s: %w", l.ID, planSample(r.Plan), err))
	}
	c, err := m.connFor(l)
	if err != nil {
		return fail(err)
	}
	rv := records.LeaseRevert{From: l.Samples, To: planSample(r.Plan), Plan: r.Plan.ID, Holder: r.Holder, How: "boot"}
	// The captures stop while their tap exists: a daemon that outlives its
	// interface ends without removing the rules.
	if rv.Captures, err = m.stopCaptures(ctx, l.ID); err != nil {
		return fail(err)
	}
	// Then the old guest: nothing it left runs while the rest is reset.
	if err := c.Destroy(ctx, l.VMName); err != nil {
		return fail(err)
	}
	if rv.Revision, err = m.closeAllowChain(ctx, l.ID, rv.To); err != nil {
		return fail(err)
	}
	how, took, err := m.clean(ctx, c, l, r.BootTimeout)
	if err != nil {
		return fail(err)
	}
	rv.How = how
	rv.Took = records.Duration(time.Since(start).Round(time.Millisecond))
	now := m.St.Now()
	rv.At = now
	m.Out.Log.Info("lease reverted for another sample", "lease", l.ID, "from", rv.From, "to", rv.To, "took", rv.Took)
	exp := now.Add(r.TTL)
	return m.update(ctx, l.ID, func(x *records.SandboxLease) error {
		x.State, x.Health, x.PID, x.Error, x.BootToAgent = records.LeaseBusy, records.HealthHealthy, 0, "", records.Duration(took)
		x.Plan, x.Holder, x.Samples = r.Plan.ID, r.Holder, sampleList(r.Plan)
		x.AcquiredAt, x.ExpiresAt, x.TTL = &now, &exp, records.Duration(r.TTL)
		x.Acquisitions++
		x.Reverts = append(x.Reverts, rv)
		if n := len(x.Reverts); n > records.MaxReverts {
			x.Reverts = x.Reverts[n-records.MaxReverts:]
		}
		return nil
	})
}

// goldenPaths are where a lease keeps its clean state: its guest saved
// right after a fresh boot, before any sample ran (memory, disk).
func goldenPaths(l *records.SandboxLease) (mem, disk string) {
	return filepath.Join(l.Dir, "golden", memoryFile), filepath.Join(l.Dir, "golden", diskFile)
}

// clean brings a lease's destroyed guest back clean: restored from its
// clean state when it has one ("snapshot": no boot), else booted on a
// fresh overlay of its image ("boot") and then saved as its clean state
// for the next revert. A guest that cannot be saved (the machine's
// devices do not migrate), or whose machine keeps no clean state
// (keepsCleanState), reverts by booting each time.
func (m *Manager) clean(ctx context.Context, c Host, l *records.SandboxLease, timeout time.Duration) (string, time.Duration, error) {
	mem, disk := goldenPaths(l)
	if _, err := os.Stat(mem); err == nil {
		start := time.Now()
		err := files.Copy(disk, l.Overlay)
		if err == nil {
			err = m.restoreGuest(ctx, c, l, mem, "", timeout)
		}
		if err == nil {
			return "snapshot", time.Since(start).Round(time.Millisecond), nil
		}
		m.Out.Log.Warn("restoring the lease's clean state failed; booting it instead", "lease", l.ID, "err", err)
		os.RemoveAll(filepath.Dir(mem))
		if err := c.Destroy(ctx, l.VMName); err != nil {
			return "", 0, err
		}
	}
	img, err := image.Resolve(m.St, l.Image)
	if err != nil {
		return "", 0, err
	}
	took, err := m.reboot(ctx, l, img, timeout, true)
	if err != nil || !keepsCleanState(l) {
		return "boot", took, err
	}
	if err := m.saveClean(ctx, c, l, mem, disk, timeout); err != nil {
		m.Out.Log.Info("the lease's clean state is not kept: its reverts boot", "lease", l.ID, "err", err)
		os.RemoveAll(filepath.Dir(mem))
		// A save that failed may have left the guest stopped.
		if s, ok, _ := c.DomainStatusOf(l.VMName); !ok || s.State != "running" {
			took, err = m.reboot(ctx, l, img, timeout, true)
		}
	}
	return "boot", took, err
}

// saveClean saves the freshly booted guest as the lease's clean state and
// resumes it from there.
func (m *Manager) saveClean(ctx context.Context, c Host, l *records.SandboxLease, mem, disk string, timeout time.Duration) error {
	if err := m.mkdirReachable(filepath.Dir(mem)); err != nil {
		return err
	}
	if err := c.SaveDomain(ctx, l.VMName, mem); err != nil {
		return err
	}
	if err := files.Copy(l.Overlay, disk); err != nil {
		return err
	}
	return m.restoreGuest(ctx, c, l, mem, "", timeout)
}

// sampleList is a fresh guest's Samples for a plan.
func sampleList(p *records.Plan) []string {
	if s := planSample(p); s != "" {
		return []string{s}
	}
	return nil
}

// stopCaptures stops the lease's captures that run or whose rules are
// still applied (a daemon that died), which removes the lease's rules from
// the lab's firewall.
func (m *Manager) stopCaptures(ctx context.Context, lease string) ([]string, error) {
	cs, err := state.FindBy(m.St, records.KindCapture, records.KeyLease, lease, func(c *records.Capture) bool {
		return c.State == capture.StateRunning || c.State == capture.StateStarting || (c.Rules != nil && c.Rules.Applied)
	})
	if err != nil {
		return nil, err
	}
	var stopped []string
	for _, c := range cs {
		if _, _, err := capture.Stop(ctx, m.St, c); err != nil {
			return stopped, fmt.Errorf("stopping capture %s: %w", c.ID, err)
		}
		stopped = append(stopped, c.ID)
	}
	return stopped, nil
}

// closeAllowChain revokes every entry of the lease's allow chain that is
// not already final, in one revision whose cause says why; "" when the
// chain has none. The lease's live set loses them when its next capture
// applies its rules (the capture that held them is stopped).
func (m *Manager) closeAllowChain(ctx context.Context, lease, to string) (string, error) {
	b := &allowlist.Book{St: m.St}
	ch := allowlist.Chain{Scope: records.ScopeLease, Lease: lease}
	head, _, err := b.Head(ctx, ch)
	if err != nil || head == nil {
		return "", err
	}
	note := "revoked: the lease was reverted to a clean guest for another sample"
	if to != "" {
		note += " (" + to + ")"
	}
	rev, _, err := b.Change(ctx, ch, "revert", func(es []*records.AllowEntry) error {
		for _, e := range es {
			// Whatever is not final, so that a status added later (as
			// probation was) is closed too.
			switch e.Status {
			case records.StatusRevoked, records.StatusRejected, records.StatusExpired:
			default:
				e.Status, e.Note = records.StatusRevoked, note
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return rev.ID, nil
}

// claimForRevert takes an idle lease for r under the alloc lock, as
// "creating" under this process's acquire lock, so that the old guest is
// neither handed out nor adopted while it is reverted. unlock releases
// the acquire lock.
func (m *Manager) claimForRevert(ctx context.Context, l *records.SandboxLease, r *Request) (*records.SandboxLease, func(), error) {
	unlock, ok, err := m.St.TryLock(ctx, acquireLock(l.ID))
	if err != nil || !ok {
		return nil, nil, fmt.Errorf("acquire lock of %s: %v", l.ID, err)
	}
	x, err := m.update(ctx, l.ID, func(x *records.SandboxLease) error {
		if x.State != records.LeaseIdle {
			return fmt.Errorf("lease %s changed state to %s", x.ID, x.State)
		}
		x.State, x.Health, x.Plan, x.Holder, x.PID = records.LeaseCreating, records.HealthUnknown, r.Plan.ID, r.Holder, os.Getpid()
		return nil
	})
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return x, unlock, nil
}
