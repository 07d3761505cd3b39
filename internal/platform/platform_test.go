package platform

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/elftest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/triage"
)

// elfCase is one binary, built as a real ELF header and triaged, and the
// plan it must get.
type elfCase struct {
	name     string
	spec     elftest.Spec
	platform string // Match.Platform.Name ("" when none)
	user     string // qemu-user target ("" when native or not runnable)
	runnable bool
	reason   []string // substrings of Reason (not runnable) or Native (emulated)
}

// Flags used below: MIPS EF_MIPS_ARCH_32R2|o32 (0x70001000), ARCH_64R2
// (0x80000000), ARCH_32R6 (0x90000000), EF_MIPS_ABI2 n32 (0x20); ARM
// EABI5 (0x05000000), hard float (0x400), BE8 (0x800000); SH EF_SH4 (9),
// EF_SH_DSP (4); RISC-V RVC|double (5).
var elfCases = []elfCase{
	{"amd64 static", elftest.Spec{Machine: 62, Bits: 64}, "amd64", "", true, nil},
	{"armhf dynamic", elftest.Spec{Machine: 40, Bits: 32, Flags: 0x05000400, Interp: "/lib/ld-linux-armhf.so.3"}, "armhf", "", true, nil},
	{"armel dynamic", elftest.Spec{Machine: 40, Bits: 32, Flags: 0x05000200, Interp: "/lib/ld-linux.so.3"}, "armel", "", true, nil},
	{"mipsel o32 static", elftest.Spec{Machine: 8, Bits: 32, Flags: 0x70001000}, "mipsel", "", true, nil},
	{"ppc64el", elftest.Spec{Machine: 21, Bits: 64, Flags: 2}, "ppc64el", "", true, nil},

	{"mips o32 static", elftest.Spec{Machine: 8, Bits: 32, Big: true, Flags: 0x70001007}, "amd64", "mips", true,
		[]string{"no big-endian MIPS port"}},
	{"mips n32 static", elftest.Spec{Machine: 8, Bits: 32, Big: true, Flags: 0x80000020}, "amd64", "mipsn32", true, nil},
	{"mips64 n64 static", elftest.Spec{Machine: 8, Bits: 64, Big: true, Flags: 0x80000007}, "amd64", "mips64", true, nil},
	{"mipsel r6 static", elftest.Spec{Machine: 8, Bits: 32, Flags: 0x90001000}, "amd64", "mipsel", true, []string{"R6"}},
	{"mipsel n32 r6 static", elftest.Spec{Machine: 8, Bits: 32, Flags: 0xa0000020}, "amd64", "mipsn32el", true, []string{"R6"}},
	{"ppc static", elftest.Spec{Machine: 20, Bits: 32, Big: true}, "amd64", "ppc", true, []string{"32-bit PowerPC"}},
	{"ppc64 elfv1 static", elftest.Spec{Machine: 21, Bits: 64, Big: true, Flags: 1}, "amd64", "ppc64", true, nil},
	{"ppc64 elfv2 static", elftest.Spec{Machine: 21, Bits: 64, Big: true, Flags: 2}, "amd64", "ppc64", true, nil},
	{"sh4 static", elftest.Spec{Machine: 42, Bits: 32, Flags: 9}, "amd64", "sh4", true, []string{"no Talkbox guest runs sh"}},
	{"sh4eb static", elftest.Spec{Machine: 42, Bits: 32, Big: true, Flags: 9}, "amd64", "sh4eb", true, nil},
	{"m68k static", elftest.Spec{Machine: 4, Bits: 32, Big: true}, "amd64", "m68k", true, nil},
	{"coldfire static", elftest.Spec{Machine: 4, Bits: 32, Big: true, Flags: 0x10}, "amd64", "m68k", true, nil},
	{"sparc v8 static", elftest.Spec{Machine: 2, Bits: 32, Big: true}, "amd64", "sparc", true, nil},
	{"sparc v8plus static", elftest.Spec{Machine: 18, Bits: 32, Big: true}, "amd64", "sparc32plus", true, nil},
	{"sparc64 static", elftest.Spec{Machine: 43, Bits: 64, Big: true}, "amd64", "sparc64", true, nil},
	{"armeb be8 static", elftest.Spec{Machine: 40, Bits: 32, Big: true, Flags: 0x05800000}, "amd64", "armeb", true, []string{"big-endian ARM"}},

	{"riscv64 static", elftest.Spec{Machine: 243, Bits: 64, Flags: 5}, "amd64", "riscv64", true, []string{"riscv64 is not"}},
	{"riscv32 static", elftest.Spec{Machine: 243, Bits: 32, Flags: 5}, "amd64", "riscv32", true, nil},

	// Dynamic long-tail binaries need their own C library in the guest.
	{"mips o32 dynamic", elftest.Spec{Machine: 8, Bits: 32, Big: true, Flags: 0x70001007, Interp: "/lib/ld.so.1"}, "mips", "", false,
		[]string{"no big-endian MIPS port", "only static mips binaries run under qemu-mips-static", "dynamic", "/lib/ld.so.1"}},
	{"ppc dynamic", elftest.Spec{Machine: 20, Bits: 32, Big: true, Interp: "/lib/ld.so.1"}, "powerpc", "", false,
		[]string{"qemu-ppc-static", "dynamic"}},
	{"sparc dynamic", elftest.Spec{Machine: 2, Bits: 32, Big: true, Interp: "/lib/ld-linux.so.2"}, "", "", false,
		[]string{"no Talkbox guest runs sparc", "qemu-sparc-static", "/lib/ld-linux.so.2"}},
	{"mips64el n32 dynamic", elftest.Spec{Machine: 8, Bits: 32, Flags: 0x80000020, Interp: "/lib32/ld.so.1"}, "mips64el", "", false,
		[]string{"n32 libraries", "qemu-mipsn32el-static", "dynamic"}},
	{"arm oabi dynamic", elftest.Spec{Machine: 40, Bits: 32, OSABI: 3, Interp: "/lib/ld-linux.so.2"}, "armhf", "", false,
		[]string{"OABI", "qemu-arm-static", "dynamic"}},

	// Debian's qemu-user-static runs these, but the amd64 image leaves the
	// emulator out.
	{"mips64el r6 static", elftest.Spec{Machine: 8, Bits: 64, Flags: 0xa0000000}, "", "", false, []string{"R6", "qemu-mips64el-static would run it", "leaves it out"}},
	{"arm oabi static", elftest.Spec{Machine: 40, Bits: 32, OSABI: 3}, "armhf", "", false, []string{"OABI", "qemu-arm-static would run it"}},
	{"loongarch64 static", elftest.Spec{Machine: 258, Bits: 64, Flags: 3}, "", "", false, []string{"qemu-loongarch64-static would run it"}},
	{"hppa static", elftest.Spec{Machine: 15, Bits: 32, Big: true}, "", "", false, []string{"qemu-hppa-static"}},
	{"alpha static", elftest.Spec{Machine: 0x9026, Bits: 64}, "", "", false, []string{"qemu-alpha-static"}},

	// Nothing in the guest runs these.
	{"aarch64_be static", elftest.Spec{Machine: 183, Bits: 64, Big: true}, "", "", false,
		[]string{"big-endian AArch64", "qemu-aarch64_be-static", "no binfmt_misc handler"}},
	{"aarch64 ilp32", elftest.Spec{Machine: 183, Bits: 32}, "", "", false, []string{"ILP32"}},
	{"x32", elftest.Spec{Machine: 62, Bits: 32}, "", "", false, []string{"x32"}},
	{"sh-dsp static", elftest.Spec{Machine: 42, Bits: 32, Flags: 4}, "", "", false, []string{"sh-dsp"}},
	{"s390 31-bit", elftest.Spec{Machine: 22, Bits: 32, Big: true}, "", "", false, []string{"31-bit s390"}},
	{"xtensa", elftest.Spec{Machine: 94, Bits: 32}, "", "", false, []string{"Xtensa core"}},
	{"or1k", elftest.Spec{Machine: 92, Bits: 32, Big: true}, "", "", false, []string{"qemu-or1k-static"}},
	{"microblaze", elftest.Spec{Machine: 189, Bits: 32, Big: true}, "", "", false, []string{"0xbaab"}},
	{"arc", elftest.Spec{Machine: 195, Bits: 32}, "", "", false, []string{"ARC"}},
	{"ppc little-endian", elftest.Spec{Machine: 20, Bits: 32}, "powerpc", "", false, []string{"no emulator for ppc (32-bit little-endian)"}},
	{"freebsd mips", elftest.Spec{Machine: 8, Bits: 32, Big: true, OSABI: 9, Flags: 0x70001007}, "", "", false, []string{"freebsd"}},
}

