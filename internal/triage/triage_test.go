package triage

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// want lists the fields a test cares about; zero values are not checked,
// except Problem, which must be empty unless problem is set.
type want struct {
	format, arch, endian, os, typ, interp, packer string
	bits                                          int
	static, stripped                              *bool
	noStatic                                      bool // Static must be nil
	abiName, float, isa                           string
	eabi                                          int
	details                                       map[string]any
	problem                                       string // substring Problem must contain
}

func ptr[T any](v T) *T { return &v }

var (
	yes = ptr(true)
	no  = ptr(false)
)

func check(t *testing.T, name string, got records.Triage, w want) {
	t.Helper()
	var errs []string
	eq := func(field string, g, w any) {
		if reflect.ValueOf(w).IsZero() {
			return
		}
		if !reflect.DeepEqual(g, w) {
			errs = append(errs, fmt.Sprintf("%s = %v, want %v", field, g, w))
		}
	}
	eq("Format", got.Format, w.format)
	eq("Arch", got.Arch, w.arch)
	eq("Endianness", got.Endianness, w.endian)
	eq("Bits", got.Bits, w.bits)
	eq("OS", got.OS, w.os)
	eq("Type", got.Type, w.typ)
	eq("Interpreter", got.Interpreter, w.interp)
	eq("Packer", got.Packer, w.packer)
	if w.static != nil && (got.Static == nil || *got.Static != *w.static) {
		errs = append(errs, fmt.Sprintf("Static = %v, want %v", show(got.Static), *w.static))
	}
	if w.noStatic && got.Static != nil {
		errs = append(errs, fmt.Sprintf("Static = %v, want nil", *got.Static))
	}
	if w.stripped != nil && (got.Stripped == nil || *got.Stripped != *w.stripped) {
		errs = append(errs, fmt.Sprintf("Stripped = %v, want %v", show(got.Stripped), *w.stripped))
	}
	if w.abiName != "" || w.float != "" || w.isa != "" || w.eabi != 0 {
		if got.ABI == nil {
			errs = append(errs, "ABI = nil")
		} else {
			eq("ABI.Name", got.ABI.Name, w.abiName)
			eq("ABI.Float", got.ABI.Float, w.float)
			eq("ABI.ISA", got.ABI.ISA, w.isa)
			eq("ABI.EABI", got.ABI.EABI, w.eabi)
		}
	}
	for k, v := range w.details {
		if g, ok := got.Details[k]; !ok || !reflect.DeepEqual(g, v) {
			errs = append(errs, fmt.Sprintf("Details[%q] = %#v, want %#v", k, g, v))
		}
	}
	switch {
	case w.problem == "" && got.Problem != "":
		errs = append(errs, fmt.Sprintf("unexpected Problem %q", got.Problem))
	case w.problem != "" && !strings.Contains(got.Problem, w.problem):
		errs = append(errs, fmt.Sprintf("Problem = %q, want it to contain %q", got.Problem, w.problem))
	}
	if len(errs) > 0 {
		t.Errorf("%s: %s\n\tgot %+v abi=%+v", name, strings.Join(errs, "; "), got, got.ABI)
	}
}

func show(b *bool) string {
	if b == nil {
		return "nil"
	}
	return fmt.Sprint(*b)
}

type sample struct {
	name string
	data []byte
	want want
}

func elfSample(name string, sp elfSpec, w want) sample {
	w.format = "elf"
	return sample{name, sp.build(), w}
}

var (
	le = binary.LittleEndian
	be = binary.BigEndian
)

