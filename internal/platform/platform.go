// Package platform is the catalogue of guest platforms Talkbox can run
// samples on, of the qemu-user targets that run the long tail inside one of
// them, and the rules that match a triaged binary to a platform or target.
package platform

import (
	"fmt"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Platform is one guest architecture, named as Debian names it.
type Platform struct {
	Name       string // Debian architecture: amd64, armhf, mipsel, …
	Arch       string // triage arch it runs natively
	Bits       int
	Endianness string
	// QEMU system emulator and machine type that boot it.
	QEMU    string
	Machine string
	// Images says whether Talkbox ships an image spec for it (Debian
	// bookworm); a platform without one is known but not runnable yet.
	Images bool
	// Why explains a platform without images.
	Why string
}

// Catalogue lists every platform Talkbox knows, in preference order.
func Catalogue() []Platform {
	return []Platform{
		{Name: "amd64", Arch: "x86_64", Bits: 64, Endianness: "little", QEMU: "qemu-system-x86_64", Machine: "q35", Images: true},
		{Name: "i386", Arch: "x86", Bits: 32, Endianness: "little", QEMU: "qemu-system-i386", Machine: "pc", Images: true},
		{Name: "arm64", Arch: "aarch64", Bits: 64, Endianness: "little", QEMU: "qemu-system-aarch64", Machine: "virt", Images: true},
		{Name: "armhf", Arch: "arm", Bits: 32, Endianness: "little", QEMU: "qemu-system-arm", Machine: "virt", Images: true},
		{Name: "armel", Arch: "arm", Bits: 32, Endianness: "little", QEMU: "qemu-system-arm", Machine: "virt", Images: true},
		{Name: "mipsel", Arch: "mips", Bits: 32, Endianness: "little", QEMU: "qemu-system-mipsel", Machine: "malta", Images: true},
		{Name: "mips64el", Arch: "mips64", Bits: 64, Endianness: "little", QEMU: "qemu-system-mips64el", Machine: "malta", Images: true},
		{Name: "mips", Arch: "mips", Bits: 32, Endianness: "big", QEMU: "qemu-system-mips", Machine: "malta", Why: "Debian bookworm has no big-endian MIPS port"},
		{Name: "mips64", Arch: "mips64", Bits: 64, Endianness: "big", QEMU: "qemu-system-mips64", Machine: "malta", Why: "Debian has no big-endian MIPS64 port"},
		{Name: "ppc64el", Arch: "ppc64", Bits: 64, Endianness: "little", QEMU: "qemu-system-ppc64", Machine: "pseries", Images: true},
		{Name: "ppc64", Arch: "ppc64", Bits: 64, Endianness: "big", QEMU: "qemu-system-ppc64", Machine: "pseries", Why: "big-endian PowerPC 64 is not a Debian bookworm release architecture"},
		{Name: "powerpc", Arch: "ppc", Bits: 32, Endianness: "big", QEMU: "qemu-system-ppc", Machine: "mac99", Why: "32-bit PowerPC is not a Debian bookworm release architecture"},
		{Name: "s390x", Arch: "s390x", Bits: 64, Endianness: "big", QEMU: "qemu-system-s390x", Machine: "s390-ccw-virtio", Images: true},
		{Name: "riscv64", Arch: "riscv64", Bits: 64, Endianness: "little", QEMU: "qemu-system-riscv64", Machine: "virt", Why: "riscv64 is not a Debian bookworm release architecture"},
	}
}

// Lookup finds a platform by its Debian name.
func Lookup(name string) (Platform, bool) {
	for _, p := range Catalogue() {
		if p.Name == name {
			return p, true
		}
	}
	return Platform{}, false
}

// Match is the platform a sample needs, or why none can run it.
type Match struct {
	Platform Platform
	Found    bool   // a catalogue platform runs this binary
	Reason   string // why it is not runnable (empty when runnable)
	Features []string
	// User is set when Platform is UserHost and the sample runs in it under
	// a qemu-user emulator; Native then says why no guest runs it natively.
	User   *UserTarget
	Native string
}

// Runnable reports whether an image can run the sample.
func (m Match) Runnable() bool { return m.Found && m.Platform.Images && m.Reason == "" }

// For matches a triaged sample to the platform that runs it natively.
func For(t records.Triage) Match {
	if t.Problem != "" {
		return Match{Reason: t.Problem}
	}
	switch t.Format {
	case "elf":
		return forELF(t)
	case "script":
		// Scripts are architecture-neutral; the first platform has the interpreters.
		m := Match{Platform: Catalogue()[0], Found: true, Features: []string{"interpreter:" + t.Interpreter}}
		return m
	case "pe":
		return Match{Reason: "Windows PE (" + orUnknown(t.Arch) + ") needs a Windows guest; Talkbox images are Linux"}
	case "macho":
		return Match{Reason: "Mach-O needs a macOS guest; Talkbox images are Linux"}
	case "zip", "gzip", "tar":
		return Match{Reason: t.Format + " archive: unpack it and plan its members"}
	}
	return Match{Reason: "unknown format: not an executable Talkbox recognises"}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown architecture"
	}
	return s
}

