package triage

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// abi fills the per-architecture details that decide which VM (CPU model,
// kernel config, C library) can run the binary.
func (e *elfFile) abi(gi goBuild) *records.ABI {
	a := &records.ABI{Flags: fmt.Sprintf("%#x", e.flags)}
	f := e.flags
	switch e.machine {
	case emARM:
		e.armABI(a, gi)
	case emMIPS, emMIPSRS3LE:
		e.mipsABI(a, gi)
	case emPPC64:
		switch f & 3 {
		case 1:
			a.Name = "elfv1"
		case 2:
			a.Name = "elfv2"
		default: // unspecified: what the toolchains of each byte order assume
			a.Name = "elfv2"
			if e.t.Endianness == "big" {
				a.Name = "elfv1"
			}
		}
	case emPPC:
		// Tag_GNU_Power_ABI_FP: 1 hard (double), 2 soft, 3 single hard.
		e.walkAttrs(e.gnuAttrs, "gnu", func(tag, v uint64, _ []byte) {
			if tag == 4 {
				a.Float = [4]string{"", "hard", "soft", "single"}[v&3]
			}
		})
	case emRISCV:
		base := "ilp32"
		if e.is64 {
			base = "lp64"
		}
		a.ISA = "rv32"
		if e.is64 {
			a.ISA = "rv64"
		}
		if f&8 != 0 { // EF_RISCV_RVE
			base, a.ISA = base+"e", a.ISA+"e"
		}
		fl := (f >> 1) & 3
		a.Name = base + [4]string{"", "f", "d", "q"}[fl]
		a.Float = [4]string{"soft", "single", "double", "quad"}[fl]
		e.walkAttrs(e.procAttrs, "riscv", func(tag, _ uint64, s []byte) {
			if tag == 5 { // Tag_RISCV_arch
				detail(e.t, "riscv_arch", string(s))
			}
		})
	case emLoongArch:
		base := "ilp32"
		if e.is64 {
			base = "lp64"
		}
		switch f & 7 { // EF_LOONGARCH_ABI_MODIFIER_MASK
		case 1:
			a.Name, a.Float = base+"s", "soft"
		case 2:
			a.Name, a.Float = base+"f", "single"
		case 3:
			a.Name, a.Float = base+"d", "double"
		}
	case emX86_64:
		if !e.is64 {
			a.Name = "x32"
		}
	case emAArch64:
		if !e.is64 {
			a.Name = "ilp32"
		}
	case emSPARC32PLUS:
		a.ISA = "v8plus"
	case emSPARCV9:
		a.ISA = "v9"
	case emARC:
		a.ISA = "arc"
	case emARCCompact:
		a.ISA = "arcompact"
	case emARCCompact2:
		a.ISA = "arcv2"
	case emARCCompact3, emARCCompact64:
		a.ISA = "arcv3"
	case emSH:
		a.ISA = shMach[f&0x1f]
	case em68K:
		switch {
		case f&0xff != 0: // EF_M68K_CF_ISA_MASK and friends
			a.ISA = "coldfire"
		case f&0x00810000 == 0x00810000:
			a.ISA = "cpu32"
		case f&0x01000000 != 0:
			a.ISA = "m68000"
		}
	}
	return a
}

var shMach = map[uint32]string{
	1: "sh1", 2: "sh2", 3: "sh3", 4: "sh-dsp", 5: "sh3-dsp", 6: "sh4al-dsp", 8: "sh3e", 9: "sh4",
	11: "sh2e", 12: "sh4a", 13: "sh2a", 16: "sh4-nofpu", 17: "sh4a-nofpu", 18: "sh4-nommu-nofpu",
	19: "sh2a-nofpu", 20: "sh3-nommu",
}

// armCPUArch names Tag_CPU_arch values.
var armCPUArch = []string{
	"armv4", "armv4", "armv4t", "armv5t", "armv5te", "armv5tej", "armv6", "armv6kz", "armv6t2",
	"armv6k", "armv7", "armv6-m", "armv6s-m", "armv7e-m", "armv8", "armv8-r", "armv8-m.base",
	"armv8-m.main", "armv8.1-m.main", "armv9",
}

