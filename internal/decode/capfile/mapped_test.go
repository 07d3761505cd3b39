package capfile

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// writeCapture writes a little-endian pcap of n packets of size bytes each
// (the i-th filled with byte i) to a new file, and returns its path and
// size.
func writeCapture(t *testing.T, n, size int) (string, int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	w.Write(pcapFile(binary.LittleEndian, false, 1))
	var h [16]byte
	p := make([]byte, size)
	for i := range n {
		binary.LittleEndian.PutUint32(h[0:], 1700000000)
		binary.LittleEndian.PutUint32(h[4:], uint32(i))
		binary.LittleEndian.PutUint32(h[8:], uint32(size))
		binary.LittleEndian.PutUint32(h[12:], uint32(size))
		w.Write(h[:])
		for j := range p {
			p[j] = byte(i)
		}
		w.Write(p)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path, int64(24 + n*(16+size))
}

// mapT maps the capture at path, of size bytes, for the rest of the test.
func mapT(t *testing.T, path string, size int64) *Mapped {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	m := Map(f, size)
	if m == nil {
		t.Fatalf("%s: not mapped", path)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// rssFile is the process's resident memory backed by files, in bytes.
func rssFile(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestMappedReleasesWhatItRead: a mapped capture reads the same packets as
// its stream, and what has been read does not stay resident: reading 48 MiB
// leaves the process's file-backed memory a few windows larger at most.
func TestMappedReleasesWhatItRead(t *testing.T) {
	const n, size = 32 << 10, 1500
	path, total := writeCapture(t, n, size)
	m := mapT(t, path, total)
	before := rssFile(t)
	rd, err := m.Reader()
	if err != nil {
		t.Fatal(err)
	}
	var p Packet
	var most int64
	i := 0
	for ; ; i++ {
		if err = rd.Next(&p); err != nil {
			break
		}
		if p.N != int64(i+1) || len(p.Data) != size || p.Data[0] != byte(i) || p.Data[size-1] != byte(i) {
			t.Fatalf("packet %d: N %d, %d bytes, first %d", i+1, p.N, len(p.Data), p.Data[0])
		}
		if i%1024 == 0 {
			most = max(most, rssFile(t)-before)
		}
	}
	if err != io.EOF || i != n || rd.Offset() != total {
		t.Fatalf("%d packets, %v, at offset %d; want %d, EOF at %d", i, err, rd.Offset(), n, total)
	}
	if most > 3*bytesWindow {
		t.Errorf("reading %d MiB mapped kept up to %d MiB more resident (window %d MiB)", total>>20, most>>20, bytesWindow>>20)
	}
}

// TestMappedCutWhileRead: a mapped capture cut short while it is read
// faults past its new end; Guard makes that an error, where it would end
// the process.
func TestMappedCutWhileRead(t *testing.T) {
	path, total := writeCapture(t, 1024, 1000)
	m := mapT(t, path, total)
	rd, err := m.Reader()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 64<<10); err != nil {
		t.Fatal(err)
	}
	read, sum := 0, 0
	err = m.Guard(func() error {
		var p Packet
		for {
			if err := rd.Next(&p); err != nil {
				return err
			}
			sum += int(p.Data[len(p.Data)-1]) // the packet's last byte
			read++
		}
	})
	t.Logf("%d packets read, their last bytes add up to %d", read, sum)
	if err == nil || !strings.Contains(err.Error(), "the file changed while it was read (cut to less than its 1040408 bytes?)") {
		t.Fatalf("read %d packets of a capture cut to 64 KiB as it was read: %v", read, err)
	}
	if read == 0 || read > 64 {
		t.Errorf("%d packets read before the fault, want those in the first 64 KiB", read)
	}
	// Any other panic goes on up.
	defer func() {
		if r := recover(); r != "not a fault" {
			t.Errorf("panic %v, want it passed on", r)
		}
	}()
	m.Guard(func() error { panic("not a fault") })
}

// TestMapOnlyCaptures: what does not start as a capture is not mapped.
func TestMapOnlyCaptures(t *testing.T) {
	for name, data := range map[string][]byte{
		"gzip":  {0x1f, 0x8b, 8, 0, 0, 0, 0, 0},
		"log":   []byte("#separator \\x09\n"),
		"short": {0xd4, 0xc3},
	} {
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		m := Map(f, int64(len(data)))
		f.Close()
		if m != nil {
			t.Errorf("%s: mapped", name)
		}
	}
	if _, err := readAll(t, bytes.Repeat([]byte{0}, 8)); err == nil {
		t.Error("zeros read as a capture")
	}
}

// TestMappedReadsWhatWasThere: a capture still being written is read as
// far as it reached when it was mapped, what is appended after is not.
func TestMappedReadsWhatWasThere(t *testing.T) {
	path, total := writeCapture(t, 10, 100)
	m := mapT(t, path, total)
	more, _ := writeCapture(t, 5, 100)
	extra, err := os.ReadFile(more)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(extra[24:]); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rd, err := m.Reader()
	if err != nil {
		t.Fatal(err)
	}
	var p Packet
	n := 0
	for err = rd.Next(&p); err == nil; err = rd.Next(&p) {
		n++
	}
	if err != io.EOF || n != 10 {
		t.Fatalf("%d packets, %v; want the 10 there when it was mapped, then EOF", n, err)
	}
}
