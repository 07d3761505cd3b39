package triage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// ELF constants (System V gABI and the processor supplements).
const (
	etRel  = 1
	etExec = 2
	etDyn  = 3
	etCore = 4

	ptDynamic      = 2
	ptInterp       = 3
	ptNote         = 4
	ptMIPSAbiflags = 0x70000003

	shtSymtab        = 2
	shtNobits        = 8
	shtGNUAttributes = 0x6ffffff5
	shtProcAttrs     = 0x70000003 // SHT_ARM_ATTRIBUTES, SHT_RISCV_ATTRIBUTES
	shtMIPSAbiflags  = 0x7000002a

	dtNull   = 0
	dtNeeded = 1
	dtFlags1 = 0x6ffffffb
	df1PIE   = 0x08000000

	emSPARC        = 2
	em386          = 3
	em68K          = 4
	emMIPS         = 8
	emMIPSRS3LE    = 10
	emPARISC       = 15
	emSPARC32PLUS  = 18
	emPPC          = 20
	emPPC64        = 21
	emS390         = 22
	emARM          = 40
	emSH           = 42
	emSPARCV9      = 43
	emARC          = 45
	emX86_64       = 62
	emARCCompact   = 93
	emAArch64      = 183
	emARCCompact2  = 195
	emRISCV        = 243
	emARCCompact3  = 255
	emARCCompact64 = 253
	emLoongArch    = 258
)

// Limits on what a header may make us read. The kernel refuses more than
// 64 KiB of program headers; the others are far above anything real.
const (
	maxPhdrBytes   = 64 << 10
	maxSections    = 1 << 18
	maxShstrtab    = 1 << 20
	maxNoteBytes   = 64 << 10
	maxNoteSegs    = 16
	maxDynBytes    = 64 << 10
	maxAttrBytes   = 64 << 10
	maxGoBuildinfo = 256 << 10
	maxInterp      = 4096
	shChunkBytes   = 64 << 10
)

// elfMachines maps e_machine to the canonical arch for machines whose name
// does not depend on the ELF class.
var elfMachines = map[uint16]string{
	emSPARC:        "sparc",
	em386:          "x86",
	em68K:          "m68k",
	5:              "m88k",
	6:              "x86", // EM_486, used by a few old toolchains
	7:              "i860",
	emPARISC:       "hppa",
	emSPARC32PLUS:  "sparc",
	emPPC:          "ppc",
	emPPC64:        "ppc64",
	emARM:          "arm",
	emSH:           "sh",
	emSPARCV9:      "sparc64",
	emARC:          "arc",
	46:             "h8300",
	50:             "ia64",
	emX86_64:       "x86_64",
	75:             "vax",
	76:             "cris",
	83:             "avr",
	88:             "m32r",
	89:             "mn10300",
	92:             "openrisc",
	emARCCompact:   "arc",
	94:             "xtensa",
	106:            "bfin",
	113:            "nios2",
	164:            "hexagon",
	emAArch64:      "aarch64",
	185:            "avr32",
	188:            "tilepro",
	189:            "microblaze",
	191:            "tilegx",
	emARCCompact2:  "arc",
	247:            "bpf",
	252:            "csky",
	emARCCompact64: "arc64",
	emARCCompact3:  "arc",
	0x5441:         "frv",
	0x8472:         "openrisc", // pre-registration EM_OPENRISC
	0x9026:         "alpha",
	0xa390:         "s390", // EM_S390_OLD
	0xbaab:         "microblaze",
}

var elfOSABI = map[byte]string{
	1:   "hpux",
	2:   "netbsd",
	3:   "linux",
	4:   "hurd",
	6:   "solaris",
	7:   "aix",
	8:   "irix",
	9:   "freebsd",
	10:  "tru64",
	11:  "modesto",
	12:  "openbsd",
	13:  "openvms",
	14:  "nsk",
	15:  "aros",
	16:  "fenixos",
	17:  "cloudabi",
	18:  "openvos",
	255: "standalone",
}

var elfTypes = map[uint16]string{etRel: "object", etExec: "exec", etDyn: "shared", etCore: "core"}

type span struct{ off, size uint64 }