// handSamples are headers for what Go cannot target, plus the corner cases
// of each decision.
func handSamples() []sample {
	needed := [][2]uint64{{dtNeeded, 1}}
	gnuLinux := []elfNote{{"GNU", 1, le.AppendUint32(make([]byte, 0, 16), 0)}}
	gnuLinux[0].desc = append(gnuLinux[0].desc, make([]byte, 12)...)
	return []sample{
		elfSample("sparc", elfSpec{big: true, etype: etExec, machine: emSPARC, symtab: true},
			want{arch: "sparc", bits: 32, endian: "big", os: "linux", typ: "exec", static: yes, stripped: no,
				details: map[string]any{"os_source": "default"}}),
		elfSample("sparc32plus", elfSpec{big: true, etype: etExec, machine: emSPARC32PLUS, flags: 0x100},
			want{arch: "sparc", bits: 32, endian: "big", isa: "v8plus", stripped: yes}),
		elfSample("sparcv9", elfSpec{is64: true, big: true, etype: etExec, machine: emSPARCV9},
			want{arch: "sparc64", bits: 64, endian: "big", isa: "v9"}),
		elfSample("m68k-dyn", elfSpec{big: true, etype: etDyn, machine: em68K, interp: "/lib/ld.so.1", dyn: needed},
			want{arch: "m68k", bits: 32, endian: "big", os: "linux", typ: "pie", static: no, interp: "/lib/ld.so.1",
				details: map[string]any{"os_source": "interpreter"}}),
		elfSample("sh4-le", elfSpec{etype: etExec, machine: emSH, flags: 9},
			want{arch: "sh", bits: 32, endian: "little", isa: "sh4", static: yes}),
		elfSample("sh4a-be", elfSpec{big: true, etype: etExec, machine: emSH, flags: 12},
			want{arch: "sh", bits: 32, endian: "big", isa: "sh4a"}),
		elfSample("arc-compact", elfSpec{etype: etExec, machine: emARCCompact, interp: "/lib/ld-uClibc.so.0", dyn: needed},
			want{arch: "arc", bits: 32, endian: "little", isa: "arcompact", os: "linux", static: no}),
		elfSample("arc-compact2", elfSpec{etype: etExec, machine: emARCCompact2},
			want{arch: "arc", bits: 32, isa: "arcv2", static: yes}),
		elfSample("arc-old", elfSpec{etype: etExec, machine: emARC},
			want{arch: "arc", isa: "arc"}),
		elfSample("x86-dyn", elfSpec{etype: etDyn, machine: em386, interp: "/lib/ld-linux.so.2", dyn: needed, notes: gnuLinux},
			want{arch: "x86", bits: 32, endian: "little", os: "linux", typ: "pie", static: no, stripped: yes,
				interp: "/lib/ld-linux.so.2", details: map[string]any{"os_source": "note"}}),
		elfSample("arm-eabi5-hf-interp", elfSpec{etype: etExec, machine: emARM, flags: 0x05000000,
			interp: "/lib/ld-linux-armhf.so.3", dyn: needed},
			want{arch: "arm", bits: 32, typ: "exec", static: no, abiName: "eabi5-hf", eabi: 5, float: "hard",
				interp: "/lib/ld-linux-armhf.so.3"}),
		elfSample("arm-eabi5-sf-interp", elfSpec{etype: etExec, machine: emARM, flags: 0x05000000,
			interp: "/lib/ld-linux.so.3", dyn: needed},
			want{arch: "arm", abiName: "eabi5-sf", eabi: 5, float: "soft"}),
		elfSample("arm-eabi5-hf-flag", elfSpec{etype: etExec, machine: emARM, flags: 0x05000402},
			want{arch: "arm", abiName: "eabi5-hf", eabi: 5, float: "hard", static: yes}),
		elfSample("arm-eabi5-sf-flag", elfSpec{etype: etExec, machine: emARM, flags: 0x05000202,
			interp: "/lib/ld-linux-armhf.so.3"},
			want{arch: "arm", abiName: "eabi5-sf", float: "soft"}),
		elfSample("arm-eabi5-attrs", elfSpec{etype: etExec, machine: emARM, flags: 0x05000000,
			secs: []elfSec{{".ARM.attributes", shtProcAttrs, attrSection(le, "aeabi",
				append(append(uleb(5), "7-A\x00"...), uleb(6, 10, 7, 'A', 28, 1)...))}}},
			want{arch: "arm", abiName: "eabi5-hf", eabi: 5, float: "hard", isa: "armv7"}),
		elfSample("arm-eabi5-attrs-sf", elfSpec{etype: etExec, machine: emARM, flags: 0x05000000,
			interp: "/lib/ld-linux-armhf.so.3", // attributes win over the loader name
			secs:   []elfSec{{".ARM.attributes", shtProcAttrs, attrSection(le, "aeabi", uleb(6, 4, 28, 0))}}},
			want{arch: "arm", abiName: "eabi5-sf", float: "soft", isa: "armv5te"}),
		elfSample("arm-oabi", elfSpec{etype: etExec, machine: emARM, flags: 0x2, osabi: 97},
			want{arch: "arm", abiName: "oabi", os: "linux"}),
		elfSample("armeb-eabi4", elfSpec{big: true, etype: etExec, machine: emARM, flags: 0x04000000},
			want{arch: "arm", endian: "big", abiName: "eabi4-sf", eabi: 4}),
		elfSample("mips-n32", elfSpec{big: true, etype: etExec, machine: emMIPS, flags: 0x20000024},
			want{arch: "mips64", bits: 32, endian: "big", abiName: "n32", isa: "mips3"}),
		elfSample("mips-o32-be-dyn", elfSpec{big: true, etype: etExec, machine: emMIPS, flags: 0x70001007,
			interp: "/lib/ld.so.1", dyn: needed,
			secs: []elfSec{{".MIPS.abiflags", shtMIPSAbiflags, mipsAbiflags(32, 2, 1)}}},
			want{arch: "mips", bits: 32, endian: "big", abiName: "o32", isa: "mips32r2", float: "hard",
				static: no, interp: "/lib/ld.so.1", os: "linux"}),
		elfSample("mipsel-nan2008-gnuattr-soft", elfSpec{etype: etExec, machine: emMIPS, flags: 0x70001404,
			secs: []elfSec{{".gnu.attributes", shtGNUAttributes, attrSection(le, "gnu", uleb(4, 3))}}},
			want{arch: "mips", endian: "little", abiName: "o32", isa: "mips32r2+nan2008", float: "soft"}),
		elfSample("mips-abiflags-segment", elfSpec{big: true, etype: etExec, machine: emMIPS, flags: 0x50001004,
			segs: []elfSeg{{ptMIPSAbiflags, mipsAbiflags(32, 1, 5)}}, noShdrs: true},
			want{arch: "mips", abiName: "o32", isa: "mips32", float: "hard", stripped: yes}),
		elfSample("mips-o32-single", elfSpec{etype: etExec, machine: emMIPS, flags: 0x10000000,
			secs: []elfSec{{".MIPS.abiflags", shtMIPSAbiflags, mipsAbiflags(2, 0, 2)}}},
			want{arch: "mips", abiName: "o32", isa: "mips2", float: "single"}),
		elfSample("mips64r6-n64", elfSpec{is64: true, etype: etExec, machine: emMIPS, flags: 0xa0000400},
			want{arch: "mips64", bits: 64, endian: "little", abiName: "n64", isa: "mips64r6+nan2008"}),
		elfSample("mips-o64", elfSpec{big: true, etype: etExec, machine: emMIPS, flags: 0x40002000},
			want{arch: "mips", abiName: "o64", isa: "mips5"}),
		elfSample("riscv32", elfSpec{etype: etExec, machine: emRISCV, flags: 0,
			secs: []elfSec{{".riscv.attributes", shtProcAttrs, attrSection(le, "riscv",
				append(uleb(4, 16, 5), "rv32i2p1_m2p0_c2p0\x00"...))}}},
			want{arch: "riscv32", bits: 32, endian: "little", abiName: "ilp32", float: "soft", isa: "rv32",
				details: map[string]any{"riscv_arch": "rv32i2p1_m2p0_c2p0"}}),
		elfSample("riscv32-ilp32d", elfSpec{etype: etExec, machine: emRISCV, flags: 0x5},
			want{arch: "riscv32", abiName: "ilp32d", float: "double"}),
		elfSample("riscv64-lp64f", elfSpec{is64: true, etype: etExec, machine: emRISCV, flags: 0x3},
			want{arch: "riscv64", bits: 64, abiName: "lp64f", float: "single", isa: "rv64"}),
		elfSample("s390-31bit", elfSpec{big: true, etype: etExec, machine: emS390},
			want{arch: "s390", bits: 32, endian: "big"}),
		elfSample("upx-magic", elfSpec{etype: etExec, machine: em386, noShdrs: true,
			headBlob: []byte("\x00\x00\x00\x00UPX!\x0d\x16\x0d\x17")},
			want{arch: "x86", packer: "upx", stripped: yes}),
		elfSample("upx-sections", elfSpec{is64: true, etype: etExec, machine: emX86_64,
			secs: []elfSec{{"UPX0", 8, nil}, {"UPX1", 1, []byte("packed")}}},
			want{arch: "x86_64", packer: "upx"}),
		elfSample("x32", elfSpec{etype: etExec, machine: emX86_64},
			want{arch: "x86_64", bits: 32, abiName: "x32"}),
		elfSample("static-pie", elfSpec{is64: true, etype: etDyn, machine: emX86_64,
			dyn: [][2]uint64{{dtFlags1, df1PIE}}},
			want{arch: "x86_64", typ: "pie", static: yes}),
		elfSample("shared-lib", elfSpec{is64: true, etype: etDyn, machine: emAArch64, dyn: needed, symtab: true},
			want{arch: "aarch64", typ: "shared", static: no, stripped: no}),
		elfSample("freebsd-note", elfSpec{is64: true, etype: etExec, machine: emX86_64,
			notes: []elfNote{{"FreeBSD", 1, le.AppendUint32(nil, 1400000)}}},
			want{os: "freebsd", details: map[string]any{"os_source": "note"}}),
		elfSample("gnu-hurd-note", elfSpec{etype: etExec, machine: em386,
			notes: []elfNote{{"GNU", 1, le.AppendUint32(make([]byte, 0, 16), 1)}}},
			want{os: "hurd"}),
		elfSample("freebsd-osabi", elfSpec{is64: true, etype: etExec, machine: emX86_64, osabi: 9},
			want{os: "freebsd", details: map[string]any{"os_source": "osabi"}}),
		elfSample("android-interp", elfSpec{is64: true, etype: etDyn, machine: emAArch64,
			interp: "/system/bin/linker64", dyn: needed},
			want{os: "android", typ: "pie", static: no}),
		elfSample("solaris-interp", elfSpec{big: true, etype: etExec, machine: emSPARC, interp: "/usr/lib/ld.so.1"},
			want{os: "solaris", arch: "sparc"}),
		elfSample("ppc-soft", elfSpec{big: true, etype: etExec, machine: emPPC,
			secs: []elfSec{{".gnu.attributes", shtGNUAttributes, attrSection(be, "gnu", uleb(4, 2))}}},
			want{arch: "ppc", bits: 32, endian: "big", float: "soft"}),
		elfSample("ppc64-be-unspecified", elfSpec{is64: true, big: true, etype: etExec, machine: emPPC64},
			want{arch: "ppc64", endian: "big", abiName: "elfv1"}),
		elfSample("ppc64-le-unspecified", elfSpec{is64: true, etype: etExec, machine: emPPC64},
			want{arch: "ppc64", endian: "little", abiName: "elfv2"}),
		elfSample("ppc64-be-v2", elfSpec{is64: true, big: true, etype: etExec, machine: emPPC64, flags: 2},
			want{arch: "ppc64", endian: "big", abiName: "elfv2"}),
		elfSample("loongarch64-soft", elfSpec{is64: true, etype: etExec, machine: emLoongArch, flags: 0x41},
			want{arch: "loongarch64", abiName: "lp64s", float: "soft"}),
		elfSample("aarch64-be", elfSpec{is64: true, big: true, etype: etExec, machine: emAArch64},
			want{arch: "aarch64", endian: "big", bits: 64}),
		elfSample("aarch64-ilp32", elfSpec{etype: etExec, machine: emAArch64},
			want{arch: "aarch64", bits: 32, abiName: "ilp32"}),
		elfSample("alpha", elfSpec{is64: true, etype: etExec, machine: 0x9026}, want{arch: "alpha", bits: 64}),
		elfSample("hppa", elfSpec{big: true, etype: etExec, machine: emPARISC}, want{arch: "hppa", endian: "big"}),
		elfSample("ia64", elfSpec{is64: true, etype: etExec, machine: 50}, want{arch: "ia64"}),
		elfSample("microblaze", elfSpec{big: true, etype: etExec, machine: 189}, want{arch: "microblaze"}),
		elfSample("xtensa", elfSpec{etype: etExec, machine: 94}, want{arch: "xtensa"}),
		elfSample("openrisc", elfSpec{big: true, etype: etExec, machine: 92}, want{arch: "openrisc"}),
		elfSample("nios2", elfSpec{etype: etExec, machine: 113}, want{arch: "nios2"}),
		elfSample("csky", elfSpec{etype: etExec, machine: 252}, want{arch: "csky"}),
		elfSample("unknown-machine", elfSpec{etype: etExec, machine: 0x1234},
			want{details: map[string]any{"machine": 0x1234}}),
		elfSample("object", elfSpec{is64: true, etype: etRel, machine: emX86_64, symtab: true},
			want{typ: "object", noStatic: true, stripped: no}),
		elfSample("core", elfSpec{is64: true, etype: etCore, machine: emX86_64,
			notes: []elfNote{{"CORE", 1, make([]byte, 8)}, {"LINUX", 0x200, make([]byte, 8)}}},
			want{typ: "core", noStatic: true, os: "linux", details: map[string]any{"os_source": "note"}}),

		{"pe-dotnet", peSpec{machine: 0x14c, subsystem: 3, clr: true, coffSyms: true, sections: []string{".text", ".rsrc"}}.build(),
			want{format: "pe", arch: "x86", bits: 32, endian: "little", os: "windows", typ: "exe", stripped: no,
				details: map[string]any{"dotnet": true, "subsystem": "console"}}},
		{"pe-dll-gui", peSpec{machine: 0x8664, plus: true, dll: true, subsystem: 2, sections: []string{".text"}}.build(),
			want{format: "pe", arch: "x86_64", bits: 64, typ: "dll", stripped: yes, noStatic: true,
				details: map[string]any{"subsystem": "gui"}}},
		{"pe-armnt", peSpec{machine: 0x1c4, subsystem: 2}.build(),
			want{format: "pe", arch: "arm", bits: 32}},
		{"pe-upx", peSpec{machine: 0x14c, subsystem: 2, sections: []string{"UPX0", "UPX1", ".rsrc"}}.build(),
			want{format: "pe", packer: "upx"}},
		{"pe-efi", peSpec{machine: 0xaa64, plus: true, subsystem: 10}.build(),
			want{format: "pe", arch: "aarch64", details: map[string]any{"subsystem": "efi_application"}}},

		{"macho-fat", machoFat(4096,
			machoThin(0x01000007, true, false, 2, 0x200085, "/usr/lib/dyld", 5),
			machoThin(0x0100000c, true, false, 2, 0x200085, "/usr/lib/dyld", 5)),
			want{format: "macho", os: "darwin", endian: "little", typ: "pie",
				details: map[string]any{"fat": true, "slices": []string{"x86_64", "aarch64"}}}},
		{"macho-fat-one", machoFat(4096, machoThin(0x12, false, true, 6, 0, "", 3)),
			want{format: "macho", arch: "ppc", bits: 32, endian: "big", typ: "shared",
				details: map[string]any{"fat": true, "slices": []string{"ppc"}}}},
		{"macho-ppc", machoThin(0x12, false, true, 2, 0, "/usr/lib/dyld", 10),
			want{format: "macho", os: "darwin", arch: "ppc", bits: 32, endian: "big", typ: "exec",
				interp: "/usr/lib/dyld", stripped: no}},
		{"macho-i386-stripped", machoThin(7, false, false, 2, 0, "/usr/lib/dyld", 0),
			want{format: "macho", arch: "x86", bits: 32, endian: "little", stripped: yes}},
		{"macho-arm64_32", machoThin(0x0200000c, false, false, 2, 0, "", 1),
			want{format: "macho", arch: "aarch64", bits: 32}},
		{"macho-unknown-cpu", machoThin(0x77, true, true, 2, 0, "", 1),
			want{format: "macho", bits: 64, endian: "big", details: map[string]any{"cputype": "0x77"}}},
		{"java-class", append([]byte{0xca, 0xfe, 0xba, 0xbe, 0, 0, 0, 52}, make([]byte, 100)...),
			want{format: "unknown", details: map[string]any{"java_class": true, "class_version": 52}}},
	}
}

