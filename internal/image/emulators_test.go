package image

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestUserEmulators lays out what qemu-user-static installs (binfmt.d
// entry, libexec link, static binary) for three targets, one of them with
// its binary excluded by the spec, as dpkg path-exclude leaves it.
func TestUserEmulators(t *testing.T) {
	root := t.TempDir()
	mk := func(rel, data string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, rel string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"mips", "sparc32plus", "arm"} {
		mk("usr/lib/binfmt.d/qemu-"+n+".conf", "# comment\n:qemu-"+n+`:M::\x7f\x45\x4c\x46:\xff\xff\xff\xff:/usr/libexec/qemu-binfmt/`+n+"-binfmt-P:OPF\n")
		link("../../bin/qemu-"+n+"-static", "usr/libexec/qemu-binfmt/"+n+"-binfmt-P")
	}
	mk("usr/bin/qemu-mips-static", "")
	// An absolute link target is the guest's path, not the host's.
	os.Remove(filepath.Join(root, "usr/libexec/qemu-binfmt/sparc32plus-binfmt-P"))
	link("/usr/bin/qemu-sparc32plus-static", "usr/libexec/qemu-binfmt/sparc32plus-binfmt-P")
	mk("usr/bin/qemu-sparc32plus-static", "")
	got, err := userEmulators(root)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"mips", "sparc32plus"}; !slices.Equal(got, want) {
		t.Fatalf("userEmulators = %v, want %v", got, want)
	}

	empty, err := userEmulators(t.TempDir())
	if err != nil || len(empty) != 0 {
		t.Fatalf("without qemu-user-static: %v, %v", empty, err)
	}

	mk("usr/lib/binfmt.d/qemu-bad.conf", ":qemu-bad:M::\\x7f\n")
	if _, err := userEmulators(root); err == nil {
		t.Fatal("a malformed entry was accepted")
	}
}
