package image_test

import (
	"context"
	"debug/elf"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/image"
	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
)

// TestForeignImage checks a real mipsel image, built through qemu-user-static
// and binfmt_misc, on its disk: its programs are MIPS little-endian 32-bit
// binaries, its packages mipsel's, nothing the spec's hardening excludes is
// there (mmdebstrap's extraction does not filter them; removeExcluded does)
// and the build's own dpkg setting is gone. It is the fixture image that
// tb-run's end-to-end test boots (leasetest.ImageFor), built once for both:
// the smoke test that published it booted it from its initramfs.
func TestForeignImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	const spec = "debian-bookworm-mipsel"
	fx, err := leasetest.ImageFor(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := image.LoadPublicKey(fx.State)
	if err != nil {
		t.Fatal(err)
	}
	m, probs := image.VerifyDir(fx.Image.Dir, pub)
	if len(probs) > 0 {
		t.Fatalf("%s: %s", fx.Image.Dir, probs[0])
	}
	raw := filepath.Join(t.TempDir(), "disk.raw")
	if out, err := exec.CommandContext(ctx, "qemu-img", "convert", "-O", "raw", filepath.Join(fx.Image.Dir, fx.Image.Boot.Disk), raw).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v\n%s", err, out)
	}
	debugfs := func(req string) string {
		out, err := exec.CommandContext(ctx, "debugfs", "-R", req, raw).Output()
		if err != nil {
			t.Fatalf("debugfs -R %q: %v", req, err)
		}
		return string(out)
	}
	for _, p := range []string{"/usr/bin/busybox", "/usr/sbin/qemu-ga", "/usr/bin/dpkg", "/usr/bin/dash"} {
		local := filepath.Join(t.TempDir(), filepath.Base(p))
		debugfs("dump " + p + " " + local)
		f, err := elf.Open(local)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if f.Machine != elf.EM_MIPS || f.Class != elf.ELFCLASS32 || f.Data != elf.ELFDATA2LSB {
			t.Errorf("%s is %v %v %v, want MIPS 32-bit little-endian", p, f.Machine, f.Class, f.Data)
		}
		f.Close()
	}
	have := map[string]image.Package{}
	for _, p := range m.Packages {
		have[p.Name] = p
	}
	ss, err := image.LoadSpecs("")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ss.Get(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range s.Packages {
		p, ok := have[want]
		if !ok {
			t.Errorf("package %s is not installed", want)
		} else if p.Arch != "mipsel" && p.Arch != "all" {
			t.Errorf("package %s is %s", want, p.Arch)
		}
	}
	// What an exclude's directory held must be gone; a '*' inside the
	// path (the kernel's release) stands for each entry there.
	entries := func(dir string) []string {
		var names []string
		for _, l := range strings.Split(debugfs("ls -p "+dir), "\n") {
			// /INODE/MODE/UID/GID/NAME/SIZE/
			if f := strings.Split(l, "/"); len(f) > 5 && f[5] != "." && f[5] != ".." {
				names = append(names, f[5])
			}
		}
		return names
	}
	checked := 0
	for _, x := range s.Hardening.Exclude {
		dir, ok := strings.CutSuffix(x, "/*")
		if !ok {
			continue
		}
		dirs := []string{dir}
		if before, after, found := strings.Cut(dir, "/*/"); found {
			dirs = nil
			for _, e := range entries(before) {
				dirs = append(dirs, before+"/"+e+"/"+after)
			}
		}
		for _, d := range dirs {
			if strings.Contains(d, "*") {
				continue
			}
			checked++
			if names := entries(d); len(names) > 0 {
				t.Errorf("%s holds %v, which the spec excludes", d, names)
			}
		}
	}
	if checked == 0 {
		t.Errorf("no exclude of %s checked", spec)
	}
	cfg := debugfs("ls -p /etc/dpkg/dpkg.cfg.d")
	if !strings.Contains(cfg, "/talkbox-exclude/") || strings.Contains(cfg, "/talkbox-build/") {
		t.Errorf("/etc/dpkg/dpkg.cfg.d holds %q: want talkbox-exclude, not the build's talkbox-build", cfg)
	}
	if c := debugfs("cat /etc/dpkg/dpkg.cfg.d/talkbox-exclude"); !strings.Contains(c, "path-exclude=/usr/share/doc/*\n") {
		t.Errorf("talkbox-exclude holds %q", c)
	}
	if _, ok := have["usrmerge"]; ok {
		t.Errorf("usrmerge is installed: /usr was not merged before the install")
	}
}
