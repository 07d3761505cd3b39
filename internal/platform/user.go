package platform

import (
	"fmt"
	"slices"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// UserHost is the platform whose image carries qemu-user-static with its
// targets registered with binfmt_misc: binaries of architectures no guest
// runs natively are executed inside that guest, never on the Talkbox host.
const UserHost = "amd64"

// UserTarget is one qemu-user target, as Debian bookworm's
// qemu-user-static (QEMU 7.2) ships it, and the binaries it runs.
type UserTarget struct {
	// Name is QEMU's target name: the emulator is qemu-<Name>-static and
	// an image lists Name in its user_emulators.
	Name string
	// Platform names the sample's own architecture as Debian or its
	// toolchain does (powerpc, sh4, sparc, …).
	Platform   string
	Arch       string // triage arch
	Bits       int    // ELF class
	Endianness string
	// ABI and ISA, when set, narrow the binaries to those whose triage ABI
	// name or ISA is this: the binfmt_misc masks tell MIPS o32 from n32 by
	// EF_MIPS_ABI2, and EM_SPARC32PLUS (triage ISA v8plus) from EM_SPARC.
	ABI string
	ISA string
	// NoBinfmt says why the emulator exists but binfmt_misc does not hand
	// it these binaries, so an exec in the guest would fail.
	NoBinfmt string
	// Excluded is set for the emulators the debian-bookworm-amd64 spec
	// leaves out of the image (hardening.exclude), so no image would list
	// them in user_emulators; a test keeps this in step with the spec.
	Excluded bool
}

// Emulator is the emulator binary in the guest.
func (u UserTarget) Emulator() string { return "qemu-" + u.Name + "-static" }

// Feature is the plan feature an image satisfies by listing Name in its
// user_emulators.
func (u UserTarget) Feature() string { return "qemu-user:" + u.Name }

// UserTargets lists the qemu-user targets Talkbox plans for, in match order
// (sparc32plus before sparc). They are the binfmt_misc entries of Debian
// bookworm's qemu-user-static (/usr/lib/binfmt.d/qemu-*.conf), plus the
// emulators it ships without an entry, which are listed so that the plan
// can say why they are not used.
func UserTargets() []UserTarget {
	const noEntry = "Debian bookworm's qemu-user-static ships %s but registers no binfmt_misc handler for it"
	return []UserTarget{
		{Name: "mips", Platform: "mips", Arch: "mips", Bits: 32, Endianness: "big", ABI: "o32"},
		{Name: "mipsel", Platform: "mipsel", Arch: "mips", Bits: 32, Endianness: "little", ABI: "o32"},
		{Name: "mipsn32", Platform: "mipsn32", Arch: "mips64", Bits: 32, Endianness: "big", ABI: "n32"},
		{Name: "mipsn32el", Platform: "mipsn32el", Arch: "mips64", Bits: 32, Endianness: "little", ABI: "n32"},
		{Name: "mips64", Platform: "mips64", Arch: "mips64", Bits: 64, Endianness: "big", ABI: "n64"},
		{Name: "mips64el", Platform: "mips64el", Arch: "mips64", Bits: 64, Endianness: "little", ABI: "n64", Excluded: true},
		{Name: "ppc", Platform: "powerpc", Arch: "ppc", Bits: 32, Endianness: "big"},
		{Name: "ppc64", Platform: "ppc64", Arch: "ppc64", Bits: 64, Endianness: "big"},
		{Name: "sh4", Platform: "sh4", Arch: "sh", Bits: 32, Endianness: "little"},
		{Name: "sh4eb", Platform: "sh4eb", Arch: "sh", Bits: 32, Endianness: "big"},
		{Name: "m68k", Platform: "m68k", Arch: "m68k", Bits: 32, Endianness: "big"},
		{Name: "sparc32plus", Platform: "sparc", Arch: "sparc", Bits: 32, Endianness: "big", ISA: "v8plus"},
		{Name: "sparc", Platform: "sparc", Arch: "sparc", Bits: 32, Endianness: "big"},
		{Name: "sparc64", Platform: "sparc64", Arch: "sparc64", Bits: 64, Endianness: "big"},
		// Little-endian ARM reaches here only as OABI, which the armhf
		// kernel lacks and qemu-arm decodes from the SWI immediate.
		{Name: "arm", Platform: "arm", Arch: "arm", Bits: 32, Endianness: "little", Excluded: true},
		{Name: "armeb", Platform: "armeb", Arch: "arm", Bits: 32, Endianness: "big"},
		{Name: "aarch64_be", Platform: "aarch64_be", Arch: "aarch64", Bits: 64, Endianness: "big",
			NoBinfmt: fmt.Sprintf(noEntry, "qemu-aarch64_be-static")},
		{Name: "riscv64", Platform: "riscv64", Arch: "riscv64", Bits: 64, Endianness: "little"},
		{Name: "riscv32", Platform: "riscv32", Arch: "riscv32", Bits: 32, Endianness: "little"},
		{Name: "loongarch64", Platform: "loong64", Arch: "loongarch64", Bits: 64, Endianness: "little", Excluded: true},
		{Name: "hppa", Platform: "hppa", Arch: "hppa", Bits: 32, Endianness: "big", Excluded: true},
		{Name: "alpha", Platform: "alpha", Arch: "alpha", Bits: 64, Endianness: "little", Excluded: true},
		{Name: "hexagon", Platform: "hexagon", Arch: "hexagon", Bits: 32, Endianness: "little", Excluded: true},
		{Name: "cris", Platform: "cris", Arch: "cris", Bits: 32, Endianness: "little", Excluded: true},
		{Name: "or1k", Platform: "or1k", Arch: "openrisc", Bits: 32, Endianness: "big",
			NoBinfmt: fmt.Sprintf(noEntry, "qemu-or1k-static")},
		{Name: "nios2", Platform: "nios2", Arch: "nios2", Bits: 32, Endianness: "little",
			NoBinfmt: fmt.Sprintf(noEntry, "qemu-nios2-static")},
		{Name: "microblazeel", Platform: "microblazeel", Arch: "microblaze", Bits: 32, Endianness: "little",
			NoBinfmt: fmt.Sprintf(noEntry, "qemu-microblazeel-static")},
	}
}

// userMode turns a binary no guest runs natively into a plan for UserHost
// under qemu-user, or adds to native's reason why that is impossible too.
func userMode(t records.Triage, abi string, static bool, native Match) Match {
	u, why := userTarget(t, abi)
	if u == nil {
		if why != "" {
			native.Reason += "; " + why
		}
		return native
	}
	if !static {
		// qemu-user runs the binary's own dynamic loader and C library
		// from the guest's file system; the UserHost image has only its
		// own architecture's.
		loader := "its dynamic loader"
		if t.Interpreter != "" {
			loader = t.Interpreter
		}
		native.Reason = fmt.Sprintf("%s; only static %s binaries run under %s in the %s guest: this one is dynamic and needs %s and %s libraries, which that guest does not have",
			native.Reason, u.Platform, u.Emulator(), UserHost, loader, u.Platform)
		return native
	}
	if u.Excluded {
		native.Reason = fmt.Sprintf("%s; %s would run it in the %s guest, but the debian-bookworm-%s image spec leaves it out (hardening.exclude)",
			native.Reason, u.Emulator(), UserHost, UserHost)
		return native
	}
	host, _ := Lookup(UserHost)
	return Match{Platform: host, Found: true, Features: append(slices.Clip(native.Features), u.Feature()), User: u, Native: native.Reason}
}

// userTarget finds the qemu-user target that runs the binary, or says why
// none does.
func userTarget(t records.Triage, abi string) (*UserTarget, string) {
	isa := ""
	if t.ABI != nil {
		isa = t.ABI.ISA
	}
	switch {
	case t.Arch == "":
		return nil, ""
	case t.Arch == "x86_64" && t.Bits == 32:
		return nil, "QEMU has no user-mode x32 target"
	case t.Arch == "aarch64" && t.Bits == 32:
		return nil, "QEMU has no user-mode AArch64 ILP32 target"
	case (t.Arch == "mips" || t.Arch == "mips64") && abi != "o32" && abi != "n32" && abi != "n64":
		return nil, fmt.Sprintf("MIPS ABI %q: Linux and qemu-user run only o32, n32 and n64 binaries", abi)
	case t.Arch == "sh" && slices.Contains([]string{"sh-dsp", "sh3-dsp", "sh4al-dsp", "sh2a", "sh2a-nofpu"}, isa):
		return nil, fmt.Sprintf("QEMU's sh4 emulator models SH-4 and SH-4A CPUs, which lack the %s instructions", isa)
	case t.Arch == "microblaze" && t.Endianness == "big":
		// Triage names both e_machine values microblaze, and the handler
		// matches only one, so a plan could not tell whether exec works.
		return nil, "Debian bookworm's binfmt_misc handler for qemu-microblaze-static matches only the old e_machine 0xbaab, not EM_MICROBLAZE (189), and triage does not record which of the two this binary has"
	case t.Arch == "xtensa":
		return nil, "qemu-xtensa emulates one fixed Xtensa core configuration, and triage cannot tell which core the binary was built for"
	case t.Arch == "s390":
		return nil, "QEMU has no user-mode target for 31-bit s390"
	case t.Arch == "arc" || t.Arch == "arc64":
		return nil, "QEMU 7.2 (Debian bookworm) has no ARC emulator"
	}
	for _, u := range UserTargets() {
		if u.Arch != t.Arch || u.Bits != t.Bits || u.Endianness != t.Endianness ||
			(u.ABI != "" && u.ABI != abi) || (u.ISA != "" && u.ISA != isa) {
			continue
		}
		if u.NoBinfmt != "" {
			return nil, u.NoBinfmt
		}
		return &u, ""
	}
	return nil, fmt.Sprintf("Debian bookworm's qemu-user-static has no emulator for %s (%d-bit %s-endian) binaries",
		orUnknown(t.Arch), t.Bits, t.Endianness)
}
