// Package elftest writes minimal, valid ELF files for tests: a header, program
// headers (PT_LOAD, optional PT_INTERP and PT_DYNAMIC) and, unless stripped,
// a section table with .symtab. Real toolchains cannot target every machine
// Talkbox triages, so tests build these instead.
package elftest

import (
	"bytes"
	"cmp"
	"encoding/binary"
)

// Spec describes the file to write.
type Spec struct {
	Machine  uint16 // e_machine
	Bits     int    // 32 or 64
	Big      bool   // big-endian
	Flags    uint32 // e_flags
	OSABI    byte
	Type     uint16 // e_type; 0 means ET_EXEC
	Interp   string // PT_INTERP contents; empty: static
	Stripped bool   // no .symtab
}

// Build returns the ELF file bytes.
func Build(s Spec) []byte {
	var o binary.ByteOrder = binary.LittleEndian
	if s.Big {
		o = binary.BigEndian
	}
	is64 := s.Bits == 64
	ehsize, phentsize, shentsize := 52, 32, 40
	if is64 {
		ehsize, phentsize, shentsize = 64, 56, 64
	}
	typ := cmp.Or(s.Type, 2)
	type seg struct {
		typ        uint32
		off, fsize uint64
	}
	segs := []seg{{typ: 1}}
	var tail bytes.Buffer // contents after the program headers
	nph := 1
	if s.Interp != "" {
		nph += 2
	}
	dataStart := uint64(ehsize + nph*phentsize)
	if s.Interp != "" {
		segs = append(segs, seg{typ: 3, off: dataStart, fsize: uint64(len(s.Interp) + 1)})
		tail.WriteString(s.Interp)
		tail.WriteByte(0)
		dynOff := dataStart + uint64(tail.Len())
		segs = append(segs, seg{typ: 2, off: dynOff, fsize: 16})
		tail.Write(make([]byte, 16))
	}
	// Section table: null, .shstrtab, and .symtab unless stripped.
	shstr := []byte("\x00.shstrtab\x00.symtab\x00")
	shstrOff := dataStart + uint64(tail.Len())
	tail.Write(shstr)
	for tail.Len()%8 != 0 {
		tail.WriteByte(0)
	}
	shoff := dataStart + uint64(tail.Len())
	nsh := 2
	if !s.Stripped {
		nsh = 3
	}
	fileEnd := shoff + uint64(nsh*shentsize)
	segs[0].fsize = fileEnd

	var b bytes.Buffer
	ident := [16]byte{0x7f, 'E', 'L', 'F', 1, 1, 1, s.OSABI}
	if is64 {
		ident[4] = 2
	}
	if s.Big {
		ident[5] = 2
	}
	b.Write(ident[:])
	w := func(v any) { binary.Write(&b, o, v) }
	word := func(v uint64) {
		if is64 {
			w(v)
		} else {
			w(uint32(v))
		}
	}
	w(typ)
	w(s.Machine)
	w(uint32(1))
	word(0x10000) // entry
	word(uint64(ehsize))
	word(shoff)
	w(s.Flags)
	w(uint16(ehsize))
	w(uint16(phentsize))
	w(uint16(nph))
	w(uint16(shentsize))
	w(uint16(nsh))
	w(uint16(1)) // shstrndx
	for _, sg := range segs {
		if is64 {
			w(sg.typ)
			w(uint32(5))
			w(sg.off)
			w(uint64(0x10000) + sg.off)
			w(uint64(0x10000) + sg.off)
			w(sg.fsize)
			w(sg.fsize)
			w(uint64(0x1000))
		} else {
			w(sg.typ)
			w(uint32(sg.off))
			w(uint32(0x10000 + sg.off))
			w(uint32(0x10000 + sg.off))
			w(uint32(sg.fsize))
			w(uint32(sg.fsize))
			w(uint32(5))
			w(uint32(0x1000))
		}
	}
	b.Write(tail.Bytes())
	section := func(name, typ uint32, off, size uint64) {
		w(name)
		w(typ)
		word(0) // flags
		word(0) // addr
		word(off)
		word(size)
		w(uint32(0)) // link
		w(uint32(0)) // info
		word(1)      // addralign
		word(0)      // entsize
	}
	section(0, 0, 0, 0)
	section(1, 3, shstrOff, uint64(len(shstr)))
	if !s.Stripped {
		section(11, 2, 0, 0)
	}
	return b.Bytes()
}