func (e *elfFile) armABI(a *records.ABI, gi goBuild) {
	f := e.flags
	a.EABI = int(f >> 24) // EF_ARM_EABIMASK
	// Both the EABI5 flags (ABI_FLOAT_HARD/SOFT) and the legacy GNU ones
	// (VFP_FLOAT/SOFT_FLOAT) use the same bits.
	switch {
	case f&0x400 != 0:
		a.Float = "hard"
	case f&0x200 != 0:
		a.Float = "soft"
	}
	e.walkAttrs(e.procAttrs, "aeabi", func(tag, v uint64, _ []byte) {
		switch tag {
		case 6: // Tag_CPU_arch
			if v < uint64(len(armCPUArch)) {
				a.ISA = armCPUArch[v]
			}
		case 28: // Tag_ABI_VFP_args: 0 base (soft) PCS, 1 VFP registers
			if a.Float == "" && v <= 1 {
				a.Float = [2]string{"soft", "hard"}[v]
			}
		}
	})
	if a.ISA == "" && gi.goarm != "" {
		a.ISA = "armv" + strings.SplitN(gi.goarm, ",", 2)[0]
	}
	if a.EABI == 0 {
		// EABI version 0 is the old GNU ABI, which Linux runs as OABI; other
		// systems (OpenBSD) leave the field unset for EABI binaries.
		if e.t.OS == "linux" {
			a.Name = "oabi"
		}
		return
	}
	if a.Float == "" && e.t.Interpreter != "" {
		if strings.Contains(e.t.Interpreter, "armhf") || strings.Contains(e.t.Interpreter, "-hf") {
			a.Float = "hard"
		} else {
			a.Float = "soft"
		}
	}
	a.Float = cmp.Or(a.Float, "soft") // no VFP argument passing recorded: base AAPCS
	a.Name = fmt.Sprintf("eabi%d", a.EABI)
	switch a.Float {
	case "hard":
		a.Name += "-hf"
	case "soft":
		a.Name += "-sf"
	}
}

var mipsISA = []string{
	"mips1", "mips2", "mips3", "mips4", "mips5", "mips32", "mips64", "mips32r2", "mips64r2",
	"mips32r6", "mips64r6",
}

// mipsFP names the .MIPS.abiflags fp_abi / Tag_GNU_MIPS_ABI_FP values.
var mipsFP = []string{"", "hard", "single", "soft", "hard", "hard", "hard", "hard"}

func (e *elfFile) mipsABI(a *records.ABI, gi goBuild) {
	f := e.flags
	if i := f >> 28; int(i) < len(mipsISA) { // EF_MIPS_ARCH
		a.ISA = mipsISA[i]
	}
	switch {
	case e.is64 && f&0xf000 == 0x4000:
		a.Name = "eabi64"
	case e.is64:
		a.Name = "n64"
	case f&0x20 != 0: // EF_MIPS_ABI2
		a.Name = "n32"
		e.t.Arch = "mips64" // n32 needs a 64-bit CPU, like x32
	default:
		a.Name = cmp.Or(map[uint32]string{0x1000: "o32", 0x2000: "o64", 0x3000: "eabi32", 0x4000: "eabi64"}[f&0xf000], "o32")
	}
	abiflags := e.mipsAbiSec
	if abiflags.size == 0 {
		abiflags = e.mipsAbiflags
	}
	if b := e.read(abiflags, 24); len(b) == 24 {
		if v := b[7]; int(v) < len(mipsFP) {
			a.Float = mipsFP[v]
		}
	}
	if a.Float == "" {
		e.walkAttrs(e.gnuAttrs, "gnu", func(tag, v uint64, _ []byte) {
			if tag == 4 && v < uint64(len(mipsFP)) { // Tag_GNU_MIPS_ABI_FP
				a.Float = mipsFP[v]
			}
		})
	}
	if a.Float == "" && f&0x200 != 0 { // EF_MIPS_FP64
		a.Float = "hard"
	}
	if a.Float == "" {
		switch gm := gi.gomips; {
		case strings.Contains(gm, "softfloat"):
			a.Float = "soft"
		case strings.Contains(gm, "hardfloat"):
			a.Float = "hard"
		}
	}
	if f&0x400 != 0 && a.ISA != "" { // EF_MIPS_NAN2008
		a.ISA += "+nan2008"
	}
}

