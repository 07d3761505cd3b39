package image

import (
	"context"
	"os"
	"os/exec"
	"testing"
)

// TestEnsureBinfmtRunsI386: after EnsureBinfmt, mmdebstrap's own check
// (arch-test) finds that i386 programs run, whether the kernel runs them
// itself or, as on the test host of 2026-11-29 (a hypervisor without
// compat mode), only through the qemu-user handler tb-build registers.
func TestEnsureBinfmtRunsI386(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (binfmt_misc); run it with make test")
	}
	if err := EnsureBinfmt(context.Background(), "i386"); err != nil {
		t.Fatal(err)
	}
	native := exec.Command("arch-test", "-n", "i386").Run() == nil
	if out, err := exec.Command("arch-test", "i386").CombinedOutput(); err != nil {
		t.Fatalf("arch-test i386 after EnsureBinfmt (the kernel runs i386 itself: %v): %v: %s", native, err, out)
	}
	t.Logf("the kernel runs i386 itself: %v", native)
}
