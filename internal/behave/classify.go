package behave

import (
	"path"
	"strconv"
	"strings"
)

// persistenceKind names the persistence a write to p would be: init
// scripts, cron, systemd units, the dynamic linker's preload list, SSH
// keys, shell profiles, accounts; "" for none. The same files under another
// root (a chroot, a mounted root file system: /mnt/root/etc/crontab) count
// too.
func persistenceKind(p string) string {
	if k := rootPersistence(p); k != "" {
		return k
	}
	for i := 1; i < len(p); i++ {
		if p[i] == '/' && (strings.HasPrefix(p[i:], "/etc/") || strings.HasPrefix(p[i:], "/var/spool/cron/")) {
			if k := rootPersistence(p[i:]); k != "" {
				return k
			}
		}
	}
	return ""
}

func rootPersistence(p string) string {
	base := path.Base(p)
	switch {
	case p == "/etc/rc.local", p == "/etc/inittab", strings.HasPrefix(p, "/etc/init.d/"), strings.HasPrefix(p, "/etc/rc.d/"),
		strings.HasPrefix(p, "/etc/init/"), isRcDir(p):
		return "init"
	case p == "/etc/crontab", p == "/etc/anacrontab", strings.HasPrefix(p, "/etc/cron."), strings.HasPrefix(p, "/var/spool/cron/"):
		return "cron"
	case strings.HasPrefix(p, "/etc/systemd/"), strings.HasPrefix(p, "/lib/systemd/"), strings.HasPrefix(p, "/usr/lib/systemd/"),
		strings.Contains(p, "/.config/systemd/"):
		return "systemd"
	case p == "/etc/ld.so.preload":
		return "ld-preload"
	case (base == "authorized_keys" || base == "authorized_keys2") && strings.Contains(p, "/.ssh/"):
		return "ssh-key"
	case p == "/etc/profile", strings.HasPrefix(p, "/etc/profile.d/"), p == "/etc/bash.bashrc", p == "/etc/bashrc",
		base == ".bashrc", base == ".bash_profile", base == ".bash_login", base == ".profile":
		return "profile"
	case p == "/etc/passwd", p == "/etc/shadow", p == "/etc/sudoers", strings.HasPrefix(p, "/etc/sudoers.d/"):
		return "account"
	}
	return ""
}

// isRcDir reports whether p is in a SysV runlevel directory, /etc/rcN.d/.
func isRcDir(p string) bool {
	rest, ok := strings.CutPrefix(p, "/etc/rc")
	return ok && len(rest) > 4 && strings.IndexByte("0123456S", rest[0]) >= 0 && strings.HasPrefix(rest[1:], ".d/")
}

// isWatchdog reports whether p is a watchdog device (a bot that opens it
// keeps the device from rebooting).
func isWatchdog(p string) bool {
	return p == "/dev/misc/watchdog" || strings.HasPrefix(p, "/dev/watchdog")
}

// evasionRead names what reading p may probe: tracer-check (TracerPid in
// the status of its own process), cpuinfo, dmi (the machine's vendor and
// product); "" for none.
func evasionRead(p string, own func(int) bool) string {
	switch {
	case p == "/proc/cpuinfo":
		return "cpuinfo"
	case strings.HasPrefix(p, "/sys/class/dmi/"), strings.HasPrefix(p, "/sys/devices/virtual/dmi/"):
		return "dmi"
	case p == "/proc/self/status", strings.HasPrefix(p, "/proc/thread-self/") && strings.HasSuffix(p, "/status"):
		return "tracer-check"
	}
	if pid, ok := procPID(p); ok && own(pid) && (strings.HasSuffix(p, "/status") && strings.Count(p, "/") == 3 ||
		strings.Contains(p, "/task/") && strings.HasSuffix(p, "/status")) {
		return "tracer-check"
	}
	return ""
}

// cgroupMove tells a cgroup file that moves the processes written to it
// into its cgroup: written, a way out of the cgroup tb-run kills a cycle's
// sample through (wherever the sample mounted the cgroup file system).
func cgroupMove(p string) bool {
	base := path.Base(p)
	return base == "cgroup.procs" || base == "cgroup.threads" || base == "tasks" && strings.Contains(p, "cgroup")
}

// procPID is the pid of a /proc/PID/... path.
func procPID(p string) (int, bool) {
	rest, ok := strings.CutPrefix(p, "/proc/")
	if !ok {
		return 0, false
	}
	num, _, _ := strings.Cut(rest, "/")
	pid, err := strconv.Atoi(num)
	return pid, err == nil && pid > 0
}

// isFirewallTool reports whether an executable's name is a firewall's
// command-line tool.
func isFirewallTool(name string) bool {
	switch name {
	case "iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy", "iptables-nft", "ip6tables-nft",
		"iptables-restore", "ip6tables-restore", "iptables-legacy-restore", "iptables-nft-restore",
		"xtables-legacy-multi", "xtables-nft-multi", "nft", "ufw", "firewall-cmd":
		return true
	}
	return false
}
