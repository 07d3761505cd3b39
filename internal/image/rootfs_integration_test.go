package image

import (
	"bytes"
	"context"
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCache is a .deb cache shared by test runs, so that only the first run
// on a machine downloads; TB_TEST_APT_CACHE moves it.
func testCache(t *testing.T, s *Spec) string {
	dir := os.Getenv("TB_TEST_APT_CACHE")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "talkbox-test-apt-cache")
	}
	return filepath.Join(dir, s.OS.Release+"-"+s.Arch)
}

func checkELF(t *testing.T, path string, machine elf.Machine, class elf.Class, data elf.Data) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	if f.Machine != machine || f.Class != class || f.Data != data {
		t.Fatalf("%s is %v %v %v, want %v %v %v", path, f.Machine, f.Class, f.Data, machine, class, data)
	}
}

// TestRootfsForeignArch builds a real mipsel root filesystem through
// qemu-user-static and binfmt_misc and checks that it is complete and that
// its programs are MIPS little-endian 32-bit binaries.
func TestRootfsForeignArch(t *testing.T) {
	ss, err := LoadSpecs("")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ss.Get("debian-bookworm-mipsel")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	b := MMDebstrap{}
	if err := b.Check(ctx, s); err != nil {
		t.Fatalf("build dependencies (scripts/deps.sh installs them): %v", err)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	t.Cleanup(func() {
		if err := removeTree(root); err != nil {
			t.Error(err)
		}
	})
	var log bytes.Buffer
	start := time.Now()
	if err := b.Rootfs(ctx, s, root, testCache(t, s), &log); err != nil {
		t.Fatalf("%v\n%s", err, tail(log.String(), 30))
	}
	t.Logf("mipsel root filesystem in %s", time.Since(start).Round(time.Second))
	for _, p := range []string{"bin/busybox", "usr/sbin/qemu-ga", "usr/bin/dpkg"} {
		checkELF(t, filepath.Join(root, p), elf.EM_MIPS, elf.ELFCLASS32, elf.ELFDATA2LSB)
	}
	sh, err := filepath.EvalSymlinks(filepath.Join(root, "bin/sh"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sh, root) {
		sh = filepath.Join(root, sh)
	}
	checkELF(t, sh, elf.EM_MIPS, elf.ELFCLASS32, elf.ELFDATA2LSB)

	pkgs, err := installedPackages(root)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]Package{}
	for _, p := range pkgs {
		have[p.Name] = p
	}
	for _, want := range s.Packages {
		p, ok := have[want]
		if !ok {
			t.Errorf("package %s is not installed", want)
			continue
		}
		if p.Arch != "mipsel" && p.Arch != "all" {
			t.Errorf("package %s is %s", want, p.Arch)
		}
	}
	if err := customize(root, s); err != nil {
		t.Fatal(err)
	}
	_, rel, err := findKernel(root)
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(t.TempDir(), "initrd.img")
	if err := writeInitramfs(initrd, root, rel, s.Kernel.Modules); err != nil {
		t.Fatal(err)
	}
	order, err := moduleOrder(filepath.Join(root, "lib/modules", rel), s.Kernel.Modules)
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(order, " ")
	for _, m := range []string{"virtio_blk", "virtio_net", "virtio_console"} {
		if !strings.Contains(joined, m) {
			t.Errorf("initramfs lacks %s (modules: %s)", m, joined)
		}
	}
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
