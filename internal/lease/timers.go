package lease

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/platform"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// A restored guest's timers.
//
// QEMU 7.2 does not carry a POWER guest's decrementer across a save under
// TCG: the timer event the guest's kernel had programmed is not armed again
// on restore (QEMU 8.1 migrates it, "target/ppc: Migrate DECR SPR"). A
// pseries guest saved with an event pending comes back without any timer
// interrupt: its agent answers, since replies are driven by the virtio
// interrupt, but nothing that waits for time wakes up (a sleep, an RCU grace
// period and with it `ip link set dev eth0 down`), and as the kernel still
// believes that event is due it never programs the decrementer again. How
// often this happens depends on what the guest was doing when it was saved
// (a guest whose processes sleep in short steps comes back stopped almost
// every time), and a clean state saved so stops on every revert.
//
// Any write of the decrementer repairs it. The one a process can cause
// without a program of its own is an irq_work's: powerpc raises one by
// setting the decrementer to 1, and a write to the trace marker with a
// reader waiting on the trace pipe queues one. The kick below does that
// until the guest's timer interrupts count up again.

// restoredTimeout bounds a snapshot's wait for its source guest to come
// back and settle; a guest whose timers stay stopped fails it.
const restoredTimeout = time.Minute

// A pseries guest restored with its timer stopped may not answer its agent
// at all, so that the kick cannot be sent: qemu-ga, when it reads the end
// of its channel (the host side reconnects after a restore), sleeps 100 ms
// before reading again, and that sleep never ends. Whether it reads in
// that window is a race of each restore, not of the save file, so such a
// guest is restored again: up to restoreAttempts times, the first given
// restoreAgentWait for its agent (it answers in about 2 s when it does, on
// a quiet host) and each after it twice the wait of the one before, within
// the caller's timeout: on a loaded host an agent that does answer can
// take longer than 20 s (beside six busy loops, all three 20 s waits ran
// out, and a 90 s wait passed).
const (
	restoreAttempts  = 3
	restoreAgentWait = 20 * time.Second
)

// restoreGuest restores l's guest from the save file mem, whose definition
// is already l's own, its tap bound before it runs; on Malta re-arms its
// timer before it runs (rearmsTimer); waits for its agent and settles it
// with then (settleRestored), within timeout. A guest that does not settle
// is destroyed; on a machine that stops its timers (stopsTimers) it is
// restored again (see restoreAttempts).
func (m *Manager) restoreGuest(ctx context.Context, c Host, l *records.SandboxLease, mem, then string, timeout time.Duration) error {
	attempts, wait := 1, timeout
	if stopsTimers(l) {
		attempts, wait = restoreAttempts, min(timeout, restoreAgentWait)
	}
	restore := func() error {
		if err := c.RestorePaused(ctx, mem, ""); err != nil {
			return err
		}
		if rearmsTimer(l) {
			// A guest whose timer was not re-armed still comes back, as
			// before, when its kernel writes Compare again: slower, not
			// broken, so that is a warning.
			p, _ := platform.Lookup(l.Platform)
			if err := c.RearmMIPSTimer(ctx, l.VMName, p.Bits/8, byteOrder(p)); err != nil {
				m.Out.Log.Warn("the restored guest's timer was not re-armed: it resumes when its kernel sets the timer again, seconds later", "lease", l.ID, "err", err)
			}
		}
		return nil
	}
	var err error
	for i := range attempts {
		if err = m.run(ctx, c, l, restore); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, min(timeout, wait<<i))
		g := virt.NewGuest(c, l.VMName, l.ConsoleLog)
		if err = g.WaitAgent(wctx); err == nil {
			err = settleRestored(wctx, g, l, then)
		}
		cancel()
		if err == nil {
			return nil
		}
		c.Destroy(context.WithoutCancel(ctx), l.VMName)
		if ctx.Err() != nil || i+1 == attempts {
			break
		}
		m.Out.Log.Warn("the restored guest did not settle; restoring it again", "lease", l.ID, "attempt", i+1, "err", err)
	}
	return err
}

func byteOrder(p platform.Platform) binary.ByteOrder {
	if p.Endianness == "big" {
		return binary.BigEndian
	}
	return binary.LittleEndian
}

// stopsTimers tells whether l's machine may come back from a save with its
// timer stopped and needs the kick through its agent: pseries under TCG
// (KVM keeps the decrementer in the host kernel, which migrates it).
func stopsTimers(l *records.SandboxLease) bool {
	p, ok := platform.Lookup(l.Platform)
	return ok && p.Machine == "pseries" && virt.Accel(l.Accel) != virt.KVM
}

// onMalta tells whether l is a MIPS Malta guest under TCG, whose compare
// timer QEMU 7.2 does not arm again when it loads a save (see
// virt.RearmMIPSTimer): a guest saved while a timer event was due (a guest
// just booted always has one) gets no timer interrupt until its kernel
// writes Compare again, which took 13–31 s after a restore
// (docs/performance.md).
func onMalta(l *records.SandboxLease) bool {
	p, ok := platform.Lookup(l.Platform)
	return ok && p.Machine == "malta" && virt.Accel(l.Accel) != virt.KVM
}

// rearmsTimer tells whether l's restored guest has its timer re-armed from
// the host before it runs: on Malta, where its host is this machine (the
// gdbstub's socket is a file here).
func rearmsTimer(l *records.SandboxLease) bool {
	return onMalta(l) && virt.LocalURI(l.ConnectURI)
}

// keepsCleanState tells whether a revert of l should restore a clean state
// saved after its boot rather than boot again: not where its timer would
// come back stopped and cannot be re-armed (a Malta guest on another
// host), since such a revert took 29–31 s against a 5.5–8.5 s boot.
func keepsCleanState(l *records.SandboxLease) bool {
	return !onMalta(l) || rearmsTimer(l)
}

// timerKick restarts a stopped pseries guest's timer (see above): with
// busybox only, since the image's own tools vary. "LOC" is the powerpc
// timer interrupts' line in /proc/interrupts; tracefs is mounted for the
// kick only when the guest has not mounted it itself.
const timerKick = `b=/bin/busybox T=/sys/kernel/tracing m=
[ -e $T/trace_marker ] || { $b mount -t tracefs nodev $T && m=1; }
$b cat $T/trace_pipe >/dev/null & k=$!
l0=$($b grep LOC /proc/interrupts)
i=0
while [ $i -lt 200 ] && [ "$($b grep LOC /proc/interrupts)" = "$l0" ]; do echo talkbox-restore >$T/trace_marker; i=$((i+1)); done
$b kill $k; wait $k
[ -z "$m" ] || $b umount $T
`

// timersRun is the proof that a guest's timers run: a 1 ms sleep ends only
// on a timer interrupt.
const timersRun = "/bin/busybox usleep 1000"

// settleRestored runs, in a guest that was just restored from a save, what
// makes it whole and shows it is: the timer kick where its machine needs
// one, then then (a shell command, "" for none), then a 1 ms sleep. A guest
// whose timers do not run fails here when ctx ends, not later in a
// sample's cycle.
func settleRestored(ctx context.Context, g *virt.Guest, l *records.SandboxLease, then string) error {
	var script strings.Builder
	if stopsTimers(l) {
		script.WriteString(timerKick)
	}
	if then != "" {
		script.WriteString(then + " && ")
	}
	script.WriteString(timersRun)
	res, err := g.Run(ctx, "/bin/busybox", "sh", "-c", script.String())
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("the restored guest's timers do not run (a 1 ms sleep in it did not end): %w", err)
	}
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("settling the restored guest: exit %d: %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return nil
}
