package image

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A killed build leaves mounts inside its chroot; removeTree must detach
// them before deleting, never delete through them.
func TestRemoveTreeDetachesMounts(t *testing.T) {
	outside := t.TempDir()
	keep := filepath.Join(outside, "precious")
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "build")
	mnt := filepath.Join(dir, "rootfs", "dev")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(outside, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount (the tests run as root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	if m, _ := mountsUnder(dir); len(m) != 1 || m[0] != mnt {
		t.Fatalf("mountsUnder: %v", m)
	}
	if err := removeTree(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still exists", dir)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("removeTree deleted through a bind mount: %v", err)
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/tmp/a\040b\011c`); got != "/tmp/a b\tc" {
		t.Fatalf("%q", got)
	}
}
