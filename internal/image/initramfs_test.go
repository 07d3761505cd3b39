package image

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

type cpioEntry struct {
	name         string
	mode         uint64
	major, minor uint64
	data         string
}

// readNewc parses a "newc" archive the way the kernel does.
func readNewc(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	pad := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		if len(b) < off+110 || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad header at %d", off)
		}
		f := func(i int) uint64 {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		mode, size, major, minor, nsize := f(1), f(6), f(9), f(10), f(11)
		name := string(b[off+110 : off+110+int(nsize)-1])
		dataOff := pad(off + 110 + int(nsize))
		e := cpioEntry{name: name, mode: mode, major: major, minor: minor, data: string(b[dataOff : dataOff+int(size)])}
		off = pad(dataOff + int(size))
		if name == "TRAILER!!!" {
			return out
		}
		out = append(out, e)
	}
}

func TestInitramfs(t *testing.T) {
	root := t.TempDir()
	rel := "6.1.0-test"
	mod := filepath.Join(root, "lib/modules", rel)
	for _, p := range []string{"kernel/drivers/virtio/virtio.ko", "kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/block/virtio_blk.ko", "kernel/fs/ext4/ext4.ko", "kernel/fs/jbd2/jbd2.ko", "kernel/sound/snd.ko"} {
		os.MkdirAll(filepath.Join(mod, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(mod, p), []byte("module "+p), 0o644)
	}
	os.WriteFile(filepath.Join(mod, "modules.dep"), []byte(`kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/fs/jbd2/jbd2.ko:
kernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko
kernel/sound/snd.ko:
`), 0o644)
	os.MkdirAll(filepath.Join(root, "bin"), 0o755)
	os.WriteFile(filepath.Join(root, "bin/busybox"), []byte("busybox binary"), 0o755)
	out := filepath.Join(t.TempDir(), "initrd.img")
	if err := writeInitramfs(out, root, rel, []string{"virtio_blk", "ext4", "not_built"}); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(out)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(zr)
	entries := readNewc(t, b)
	byName := map[string]cpioEntry{}
	var names []string
	for _, e := range entries {
		byName[e.name] = e
		names = append(names, e.name)
	}
	if e := byName["dev/console"]; e.mode != 0o020600 || e.major != 5 || e.minor != 1 {
		t.Errorf("dev/console: %+v", e)
	}
	if e := byName["init"]; e.mode != 0o100755 || !strings.Contains(e.data, "switch_root /root") {
		t.Errorf("init: mode %o", e.mode)
	}
	if e := byName["bin/busybox"]; e.data != "busybox binary" {
		t.Errorf("busybox: %+v", e)
	}
	want := "kernel/drivers/virtio/virtio_ring.ko\nkernel/drivers/virtio/virtio.ko\nkernel/drivers/block/virtio_blk.ko\nkernel/fs/jbd2/jbd2.ko\nkernel/fs/ext4/ext4.ko\n"
	if got := byName["modules"].data; got != want {
		t.Errorf("load order:\n%s\nwant:\n%s", got, want)
	}
	if _, ok := byName["lib/modules/kernel/sound/snd.ko"]; ok {
		t.Error("an unrequested module was packed")
	}
	// Every file's directory comes before it, as the kernel needs.
	seen := map[string]bool{}
	for _, n := range names {
		if d := filepath.Dir(n); d != "." && !seen[d] {
			t.Errorf("%s comes before its directory %s", n, d)
		}
		seen[n] = true
	}
}
