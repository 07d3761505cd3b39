package image

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The guest's boot path without systemd: the initramfs mounts the root disk
// and executes /sbin/talkbox-init, which mounts the API filesystems, sets
// up the network as the spec (or the kernel command line) says and hands
// over to busybox init, whose only job is to keep the guest agent running
// and reap orphans.

const talkboxInit = `#!/bin/busybox sh
# talkbox-init: the guest's PID 1 until busybox init takes over.
b=/bin/busybox
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
$b mount -t proc proc /proc 2>/dev/null
$b mount -t sysfs sysfs /sys 2>/dev/null
[ -e /dev/null ] || $b mount -t devtmpfs devtmpfs /dev
$b mkdir -p /dev/pts /dev/shm /run /tmp
$b mount -t devpts -o gid=5,mode=620 devpts /dev/pts
$b mount -t tmpfs -o mode=1777 tmpfs /dev/shm
$b mount -t tmpfs -o mode=755 tmpfs /run
$b hostname -F /etc/hostname
/sbin/talkbox-net
[ -f /etc/sysctl.d/90-talkbox.conf ] && $b sysctl -q -p /etc/sysctl.d/90-talkbox.conf >/dev/null 2>&1
/sbin/talkbox-binfmt
exec $b init
`

// talkboxBinfmt registers Debian's qemu-user-static entries, so that a
// foreign sample (big-endian MIPS, PowerPC, SuperH, …) runs inside the
// guest, behind the VM boundary, and never on the host. The entries keep
// Debian's flags: F opens the interpreter now, so it serves the sample's
// children and other mount namespaces; P gives QEMU the sample's argv[0];
// O passes the binary as an open file. Only builtins run per entry (a fork
// costs milliseconds under TCG), and the script exits at once in images
// without the package. An entry whose emulator the spec excluded fails to
// register (F needs the interpreter) and is left out, as userEmulators
// leaves it out of the image record.
const talkboxBinfmt = `#!/bin/busybox sh
# talkbox-binfmt: register /usr/lib/binfmt.d/qemu-*.conf with binfmt_misc.
b=/bin/busybox
d=/proc/sys/fs/binfmt_misc
set -- /usr/lib/binfmt.d/qemu-*.conf
[ -e "$1" ] || exit 0
if [ ! -e $d/register ]; then
	# insmod by path: under TCG it is a fraction of modprobe's half
	# second, which mounting an unloaded binfmt_misc would cost too (the
	# kernel calls modprobe). A built-in one has no .ko; insmod of a
	# loaded one fails harmlessly.
	read -r r </proc/sys/kernel/osrelease
	m=/lib/modules/$r/kernel/fs/binfmt_misc.ko
	[ -e $m ] && $b insmod $m 2>/dev/null
	$b mount -t binfmt_misc binfmt_misc $d 2>/dev/null || exit 0
fi
for f; do
	while read -r l; do
		case "$l" in
		:*) printf '%s\n' "$l" >$d/register ;;
		esac
	done <"$f"
done 2>/dev/null
exit 0
`

const talkboxNet = `#!/bin/busybox sh
# talkbox-net: the network set-up of /etc/talkbox/network, overridden by
# talkbox.net=, talkbox.if=, talkbox.ip=, talkbox.gw=, talkbox.dns= on the
# kernel command line.
b=/bin/busybox
. /etc/talkbox/network
for a in $($b cat /proc/cmdline); do
	case "$a" in
	talkbox.net=*) TB_NET=${a#*=} ;;
	talkbox.if=*) TB_IF=${a#*=} ;;
	talkbox.ip=*) TB_IP=${a#*=} ;;
	talkbox.gw=*) TB_GW=${a#*=} ;;
	talkbox.dns=*) TB_DNS=$(echo "${a#*=}" | $b tr , ' ') ;;
	esac
done
$b ip link set lo up
case "$TB_NET" in
static)
	$b ip addr add "$TB_IP" dev "$TB_IF"
	$b ip link set "$TB_IF" up
	[ -n "$TB_GW" ] && $b ip route add default via "$TB_GW"
	: >/etc/resolv.conf
	for d in $TB_DNS; do echo "nameserver $d" >>/etc/resolv.conf; done
	;;
esac
exit 0
`

const talkboxAgent = `#!/bin/busybox sh
# talkbox-agent: run qemu-ga on the virtio port libvirt named for it (there
# is no udev to make the /dev/virtio-ports link).
for p in /sys/class/virtio-ports/*; do
	if [ "$(/bin/busybox cat "$p/name" 2>/dev/null)" = org.qemu.guest_agent.0 ]; then
		exec /usr/sbin/qemu-ga -m virtio-serial -p "/dev/${p##*/}"
	fi
done
echo "talkbox-agent: no org.qemu.guest_agent.0 port" >/dev/console
exec /bin/busybox sleep 5
`

const inittab = `::respawn:/sbin/talkbox-agent
::ctrlaltdel:/bin/busybox poweroff -f
::shutdown:/bin/busybox umount -a -r
`

