package triage

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
)

// countingReader is a ReaderAt over b that counts what Inspect asks for.
type countingReader struct {
	b            []byte
	reads, bytes int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.reads++
	c.bytes += int64(len(p))
	if off >= int64(len(c.b)) {
		return 0, io.EOF
	}
	n := copy(p, c.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

var formats = map[string]bool{"elf": true, "pe": true, "macho": true, "script": true, "zip": true,
	"gzip": true, "tar": true, "unknown": true}

// seedCorpus is every small sample we have, plus the head of each real
// binary when the Go corpus is cached (the fuzz seeds must not trigger a
// multi-minute build).
func seedCorpus() [][]byte {
	var seeds [][]byte
	for _, s := range handSamples() {
		seeds = append(seeds, s.data)
	}
	var zb bytes.Buffer
	zw := zip.NewWriter(&zb)
	w, _ := zw.Create("x")
	w.Write([]byte("y"))
	zw.Close()
	seeds = append(seeds, zb.Bytes(), []byte("#!/usr/bin/env python3\n"), []byte{0x1f, 0x8b, 8, 8, 0, 0, 0, 0, 0, 3, 'n', 0},
		peSpec{machine: 0x8664, plus: true, subsystem: 3, clr: true, sections: []string{"UPX0"}}.build(), nil)
	if corpusCached() {
		if cs, err := loadCorpus(); err == nil {
			for _, f := range cs.files {
				if b, err := os.ReadFile(f.path); err == nil {
					seeds = append(seeds, b[:min(len(b), 8192)])
				}
			}
		}
	}
	return seeds
}

func FuzzInspect(f *testing.F) {
	for _, s := range seedCorpus() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &countingReader{b: data}
		got := Inspect(r, int64(len(data)))
		if strings.HasPrefix(got.Problem, "internal error") {
			t.Fatalf("panic inside Inspect: %s", got.Problem)
		}
		if !formats[got.Format] {
			t.Fatalf("format %q", got.Format)
		}
		// Every read is bounded by the size; a handful of regions at most.
		if limit := 40*int64(len(data)) + 1<<16; r.bytes > limit {
			t.Fatalf("read %d bytes of a %d-byte file", r.bytes, len(data))
		}
		if again := inspectBytes(data); !reflect.DeepEqual(got, again) {
			t.Fatalf("not deterministic:\n%+v\n%+v", got, again)
		}
		if _, err := json.Marshal(got); err != nil {
			t.Fatalf("marshal: %v", err)
		}
		if e := DigestBytes(data).Entropy; e < 0 || e > 8 {
			t.Fatalf("entropy %v", e)
		}
	})
}

// TestInspectReadsLittle checks Inspect reads headers, not files.
func TestInspectReadsLittle(t *testing.T) {
	cs := corpus(t)
	for _, f := range cs.files {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		r := &countingReader{b: b}
		Inspect(r, int64(len(b)))
		// Head, section headers, their names, Go build info (ELF); a few
		// more regions for the interpreter, dynamic section or notes.
		if r.reads > 7 || r.bytes > 32<<10 {
			t.Errorf("%s (%d bytes): %d reads, %d bytes", f.target.name(), len(b), r.reads, r.bytes)
		}
	}
}
