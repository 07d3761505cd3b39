package image

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/crashhook"
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
	// What apt downloads comes out here, then into the cache
	// (addToDebCache): builds sharing the cache do not take turns.
	fetched := dir + ".debs"
	if err := os.MkdirAll(fetched, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(fetched)
	args := []string{
		"--mode=root", "--variant=" + s.OS.Variant, "--architectures=" + strings.Join(append([]string{s.Arch}, s.foreignArches()...), ","),
		"--components=" + strings.Join(s.OS.Components, ","),
		"--include=" + strings.Join(s.Packages, ","),
		// Keep the essential packages' .debs so the cache gets them too.
		"--skip=essential/unlink",
		// A mirror that drops a connection now and then must not fail a
		// build of several minutes.
		`--aptopt=Acquire::Retries "3"`,
		// /usr merged as debootstrap merges it, with directory symlinks
		// made before anything is unpacked; else bookworm's
		// init-system-helpers pulls in usrmerge, whose conversion (and
		// the whole of perl it needs) runs under qemu-user on a foreign
		// build, a fifth of its time. "maybe": only for a release that
		// has the usr-is-merged package the hook installs.
		"--hook-dir=/usr/share/mmdebstrap/hooks/maybe-merged-usr",
		"--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/",
		"--setup-hook=sync-in " + shq(cacheDir) + " /var/cache/apt/archives/",
		// Talkbox builds its own small initramfs; running update-initramfs
		// (slow, and slower still under qemu-user) would be wasted.
		`--essential-hook=chroot "$1" dpkg-divert --quiet --local --rename --add /usr/sbin/update-initramfs && ln -sf /bin/true "$1"/usr/sbin/update-initramfs`,
		"--customize-hook=sync-out /var/cache/apt/archives " + shq(fetched),
		// dpkg need not fsync every file it unpacks: a build that fails
		// is thrown away whole. The setting is the build's, not the
		// image's, so it goes before the root filesystem is done.
		`--setup-hook=mkdir -p "$1"/etc/dpkg/dpkg.cfg.d && echo force-unsafe-io > "$1"/etc/dpkg/dpkg.cfg.d/` + buildDpkgConfig,
		`--customize-hook=rm "$1"/etc/dpkg/dpkg.cfg.d/` + buildDpkgConfig,
	}
	if len(s.Hardening.Exclude) > 0 {
		// The excludes go in a dpkg configuration file of Talkbox's own,
		// not through --dpkgopt: with them in its own file, mmdebstrap
		// pipes every essential package it extracts through its Python
		// tar filter, half a minute of a foreign build. What that
		// unfiltered extraction leaves at excluded paths, dpkg's install
		// of the same packages does not own; removeExcluded deletes it.
		lines := make([]string, len(s.Hardening.Exclude))
		for i, x := range s.Hardening.Exclude {
			lines[i] = shq("path-exclude=" + x)
		}
		args = append(args, `--setup-hook=mkdir -p "$1"/etc/dpkg/dpkg.cfg.d && printf '%s\n' `+strings.Join(lines, " ")+
			` > "$1"/etc/dpkg/dpkg.cfg.d/`+excludeDpkgConfig)
	}
	args = append(args, s.OS.Release, dir, s.OS.Mirror)
	fmt.Fprintf(log, "+ mmdebstrap %s\n", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	// One writer for both, so that os/exec writes from one goroutine.
	tail := &logTail{}
	out := io.MultiWriter(log, tail)
	if crashhook.Enabled {
		out = io.MultiWriter(out, essentialHook{ctx})
	}
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
	if err := addToDebCache(ctx, fetched, cacheDir); err != nil {
		return err
	}
	return removeExcluded(dir, s.Hardening.Exclude)
}

// The dpkg configuration files a build writes in the root filesystem: the
// spec's excludes (kept, so that a package installed later in the guest
// is trimmed alike) and the build's own settings (removed at its end).
const (
	excludeDpkgConfig = "talkbox-exclude"
	buildDpkgConfig   = "talkbox-build"
)

// removeExcluded deletes what lies at a dpkg path-exclude glob in root.
// dpkg matches a package's paths with fnmatch(3) without FNM_PATHNAME, so
// '*' crosses '/'. A path under the merged /usr is matched as well by the
// name the package gives it (/lib/modules/..., not /usr/lib/modules/...).
func removeExcluded(root string, globs []string) error {
	if len(globs) == 0 {
		return nil
	}
	res := make([]*regexp.Regexp, len(globs))
	for i, g := range globs {
		re, err := fnmatchRegexp(g)
		if err != nil {
			return fmt.Errorf("hardening exclude %q: %w", g, err)
		}
		res[i] = re
	}
	excluded := func(p string) bool {
		for _, re := range res {
			if re.MatchString(p) {
				return true
			}
		}
		return false
	}
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == root {
			return nil
		}
		p := "/" + filepath.ToSlash(path[len(root)+1:])
		if !excluded(p) && !(strings.HasPrefix(p, "/usr/") && excluded(p[len("/usr"):])) {
			return nil
		}
		if err := os.RemoveAll(path); err != nil {
			return err
		}
		if d.IsDir() {
			return filepath.SkipDir
		}
		return nil
	})
}

// fnmatchRegexp is the regular expression of an fnmatch(3) pattern without
// flags: '*' and '?' match any characters, '/' too; brackets are classes
// ('!' negates); a backslash quotes the next character.
func fnmatchRegexp(glob string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(glob); i++ {
		switch c := glob[i]; c {
		case '*':
			b.WriteString("(?s:.*)")
		case '?':
			b.WriteString("(?s:.)")
		case '\\':
			if i+1 < len(glob) {
				i++
			}
			b.WriteString(regexp.QuoteMeta(glob[i : i+1]))
		case '[':
			// A ']' first in the class (after a '!') is one of its members.
			from := i + 1
			if from < len(glob) && glob[from] == '!' {
				from++
			}
			end := strings.IndexByte(glob[min(from+1, len(glob)):], ']')
			if end < 0 {
				b.WriteString(`\[`)
				continue
			}
			class := glob[i+1 : from+1+end]
			i = from + 1 + end
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// essentialHook is CrashEnv's "essential" point: mmdebstrap announcing the
// install of the essential packages, its chroot's /proc, /sys and /dev
// mounted, which a build killed there leaves for the next to clean up.
type essentialHook struct{ ctx context.Context }

func (h essentialHook) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("I: installing essential packages")) {
		crashhook.At(h.ctx, CrashEnv, "essential")
	}
	return len(p), nil
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
