package image_test

import (
	"context"
	"debug/elf"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// forkExecSelf prints the machine uname(2) reports, then forks and execs
// itself once, so that the child's line proves the emulation reaches a
// sample's children too (they go through binfmt_misc again). It uses no
// libc, as IoT samples carry a tiny one of their own, and because Debian
// bookworm's sh4 glibc, built by a gcc that drops tests against zero at -O1
// and above, never reaches main (see internal/demo/cbeacon/sh4-sysroot.sh):
// a glibc build would test glibc, not the emulation. For the same reason
// it is compiled at -O0.
const forkExecSelf = `#if defined(__mips__)
#define NR(n) (4000 + (n))
static long sys4(long n, long a, long b, long c, long d) {
	register long v0 __asm__("$2") = n;
	register long a0 __asm__("$4") = a, a1 __asm__("$5") = b, a2 __asm__("$6") = c, a3 __asm__("$7") = d;
	__asm__ volatile("syscall" : "+r"(v0), "+r"(a3) : "r"(a0), "r"(a1), "r"(a2)
		: "$1", "$3", "$8", "$9", "$10", "$11", "$12", "$13", "$14", "$15", "$24", "$25", "hi", "lo", "memory");
	return a3 ? -v0 : v0;
}
__asm__(".text\n.globl tb_start\n.set noreorder\ntb_start:\n move $4, $29\n addiu $29, $29, -32\n jal cstart\n nop\n.set reorder\n");
#elif defined(__powerpc__)
#define NR(n) (n)
static long sys4(long n, long a, long b, long c, long d) {
	register long r0 __asm__("r0") = n;
	register long r3 __asm__("r3") = a, r4 __asm__("r4") = b, r5 __asm__("r5") = c, r6 __asm__("r6") = d;
	__asm__ volatile("sc\n\tbns+ 1f\n\tneg 3,3\n1:" : "+r"(r0), "+r"(r3), "+r"(r4), "+r"(r5), "+r"(r6)
		: : "r7", "r8", "r9", "r10", "r11", "r12", "cr0", "ctr", "memory");
	return r3;
}
__asm__(".text\n.globl tb_start\ntb_start:\n mr 3,1\n clrrwi 1,1,4\n li 0,0\n stwu 0,-16(1)\n bl cstart\n");
#elif defined(__sh__)
#define NR(n) (n)
static long sys4(long n, long a, long b, long c, long d) {
	register long r3 __asm__("r3") = n;
	register long r4 __asm__("r4") = a, r5 __asm__("r5") = b, r6 __asm__("r6") = c, r7 __asm__("r7") = d;
	register long r0 __asm__("r0");
	__asm__ volatile("trapa #0x14" : "=z"(r0) : "r"(r3), "r"(r4), "r"(r5), "r"(r6), "r"(r7) : "memory", "t");
	return r0;
}
__asm__(".text\n.globl tb_start\ntb_start:\n mov r15,r4\n mov.l 1f,r0\n jsr @r0\n nop\n .align 2\n1: .long cstart\n");
#else
#error unsupported architecture
#endif

struct utsname { char sysname[65], nodename[65], release[65], version[65], machine[65], domain[65]; };

static void out(const char *s) {
	long n = 0;
	while (s[n])
		n++;
	sys4(NR(4), 1, (long)s, n, 0);
}

static __attribute__((noreturn)) void quit(long code) {
	for (;;)
		sys4(NR(1), code, 0, 0, 0);
}

__attribute__((noreturn, used)) void cstart(long *sp) {
	long argc = sp[0];
	char **argv = (char **)(sp + 1), **envp = argv + argc + 1;
	char *av[3] = {argv[0], "child", 0};
	struct utsname u;
	int st = 0;
	long p;
	if (sys4(NR(122), (long)&u, 0, 0, 0) < 0)
		quit(2);
	out(argc > 1 ? "child " : "parent ");
	out(u.machine);
	out("\n");
	if (argc > 1)
		quit(0);
	p = sys4(NR(2), 0, 0, 0, 0);
	if (p == 0) {
		sys4(NR(11), (long)argv[0], (long)av, (long)envp, 0);
		quit(3);
	}
	if (p < 0 || sys4(NR(114), p, (long)&st, 0, 0) != p)
		quit(4);
	quit((st & 0x7f) == 0 ? (st >> 8) & 0xff : 5);
}
`

// TestUserModeEmulation runs static big-endian MIPS, 32-bit PowerPC and
// SuperH binaries inside a real amd64 guest of the fixture image, through
// the qemu-user-static entries talkbox-init registers with binfmt_misc:
// the architectures without a Debian kernel run behind the VM boundary,
// never on the host. The cross compilers come from scripts/deps.sh
// (gcc-mips-linux-gnu, gcc-powerpc-linux-gnu, gcc-sh4-linux-gnu).
func TestUserModeEmulation(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (libvirt guests); run it with make test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	targets := []struct {
		emulator, gcc, uname string
		flags                []string
		machine              elf.Machine
		data                 elf.Data
	}{
		// -G0 -mno-abicalls: no $gp set-up, which the bare entry point
		// does not do.
		{"mips", "mips-linux-gnu-gcc", "mips", []string{"-G0", "-mno-abicalls"}, elf.EM_MIPS, elf.ELFDATA2MSB},
		{"ppc", "powerpc-linux-gnu-gcc", "ppc", nil, elf.EM_PPC, elf.ELFDATA2MSB},
		{"sh4", "sh4-linux-gnu-gcc", "sh4", nil, elf.EM_SH, elf.ELFDATA2LSB},
	}
	dir := t.TempDir()
	if err := leasetest.Reachable(dir); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "forkexec.c")
	if err := os.WriteFile(src, []byte(forkExecSelf), 0o644); err != nil {
		t.Fatal(err)
	}
	// Compiled, and checked to be foreign, but never run on the host.
	for _, tg := range targets {
		out := filepath.Join(dir, tg.emulator)
		args := append([]string{"-static", "-nostdlib", "-ffreestanding", "-fno-builtin", "-fno-stack-protector", "-fno-pic", "-no-pie",
			"-O0", "-Wl,-e,tb_start", "-o", out, src}, tg.flags...)
		if b, err := exec.CommandContext(ctx, tg.gcc, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s (scripts/deps.sh installs it): %v\n%s", tg.gcc, err, b)
		}
		f, err := elf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		if f.Machine != tg.machine || f.Class != elf.ELFCLASS32 || f.Data != tg.data {
			t.Fatalf("%s built a %v %v %v binary", tg.gcc, f.Machine, f.Class, f.Data)
		}
		f.Close()
	}

	fx, err := leasetest.Image(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets {
		if !slices.Contains(fx.Image.UserEmulators, tg.emulator) {
			t.Fatalf("image %s records user emulators %v, want %s among them", fx.Image.ID, fx.Image.UserEmulators, tg.emulator)
		}
	}
	g := bootFixture(ctx, t, fx, dir)

	for _, tg := range targets {
		t.Run(tg.emulator, func(t *testing.T) {
			// A hung emulator fails the subtest instead of the whole run.
			ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			b, err := os.ReadFile(filepath.Join(dir, tg.emulator))
			if err != nil {
				t.Fatal(err)
			}
			p := "/tmp/forkexec-" + tg.emulator
			if _, err := g.WriteFile(ctx, p, strings.NewReader(string(b))); err != nil {
				t.Fatal(err)
			}
			if r, err := g.Run(ctx, "/bin/chmod", "0755", p); err != nil || r.ExitCode != 0 {
				t.Fatalf("chmod: %v %+v", err, r)
			}
			r, err := g.Run(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("parent %s\nchild %s\n", tg.uname, tg.uname)
			if r.ExitCode != 0 || string(r.Stdout) != want {
				t.Fatalf("%s in the guest: exit %d, stdout %q, stderr %q; want stdout %q", p, r.ExitCode, r.Stdout, r.Stderr, want)
			}
		})
	}
}

// bootFixture boots the fixture image on a throw-away overlay with no
// network interface at all (nothing here needs one) and waits for its
// agent; the guest is destroyed when the test ends. It pushes and runs
// through guestagent, as tb-run does.
func bootFixture(ctx context.Context, t *testing.T, fx *leasetest.Fixture, dir string) *virt.Guest {
	t.Helper()
	img := fx.Image
	overlay := filepath.Join(dir, "overlay.qcow2")
	if b, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2",
		"-b", filepath.Join(img.Dir, img.Boot.Disk), overlay).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v\n%s", err, b)
	}
	hv, err := virt.Connect(virt.DefaultURI)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hv.Close() })
	accel := virt.TCG
	if virt.GuestCanUseKVM(img.Boot.Arch) {
		r, err := virt.ProbeAccel(ctx, virt.ProbeConfig{Emulator: img.Boot.Emulator, Machine: img.Boot.Machine,
			Kernel: filepath.Join(img.Dir, img.Boot.Kernel), CacheDir: filepath.Join(fx.State, "virt")})
		if err != nil {
			t.Fatal(err)
		}
		accel = r.Accel
	}
	emulator, err := exec.LookPath(img.Boot.Emulator)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("tb-usermode-%08x", rand.Uint32())
	console := filepath.Join(dir, "console.log")
	cfg := virt.DomainConfig{
		Name: name, Accel: accel, Emulator: emulator, Arch: img.Boot.Arch, Machine: img.Boot.Machine,
		CPU: img.Boot.CPU, MemoryMiB: img.Boot.MemoryMiB, VCPUs: img.Boot.VCPUs,
		Kernel: filepath.Join(img.Dir, img.Boot.Kernel), Initrd: filepath.Join(img.Dir, img.Boot.Initrd),
		Cmdline:    img.Boot.Cmdline + " talkbox.net=none",
		Disks:      []virt.Disk{{Path: overlay, Format: "qcow2", Bus: img.Boot.DiskBus}},
		ConsoleLog: console,
	}
	if err := hv.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hv.Destroy(context.WithoutCancel(ctx), name) })
	g := virt.NewGuest(hv, name, console)
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := g.WaitAgent(wctx); err != nil {
		t.Fatal(err)
	}
	return g
}
