package lease

import (
	"context"
	"fmt"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Malta's PCI interrupts.
//
// QEMU's Malta has two PCI interrupt lines for three virtio devices: the
// guest's kernel routes them to the PIIX4's i8259 as lines 10 and 11, and
// the agent's virtio-serial shares line 10 with the disk. PCI interrupts
// are level-triggered, but only the board's firmware (YAMON) marks those
// lines so in the PIIX4's edge/level control register (ELCR), and QEMU
// boots the kernel without it: the lines stay edge-triggered. When the
// second device raises a line the first still holds, no edge comes, the
// first's interrupt is served and the second's is lost for good, and the
// line stays up: the disk and the agent both stop answering. A make test
// saw a traced sample that never exited and an agent silent for minutes;
// a guest reading its disk while the host keeps its agent busy falls
// silent within seconds (TestMaltaSharedInterruptLine).
//
// The guest's root sets the two lines level-triggered through /dev/port
// as soon as its agent answers, before the lease is ready. The boot
// itself runs edge-triggered; so would a guest that rebooted itself
// (QEMU's reset clears the register), and a sample with root can clear
// it, which stalls only its own guest.

// maltaPCILines are the ELCR bits of lines 10 and 11 in the slave i8259's
// register (I/O port 0x4d1, one bit per line from line 8).
const (
	maltaELCRPort  = 0x4d1
	maltaPCILines  = 1<<(10-8) | 1<<(11-8)
	maltaLevelTrig = `p=/dev/port o=$1 want=$2
b=/bin/busybox
get() { $b dd if=$p bs=1 skip=$o count=1 2>/dev/null | $b od -An -tu1; }
v=$(get) || exit 1
v=$(( ${v:-0} | want ))
printf "\\$(printf %o "$v")" | $b dd of=$p bs=1 seek=$o count=1 conv=notrunc 2>/dev/null || exit 1
w=$(get)
[ $(( ${w:-0} & want )) -eq "$want" ] || { echo "ELCR reads ${w:-nothing} after writing $v" >&2; exit 1; }`
)

// agentAnswered readies a guest that has just booted and whose agent
// answers, before anything else uses it: on Malta it sets the PCI
// interrupt lines level-triggered (see above). Every boot of a lease's
// guest comes through here (acquire, and the reboots of heal and revert).
func agentAnswered(ctx context.Context, c Host, l *records.SandboxLease, img *records.SandboxImage) error {
	if img.Boot.Machine != "malta" {
		return nil
	}
	r, err := guestagent.New(c, l.VMName).Run(ctx, "/bin/busybox", "sh", "-c", maltaLevelTrig, "tb-lease", fmt.Sprint(maltaELCRPort), fmt.Sprint(maltaPCILines))
	if err != nil {
		return fmt.Errorf("setting Malta's PCI interrupts level-triggered: %w", err)
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("setting Malta's PCI interrupts level-triggered: exit %d: %s", r.ExitCode, strings.TrimSpace(string(r.Stderr)))
	}
	return nil
}