func TestHandBuilt(t *testing.T) {
	for _, s := range handSamples() {
		check(t, s.name, inspectBytes(s.data), s.want)
	}
}

// TestTruncated cuts real and hand-built headers at every interesting point:
// each cut must give a Problem (or a plain "unknown"), never a panic.
func TestTruncated(t *testing.T) {
	full := elfSpec{is64: true, etype: etDyn, machine: emX86_64, interp: "/lib64/ld-linux-x86-64.so.2",
		dyn: [][2]uint64{{dtNeeded, 1}}, symtab: true, secs: []elfSec{{".text", 1, make([]byte, 64)}}}.build()
	shoff := int(le.Uint64(full[40:]))
	cases := []struct {
		n       int
		problem string
	}{
		{5, "truncated ELF header: 5 bytes, need 52"},
		{40, "truncated ELF header: 40 bytes, need 64"},
		{63, "truncated ELF header: 63 bytes, need 64"},
		{64, "program headers beyond end of file"},
		{64 + 56 + 10, "program headers truncated: 1 of 2"},
		{shoff - 8, "section headers beyond end of file"},
		{shoff + 64*2 + 3, "section headers truncated: 2 of"},
		{len(full) - 1, "section headers truncated"},
	}
	for _, c := range cases {
		got := inspectBytes(full[:c.n])
		check(t, fmt.Sprintf("cut at %d", c.n), got, want{format: "elf", problem: c.problem})
	}
	got := inspectBytes(full[:40])
	if got.Arch != "x86_64" || got.Bits != 64 {
		t.Errorf("truncated header lost the fields it has: %+v", got)
	}
	// Interpreter beyond the end: patch PT_INTERP's offset.
	bad := bytes.Clone(full)
	le.PutUint64(bad[64+8:], uint64(len(bad)+100))
	check(t, "interp beyond EOF", inspectBytes(bad), want{format: "elf", problem: "interpreter beyond end of file"})

	bad32 := elfSpec{etype: etExec, machine: em386}.build()
	bad32[4] = 7
	check(t, "bad class", inspectBytes(bad32), want{format: "elf", problem: "invalid ELF class 7"})
	bad32[4], bad32[5] = 1, 0
	check(t, "bad data", inspectBytes(bad32), want{format: "elf", problem: "invalid ELF data encoding 0"})

	// Every prefix of a few samples: no panic, no internal error.
	for _, s := range handSamples()[:12] {
		for n := 0; n <= len(s.data); n++ {
			got := inspectBytes(s.data[:n])
			if strings.HasPrefix(got.Problem, "internal error") {
				t.Fatalf("%s cut at %d: %s", s.name, n, got.Problem)
			}
		}
	}

	pe := peSpec{machine: 0x14c, subsystem: 3}.build()
	check(t, "pe cut in COFF", inspectBytes(pe[:0x90]), want{format: "pe", problem: "truncated COFF header"})
	check(t, "pe cut before PE", inspectBytes(pe[:0x70]), want{format: "pe", problem: "truncated PE"})
	check(t, "pe cut in optional header", inspectBytes(pe[:0x100]), want{format: "pe", problem: "truncated optional header"})
	dos := bytes.Clone(pe)
	copy(dos[0x80:], "NE")
	check(t, "NE", inspectBytes(dos), want{format: "unknown", details: map[string]any{"dos": "NE"}})

	mo := machoThin(0x0100000c, true, false, 2, 0, "/usr/lib/dyld", 5)
	check(t, "macho header", inspectBytes(mo[:20]), want{format: "macho", bits: 64, endian: "little", problem: "truncated Mach-O header: 20 bytes, need 32"})
	check(t, "macho cmds", inspectBytes(mo[:40]), want{format: "macho", problem: "load commands truncated"})
	fat := machoFat(4096, mo, mo)
	check(t, "fat table", inspectBytes(fat[:30]), want{format: "macho", problem: "truncated fat header: 1 of 2"})
	check(t, "fat slice", inspectBytes(fat[:5000]), want{format: "macho", problem: "fat slice 1"})
}

