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

// ownArch reports whether a Debian architecture is the host's own.
func ownArch(arch string) bool {
	return arch == runtime.GOARCH
}

// compatMagic is the binfmt_misc magic and mask of each 32-bit
// architecture a 64-bit kernel runs in compat mode (i386 on amd64, armhf
// and armel on arm64; QEMU's masks: executables and shared objects).
// Debian's qemu-user-static registers no handler for them there, since the
// kernel runs them itself: one built without compat support, or a guest of
// a hypervisor without compat mode (this project's test host of
// 2026-11-29: arch-test -n i386 says "not supported"), does not.
var compatMagic = map[string]struct{ goarch, magic, mask string }{
	"i386": {"amd64", `\x7fELF\x01\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x03\x00`,
		`\xff\xff\xff\xff\xff\xfe\xfe\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff`},
	"armhf": {"arm64", armMagic, armMask},
	"armel": {"arm64", armMagic, armMask},
}

const (
	armMagic = `\x7fELF\x01\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x28\x00`
	armMask  = `\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff`
)

const binfmtDir = "/proc/sys/fs/binfmt_misc"

// EnsureBinfmt makes foreign binaries of arch runnable in a chroot through
// qemu-user-static: it mounts binfmt_misc and enables the qemu handler when
// they are missing, and says which package is missing otherwise. The
// 32-bit architecture of the host's (i386 on amd64) needs nothing where the
// kernel runs it itself (arch-test -n); where it does not, tb-build
// registers qemu-user for it as for any foreign architecture.
func EnsureBinfmt(ctx context.Context, arch string) error {
	if ownArch(arch) {
		return nil
	}
	name := qemuUserName[arch]
	archTest, err := need("arch-test", "arch-test", "mmdebstrap checks with it that "+arch+" programs run")
	if err != nil {
		return err
	}
	compat, isCompat := compatMagic[arch]
	isCompat = isCompat && compat.goarch == runtime.GOARCH
	if isCompat && exec.CommandContext(ctx, archTest, "-n", arch).Run() == nil {
		return nil // the kernel runs them
	}
	qemu, err := need("qemu-"+name+"-static", "qemu-user-static", "runs "+arch+" programs while the root filesystem is built")
	if err != nil {
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
	if isCompat {
		// F: the kernel opens the emulator now, so that it runs in the
		// chroot, which has none.
		rule := ":qemu-" + name + ":M::" + compat.magic + ":" + compat.mask + ":" + qemu + ":F"
		werr := os.WriteFile(filepath.Join(binfmtDir, "register"), []byte(rule), 0)
		if !binfmtEnabled(entry) {
			return fault.Unavailable(fmt.Errorf("this kernel does not run %s programs, and registering qemu-%s with binfmt_misc failed: %v (run as root)", arch, name, werr))
		}
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