func TestForELF(t *testing.T) {
	for _, c := range elfCases {
		tr := inspectBytes(elftest.Build(c.spec))
		if tr.Problem != "" {
			t.Fatalf("%s: triage: %s", c.name, tr.Problem)
		}
		m := For(tr)
		user := ""
		if m.User != nil {
			user = m.User.Name
		}
		if m.Platform.Name != c.platform || user != c.user || m.Runnable() != c.runnable {
			t.Errorf("%s (%s %d-bit %s %+v): platform=%q user=%q runnable=%v reason=%q; want %q %q %v",
				c.name, tr.Arch, tr.Bits, tr.Endianness, tr.ABI, m.Platform.Name, user, m.Runnable(), m.Reason, c.platform, c.user, c.runnable)
			continue
		}
		why := m.Reason
		if m.User != nil {
			why = m.Native
			if !strings.Contains(strings.Join(m.Features, " "), "qemu-user:"+user) || m.Reason != "" {
				t.Errorf("%s: emulated match features %q reason %q", c.name, m.Features, m.Reason)
			}
		}
		for _, s := range c.reason {
			if !strings.Contains(why, s) {
				t.Errorf("%s: reason %q does not say %q", c.name, why, s)
			}
		}
		if !c.runnable && why == "" {
			t.Errorf("%s: not runnable without a reason", c.name)
		}
	}
}

