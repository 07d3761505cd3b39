package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// makeDisk turns a root tree into a zstd-compressed qcow2 holding one ext4
// filesystem (no partition table: the guest mounts /dev/vda). mkfs.ext4 -d
// copies the tree, so no loop device or mount is needed.
func makeDisk(ctx context.Context, root, out string, sizeMiB int, log io.Writer) error {
	mkfs, err := need("mkfs.ext4", "e2fsprogs", "makes the root filesystem")
	if err != nil {
		return err
	}
	qimg, err := need("qemu-img", "qemu-utils", "writes the qcow2 disk")
	if err != nil {
		return err
	}
	raw := out + ".raw"
	defer os.Remove(raw)
	f, err := os.Create(raw)
	if err != nil {
		return err
	}
	if err := f.Truncate(int64(sizeMiB) << 20); err != nil {
		f.Close()
		return err
	}
	f.Close()
	if err := run(ctx, log, mkfs, "-q", "-F", "-L", "talkbox-root", "-E", "root_owner=0:0", "-d", root, raw); err != nil {
		return err
	}
	// zstd rather than qcow2's default zlib: a quarter of the time for a
	// slightly smaller disk (QEMU 5.1 and later read it).
	return run(ctx, log, qimg, "convert", "-c", "-f", "raw", "-O", "qcow2", "-o", "compression_type=zstd", raw, out)
}

func run(ctx context.Context, log io.Writer, prog string, args ...string) error {
	fmt.Fprintf(log, "+ %s %s\n", prog, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s failed: %v (see the build log)", filepath.Base(prog), err)
	}
	return nil
}

// removeTree deletes a build directory. A build killed while mmdebstrap ran
// leaves /proc, /sys and /dev mounted inside its chroot; those are detached
// first, and nothing is deleted while any mount remains, so a host /dev
// bind mount can never be emptied.
func removeTree(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for range 3 {
		killChrooted(abs)
		mounts, err := mountsUnder(abs)
		if err != nil {
			return err
		}
		if len(mounts) == 0 {
			// A process killed in a system call finishes it first: the
			// dpkg of an interrupted build made a file in a directory
			// being removed ("directory not empty", seen once in a
			// fresh-clone make test, 2026-11-30). Its writes end with it.
			if err = os.RemoveAll(abs); !errors.Is(err, unix.ENOTEMPTY) {
				return err
			}
			continue
		}
		for _, m := range mounts {
			unix.Unmount(m, unix.MNT_DETACH)
		}
	}
	if mounts, _ := mountsUnder(abs); len(mounts) > 0 {
		return fmt.Errorf("cannot remove %s: still mounted: %s", abs, strings.Join(mounts, ", "))
	}
	return os.RemoveAll(abs)
}

// killChrooted kills processes whose root directory is inside dir (the
// apt and dpkg of a build whose mmdebstrap was killed) and waits, up to
// 5 s, until they are gone or zombies: no longer writing into dir.
func killChrooted(dir string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/root")
	var killed []string
	for _, p := range procs {
		root, err := os.Readlink(p)
		if err != nil || (root != dir && !strings.HasPrefix(root, dir+"/")) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && unix.Kill(pid, unix.SIGKILL) == nil {
			killed = append(killed, filepath.Join(filepath.Dir(p), "stat"))
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, stat := range killed {
		for time.Now().Before(deadline) && running(stat) {
			time.Sleep(10 * time.Millisecond) // another parent's child: no wait4 for it
		}
	}
}

// running reports whether the process of /proc/PID/stat exists and is not
// a zombie.
func running(stat string) bool {
	b, err := os.ReadFile(stat)
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
