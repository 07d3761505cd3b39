package triage

import (
	"encoding/binary"
)

// Builders for minimal but well-formed headers, for targets Go cannot
// produce. Layout: header, program headers, data blobs, section headers.

type elfNote struct {
	name string
	typ  uint32
	desc []byte
}

type elfSec struct {
	name string
	typ  uint32
	data []byte
}

type elfSeg struct {
	typ  uint32
	data []byte
}

type elfSpec struct {
	is64, big bool
	osabi     byte
	etype     uint16
	machine   uint16
	flags     uint32
	interp    string
	dyn       [][2]uint64 // tag, value; DT_NULL is appended
	notes     []elfNote
	segs      []elfSeg
	secs      []elfSec
	symtab    bool   // add a .symtab, i.e. not stripped
	headBlob  []byte // placed right after the program headers
	noShdrs   bool
}

func (sp elfSpec) order() order {
	if sp.big {
		return binary.BigEndian
	}
	return binary.LittleEndian
}

func (sp elfSpec) build() []byte {
	bo := sp.order()
	ehsize, phent, shent := 52, 32, 40
	if sp.is64 {
		ehsize, phent, shent = 64, 56, 64
	}
	type ph struct {
		typ       uint32
		off, size int
		align     int
	}
	var phs []ph
	nph := len(sp.segs)
	if sp.interp != "" {
		nph++
	}
	if sp.dyn != nil {
		nph++
	}
	if sp.notes != nil {
		nph++
	}
	base := ehsize + nph*phent
	var data []byte
	place := func(b []byte, align int) int {
		for (base+len(data))%align != 0 {
			data = append(data, 0)
		}
		off := base + len(data)
		data = append(data, b...)
		return off
	}
	if sp.headBlob != nil {
		place(sp.headBlob, 1)
	}
	if sp.interp != "" {
		b := append([]byte(sp.interp), 0)
		phs = append(phs, ph{ptInterp, place(b, 1), len(b), 1})
	}
	if sp.notes != nil {
		var nb []byte
		for _, n := range sp.notes {
			var h [12]byte
			bo.PutUint32(h[0:], uint32(len(n.name)+1))
			bo.PutUint32(h[4:], uint32(len(n.desc)))
			bo.PutUint32(h[8:], n.typ)
			nb = append(nb, h[:]...)
			nb = append(nb, pad4(append([]byte(n.name), 0))...)
			nb = append(nb, pad4(n.desc)...)
		}
		phs = append(phs, ph{ptNote, place(nb, 4), len(nb), 4})
	}
	if sp.dyn != nil {
		var db []byte
		for _, d := range append(sp.dyn, [2]uint64{0, 0}) {
			db = appendWord(db, bo, sp.is64, d[0])
			db = appendWord(db, bo, sp.is64, d[1])
		}
		phs = append(phs, ph{ptDynamic, place(db, 8), len(db), 8})
	}
	for _, s := range sp.segs {
		phs = append(phs, ph{s.typ, place(s.data, 8), len(s.data), 8})
	}

	secs := sp.secs
	if sp.symtab {
		secs = append(secs, elfSec{".symtab", shtSymtab, make([]byte, shent/2)})
	}
	type sh struct {
		name, typ uint32
		off, size int
	}
	var shs []sh
	strtab := []byte{0}
	for _, s := range secs {
		nameOff := len(strtab)
		strtab = append(append(strtab, s.name...), 0)
		shs = append(shs, sh{uint32(nameOff), s.typ, place(s.data, 8), len(s.data)})
	}
	nameOff := len(strtab)
	strtab = append(append(strtab, ".shstrtab"...), 0)
	shs = append(shs, sh{uint32(nameOff), 3, place(strtab, 1), len(strtab)})

	shoff := place(nil, 8)
	out := make([]byte, shoff, shoff+(len(shs)+1)*shent)
	copy(out[base:], data)
	copy(out, "\x7fELF")
	out[4], out[5], out[6], out[7] = 1, 1, 1, sp.osabi
	if sp.is64 {
		out[4] = 2
	}
	if sp.big {
		out[5] = 2
	}
	bo.PutUint16(out[16:], sp.etype)
	bo.PutUint16(out[18:], sp.machine)
	bo.PutUint32(out[20:], 1)
	nsh := len(shs) + 1
	if sp.noShdrs {
		shoff, nsh = 0, 0
	}
	if sp.is64 {
		bo.PutUint64(out[32:], uint64(ehsize))
		bo.PutUint64(out[40:], uint64(shoff))
		bo.PutUint32(out[48:], sp.flags)
		bo.PutUint16(out[52:], uint16(ehsize))
		bo.PutUint16(out[54:], uint16(phent))
		bo.PutUint16(out[56:], uint16(nph))
		bo.PutUint16(out[58:], uint16(shent))
		bo.PutUint16(out[60:], uint16(nsh))
		bo.PutUint16(out[62:], uint16(max(nsh-1, 0)))
	} else {
		bo.PutUint32(out[28:], uint32(ehsize))
		bo.PutUint32(out[32:], uint32(shoff))
		bo.PutUint32(out[36:], sp.flags)
		bo.PutUint16(out[40:], uint16(ehsize))
		bo.PutUint16(out[42:], uint16(phent))
		bo.PutUint16(out[44:], uint16(nph))
		bo.PutUint16(out[46:], uint16(shent))
		bo.PutUint16(out[48:], uint16(nsh))
		bo.PutUint16(out[50:], uint16(max(nsh-1, 0)))
	}
	for i, p := range phs {
		o := out[ehsize+i*phent:]
		bo.PutUint32(o, p.typ)
		if sp.is64 {
			bo.PutUint32(o[4:], 4)
			bo.PutUint64(o[8:], uint64(p.off))
			bo.PutUint64(o[16:], uint64(p.off))
			bo.PutUint64(o[24:], uint64(p.off))
			bo.PutUint64(o[32:], uint64(p.size))
			bo.PutUint64(o[40:], uint64(p.size))
			bo.PutUint64(o[48:], uint64(p.align))
		} else {
			bo.PutUint32(o[4:], uint32(p.off))
			bo.PutUint32(o[8:], uint32(p.off))
			bo.PutUint32(o[12:], uint32(p.off))
			bo.PutUint32(o[16:], uint32(p.size))
			bo.PutUint32(o[20:], uint32(p.size))
			bo.PutUint32(o[24:], 4)
			bo.PutUint32(o[28:], uint32(p.align))
		}
	}
	if sp.noShdrs {
		return out
	}
	out = out[:shoff+nsh*shent]
	for i, s := range shs {
		o := out[shoff+(i+1)*shent:]
		bo.PutUint32(o, s.name)
		bo.PutUint32(o[4:], s.typ)
		if sp.is64 {
			bo.PutUint64(o[24:], uint64(s.off))
			bo.PutUint64(o[32:], uint64(s.size))
		} else {
			bo.PutUint32(o[16:], uint32(s.off))
			bo.PutUint32(o[20:], uint32(s.size))
		}
	}
	return out
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func appendWord(b []byte, bo order, is64 bool, v uint64) []byte {
	if is64 {
		return bo.AppendUint64(b, v)
	}
	return bo.AppendUint32(b, uint32(v))
}

// attrSection builds an "A"-format build-attributes section with one
// file-scope subsection for vendor.
func attrSection(bo order, vendor string, body []byte) []byte {
	sub := append([]byte{1}, bo.AppendUint32(nil, uint32(5+len(body)))...)
	sub = append(sub, body...)
	v := append([]byte(vendor), 0)
	out := []byte{'A'}
	out = bo.AppendUint32(out, uint32(4+len(v)+len(sub)))
	out = append(out, v...)
	return append(out, sub...)
}

// uleb appends ULEB128 values.
func uleb(vals ...uint64) []byte {
	var b []byte
	for _, v := range vals {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

// mipsAbiflags builds a .MIPS.abiflags record (only single bytes are set,
// so byte order does not matter).
func mipsAbiflags(isaLevel, isaRev, fpABI byte) []byte {
	b := make([]byte, 24)
	b[2], b[3], b[4], b[5], b[7] = isaLevel, isaRev, 1, 1, fpABI
	return b
}

type peSpec struct {
	machine   uint16
	plus      bool // PE32+
	dll       bool
	subsystem uint16
	clr       bool
	coffSyms  bool
	sections  []string
}

func (p peSpec) build() []byte {
	le := binary.LittleEndian
	b := make([]byte, 0x400)
	copy(b, "MZ")
	le.PutUint16(b[0x18:], 0x40)
	le.PutUint32(b[0x3c:], 0x80)
	copy(b[0x80:], "PE\x00\x00")
	coff := b[0x84:]
	le.PutUint16(coff, p.machine)
	le.PutUint16(coff[2:], uint16(len(p.sections)))
	if p.coffSyms {
		le.PutUint32(coff[8:], 0x300)
		le.PutUint32(coff[12:], 1)
	}
	optSize, ddOff := 224, 96
	if p.plus {
		optSize, ddOff = 240, 112
	}
	le.PutUint16(coff[16:], uint16(optSize))
	chars := uint16(0x0002)
	if p.dll {
		chars |= 0x2000
	}
	le.PutUint16(coff[18:], chars)
	opt := b[0x98:]
	if p.plus {
		le.PutUint16(opt, 0x20b)
	} else {
		le.PutUint16(opt, 0x10b)
	}
	le.PutUint16(opt[68:], p.subsystem)
	le.PutUint32(opt[ddOff-4:], 16)
	if p.clr {
		le.PutUint32(opt[ddOff+14*8:], 0x2008)
		le.PutUint32(opt[ddOff+14*8+4:], 0x48)
	}
	sec := b[0x98+optSize:]
	for i, name := range p.sections {
		copy(sec[i*40:], name)
	}
	return b
}

// machoThin builds a Mach-O header with LC_LOAD_DYLINKER (when dylinker is
// set) and an LC_SYMTAB holding nsyms symbols.
func machoThin(cpu uint32, is64, big bool, ftype, flags uint32, dylinker string, nsyms uint32) []byte {
	var bo order = binary.LittleEndian
	if big {
		bo = binary.BigEndian
	}
	magic := uint32(0xfeedface)
	if is64 {
		magic = 0xfeedfacf
	}
	var cmds []byte
	ncmds := 0
	if dylinker != "" {
		name := pad4(append([]byte(dylinker), 0))
		c := bo.AppendUint32(nil, 0xe)
		c = bo.AppendUint32(c, uint32(12+len(name)))
		c = bo.AppendUint32(c, 12)
		cmds = append(append(cmds, c...), name...)
		ncmds++
	}
	c := bo.AppendUint32(nil, 0x2)
	c = bo.AppendUint32(c, 24)
	c = bo.AppendUint32(c, 0)
	c = bo.AppendUint32(c, nsyms)
	c = bo.AppendUint32(c, 0)
	c = bo.AppendUint32(c, 0)
	cmds = append(cmds, c...)
	ncmds++
	out := bo.AppendUint32(nil, magic)
	out = bo.AppendUint32(out, cpu)
	out = bo.AppendUint32(out, 0)
	out = bo.AppendUint32(out, ftype)
	out = bo.AppendUint32(out, uint32(ncmds))
	out = bo.AppendUint32(out, uint32(len(cmds)))
	out = bo.AppendUint32(out, flags)
	if is64 {
		out = bo.AppendUint32(out, 0)
	}
	out = append(out, cmds...)
	return append(out, make([]byte, 64)...)
}

// machoFat joins thin Mach-O files into a universal binary.
func machoFat(align int, slices ...[]byte) []byte {
	be := binary.BigEndian
	out := be.AppendUint32(nil, 0xcafebabe)
	out = be.AppendUint32(out, uint32(len(slices)))
	off := 8 + 20*len(slices)
	var offs []int
	for _, s := range slices {
		off = (off + align - 1) / align * align
		offs = append(offs, off)
		off += len(s)
	}
	for i, s := range slices {
		var bo order = binary.LittleEndian
		if s[0] == 0xfe {
			bo = binary.BigEndian
		}
		out = be.AppendUint32(out, bo.Uint32(s[4:]))
		out = be.AppendUint32(out, bo.Uint32(s[8:]))
		out = be.AppendUint32(out, uint32(offs[i]))
		out = be.AppendUint32(out, uint32(len(s)))
		shift := uint32(0)
		for 1<<shift < align {
			shift++
		}
		out = be.AppendUint32(out, shift)
	}
	for i, s := range slices {
		out = append(out, make([]byte, offs[i]-len(out))...)
		out = append(out, s...)
	}
	return out
}

type order interface {
	binary.ByteOrder
	binary.AppendByteOrder
}