func TestScripts(t *testing.T) {
	cases := []struct {
		text   string
		interp string
		name   string
		args   string
	}{
		{"#!/bin/sh\necho hi\n", "/bin/sh", "sh", ""},
		{"#! /bin/bash -e\n", "/bin/bash", "bash", "-e"},
		{"#!/usr/bin/env python3\nprint(1)\n", "/usr/bin/env", "python3", ""},
		{"#!/usr/bin/env -S perl -w\r\n", "/usr/bin/env", "perl", "-w"},
		{"#!/usr/bin/env -u HOME LANG=C node --harmony\n", "/usr/bin/env", "node", "--harmony"},
		{"#!/usr/local/bin/python3.12", "/usr/local/bin/python3.12", "python3.12", ""},
		{"#!/usr/bin/env\n", "/usr/bin/env", "env", ""},
	}
	for _, c := range cases {
		w := want{format: "script", interp: c.interp, details: map[string]any{"interpreter": c.name}}
		if c.args != "" {
			w.details["args"] = c.args
		}
		got := inspectBytes([]byte(c.text))
		check(t, c.text, got, w)
		if _, ok := got.Details["args"]; c.args == "" && ok {
			t.Errorf("%q: unexpected args %q", c.text, got.Details["args"])
		}
	}
	check(t, "empty shebang", inspectBytes([]byte("#!\n")), want{format: "script", problem: "shebang without interpreter"})
}

