package lease_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/lease"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// TestRestorePseriesRealGuest: a ppc64el guest whose processes sleep in
// short steps (a timer event is nearly always pending) is snapshotted,
// which saves it and restores it in place, and the snapshot is restored as
// a new lease. QEMU 7.2 brings such a pseries guest back under TCG without
// timer interrupts (timers.go): its agent answers, but the new lease's
// re-addressing (`ip link set down` waits for an RCU grace period) and any
// sleep hang. Both guests must come back with timers that run. Without
// the timer kick, Restore fails with "the restored guest's timers do not
// run".
func TestRestorePseriesRealGuest(t *testing.T) {
	h := newRealGuestHost(t, "debian-bookworm-ppc64el", documentationLab)
	ctx := context.Background()
	m, stderr := h.m, h.stderr
	src := h.acquireOne(t, "ppc64el", 512)
	guestSh(t, m, src.ID, "(setsid /bin/busybox sh -c 'while :; do /bin/busybox usleep 3000; done' >/dev/null 2>&1 </dev/null &)")
	snap, err := m.Snapshot(ctx, src.ID)
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	restored, err := m.Restore(ctx, snap.ID, lease.Request{Holder: "cycle_r"})
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	for _, l := range []*records.SandboxLease{src, restored} {
		if out := guestSh(t, m, l.ID, "/bin/busybox usleep 1000 && echo slept"); strings.TrimSpace(out) != "slept" {
			t.Errorf("lease %s: a sleep in its guest: %q", l.ID, out)
		}
	}
	if out := guestSh(t, m, restored.ID, "/bin/busybox ip -4 -o addr show dev eth0"); !strings.Contains(out, restored.IP+"/") {
		t.Errorf("the restored guest does not have its lease's address %s: %q", restored.IP, out)
	}
}

// TestRestoreMaltaRealGuest: a mipsel guest whose CPU is kept busy (its
// kernel then ticks, so a timer event is always due, as right after a
// boot) is snapshotted, which saves it and restores it in place, and the
// snapshot is restored as a new lease. QEMU 7.2 does not arm a MIPS
// guest's compare timer again when it loads a save, so both guests would
// come back with no timer interrupt until their kernel writes Compare
// again, which took 13–31 s; tb-lease re-arms it through QEMU's gdbstub
// before the guest runs (virt.RearmMIPSTimer). The busy process is the
// witness, from inside the guest: it notes any 5 s of the guest's uptime
// (its clock reads Count, which runs on) without a timer interrupt, which
// a ticking kernel never has. Not less: a loaded host can keep QEMU's
// thread that fires the timer off a CPU for over a second, and the
// uptime is read before the interrupt count so that a pause between the
// two reads shows as an interrupt, not as a stall. Without the re-arm
// the test fails: "its guest's timer stopped: no timer interrupt from 8 s
// to 13 s of uptime".
func TestRestoreMaltaRealGuest(t *testing.T) {
	h := newRealGuestHost(t, "debian-bookworm-mipsel", documentationLab)
	ctx := context.Background()
	m, stderr := h.m, h.stderr
	src := h.acquireOne(t, "mipsel", 256)
	if out := guestSh(t, m, src.ID, "/bin/busybox grep -w timer /proc/interrupts"); strings.TrimSpace(out) == "" {
		t.Fatal("the guest has no timer line in /proc/interrupts")
	}
	guestSh(t, m, src.ID, `(setsid /bin/busybox sh -c '
b=/bin/busybox
read u r </proc/uptime; t0=$((${u%.*}*100+1${u#*.}-100)); c0=$($b grep -w timer /proc/interrupts)
: >/run/witness.up
while [ ! -e /run/witness.stop ]; do
  read u r </proc/uptime; t=$((${u%.*}*100+1${u#*.}-100))
  c=$($b grep -w timer /proc/interrupts)
  if [ "$c" != "$c0" ]; then c0=$c t0=$t
  elif [ $((t - t0)) -ge 500 ]; then echo "no timer interrupt from $((t0/100)) s to $((t/100)) s of uptime" >>/run/stalled; t0=$t
  fi
done' >/dev/null 2>&1 </dev/null &)`)
	// The snapshot is taken while the witness keeps the CPU busy.
	guestSh(t, m, src.ID, "while [ ! -e /run/witness.up ]; do /bin/busybox usleep 10000; done")
	snap, err := m.Snapshot(ctx, src.ID)
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	restored, err := m.Restore(ctx, snap.ID, lease.Request{Holder: "cycle_r"})
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	for _, l := range []*records.SandboxLease{src, restored} {
		if out := guestSh(t, m, l.ID, "/bin/busybox touch /run/witness.stop; /bin/busybox cat /run/stalled 2>/dev/null; true"); out != "" {
			t.Errorf("lease %s: its guest's timer stopped: %s", l.ID, out)
		}
		if out := guestSh(t, m, l.ID, "/bin/busybox usleep 1000 && echo slept"); strings.TrimSpace(out) != "slept" {
			t.Errorf("lease %s: a sleep in its guest: %q", l.ID, out)
		}
	}
	if out := guestSh(t, m, restored.ID, "/bin/busybox ip -4 -o addr show dev eth0"); !strings.Contains(out, restored.IP+"/") {
		t.Errorf("the restored guest does not have its lease's address %s: %q", restored.IP, out)
	}
}

// acquireOne stores a runnable plan for one vCPU of platform with
// memoryMiB and acquires a lease for it under TCG.
func (h *realGuestHost) acquireOne(t *testing.T, platform string, memoryMiB int) *records.SandboxLease {
	t.Helper()
	ctx := context.Background()
	p := &records.Plan{Runnable: true, Image: records.ImageNeeds{Platform: platform},
		Lease: records.LeaseNeeds{VCPUs: 1, MemoryMiB: memoryMiB, TTL: records.Duration(time.Hour)}}
	records.Init(p, records.KindPlan, h.st.Now())
	if err := h.st.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	l, err := h.m.Acquire(ctx, lease.Request{Plan: p, Holder: "cycle_p", Accel: "tcg"})
	if err != nil {
		t.Fatal(err, h.stderr.String())
	}
	return l
}
