package image

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Builder makes a Debian root filesystem for a spec.
type Builder interface {
	// Name is the tool and its version, recorded with each build.
	Name(ctx context.Context) string
	// Check reports missing tools (exit 69, naming the Debian package).
	Check(ctx context.Context, s *Spec) error
	// Rootfs installs the spec's packages into dir (which must not exist),
	// reusing and refilling the .deb cache in cacheDir.
	Rootfs(ctx context.Context, s *Spec, dir, cacheDir string, log io.Writer) error
}

// MMDebstrap builds with mmdebstrap, which installs foreign architectures
// through qemu-user and binfmt_misc and runs much faster than debootstrap.
type MMDebstrap struct{}

var _ Builder = MMDebstrap{}

func (MMDebstrap) Name(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "mmdebstrap", "--version").Output()
	if err != nil {
		return "mmdebstrap"
	}
	return strings.TrimSpace(string(out))
}

func (MMDebstrap) Check(ctx context.Context, s *Spec) error {
	if _, err := need("mmdebstrap", "mmdebstrap", "builds the root filesystem"); err != nil {
		return err
	}
	return EnsureBinfmt(ctx, s.Arch)
}

// shq quotes s for sh.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (MMDebstrap) Rootfs(ctx context.Context, s *Spec, dir, cacheDir string, log io.Writer) error {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return err
	}
	// Builds sharing a cache take turns: one build's sync-out racing
	// another's sync-in would hand apt half-copied .debs.
	unlock, err := lockCache(ctx, cacheDir)
	if err != nil {
		return err
	}
	defer unlock()
	args := []string{
		"--mode=root", "--variant=" + s.OS.Variant, "--architectures=" + strings.Join(append([]string{s.Arch}, s.foreignArches()...), ","),
		"--components=" + strings.Join(s.OS.Components, ","),
		"--include=" + strings.Join(s.Packages, ","),
		// Keep the essential packages' .debs so the cache gets them too.
		"--skip=essential/unlink",
		// A mirror that drops a connection now and then must not fail a
		// build of several minutes.
		`--aptopt=Acquire::Retries "3"`,
		"--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/",
		"--setup-hook=sync-in " + shq(cacheDir) + " /var/cache/apt/archives/",
		// Talkbox builds its own small initramfs; running update-initramfs
		// (slow, and slower still under qemu-user) would be wasted.
		`--essential-hook=chroot "$1" dpkg-divert --quiet --local --rename --add /usr/sbin/update-initramfs && ln -sf /bin/true "$1"/usr/sbin/update-initramfs`,
		"--customize-hook=sync-out /var/cache/apt/archives " + shq(cacheDir),
	}
	for _, x := range s.Hardening.Exclude {
		args = append(args, "--dpkgopt=path-exclude="+x)
	}
	args = append(args, s.OS.Release, dir, s.OS.Mirror)
	fmt.Fprintf(log, "+ mmdebstrap %s\n", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	// One writer for both, so that os/exec writes from one goroutine.
	tail := &logTail{}
	out := io.MultiWriter(log, tail)
	cmd.Stdout, cmd.Stderr = out, out
	// If tb-build is killed outright, mmdebstrap goes with it; what it
	// leaves is cleaned up by the next build (removeTree).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// On cancellation let mmdebstrap unmount what it mounted in the chroot.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("mmdebstrap failed (%v): %s; see the build log", err, tail.reason())
	}
	return nil
}

// logTail keeps the end of a tool's output, for a one-line reason when it
// fails: the build log is a blob a reader may not have at hand.
type logTail struct{ b []byte }

const logTailMax = 8 << 10

func (t *logTail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if n := len(t.b); n > logTailMax {
		t.b = append(t.b[:0], t.b[n-logTailMax:]...)
	}
	return len(p), nil
}

// reason is the last error line apt or mmdebstrap printed ("E: ..."), or
// else the last line.
func (t *logTail) reason() string {
	lines := strings.Split(strings.TrimSpace(string(t.b)), "\n")
	last := lines[len(lines)-1]
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "E: ") {
			last = lines[i]
			break
		}
	}
	if len(last) > 300 {
		last = last[:300] + "…"
	}
	return strings.TrimSpace(last)
}

// lockCache takes an exclusive flock(2) on the cache directory's lock file,
// waiting while another build holds it, until ctx ends.
func lockCache(ctx context.Context, cacheDir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(cacheDir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if err != syscall.EWOULDBLOCK && err != syscall.EINTR {
			f.Close()
			return nil, fmt.Errorf("locking the package cache %s: %w", cacheDir, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}