type elfFile struct {
	s        *src
	t        *records.Triage
	bo       binary.ByteOrder
	is64     bool
	etype    uint16
	machine  uint16
	osabi    byte
	flags    uint32
	phoff    uint64
	shoff    uint64
	phent    uint64
	phnum    uint64
	shent    uint64
	shnum    uint64
	shstrndx uint64

	interp, dyn, mipsAbiflags span
	hasInterp, hasDyn         bool
	notes                     []span
	noteAlign                 []uint64

	hasSymtab, upx                          bool
	procAttrs, gnuAttrs, mipsAbiSec, goInfo span
}

func inspectELF(s *src) records.Triage {
	t := records.Triage{Format: "elf"}
	h := s.head
	if len(h) < 6 {
		t.Problem = fmt.Sprintf("truncated ELF header: %d bytes, need 52", len(h))
		return t
	}
	e := &elfFile{s: s, t: &t}
	need := 52
	switch h[4] {
	case 1:
		t.Bits = 32
	case 2:
		t.Bits, e.is64, need = 64, true, 64
	default:
		t.Problem = fmt.Sprintf("invalid ELF class %d", h[4])
		return t
	}
	switch h[5] {
	case 1:
		t.Endianness, e.bo = "little", binary.LittleEndian
	case 2:
		t.Endianness, e.bo = "big", binary.BigEndian
	default:
		t.Problem = fmt.Sprintf("invalid ELF data encoding %d", h[5])
		return t
	}
	if len(h) >= 20 {
		e.etype, e.machine = e.bo.Uint16(h[16:]), e.bo.Uint16(h[18:])
		t.Arch = e.arch()
	}
	if len(h) < need {
		t.Problem = fmt.Sprintf("truncated ELF header: %d bytes, need %d", len(h), need)
		return t
	}
	e.osabi = h[7]
	if e.is64 {
		e.phoff, e.shoff = e.bo.Uint64(h[32:]), e.bo.Uint64(h[40:])
		e.flags = e.bo.Uint32(h[48:])
		e.phent, e.phnum = uint64(e.bo.Uint16(h[54:])), uint64(e.bo.Uint16(h[56:]))
		e.shent, e.shnum, e.shstrndx = uint64(e.bo.Uint16(h[58:])), uint64(e.bo.Uint16(h[60:])), uint64(e.bo.Uint16(h[62:]))
	} else {
		e.phoff, e.shoff = uint64(e.bo.Uint32(h[28:])), uint64(e.bo.Uint32(h[32:]))
		e.flags = e.bo.Uint32(h[36:])
		e.phent, e.phnum = uint64(e.bo.Uint16(h[42:])), uint64(e.bo.Uint16(h[44:]))
		e.shent, e.shnum, e.shstrndx = uint64(e.bo.Uint16(h[46:])), uint64(e.bo.Uint16(h[48:])), uint64(e.bo.Uint16(h[50:]))
	}
	if typ, ok := elfTypes[e.etype]; ok {
		t.Type = typ
	} else {
		detail(&t, "e_type", int(e.etype))
	}
	if t.Arch == "" {
		detail(&t, "machine", int(e.machine))
	}
	e.readSections()
	e.readPhdrs()
	e.finish()
	return t
}

// arch maps e_machine (and the class, for families named by width).
func (e *elfFile) arch() string {
	switch e.machine {
	case emMIPS, emMIPSRS3LE:
		if e.is64 {
			return "mips64"
		}
		return "mips"
	case emS390:
		if e.is64 {
			return "s390x"
		}
		return "s390"
	case emRISCV:
		if e.is64 {
			return "riscv64"
		}
		return "riscv32"
	case emLoongArch:
		if e.is64 {
			return "loongarch64"
		}
		return "loongarch32"
	}
	return elfMachines[e.machine]
}

func (e *elfFile) u(b []byte, off32, off64 int) uint64 {
	if e.is64 {
		return e.bo.Uint64(b[off64:])
	}
	return uint64(e.bo.Uint32(b[off32:]))
}

func (e *elfFile) problem(format string, a ...any) { addProblem(e.t, fmt.Sprintf(format, a...)) }

// fits reports whether [off, off+n) lies inside the file.
func (e *elfFile) fits(off, n uint64) bool {
	size := uint64(e.s.size)
	return off <= size && n <= size-off
}

