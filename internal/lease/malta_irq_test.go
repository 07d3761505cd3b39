package lease_test

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestMaltaSharedInterruptLine: on QEMU's Malta the guest agent's
// virtio-serial shares PCI interrupt line 10 with the disk, and QEMU boots
// the kernel without the firmware that sets the PCI lines level-triggered
// in the PIIX4's i8259; tb-lease does (malta.go). Edge-triggered, a line
// that two devices hold up at once gives no new edge when one of them is
// served, and both go unanswered for good. A make test saw it as a traced
// sample that never exited and an agent silent for minutes
// (TestBehaviourEndToEnd/mipsel). Here the guest reads its disk without
// the page cache while the host keeps the agent busy for 20 s. Without
// tb-lease's level-triggering the agent fell silent after 8 and 75
// commands (two runs of a 45 s window) and after 14 (this one); with it,
// it answered 837 and 806 commands in 45 s. The lease is then reverted,
// which boots a Malta guest again, and the new boot's lines are checked.
func TestMaltaSharedInterruptLine(t *testing.T) {
	h := newRealGuestHost(t, "debian-bookworm-mipsel", documentationLab)
	m := h.m
	l := h.acquireOne(t, "mipsel", 256)
	guestSh(t, m, l.ID, `(setsid /bin/busybox sh -c '
while [ ! -e /run/reader.stop ]; do /bin/dd if=/dev/vda of=/dev/null bs=4k count=2048 iflag=direct 2>/dev/null; done' >/dev/null 2>&1 </dev/null &)`)
	end := time.Now().Add(20 * time.Second)
	n := 0
	for ; time.Now().Before(end); n++ {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r, err := m.Exec(ctx, l.ID, []string{"/bin/busybox", "cat", "/proc/interrupts"})
		cancel()
		if err != nil {
			t.Fatalf("after %d agent commands beside the disk reads: %v", n, err)
		}
		if n == 0 && !strings.Contains(string(r.Stdout), "virtio") {
			t.Fatalf("no virtio line in /proc/interrupts: %s", r.Stdout)
		}
	}
	t.Logf("%d agent commands beside the disk reads", n)

	// A Malta lease keeps no clean state: its revert boots the guest
	// again, and the lines are set on that boot too.
	if _, err := m.Release(context.Background(), l.ID, true); err != nil {
		t.Fatal(err)
	}
	again := h.acquireOne(t, "mipsel", 256)
	if again.ID != l.ID || len(again.Reverts) != 1 || again.Reverts[0].How != "boot" {
		t.Fatalf("lease %s, reverts %+v: want %s reverted by a boot", again.ID, again.Reverts, l.ID)
	}
	if out := guestSh(t, m, again.ID, "/bin/busybox dd if=/dev/port bs=1 skip=1233 count=1 2>/dev/null | /bin/busybox od -An -tu1"); strings.TrimSpace(out) != "12" {
		t.Errorf("after the revert's boot the ELCR of lines 8-15 reads %q, want 12 (lines 10 and 11 level-triggered)", out)
	}
}