func TestArchives(t *testing.T) {
	var zb bytes.Buffer
	zw := zip.NewWriter(&zb)
	for _, n := range []string{"a.txt", "b/c.bin", "d"} {
		w, _ := zw.Create(n)
		w.Write([]byte(strings.Repeat(n, 100)))
	}
	zw.SetComment(strings.Repeat("comment ", 300)) // pushes EOCD out of the first 1 KiB tail
	zw.Close()
	check(t, "zip", inspectBytes(zb.Bytes()), want{format: "zip", details: map[string]any{"entries": int64(3)}})

	zb.Reset()
	zip.NewWriter(&zb).Close()
	check(t, "empty zip", inspectBytes(zb.Bytes()), want{format: "zip", details: map[string]any{"entries": int64(0)}})

	var gb bytes.Buffer
	gw := gzip.NewWriter(&gb)
	gw.Name = "payload.bin"
	gw.Write([]byte("hello"))
	gw.Close()
	check(t, "gzip", inspectBytes(gb.Bytes()), want{format: "gzip",
		details: map[string]any{"name": "payload.bin", "method": "deflate"}})
	check(t, "gzip cut", inspectBytes(gb.Bytes()[:5]), want{format: "gzip", problem: "truncated gzip header"})

	for _, f := range []tar.Format{tar.FormatUSTAR, tar.FormatGNU, tar.FormatPAX} {
		var tb bytes.Buffer
		tw := tar.NewWriter(&tb)
		tw.WriteHeader(&tar.Header{Name: "x", Mode: 0o644, Size: 3, Format: f})
		tw.Write([]byte("abc"))
		tw.Close()
		variant := map[tar.Format]string{tar.FormatUSTAR: "ustar", tar.FormatGNU: "gnu", tar.FormatPAX: "ustar"}[f]
		check(t, "tar "+f.String(), inspectBytes(tb.Bytes()), want{format: "tar", details: map[string]any{"variant": variant}})
		if f == tar.FormatUSTAR {
			// A v7 header: no magic, but a valid checksum.
			v7 := bytes.Clone(tb.Bytes())
			clear(v7[257:265])
			sum := 0
			copy(v7[148:156], "        ")
			for _, c := range v7[:512] {
				sum += int(c)
			}
			copy(v7[148:156], fmt.Sprintf("%06o\x00 ", sum))
			check(t, "tar v7", inspectBytes(v7), want{format: "tar", details: map[string]any{"variant": "v7"}})
			v7[0] ^= 1 // checksum no longer matches
			check(t, "tar v7 bad sum", inspectBytes(v7), want{format: "unknown"})
		}
	}
}

