package image

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// The initramfs is built here rather than by initramfs-tools: busybox,
// the few modules a virtio guest needs to reach its root disk, and a
// script. It boots in a fraction of the time Debian's generic one takes.
const initScript = `#!/bin/busybox sh
b=/bin/busybox
$b mount -t proc proc /proc
$b mount -t sysfs sysfs /sys
$b mount -t devtmpfs devtmpfs /dev
for m in $($b cat /modules); do
	$b insmod "/lib/modules/$m" || echo "talkbox-initrd: insmod $m failed"
done
root=/dev/vda
init=/sbin/talkbox-init
for a in $($b cat /proc/cmdline); do
	case "$a" in
	root=/dev/*) root=${a#root=} ;;
	talkbox.init=*) init=${a#talkbox.init=} ;;
	esac
done
# Devices appear asynchronously and there is no udev to tell us when.
i=0
while [ ! -b "$root" ] && [ $i -lt 3000 ]; do $b usleep 10000; i=$((i+1)); done
if ! $b mount -t ext4 -o rw "$root" /root; then
	echo "talkbox-initrd: cannot mount $root; powering off" >/dev/console
	$b poweroff -f
fi
$b umount /proc /sys
$b mount --move /dev /root/dev
exec $b switch_root /root "$init"
`

// moduleOrder resolves the named modules and their dependencies from the
// kernel's modules.dep, in load order. Names not found (built-in, or not
// built for this kernel) are skipped.
func moduleOrder(modDir string, names []string) ([]string, error) {
	f, err := os.Open(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	deps := map[string][]string{}
	byName := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[mod] = strings.Fields(rest)
		byName[modName(mod)] = mod
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var order []string
	seen := map[string]bool{}
	var visit func(string)
	visit = func(m string) {
		if seen[m] {
			return
		}
		seen[m] = true
		for _, d := range deps[m] {
			visit(d)
		}
		order = append(order, m)
	}
	for _, n := range names {
		if m, ok := byName[strings.ReplaceAll(n, "-", "_")]; ok {
			visit(m)
		}
	}
	return order, nil
}

func modName(p string) string {
	b := path.Base(p)
	b = b[:strings.Index(b, ".ko")]
	return strings.ReplaceAll(b, "-", "_")
}

// writeInitramfs writes a gzip-compressed newc cpio archive with busybox
// from root, the modules and the init script.
func writeInitramfs(out, root, kernelRelease string, modules []string) error {
	modDir := filepath.Join(root, "lib/modules", kernelRelease)
	order, err := moduleOrder(modDir, modules)
	if err != nil {
		return fmt.Errorf("initramfs modules: %w", err)
	}
	bb, err := os.ReadFile(filepath.Join(root, "bin/busybox"))
	if err != nil {
		return fmt.Errorf("initramfs: %w (busybox-static must be installed)", err)
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	cw := &cpioWriter{w: zw}
	for _, d := range []string{"bin", "dev", "proc", "sys", "root", "lib", "lib/modules"} {
		cw.dir(d)
	}
	cw.node("dev/console", 0o020600, 5, 1)
	cw.file("bin/busybox", 0o755, bb)
	cw.file("init", 0o755, []byte(initScript))
	cw.file("modules", 0o644, []byte(strings.Join(order, "\n")+"\n"))
	made := map[string]bool{}
	for _, m := range order {
		for d := path.Dir(m); d != "." && !made[d]; d = path.Dir(d) {
			made[d] = true
		}
	}
	// Directories first, parents before children.
	var dirs []string
	for d := range made {
		dirs = append(dirs, d)
	}
	sortByDepth(dirs)
	for _, d := range dirs {
		cw.dir("lib/modules/" + d)
	}
	for _, m := range order {
		b, err := os.ReadFile(filepath.Join(modDir, m))
		if err != nil {
			return fmt.Errorf("initramfs module %s: %w", m, err)
		}
		cw.file("lib/modules/"+m, 0o644, b)
	}
	cw.trailer()
	if cw.err != nil {
		return cw.err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return f.Close()
}

func sortByDepth(dirs []string) {
	for i := 1; i < len(dirs); i++ {
		for j := i; j > 0 && less(dirs[j], dirs[j-1]); j-- {
			dirs[j], dirs[j-1] = dirs[j-1], dirs[j]
		}
	}
}

func less(a, b string) bool {
	da, db := strings.Count(a, "/"), strings.Count(b, "/")
	if da != db {
		return da < db
	}
	return a < b
}

// cpioWriter writes the "newc" format the kernel unpacks.
type cpioWriter struct {
	w   io.Writer
	ino int
	err error
}

func (c *cpioWriter) entry(name string, mode uint32, major, minor int, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, major, minor, len(name)+1, 0)
	buf := append([]byte(hdr), name...)
	buf = append(buf, 0)
	for len(buf)%4 != 0 {
		buf = append(buf, 0)
	}
	buf = append(buf, data...)
	for len(buf)%4 != 0 {
		buf = append(buf, 0)
	}
	_, c.err = c.w.Write(buf)
}

func (c *cpioWriter) dir(name string)                         { c.entry(name, 0o040755, 0, 0, nil) }
func (c *cpioWriter) file(name string, perm uint32, b []byte) { c.entry(name, 0o100000|perm, 0, 0, b) }
func (c *cpioWriter) node(name string, mode uint32, major, minor int) {
	c.entry(name, mode, major, minor, nil)
}
func (c *cpioWriter) trailer() { c.entry("TRAILER!!!", 0, 0, 0, nil) }