func forELF(t records.Triage) Match {
	if t.OS != "" && t.OS != "linux" && t.OS != "sysv" && t.OS != "gnu" {
		return Match{Reason: fmt.Sprintf("ELF for %s: Talkbox guests run Linux", t.OS)}
	}
	if t.Type == "object" || t.Type == "core" {
		return Match{Reason: "ELF " + t.Type + " file: not executable"}
	}
	abi := ""
	if t.ABI != nil {
		abi = t.ABI.Name
	}
	static := t.Static != nil && *t.Static
	var features []string
	if static {
		features = append(features, "static")
	} else if t.Interpreter != "" {
		features = append(features, "interpreter:"+t.Interpreter)
	}
	name, reason := platformName(t, abi, static)
	m := Match{Reason: reason, Features: features}
	if name != "" {
		p, _ := Lookup(name)
		m.Platform, m.Found = p, true
		if m.Reason == "" && !p.Images {
			m.Reason = fmt.Sprintf("needs a %s guest: %s", p.Name, p.Why)
		}
	}
	if m.Runnable() {
		return m
	}
	return userMode(t, abi, static, m)
}

// platformName picks the Debian architecture whose kernel and libraries run
// the binary; reason is set when the binary needs something no image has.
func platformName(t records.Triage, abi string, static bool) (string, string) {
	le := t.Endianness == "little"
	switch t.Arch {
	case "x86_64":
		if t.Bits == 32 {
			return "", "x32 ABI binaries need a kernel booted with syscall.x32=y; no image provides it"
		}
		return "amd64", ""
	case "x86":
		return "i386", ""
	case "aarch64":
		if t.Bits == 32 {
			return "", "AArch64 ILP32 binaries need a kernel with ILP32 support; mainline Linux has none"
		}
		if !le {
			return "", "big-endian AArch64: no image"
		}
		return "arm64", ""
	case "arm":
		if !le {
			return "", "big-endian ARM: no image"
		}
		switch {
		case abi == "oabi":
			return "armhf", "ARM OABI needs a kernel with OABI compatibility; the armhf image has none"
		case strings.HasSuffix(abi, "-sf") && !static:
			return "armel", ""
		}
		// The armhf kernel runs any EABI binary; hard-float and static
		// soft-float ones need nothing more.
		return "armhf", ""
	case "mips":
		if t.ABI != nil && strings.HasSuffix(t.ABI.ISA, "r6") {
			return "", "MIPS R6 binaries need an R6 CPU and kernel; the MIPS images are R2"
		}
		if le {
			return "mipsel", ""
		}
		return "mips", ""
	case "mips64":
		if t.ABI != nil && strings.HasSuffix(t.ABI.ISA, "r6") {
			return "", "MIPS R6 binaries need an R6 CPU and kernel; the MIPS images are R2"
		}
		if !le {
			return "mips64", ""
		}
		if abi == "n32" && !static {
			return "mips64el", "dynamic MIPS n32 binaries need n32 libraries; the mips64el image has n64 only"
		}
		return "mips64el", ""
	case "ppc64":
		if le {
			return "ppc64el", ""
		}
		return "ppc64", ""
	case "ppc":
		return "powerpc", ""
	case "s390x":
		return "s390x", ""
	case "riscv64":
		return "riscv64", ""
	case "":
		return "", "ELF with an unrecognised machine"
	}
	return "", fmt.Sprintf("no Talkbox guest runs %s (%d-bit %s-endian) binaries", t.Arch, t.Bits, t.Endianness)
}