func TestUnknown(t *testing.T) {
	check(t, "empty", inspectBytes(nil), want{format: "unknown", problem: "empty file"})
	check(t, "empty reader", Inspect(bytes.NewReader(nil), 0), want{format: "unknown", problem: "empty file"})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		b := make([]byte, rng.IntN(9000))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if len(b) > 0 && (b[0] == 0x7f || b[0] == 'M' || b[0] == '#' || b[0] == 'P' || b[0] == 0x1f ||
			b[0] == 0xca || b[0] == 0xce || b[0] == 0xcf || b[0] == 0xfe) {
			b[0] = 0
		}
		check(t, fmt.Sprintf("random %d", i), inspectBytes(b), want{format: "unknown"})
	}
	check(t, "text", inspectBytes([]byte("hello world\n")), want{format: "unknown"})
	check(t, "MZ text", inspectBytes([]byte("MZ is a text file")), want{format: "unknown"})
	check(t, "long MZ text", inspectBytes([]byte(strings.Repeat("MZ is a longer text file. ", 5))),
		want{format: "unknown", details: map[string]any{"dos": "mz"}})
	// A size larger than the reader holds: believe the reader.
	b := elfSpec{etype: etExec, machine: em386, symtab: true}.build()
	check(t, "size lies", Inspect(bytes.NewReader(b), int64(len(b))+1e6), want{format: "elf", arch: "x86", stripped: no})
}