func (e *elfFile) readPhdrs() {
	if e.phnum == 0xffff { // PN_XNUM: the real count is in section 0's sh_info
		if sh0 := e.section0(); sh0 != nil {
			e.phnum = uint64(e.bo.Uint32(sh0[28+boolInt(e.is64)*16:]))
		}
	}
	if e.phoff == 0 || e.phnum == 0 {
		return
	}
	minEnt := uint64(32)
	if e.is64 {
		minEnt = 56
	}
	if e.phent < minEnt {
		e.problem("bad e_phentsize %d", e.phent)
		return
	}
	n := e.phnum
	if n*e.phent > maxPhdrBytes {
		e.problem("too many program headers (%d)", n)
		n = maxPhdrBytes / e.phent
	}
	if !e.fits(e.phoff, e.phent) {
		e.problem("program headers beyond end of file")
		return
	}
	if avail := (uint64(e.s.size) - e.phoff) / e.phent; avail < n {
		e.problem("program headers truncated: %d of %d in file", avail, e.phnum)
		n = avail
	}
	b := e.s.at(int64(e.phoff), int64(n*e.phent))
	for i := uint64(0); (i+1)*e.phent <= uint64(len(b)); i++ {
		p := b[i*e.phent:]
		typ := e.bo.Uint32(p)
		var sp span
		var align uint64
		if e.is64 {
			sp = span{e.bo.Uint64(p[8:]), e.bo.Uint64(p[32:])}
			align = e.bo.Uint64(p[48:])
		} else {
			sp = span{uint64(e.bo.Uint32(p[4:])), uint64(e.bo.Uint32(p[16:]))}
			align = uint64(e.bo.Uint32(p[28:]))
		}
		switch typ {
		case ptInterp:
			if !e.hasInterp {
				e.interp, e.hasInterp = sp, true
			}
		case ptDynamic:
			e.dyn, e.hasDyn = sp, true
		case ptNote:
			if len(e.notes) < maxNoteSegs {
				e.notes = append(e.notes, sp)
				e.noteAlign = append(e.noteAlign, align)
			}
		case ptMIPSAbiflags:
			if e.machine == emMIPS || e.machine == emMIPSRS3LE {
				e.mipsAbiflags = sp
			}
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// section0 returns the first section header, which holds the extended
// section count, string-table index and program-header count.
func (e *elfFile) section0() []byte {
	minEnt := uint64(40 + 24*boolInt(e.is64))
	if e.shoff == 0 || e.shent < minEnt || !e.fits(e.shoff, minEnt) {
		return nil
	}
	return e.s.at(int64(e.shoff), int64(minEnt))
}

// readSections streams the section header table in chunks, noting only the
// sections triage needs; names are looked up for UPX and Go only.
func (e *elfFile) readSections() {
	if e.shoff == 0 {
		return
	}
	minEnt := uint64(40 + 24*boolInt(e.is64))
	if e.shent < minEnt {
		if e.shnum != 0 {
			e.problem("bad e_shentsize %d", e.shent)
		}
		return
	}
	if !e.fits(e.shoff, e.shent) {
		e.problem("section headers beyond end of file")
		return
	}
	n, strndx := e.shnum, e.shstrndx
	if n == 0 || strndx == 0xffff { // extended numbering (SHN_XINDEX)
		sh0 := e.section0()
		if sh0 == nil {
			e.problem("truncated section header 0")
			return
		}
		if n == 0 {
			n = e.u(sh0, 20, 32)
		}
		if strndx == 0xffff {
			strndx = uint64(e.bo.Uint32(sh0[24+boolInt(e.is64)*16:]))
		}
	}
	if n == 0 {
		return
	}
	if avail := (uint64(e.s.size) - e.shoff) / e.shent; avail < n {
		e.problem("section headers truncated: %d of %d in file", avail, n)
		n = avail
	}
	if n > maxSections {
		e.problem("too many sections (%d), read %d", n, maxSections)
		n = maxSections
	}
	var names []byte
	if strndx != 0 && strndx < n {
		if sh := e.s.at(int64(e.shoff+strndx*e.shent), int64(minEnt)); uint64(len(sh)) == minEnt {
			off, size := e.u(sh, 16, 24), e.u(sh, 20, 32)
			if e.bo.Uint32(sh[4:]) != shtNobits && off < uint64(e.s.size) {
				names = e.s.at(int64(off), int64(min(size, maxShstrtab)))
			}
		}
	}
	per := max(shChunkBytes/e.shent, 1)
	var buf []byte // reused across chunks; n*shent is within the file
	if e.shoff+n*e.shent > uint64(len(e.s.head)) {
		buf = make([]byte, min(per, n)*e.shent)
	}
	for i := uint64(0); i < n; i += per {
		k := min(per, n-i)
		b := e.s.atInto(buf, int64(e.shoff+i*e.shent), int64(k*e.shent))
		for j := uint64(0); (j+1)*e.shent <= uint64(len(b)); j++ {
			e.section(b[j*e.shent:], names)
		}
		if uint64(len(b)) < k*e.shent {
			break
		}
	}
}

func (e *elfFile) section(sh, names []byte) {
	typ := e.bo.Uint32(sh[4:])
	sp := span{e.u(sh, 16, 24), e.u(sh, 20, 32)}
	switch typ {
	case shtSymtab:
		e.hasSymtab = true
	case shtGNUAttributes:
		e.gnuAttrs = sp
	case shtProcAttrs:
		if e.machine == emARM || e.machine == emRISCV {
			e.procAttrs = sp
		}
	case shtMIPSAbiflags:
		e.mipsAbiSec = sp
	}
	if names == nil {
		return
	}
	switch string(cstr(names, uint64(e.bo.Uint32(sh)))) {
	case "UPX0", "UPX1":
		e.upx = true
	case ".go.buildinfo":
		if typ != shtNobits {
			e.goInfo = sp
		}
	}
}

// cstr returns the NUL-terminated string at off, without copying.
func cstr(b []byte, off uint64) []byte {
	if off >= uint64(len(b)) {
		return nil
	}
	b = b[off:]
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

// read returns a section or segment's bytes, capped at limit.
func (e *elfFile) read(sp span, limit uint64) []byte {
	if sp.size == 0 || sp.off >= uint64(e.s.size) {
		return nil
	}
	return e.s.at(int64(sp.off), int64(min(sp.size, limit)))
}

func (e *elfFile) finish() {
	t := e.t
	if e.hasInterp {
		if !e.fits(e.interp.off, 1) {
			e.problem("interpreter beyond end of file")
		} else {
			t.Interpreter = string(cstr(e.read(e.interp, maxInterp), 0))
		}
	}

	// The dynamic section only matters without an interpreter: it tells a
	// static-pie (DF_1_PIE, no DT_NEEDED) from a shared library.
	needed, pie := e.hasDyn, false
	if e.hasDyn && !e.hasInterp {
		needed, pie = e.readDynamic()
	}
	switch e.etype {
	case etExec, etDyn:
		if e.etype == etDyn && (e.hasInterp || pie) {
			t.Type = "pie"
		}
		// Static means "needs no dynamic loader or libraries": a static-pie
		// carries a dynamic section for self-relocation, but no DT_NEEDED.
		static := !e.hasInterp && !needed && t.Type != "shared"
		t.Static = &static
	}
	stripped := !e.hasSymtab
	t.Stripped = &stripped

	gi := e.goBuild()
	if gi.version != "" {
		detail(t, "go", gi.version)
	}
	os, from := e.os(gi)
	t.OS = os
	detail(t, "os_source", from)

	t.ABI = e.abi(gi)

	if e.upx || hasUPXMagic(e.s.head) {
		t.Packer = "upx"
	}
}

// readDynamic scans the dynamic segment for DT_NEEDED and DF_1_PIE. When it
// cannot be read, the binary is assumed to need libraries.
func (e *elfFile) readDynamic() (needed, pie bool) {
	b := e.read(e.dyn, maxDynBytes)
	if len(b) == 0 {
		if !e.fits(e.dyn.off, 1) {
			e.problem("dynamic segment beyond end of file")
		}
		return true, false
	}
	ent := 8 + 8*boolInt(e.is64)
	for i := 0; i+ent <= len(b); i += ent {
		tag, val := e.u(b[i:], 0, 0), e.u(b[i:], 4, 8)
		switch tag {
		case dtNull:
			return needed, pie
		case dtNeeded:
			needed = true
		case dtFlags1:
			pie = val&df1PIE != 0
		}
	}
	return needed, pie
}

// os decides the target OS. EI_OSABI is authoritative when set; System V
// (0) is what Linux toolchains write, but so do Solaris, Android and Go for
// several BSDs, so we look in turn at OS notes, Go build info and the
// interpreter path. With no hint at all we say linux: Linux loads any SysV
// ELF, and static SysV binaries in the wild are overwhelmingly Linux ones.
func (e *elfFile) os(gi goBuild) (os, source string) {
	if os, ok := elfOSABI[e.osabi]; ok {
		return os, "osabi"
	}
	if os := e.noteOS(); os != "" {
		return os, "note"
	}
	if gi.goos != "" {
		return gi.goos, "go"
	}
	if os := osFromInterp(e.t.Interpreter); os != "" {
		return os, "interpreter"
	}
	return "linux", "default"
}

var gnuABITagOS = map[uint32]string{0: "linux", 1: "hurd", 2: "solaris", 3: "freebsd", 4: "netbsd", 5: "syllable"}

var noteOwnerOS = map[string]string{
	"FreeBSD":      "freebsd",
	"NetBSD":       "netbsd",
	"OpenBSD":      "openbsd",
	"DragonFly":    "dragonfly",
	"Android":      "android",
	"SUNW Solaris": "solaris",
	"Haiku":        "haiku",
	"LINUX":        "linux", // core files
}

// noteOS looks for an OS-identifying note in the PT_NOTE segments.
func (e *elfFile) noteOS() string {
	budget := uint64(maxNoteBytes)
	for i, sp := range e.notes {
		b := e.read(sp, min(sp.size, budget))
		budget -= uint64(len(b))
		align := 4
		if e.noteAlign[i] == 8 {
			align = 8
		}
		for len(b) >= 12 {
			namesz, descsz, typ := e.bo.Uint32(b), e.bo.Uint32(b[4:]), e.bo.Uint32(b[8:])
			nameEnd := 12 + uint64(namesz)
			descOff := alignUp(nameEnd, align)
			next := alignUp(descOff+uint64(descsz), align)
			if next > uint64(len(b)) {
				next = uint64(len(b)) // last, possibly truncated note
			}
			if nameEnd <= uint64(len(b)) {
				name := bytes.TrimRight(b[12:nameEnd], "\x00")
				if string(name) == "GNU" && typ == 1 && descOff+4 <= uint64(len(b)) {
					if os, ok := gnuABITagOS[e.bo.Uint32(b[descOff:])]; ok {
						return os
					}
				} else if os, ok := noteOwnerOS[string(name)]; ok {
					return os
				}
			}
			b = b[next:]
		}
		if budget == 0 {
			break
		}
	}
	return ""
}

func alignUp(x uint64, a int) uint64 {
	m := uint64(a - 1)
	if x > ^uint64(0)-m {
		return ^uint64(0)
	}
	return (x + m) &^ m
}

// osFromInterp knows the dynamic loaders' install paths.
func osFromInterp(p string) string {
	if p == "" {
		return ""
	}
	base := p[strings.LastIndexByte(p, '/')+1:]
	switch {
	case strings.HasPrefix(p, "/system/bin/linker"), strings.HasPrefix(p, "/system/bin/bootstrap/linker"):
		return "android"
	case base == "ld-elf.so.1" || base == "ld-elf32.so.1":
		return "freebsd"
	case base == "ld-elf.so.2":
		return "dragonfly"
	case base == "ld.elf_so":
		return "netbsd"
	case p == "/usr/libexec/ld.so":
		return "openbsd"
	case strings.HasPrefix(p, "/usr/lib/") && base == "ld.so.1",
		strings.HasPrefix(p, "/lib/amd64/"), strings.HasPrefix(p, "/lib/sparcv9/"):
		return "solaris"
	case strings.HasPrefix(base, "ld-linux"), strings.HasPrefix(base, "ld-musl-"),
		strings.HasPrefix(base, "ld-uClibc"), strings.HasPrefix(base, "ld64.so."),
		base == "ld.so.1":
		return "linux"
	case strings.HasPrefix(base, "ldqnx"):
		return "qnx"
	}
	return ""
}