const netUnit = `[Unit]
Description=Talkbox guest network set-up
DefaultDependencies=no
Before=network.target

[Service]
Type=oneshot
ExecStart=/sbin/talkbox-net
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
`

// customize writes the boot path, network set-up and hardening into root.
func customize(root string, s *Spec) error {
	w := func(rel, data string, mode os.FileMode) error {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		os.Remove(p)
		return os.WriteFile(p, []byte(data), mode)
	}
	net := fmt.Sprintf("TB_NET=%s\nTB_IF=%s\nTB_IP=%s\nTB_GW=%s\nTB_DNS=%q\n", s.Network.Mode, s.Network.Interface,
		s.Network.Address, s.Network.Gateway, strings.Join(s.Network.DNS, " "))
	files := []struct {
		rel, data string
		mode      os.FileMode
	}{
		{"sbin/talkbox-init", talkboxInit, 0o755},
		{"sbin/talkbox-net", talkboxNet, 0o755},
		{"sbin/talkbox-agent", talkboxAgent, 0o755},
		{"sbin/talkbox-binfmt", talkboxBinfmt, 0o755},
		{"etc/talkbox/network", net, 0o644},
		{"etc/hostname", s.Hardening.Hostname + "\n", 0o644},
		{"etc/hosts", "127.0.0.1\tlocalhost\n127.0.1.1\t" + s.Hardening.Hostname + "\n", 0o644},
		{"etc/machine-id", "", 0o444},
		{"etc/fstab", "/dev/vda / ext4 rw,relatime 0 1\n", 0o644},
	}
	if s.Boot.Mode == "talkbox-init" {
		files = append(files, struct {
			rel, data string
			mode      os.FileMode
		}{"etc/inittab", inittab, 0o644})
	} else {
		files = append(files, struct {
			rel, data string
			mode      os.FileMode
		}{"etc/systemd/system/talkbox-net.service", netUnit, 0o644})
	}
	if len(s.Hardening.Sysctl) > 0 {
		var keys []string
		for k := range s.Hardening.Sysctl {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "%s = %s\n", k, s.Hardening.Sysctl[k])
		}
		files = append(files, struct {
			rel, data string
			mode      os.FileMode
		}{"etc/sysctl.d/90-talkbox.conf", b.String(), 0o644})
	}
	for _, f := range files {
		if err := w(f.rel, f.data, f.mode); err != nil {
			return err
		}
	}
	if s.Boot.Mode == "systemd" {
		link := filepath.Join(root, "etc/systemd/system/multi-user.target.wants/talkbox-net.service")
		os.MkdirAll(filepath.Dir(link), 0o755)
		os.Remove(link)
		if err := os.Symlink("/etc/systemd/system/talkbox-net.service", link); err != nil {
			return err
		}
	}
	if s.Hardening.LockRoot {
		if err := lockRoot(filepath.Join(root, "etc/shadow")); err != nil {
			return fmt.Errorf("locking root: %w", err)
		}
	}
	return nil
}

// lockRoot makes root's password field unusable ("!*"), as passwd -l does.
func lockRoot(shadow string) error {
	b, err := os.ReadFile(shadow)
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		f := strings.Split(l, ":")
		if len(f) > 2 && f[0] == "root" {
			if !strings.HasPrefix(f[1], "!") {
				f[1] = "!" + f[1]
			}
			lines[i] = strings.Join(f, ":")
		}
	}
	return os.WriteFile(shadow, []byte(strings.Join(lines, "\n")), 0o640)
}

// Package is one installed Debian package.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Arch    string `json:"arch"`
}

// installedPackages reads dpkg's status file of a root filesystem.
func installedPackages(root string) ([]Package, error) {
	f, err := os.Open(filepath.Join(root, "var/lib/dpkg/status"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Package
	var cur Package
	installed := false
	flush := func() {
		if cur.Name != "" && installed {
			out = append(out, cur)
		}
		cur, installed = Package{}, false
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" {
			flush()
			continue
		}
		k, v, ok := strings.Cut(l, ": ")
		if !ok {
			continue
		}
		switch k {
		case "Package":
			cur.Name = v
		case "Version":
			cur.Version = v
		case "Architecture":
			cur.Arch = v
		case "Status":
			installed = strings.HasSuffix(v, " installed")
		}
	}
	flush()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, sc.Err()
}

// findKernel returns the kernel image in root's /boot and its release.
func findKernel(root string) (path, release string, err error) {
	for _, pat := range []string{"vmlinuz-*", "vmlinux-*"} {
		m, _ := filepath.Glob(filepath.Join(root, "boot", pat))
		sort.Strings(m)
		if len(m) > 0 {
			p := m[len(m)-1]
			rel := strings.SplitN(filepath.Base(p), "-", 2)[1]
			return p, rel, nil
		}
	}
	return "", "", fmt.Errorf("no kernel in %s/boot (is the kernel package installed?)", root)
}
