package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
)

// need finds a program or says which Debian package provides it (exit 69).
func need(prog, pkg, why string) (string, error) {
	p, err := exec.LookPath(prog)
	if err != nil {
		return "", fault.Unavailable(fmt.Errorf("%s not found (%s): install the Debian package %s (apt-get install %s)", prog, why, pkg, pkg))
	}
	return p, nil
}

// emulatorPackage is the Debian package of a QEMU system emulator.
func emulatorPackage(emulator string) string {
	b := filepath.Base(emulator)
	switch {
	case strings.HasSuffix(b, "x86_64"), strings.HasSuffix(b, "i386"):
		return "qemu-system-x86"
	case strings.Contains(b, "arm"), strings.Contains(b, "aarch64"):
		return "qemu-system-arm"
	case strings.Contains(b, "mips"):
		return "qemu-system-mips"
	case strings.Contains(b, "ppc"):
		return "qemu-system-ppc"
	}
	return "qemu-system-misc"
}

// qemuUserName is qemu-user's name for a Debian architecture.
var qemuUserName = map[string]string{
	"amd64": "x86_64", "i386": "i386", "arm64": "aarch64", "armhf": "arm", "armel": "arm", "mipsel": "mipsel",
	"mips64el": "mips64el", "ppc64el": "ppc64le", "s390x": "s390x",
}

// nativeArch reports whether the host runs binaries of a Debian
// architecture without emulation.
func nativeArch(arch string) bool {
	switch runtime.GOARCH {
	case "amd64":
		return arch == "amd64" || arch == "i386"
	case "arm64":
		return arch == "arm64" || arch == "armhf" || arch == "armel"
	}
	return runtime.GOARCH == arch
}

const binfmtDir = "/proc/sys/fs/binfmt_misc"

// EnsureBinfmt makes foreign binaries of arch runnable in a chroot through
// qemu-user-static: it mounts binfmt_misc and enables the qemu handler when
// they are missing, and says which package is missing otherwise.
func EnsureBinfmt(ctx context.Context, arch string) error {
	if nativeArch(arch) {
		return nil
	}
	name := qemuUserName[arch]
	if _, err := need("arch-test", "arch-test", "mmdebstrap checks with it that "+arch+" programs run"); err != nil {
		return err
	}
	if _, err := need("qemu-"+name+"-static", "qemu-user-static", "runs "+arch+" programs while the root filesystem is built"); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(binfmtDir, "status")); err != nil {
		if err := unix.Mount("binfmt_misc", binfmtDir, "binfmt_misc", 0, ""); err != nil {
			return fault.Unavailable(fmt.Errorf("binfmt_misc is not mounted and mounting it on %s failed: %v (run as root, or: mount -t binfmt_misc binfmt_misc %s)", binfmtDir, err, binfmtDir))
		}
	}
	entry := filepath.Join(binfmtDir, "qemu-"+name)
	if binfmtEnabled(entry) {
		return nil
	}
	ub, err := need("update-binfmts", "binfmt-support", "registers qemu-user-static with binfmt_misc")
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, ub, "--enable", "qemu-"+name).CombinedOutput()
	if !binfmtEnabled(entry) {
		return fault.Unavailable(fmt.Errorf("binfmt_misc handler qemu-%s is not registered (update-binfmts --enable qemu-%s: %v %s); reinstall qemu-user-static and binfmt-support", name, name, err, strings.TrimSpace(string(out))))
	}
	return nil
}

func binfmtEnabled(entry string) bool {
	b, err := os.ReadFile(entry)
	return err == nil && strings.HasPrefix(string(b), "enabled")
}
