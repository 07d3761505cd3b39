package triage

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// benchSet is a mixed set: hand-built headers, scripts and archives, and
// real Go binaries when the corpus is cached.
func benchSet(b *testing.B) (mem [][]byte, paths []string) {
	mem = seedCorpus()
	if corpusCached() {
		cs, err := loadCorpus()
		if err != nil {
			b.Fatal(err)
		}
		for _, f := range cs.files {
			data, err := os.ReadFile(f.path)
			if err != nil {
				b.Fatal(err)
			}
			mem = append(mem, data)
			paths = append(paths, f.path)
		}
	}
	return mem, paths
}

func BenchmarkInspect(b *testing.B) {
	mem, paths := benchSet(b)
	readers := make([]*bytes.Reader, len(mem))
	for i, m := range mem {
		readers[i] = bytes.NewReader(m)
	}
	b.Run("mem", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			r := readers[i%len(readers)]
			Inspect(r, r.Size())
			i++
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "files/s")
	})
	if len(paths) == 0 {
		return
	}
	// Open, stat, inspect, close: the cost per file on disk (page cache).
	b.Run("file", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := inspectFile(paths[i%len(paths)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "files/s")
	})
}

func randBytes(n int) []byte {
	rng := rand.New(rand.NewPCG(5, 6))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func BenchmarkDigest(b *testing.B) {
	for _, size := range []int{1 << 20, 4 << 10} {
		data := randBytes(size)
		name := map[int]string{1 << 20: "1MiB", 4 << 10: "4KiB"}[size]
		b.Run(name+"/bytes", func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				DigestBytes(data)
			}
		})
		b.Run(name+"/reader", func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				Digest(bytes.NewReader(data))
			}
		})
	}
	// The counter alone, to see what entropy costs next to the hashes.
	data := randBytes(1 << 20)
	b.Run("1MiB/entropy-only", func(b *testing.B) {
		b.SetBytes(1 << 20)
		var d digester
		d.init()
		for b.Loop() {
			d.count(data)
		}
	})
}

// BenchmarkTriageAndHash is the per-sample cost of submission for small
// files on disk: open, stat, Inspect, Digest, close.
func BenchmarkTriageAndHash(b *testing.B) {
	dir := b.TempDir()
	var paths []string
	for i, s := range seedCorpus() {
		p := filepath.Join(dir, fmt.Sprint(i))
		if err := os.WriteFile(p, s, 0o644); err != nil {
			b.Fatal(err)
		}
		paths = append(paths, p)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		f, err := os.Open(paths[i%len(paths)])
		if err != nil {
			b.Fatal(err)
		}
		fi, _ := f.Stat()
		Inspect(f, fi.Size())
		if _, err := Digest(io.NewSectionReader(f, 0, fi.Size())); err != nil {
			b.Fatal(err)
		}
		f.Close()
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "files/s")
}
