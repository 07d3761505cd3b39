// Command gen writes a corpus of mixed sample files for the tb-plan benchmark:
// ELF for many machines and ABIs, PE, Mach-O, scripts, zip, gzip, tar and
// unrecognisable data, each unique, sizes log-uniform in [-min, -max).
package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
)

func main() {
	n := flag.Int("n", 10000, "number of files")
	dir := flag.String("dir", "bench/out/plan-corpus", "output directory")
	minSize := flag.Int("min", 1<<10, "smallest file size in bytes")
	maxSize := flag.Int("max", 1<<20, "largest file size in bytes (exclusive)")
	seed := flag.Uint64("seed", 1, "random seed")
	flag.Parse()
	rng := rand.New(rand.NewPCG(*seed, *seed^0x9e3779b97f4a7c15))
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		fail(err)
	}
	var total int64
	for i := 0; i < *n; i++ {
		size := int(math.Exp(math.Log(float64(*minSize)) + rng.Float64()*(math.Log(float64(*maxSize))-math.Log(float64(*minSize)))))
		data := sample(rng, i, size)
		if err := os.WriteFile(filepath.Join(*dir, fmt.Sprintf("s%05d", i)), data, 0o644); err != nil {
			fail(err)
		}
		total += int64(len(data))
	}
	fmt.Fprintf(os.Stderr, "gen: %d files, %d bytes, in %s\n", *n, total, *dir)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gen:", err)
	os.Exit(1)
}

const textChars = "abcdefghijklmnopqrstuvwxyz /._-0123456789\n"

// body is pseudo-random filler with some structure (runs of zeros, text), so
// entropy varies as it does in real binaries.
func body(rng *rand.Rand, n int) []byte {
	b := bytes.Repeat([]byte{0}, n)
	for i := 0; i < n; {
		run := 64 + rng.IntN(4096)
		switch rng.IntN(3) {
		case 0: // random
			for j := i; j < i+run && j < n; j++ {
				b[j] = byte(rng.Uint32())
			}
		case 1: // text
			for j := i; j < i+run && j < n; j++ {
				b[j] = textChars[rng.IntN(len(textChars))]
			}
		}
		i += run
	}
	return b
}

type elfKind struct {
	machine uint16
	class   byte // 1: 32-bit, 2: 64-bit
	data    byte // 1: little, 2: big
	flags   uint32
}

var elfKinds = []elfKind{
	{62, 2, 1, 0}, {3, 1, 1, 0}, {183, 2, 1, 0}, {40, 1, 1, 0x05000400}, {40, 1, 1, 0x05000200},
	{8, 1, 2, 0x70001007}, {8, 1, 1, 0x70001007}, {8, 2, 1, 0x80000007}, {20, 1, 2, 0},
	{21, 2, 1, 2}, {21, 2, 2, 1}, {22, 2, 2, 0}, {2, 1, 2, 0}, {43, 2, 2, 0}, {4, 1, 2, 0},
	{42, 1, 1, 0}, {93, 1, 1, 0}, {195, 1, 1, 0}, {243, 2, 1, 5}, {258, 2, 1, 3},
}

func sample(rng *rand.Rand, i, size int) []byte {
	var b []byte
	switch k := rng.IntN(20); {
	case k < 12:
		b = elf(rng, elfKinds[rng.IntN(len(elfKinds))], size)
	case k < 14:
		b = pe(rng, size)
	case k < 15:
		b = macho(rng, size)
	case k < 16:
		b = append([]byte("#!/bin/sh\n"), body(rng, size)...)
	case k < 17:
		b = zipFile(rng, size)
	case k < 18:
		b = gzipFile(rng, size)
	case k < 19:
		b = tarFile(rng, size)
	default:
		b = body(rng, size)
	}
	// Unique content, so that no two files dedupe.
	return binary.LittleEndian.AppendUint64(b, uint64(i))
}