// TestUserTargetsAreDebians checks the catalogue against Debian's
// qemu-user-static (scripts/deps.sh installs it): every target has its
// emulator, and a binfmt_misc entry exactly when the catalogue says so.
// Then each emulated case above must be claimed by its target's entry and
// by no other, as the kernel in the guest would pick it.
func TestUserTargetsAreDebians(t *testing.T) {
	entries := map[string]binfmt{}
	for _, u := range UserTargets() {
		if _, err := os.Stat(filepath.Join("/usr/bin", u.Emulator())); err != nil {
			t.Errorf("%s: %v (install qemu-user-static)", u.Name, err)
		}
		b, err := readBinfmt(filepath.Join("/usr/lib/binfmt.d", "qemu-"+u.Name+".conf"))
		switch {
		case err != nil && u.NoBinfmt == "":
			t.Errorf("%s: %v", u.Name, err)
		case err == nil && u.NoBinfmt != "":
			t.Errorf("%s: Debian registers it now; drop NoBinfmt", u.Name)
		case err == nil:
			entries[u.Name] = b
		}
	}
	others, _ := filepath.Glob("/usr/lib/binfmt.d/qemu-*.conf")
	for _, f := range others {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "qemu-"), ".conf")
		if _, ok := entries[name]; ok {
			continue
		}
		if !notPlanned[name] {
			t.Errorf("Debian registers qemu-%s, which the catalogue lacks", name)
		}
	}
	for _, c := range elfCases {
		elf := elftest.Build(c.spec)
		tr := inspectBytes(elf)
		abi := ""
		if tr.ABI != nil {
			abi = tr.ABI.Name
		}
		u, _ := userTarget(tr, abi)
		if u == nil {
			continue
		}
		var claimed []string
		for name, b := range entries {
			if b.matches(elf) {
				claimed = append(claimed, name)
			}
		}
		if len(claimed) != 1 || claimed[0] != u.Name {
			t.Errorf("%s: binfmt_misc entries %v claim it; the catalogue says %s", c.name, claimed, u.Name)
		}
	}
}

// notPlanned are Debian's entries the catalogue leaves out on purpose:
// binaries a native guest runs, and those userTarget refuses with a reason.
var notPlanned = map[string]bool{"aarch64": true, "ppc64le": true, "s390x": true, "microblaze": true, "xtensa": true, "xtensaeb": true}

type binfmt struct {
	offset      int
	magic, mask []byte
}

func (b binfmt) matches(file []byte) bool {
	if len(file) < b.offset+len(b.magic) {
		return false
	}
	for i, m := range b.magic {
		if file[b.offset+i]&b.mask[i] != m&b.mask[i] {
			return false
		}
	}
	return true
}

// readBinfmt parses a binfmt.d line :name:M:offset:magic:mask:interp:flags.
func readBinfmt(path string) (binfmt, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return binfmt{}, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 8 || f[2] != "M" {
			continue
		}
		b := binfmt{magic: unescape(f[4]), mask: unescape(f[5])}
		b.offset, _ = strconv.Atoi(f[3])
		if len(b.mask) == 0 {
			b.mask = bytes.Repeat([]byte{0xff}, len(b.magic))
		}
		return b, nil
	}
	return binfmt{}, os.ErrNotExist
}

func unescape(s string) []byte {
	var out []byte
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] == 'x' {
			v, _ := strconv.ParseUint(s[i+2:i+4], 16, 8)
			out = append(out, byte(v))
			i += 3
			continue
		}
		out = append(out, s[i])
	}
	return out
}

// TestTriageRecords covers what triage records carry that headers built
// here do not: a sample without ABI details, and records written by hand.
func TestTriageRecords(t *testing.T) {
	yes := true
	m := For(records.Triage{Format: "elf", Arch: "m68k", Bits: 32, Endianness: "big", OS: "linux", Type: "exec", Static: &yes})
	if !m.Runnable() || m.User == nil || m.User.Emulator() != "qemu-m68k-static" || m.Platform.Name != UserHost {
		t.Errorf("m68k record: %+v", m)
	}
	m = For(records.Triage{Format: "elf", Arch: "mips", Bits: 32, Endianness: "big", OS: "linux", Type: "exec", Static: &yes})
	if m.Runnable() || !strings.Contains(m.Reason, `MIPS ABI ""`) {
		t.Errorf("MIPS without an ABI must not guess one: %+v", m)
	}
	us := UserTargets()
	if i := slices.IndexFunc(us, func(u UserTarget) bool { return u.Name == "sparc32plus" }); i < 0 || us[i].Platform != "sparc" || us[i].Feature() != "qemu-user:sparc32plus" {
		t.Errorf("no qemu-user target sparc32plus of platform sparc: %+v", us)
	}
}

// inspectBytes triages an in-memory file.
func inspectBytes(b []byte) records.Triage {
	return triage.Inspect(bytes.NewReader(b), int64(len(b)))
}
