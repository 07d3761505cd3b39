package triage

import (
	"encoding/binary"
	"fmt"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

const (
	machoABI64   = 0x01000000
	machoABI6432 = 0x02000000 // arm64_32: 64-bit ISA, 32-bit pointers
	maxLoadCmds  = 4 << 20
	// A fat header with at least this many slices is a Java class file:
	// nfat_arch overlaps the class version, and Java 1.1 is 45.
	maxFatSlices = 30
)

func isMachO(h []byte) bool {
	if len(h) < 4 {
		return false
	}
	switch binary.BigEndian.Uint32(h) {
	case 0xfeedface, 0xcefaedfe, 0xfeedfacf, 0xcffaedfe:
		return true
	}
	return false
}

// machoArch maps a cputype to arch and pointer width.
func machoArch(cpu uint32) (string, int) {
	bits := 32
	if cpu&machoABI64 != 0 {
		bits = 64
	}
	switch cpu &^ (machoABI64 | machoABI6432) {
	case 7:
		if bits == 64 {
			return "x86_64", 64
		}
		return "x86", 32
	case 12:
		if cpu&(machoABI64|machoABI6432) != 0 {
			return "aarch64", bits
		}
		return "arm", 32
	case 18:
		if bits == 64 {
			return "ppc64", 64
		}
		return "ppc", 32
	case 1:
		return "vax", 32
	case 6:
		return "m68k", 32
	case 8:
		return "mips", bits
	case 11:
		return "hppa", bits
	case 13:
		return "m88k", 32
	case 14:
		return "sparc", bits
	case 15:
		return "i860", 32
	}
	return "", 0
}

func archEndian(arch string) string {
	switch arch {
	case "":
		return ""
	case "ppc", "ppc64", "m68k", "sparc", "sparc64", "hppa", "m88k", "s390", "s390x":
		return "big"
	}
	return "little"
}

var machoTypes = map[uint32]string{
	1: "object", 2: "exec", 3: "fvmlib", 4: "core", 5: "preload", 6: "shared", 7: "dylinker",
	8: "bundle", 9: "dylib_stub", 10: "dsym", 11: "kext", 12: "fileset",
}

func machoType(ftype, flags uint32) string {
	if ftype == 2 && flags&0x200000 != 0 { // MH_PIE
		return "pie"
	}
	return machoTypes[ftype]
}

var machoPlatforms = map[uint32]string{
	1: "macos", 2: "ios", 3: "tvos", 4: "watchos", 5: "bridgeos", 6: "maccatalyst",
	7: "iossimulator", 8: "tvossimulator", 9: "watchossimulator", 10: "driverkit",
	11: "visionos", 12: "visionossimulator",
}

func inspectMachO(s *src) records.Triage {
	t := records.Triage{Format: "macho", OS: "darwin"}
	h := s.head
	var bo binary.ByteOrder = binary.BigEndian
	t.Endianness = "big"
	if h[0] == 0xce || h[0] == 0xcf {
		bo, t.Endianness = binary.LittleEndian, "little"
	}
	hdr := 28
	t.Bits = 32
	if h[0] == 0xcf || h[3] == 0xcf {
		hdr, t.Bits = 32, 64
	}
	if len(h) < hdr {
		t.Problem = fmt.Sprintf("truncated Mach-O header: %d bytes, need %d", len(h), hdr)
		return t
	}
	cpu := bo.Uint32(h[4:])
	ftype, ncmds, sizeofcmds, flags := bo.Uint32(h[12:]), bo.Uint32(h[16:]), bo.Uint32(h[20:]), bo.Uint32(h[24:])
	if arch, bits := machoArch(cpu); arch != "" {
		t.Arch, t.Bits = arch, bits
	} else {
		detail(&t, "cputype", fmt.Sprintf("%#x", cpu))
	}
	t.Type = machoType(ftype, flags)

	want := min(int64(sizeofcmds), maxLoadCmds)
	cmds := s.at(int64(hdr), want)
	if int64(len(cmds)) < want {
		addProblem(&t, fmt.Sprintf("load commands truncated: %d of %d bytes in file", len(cmds), sizeofcmds))
	}
	var (
		haveSymtab, haveDysym  bool
		nsyms, nlocal, nextdef uint32
	)
	off := 0
	for i := uint32(0); i < ncmds; i++ {
		if off+8 > len(cmds) {
			if int64(len(cmds)) == want {
				addProblem(&t, fmt.Sprintf("ncmds %d overruns sizeofcmds", ncmds))
			}
			break
		}
		cmd, sz := bo.Uint32(cmds[off:]), int(bo.Uint32(cmds[off+4:]))
		if sz < 8 || sz > len(cmds)-off {
			addProblem(&t, fmt.Sprintf("bad size %d for load command %d", sz, i))
			break
		}
		c := cmds[off : off+sz]
		off += sz
		u := func(at int) uint32 {
			if at+4 > len(c) {
				return 0
			}
			return bo.Uint32(c[at:])
		}
		switch cmd &^ 0x80000000 { // LC_REQ_DYLD
		case 0x2: // LC_SYMTAB
			haveSymtab, nsyms = true, u(12)
		case 0xb: // LC_DYSYMTAB
			haveDysym, nlocal, nextdef = true, u(12), u(20)
		case 0xe: // LC_LOAD_DYLINKER
			t.Interpreter = string(cstr(c, uint64(u(8))))
		case 0x1d: // LC_CODE_SIGNATURE
			detail(&t, "signed", true)
		case 0x21, 0x2c: // LC_ENCRYPTION_INFO(_64)
			if u(16) != 0 {
				detail(&t, "encrypted", true)
			}
		case 0x32: // LC_BUILD_VERSION
			if p, ok := machoPlatforms[u(8)]; ok {
				detail(&t, "platform", p)
			}
		case 0x24:
			detail(&t, "platform", "macos")
		case 0x25:
			detail(&t, "platform", "ios")
		case 0x2f:
			detail(&t, "platform", "tvos")
		case 0x30:
			detail(&t, "platform", "watchos")
		}
	}
	// Go and ld64 put an executable's symbols in the external-defined range;
	// strip leaves only imports (and __mh_execute_header).
	stripped := !haveSymtab || nsyms == 0
	if haveSymtab && haveDysym {
		if ftype == 2 {
			stripped = nlocal+nextdef <= 1
		} else {
			stripped = nlocal == 0
		}
	}
	t.Stripped = &stripped
	if hasUPXMagic(s.head) {
		t.Packer = "upx"
	}
	return t
}

// inspectCafebabe tells a fat Mach-O from a Java class file, which shares
// its magic number.
func inspectCafebabe(s *src) records.Triage {
	h := s.head
	if len(h) < 8 {
		return records.Triage{Format: "unknown", Problem: fmt.Sprintf("truncated 0xcafebabe header: %d bytes", len(h))}
	}
	be := binary.BigEndian
	n := be.Uint32(h[4:])
	is64 := h[3] == 0xbf
	if n == 0 || (!is64 && n >= maxFatSlices) {
		t := records.Triage{Format: "unknown"}
		if major := be.Uint16(h[6:]); !is64 && major >= 45 {
			detail(&t, "java_class", true)
			detail(&t, "class_version", int(major))
		}
		return t
	}
	t := records.Triage{Format: "macho", OS: "darwin"}
	detail(&t, "fat", true)
	if n >= maxFatSlices {
		t.Problem = fmt.Sprintf("implausible fat slice count %d", n)
		return t
	}
	ent := int64(20)
	if is64 {
		ent = 32
	}
	tab := s.at(8, int64(n)*ent)
	if int64(len(tab)) < int64(n)*ent {
		addProblem(&t, fmt.Sprintf("truncated fat header: %d of %d slices", int64(len(tab))/ent, n))
	}
	var slices []string
	var firstOff uint64
	bitsSet := map[int]bool{}
	for i := int64(0); (i+1)*ent <= int64(len(tab)); i++ {
		e := tab[i*ent:]
		arch, bits := machoArch(be.Uint32(e))
		if arch == "" {
			arch = fmt.Sprintf("cpu%#x", be.Uint32(e))
		}
		slices = append(slices, arch)
		bitsSet[bits] = true
		off, size := uint64(be.Uint32(e[8:])), uint64(be.Uint32(e[12:]))
		if is64 {
			off, size = be.Uint64(e[8:]), be.Uint64(e[16:])
		}
		if i == 0 {
			firstOff = off
		}
		if off > uint64(s.size) || size > uint64(s.size)-off {
			addProblem(&t, fmt.Sprintf("fat slice %d (%s) beyond end of file", i, arch))
		}
	}
	detail(&t, "slices", slices)
	if len(slices) == 0 {
		return t
	}
	same, endian := true, archEndian(slices[0])
	for _, a := range slices[1:] {
		same = same && a == slices[0]
		if archEndian(a) != endian {
			endian = ""
		}
	}
	t.Endianness = endian
	if same && len(bitsSet) == 1 {
		t.Arch = slices[0]
		for b := range bitsSet {
			t.Bits = b
		}
	}
	if fh := s.at(int64(min(firstOff, uint64(s.size))), 28); isMachO(fh) && len(fh) >= 28 {
		var bo binary.ByteOrder = binary.BigEndian
		if fh[0] == 0xce || fh[0] == 0xcf {
			bo = binary.LittleEndian
		}
		t.Type = machoType(bo.Uint32(fh[12:]), bo.Uint32(fh[24:]))
	}
	return t
}
