package triage

import (
	"encoding/binary"
	"fmt"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

type peMachine struct {
	arch string
	bits int
}

var peMachines = map[uint16]peMachine{
	0x014c: {"x86", 32},
	0x8664: {"x86_64", 64},
	0x01c0: {"arm", 32}, // ARM
	0x01c2: {"arm", 32}, // THUMB
	0x01c4: {"arm", 32}, // ARMNT
	0xaa64: {"aarch64", 64},
	0xa641: {"aarch64", 64}, // ARM64EC
	0xa64e: {"aarch64", 64}, // ARM64X
	0x0200: {"ia64", 64},
	0x5032: {"riscv32", 32},
	0x5064: {"riscv64", 64},
	0x6232: {"loongarch32", 32},
	0x6264: {"loongarch64", 64},
	0x0162: {"mips", 32}, // R3000
	0x0166: {"mips", 32}, // R4000
	0x0168: {"mips", 32}, // R10000
	0x0169: {"mips", 32}, // WCEMIPSV2
	0x0266: {"mips", 32}, // MIPS16
	0x0366: {"mips", 32}, // MIPSFPU
	0x0466: {"mips", 32}, // MIPSFPU16
	0x01f0: {"ppc", 32},
	0x01f1: {"ppc", 32}, // POWERPCFP
	0x01a2: {"sh", 32},  // SH3
	0x01a3: {"sh", 32},  // SH3DSP
	0x01a6: {"sh", 32},  // SH4
	0x01a8: {"sh", 32},  // SH5
	0x0184: {"alpha", 64},
	0x0284: {"alpha", 64}, // ALPHA64
	0x9041: {"m32r", 32},
	0x0ebc: {"ebc", 64}, // EFI byte code
}

var peSubsystems = map[uint16]string{
	1:  "native",
	2:  "gui",
	3:  "console",
	5:  "os2_console",
	7:  "posix_console",
	8:  "native_windows",
	9:  "windows_ce_gui",
	10: "efi_application",
	11: "efi_boot_service_driver",
	12: "efi_runtime_driver",
	13: "efi_rom",
	14: "xbox",
	16: "windows_boot_application",
}

func inspectPE(s *src) records.Triage {
	t := records.Triage{Format: "pe"}
	if len(s.head) < 64 {
		// Too short for the DOS header: an "MZ" text file as likely as a PE.
		return records.Triage{Format: "unknown"}
	}
	lfanew := int64(binary.LittleEndian.Uint32(s.head[0x3c:]))
	sig := s.at(lfanew, 4)
	if string(sig) != "PE\x00\x00" {
		// e_lfarlc >= 0x40 marks a "new" executable; with a plausible
		// e_lfanew past the end, it is a PE cut short.
		if len(sig) < 4 && lfanew >= 0x40 && lfanew < 1<<16 && binary.LittleEndian.Uint16(s.head[0x18:]) >= 0x40 {
			t.Problem = fmt.Sprintf("truncated PE: header at %#x, file has %d bytes", lfanew, s.size)
			return t
		}
		// Plain DOS, or NE/LE/LX: not PE, but say what it is.
		t = records.Triage{Format: "unknown"}
		kind := "mz"
		if len(sig) >= 2 {
			switch string(sig[:2]) {
			case "NE", "LE", "LX":
				kind = string(sig[:2])
			}
		}
		detail(&t, "dos", kind)
		return t
	}
	t.OS = "windows"
	t.Endianness = "little"
	coff := s.at(lfanew+4, 20)
	if len(coff) < 20 {
		t.Problem = fmt.Sprintf("truncated COFF header: %d bytes, need 20", len(coff))
		return t
	}
	le := binary.LittleEndian
	mach := le.Uint16(coff)
	nsec := int64(le.Uint16(coff[2:]))
	symPtr, nsym := le.Uint32(coff[8:]), le.Uint32(coff[12:])
	optSize := int64(le.Uint16(coff[16:]))
	chars := le.Uint16(coff[18:])
	if m, ok := peMachines[mach]; ok {
		t.Arch, t.Bits = m.arch, m.bits
	} else {
		detail(&t, "machine", fmt.Sprintf("%#x", mach))
	}
	t.Type = "exe"
	if chars&0x2000 != 0 { // IMAGE_FILE_DLL
		t.Type = "dll"
	}
	// The COFF symbol table is what Go and MinGW emit and strip removes.
	stripped := symPtr == 0 || nsym == 0
	t.Stripped = &stripped

	optOff := lfanew + 24
	opt := s.at(optOff, min(optSize, 240))
	if int64(len(opt)) < min(optSize, 240) {
		addProblem(&t, "truncated optional header")
	}
	if len(opt) >= 2 {
		var ddOff int
		switch le.Uint16(opt) {
		case 0x10b:
			t.Bits, ddOff = 32, 96
		case 0x20b:
			t.Bits, ddOff = 64, 112
		case 0x107:
			detail(&t, "rom", true)
		default:
			addProblem(&t, fmt.Sprintf("unknown optional header magic %#x", le.Uint16(opt)))
		}
		if ddOff > 0 && len(opt) >= 70 {
			ss := le.Uint16(opt[68:])
			if name, ok := peSubsystems[ss]; ok {
				detail(&t, "subsystem", name)
			} else {
				detail(&t, "subsystem", fmt.Sprintf("%d", ss))
			}
		}
		if ddOff > 0 && len(opt) >= ddOff {
			ndd := le.Uint32(opt[ddOff-4:])
			dir := func(i int) (rva, size uint32) {
				o := ddOff + 8*i
				if uint32(i) >= ndd || o+8 > len(opt) {
					return 0, 0
				}
				return le.Uint32(opt[o:]), le.Uint32(opt[o+4:])
			}
			if rva, sz := dir(14); rva != 0 && sz != 0 { // CLR runtime header
				detail(&t, "dotnet", true)
			}
			if off, sz := dir(4); off != 0 && sz != 0 { // certificate table
				detail(&t, "signed", true)
			}
		}
	}

	// Section names only matter for packers.
	secOff := optOff + optSize
	if nsec > 0 {
		tab := s.at(secOff, nsec*40)
		if int64(len(tab)) < nsec*40 {
			addProblem(&t, fmt.Sprintf("section table truncated: %d of %d in file", len(tab)/40, nsec))
		}
		for i := 0; i+40 <= len(tab); i += 40 {
			switch name := cstr(tab[i:i+8], 0); string(name) {
			case "UPX0", "UPX1", "UPX2", ".UPX0", ".UPX1":
				t.Packer = "upx"
			}
		}
	}
	if t.Packer == "" && hasUPXMagic(s.head) {
		t.Packer = "upx"
	}
	return t
}