// walkAttrs calls fn for each file-scope attribute of vendor in a build
// attributes section (ARM AEABI / GNU / RISC-V "A" format).
func (e *elfFile) walkAttrs(sp span, vendor string, fn func(tag, num uint64, str []byte)) {
	b := e.read(sp, maxAttrBytes)
	if len(b) < 1 || b[0] != 'A' {
		return
	}
	b = b[1:]
	for len(b) >= 4 {
		l := uint64(e.bo.Uint32(b))
		if l < 4 || l > uint64(len(b)) {
			return
		}
		sub := b[4:l]
		b = b[l:]
		i := bytes.IndexByte(sub, 0)
		if i < 0 || string(sub[:i]) != vendor {
			continue
		}
		sub = sub[i+1:]
		for len(sub) >= 5 {
			scope, l2 := sub[0], uint64(e.bo.Uint32(sub[1:]))
			if l2 < 5 || l2 > uint64(len(sub)) {
				return
			}
			body := sub[5:l2]
			sub = sub[l2:]
			if scope == 1 { // Tag_File
				walkAttrList(body, vendor, fn)
			}
		}
	}
}

func walkAttrList(b []byte, vendor string, fn func(tag, num uint64, str []byte)) {
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 {
			return
		}
		b = b[n:]
		var num uint64
		var str []byte
		if tag == 32 && vendor != "riscv" { // Tag_compatibility: flag, then vendor name
			if num, n = binary.Uvarint(b); n <= 0 {
				return
			}
			b = b[n:]
			str, b = ntbs(b)
		} else if attrIsString(vendor, tag) {
			str, b = ntbs(b)
		} else {
			if num, n = binary.Uvarint(b); n <= 0 {
				return
			}
			b = b[n:]
		}
		fn(tag, num, str)
	}
}

func attrIsString(vendor string, tag uint64) bool {
	switch vendor {
	case "aeabi":
		switch tag {
		case 4, 5, 65, 67: // CPU_raw_name, CPU_name, also_compatible_with, conformance
			return true
		}
	case "riscv":
		return tag%2 == 1
	}
	return tag >= 32 && tag%2 == 1
}

func ntbs(b []byte) (s, rest []byte) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i], b[i+1:]
	}
	return b, nil
}

// goBuild is what a Go binary's .go.buildinfo says about its target.
type goBuild struct {
	version, goos, goarm, gomips string
}

var goBuildinfoMagic = []byte("\xff Go buildinf:")

// goBuild reads the Go 1.18+ inline build info (version string, then the
// module info text holding "build\tGOOS=…" lines).
func (e *elfFile) goBuild() goBuild {
	var gi goBuild
	b := e.read(e.goInfo, maxGoBuildinfo)
	if len(b) < 32 || !bytes.HasPrefix(b, goBuildinfoMagic) {
		return gi
	}
	if b[15]&2 == 0 {
		// Before Go 1.18 the strings sit elsewhere, behind pointers.
		gi.version = "pre-go1.18"
		return gi
	}
	b = b[32:]
	str := func() []byte {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			b = nil
			return nil
		}
		s := b[k : k+int(n)]
		b = b[k+int(n):]
		return s
	}
	gi.version = string(str())
	mod := str()
	for len(mod) > 0 {
		var line []byte
		line, mod, _ = bytes.Cut(mod, []byte("\n"))
		kv, ok := bytes.CutPrefix(line, []byte("build\t"))
		if !ok {
			continue
		}
		k, v, _ := bytes.Cut(kv, []byte("="))
		switch string(k) {
		case "GOOS":
			gi.goos = string(v)
		case "GOARM":
			gi.goarm = string(v)
		case "GOMIPS", "GOMIPS64":
			gi.gomips = string(v)
		}
	}
	return gi
}