// hugeReader is a terabyte of zeros after a header, counting what is read.
type hugeReader struct {
	head       []byte
	reads, got int64
}

func (h *hugeReader) ReadAt(p []byte, off int64) (int, error) {
	h.reads++
	h.got += int64(len(p))
	clear(p)
	if off < int64(len(h.head)) {
		copy(p, h.head[off:])
	}
	return len(p), nil
}

// TestHostileCounts gives absurd counts and offsets in a huge virtual file:
// reads and allocation must stay bounded.
func TestHostileCounts(t *testing.T) {
	const size = 1 << 40
	hdr := elfSpec{is64: true, etype: etExec, machine: emX86_64}.build()[:64]
	le.PutUint64(hdr[32:], 64)     // phoff
	le.PutUint16(hdr[54:], 56)     // phentsize
	le.PutUint16(hdr[56:], 3)      // phnum
	le.PutUint64(hdr[40:], size/2) // shoff
	le.PutUint16(hdr[58:], 64)     // shentsize
	le.PutUint16(hdr[60:], 0)      // shnum 0: count in section 0...
	le.PutUint16(hdr[62:], 0xffff) // shstrndx: SHN_XINDEX
	head := make([]byte, 4096)
	copy(head, hdr)
	// A PT_NOTE, PT_DYNAMIC and PT_INTERP claiming a terabyte each.
	for i, typ := range []uint32{ptNote, ptDynamic, ptInterp} {
		p := head[64+i*56:]
		le.PutUint32(p, typ)
		le.PutUint64(p[8:], 0)
		le.PutUint64(p[32:], size)
	}
	r := &hugeReader{head: head}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	got := Inspect(r, size)
	runtime.ReadMemStats(&ms1)
	if got.Format != "elf" || strings.HasPrefix(got.Problem, "internal error") {
		t.Fatalf("got %+v", got)
	}
	alloc := ms1.TotalAlloc - ms0.TotalAlloc
	t.Logf("reads=%d bytes=%d alloc=%d got=%+v", r.reads, r.got, alloc, got)
	if r.got > 24<<20 || alloc > 8<<20 {
		t.Errorf("hostile counts read %d bytes, allocated %d", r.got, alloc)
	}

	// Section 0 of the zero-filled table says 0 sections: patch the reader
	// to claim 2^40 sections instead.
	r2 := &hugeReader{head: head}
	sh0 := make([]byte, 64)
	le.PutUint64(sh0[32:], size) // sh_size: section count
	r3 := readerFunc(func(p []byte, off int64) (int, error) {
		n, err := r2.ReadAt(p, off)
		if off <= size/2 && off+int64(len(p)) >= size/2+64 {
			copy(p[size/2-off:], sh0)
		}
		return n, err
	})
	runtime.ReadMemStats(&ms0)
	got = Inspect(r3, size)
	runtime.ReadMemStats(&ms1)
	alloc = ms1.TotalAlloc - ms0.TotalAlloc
	t.Logf("extended count: reads=%d bytes=%d alloc=%d problem=%q", r2.reads, r2.got, alloc, got.Problem)
	if !strings.Contains(got.Problem, "too many sections") {
		t.Errorf("Problem = %q, want too many sections", got.Problem)
	}
	if r2.got > 24<<20 || alloc > 8<<20 {
		t.Errorf("hostile section count read %d bytes, allocated %d", r2.got, alloc)
	}
}

type readerFunc func(p []byte, off int64) (int, error)

func (f readerFunc) ReadAt(p []byte, off int64) (int, error) { return f(p, off) }

// inspectBytes triages an in-memory file.
func inspectBytes(b []byte) records.Triage {
	return Inspect(bytes.NewReader(b), int64(len(b)))
}