func elf(rng *rand.Rand, k elfKind, size int) []byte {
	var order binary.ByteOrder = binary.LittleEndian
	if k.data == 2 {
		order = binary.BigEndian
	}
	size = max(size, 256)
	b := body(rng, size)
	copy(b, []byte{0x7f, 'E', 'L', 'F', k.class, k.data, 1, 0})
	for j := 8; j < 16; j++ {
		b[j] = 0
	}
	if k.class == 1 {
		order.PutUint16(b[16:], 2)
		order.PutUint16(b[18:], k.machine)
		order.PutUint32(b[20:], 1)
		order.PutUint32(b[24:], 0x10000)
		order.PutUint32(b[28:], 52) // phoff
		order.PutUint32(b[32:], 0)  // shoff: none
		order.PutUint32(b[36:], k.flags)
		order.PutUint16(b[40:], 52)
		order.PutUint16(b[42:], 32)
		order.PutUint16(b[44:], 1)
		order.PutUint16(b[46:], 40)
		order.PutUint16(b[48:], 0)
		order.PutUint16(b[50:], 0)
		ph := b[52:84] // one PT_LOAD
		for j := range ph {
			ph[j] = 0
		}
		order.PutUint32(ph[0:], 1)
		order.PutUint32(ph[16:], uint32(size))
		order.PutUint32(ph[20:], uint32(size))
	} else {
		order.PutUint16(b[16:], 2)
		order.PutUint16(b[18:], k.machine)
		order.PutUint32(b[20:], 1)
		order.PutUint64(b[24:], 0x400000)
		order.PutUint64(b[32:], 64)
		order.PutUint64(b[40:], 0)
		order.PutUint32(b[48:], k.flags)
		order.PutUint16(b[52:], 64)
		order.PutUint16(b[54:], 56)
		order.PutUint16(b[56:], 1)
		order.PutUint16(b[58:], 64)
		order.PutUint16(b[60:], 0)
		order.PutUint16(b[62:], 0)
		ph := b[64:120]
		for j := range ph {
			ph[j] = 0
		}
		order.PutUint32(ph[0:], 1)
		order.PutUint64(ph[32:], uint64(size))
		order.PutUint64(ph[40:], uint64(size))
	}
	return b
}

func pe(rng *rand.Rand, size int) []byte {
	size = max(size, 1024)
	b := body(rng, size)
	for j := 0; j < 0x200; j++ {
		b[j] = 0
	}
	copy(b, "MZ")
	binary.LittleEndian.PutUint32(b[0x3c:], 0x80)
	copy(b[0x80:], "PE\x00\x00")
	machines := []uint16{0x14c, 0x8664, 0x1c4, 0xaa64}
	m := machines[rng.IntN(len(machines))]
	binary.LittleEndian.PutUint16(b[0x84:], m)
	binary.LittleEndian.PutUint16(b[0x86:], 0) // no sections
	opt := uint16(0xe0)
	magic := uint16(0x10b)
	if m == 0x8664 || m == 0xaa64 {
		opt, magic = 0xf0, 0x20b
	}
	binary.LittleEndian.PutUint16(b[0x94:], opt)
	binary.LittleEndian.PutUint16(b[0x96:], 0x0102)
	binary.LittleEndian.PutUint16(b[0x98:], magic)
	sub := 0x98 + 68
	binary.LittleEndian.PutUint16(b[sub:], uint16(2+rng.IntN(2)))
	return b
}

func macho(rng *rand.Rand, size int) []byte {
	size = max(size, 512)
	b := body(rng, size)
	binary.LittleEndian.PutUint32(b[0:], 0xfeedfacf)
	binary.LittleEndian.PutUint32(b[4:], 0x01000007)
	binary.LittleEndian.PutUint32(b[8:], 3)
	binary.LittleEndian.PutUint32(b[12:], 2)
	binary.LittleEndian.PutUint32(b[16:], 0)
	binary.LittleEndian.PutUint32(b[20:], 0)
	return b
}

func zipFile(rng *rand.Rand, size int) []byte {
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	f, _ := w.CreateHeader(&zip.FileHeader{Name: "payload.bin", Method: zip.Store})
	f.Write(body(rng, size))
	w.Close()
	return buf.Bytes()
}

func gzipFile(rng *rand.Rand, size int) []byte {
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.NoCompression)
	w.Write(body(rng, size))
	w.Close()
	return buf.Bytes()
}

func tarFile(rng *rand.Rand, size int) []byte {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	data := body(rng, size)
	w.WriteHeader(&tar.Header{Name: "payload.bin", Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
	w.Write(data)
	w.Close()
	return buf.Bytes()
}
