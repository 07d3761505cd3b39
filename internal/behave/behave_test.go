package behave

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode/decodetest"
	"github.com/talkbox-sandbox/talkbox/internal/lines"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// parse reads a trace into a test sink.
func parse(t *testing.T, trace string, opts Options) (*decodetest.Sink, *Result) {
	t.Helper()
	sink := decodetest.New(observe.Origin{})
	res, err := Parse(context.Background(), strings.NewReader(trace), observe.Origin{Input: "trace", Cycle: "c1", Artifact: "art-1"}, sink, opts)
	if err != nil {
		t.Fatal(err)
	}
	sink.Finish(t)
	return sink, res
}

func parseFile(t *testing.T, name string, opts Options) (*decodetest.Sink, *Result) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, string(b), opts)
}

// values are the values of a type's observables, sorted.
func values(sink *decodetest.Sink, typ string) []string {
	var vs []string
	for _, o := range sink.Obs {
		if o.Type == typ {
			vs = append(vs, o.Value)
		}
	}
	slices.Sort(vs)
	return vs
}

func procOf(t *testing.T, sink *decodetest.Sink, pid int64) *records.ProcessInfo {
	t.Helper()
	return findProc(t, sink, func(p *records.ProcessInfo) bool { return p.PID == pid })
}

// The persistence and evasion a sample cannot be run on the host for
// (hand-written in strace 6.1's format).
func TestPersistenceAndEvasion(t *testing.T) {
	sink, res := parseFile(t, "testdata/persist.strace", Options{Window: time.Minute})
	if res.Stats.Bad != 0 {
		t.Fatalf("stats %+v", res.Stats)
	}
	want := []string{
		"account /etc/sudoers.d/bot", "cron /etc/cron.d/0bot", "cron /etc/crontab", "cron /var/spool/cron/crontabs/root", "firewall /usr/sbin/iptables",
		"init /etc/init.d/bot", "init /etc/rc3.d/S99bot", "inject", "kill", "ld-preload /etc/ld.so.preload", "profile /root/.bashrc",
		"ssh-key /root/.ssh/authorized_keys", "systemd /etc/systemd/system/bot.service", "watchdog /dev/misc/watchdog",
		"watchdog /dev/watchdog",
	}
	if got := values(sink, records.ObsPersistence); !slices.Equal(got, want) {
		t.Errorf("persistence\n got %q\nwant %q", got, want)
	}
	get := func(typ, v string) *records.TechniqueInfo {
		o := sink.Get(t, typ, v)
		if typ == records.ObsPersistence {
			return o.Persistence
		}
		return o.Evasion
	}
	if p := get(records.ObsPersistence, "systemd /etc/systemd/system/bot.service"); !slices.Equal(p.Paths, []string{"/etc/systemd/system/bot.service (EACCES)"}) {
		t.Errorf("a failed attempt: %+v", p)
	}
	if p := get(records.ObsPersistence, "kill"); !slices.Equal(p.Targets, []string{"1234 SIGKILL (ESRCH)", "-1 SIGKILL", "4321 SIGSTOP (ESRCH)"}) {
		t.Errorf("kill: %+v", p)
	}
	if p := get(records.ObsPersistence, "firewall /usr/sbin/iptables"); !slices.Equal(p.Paths, []string{"iptables -I INPUT -p tcp --dport 23 -j DROP"}) ||
		!slices.Equal(p.Procs, []string{"501"}) {
		t.Errorf("firewall: %+v", p)
	}
	if p := get(records.ObsPersistence, "inject"); !slices.Equal(p.Targets, []string{"PTRACE_ATTACH 900"}) {
		t.Errorf("inject: %+v", p)
	}

	want = []string{"cgroup", "clock", "cpuinfo", "dmi", "io-uring", "ptrace", "self-delete", "sleep", "tracer-check"}
	if got := values(sink, records.ObsEvasion); !slices.Equal(got, want) {
		t.Errorf("evasion\n got %q\nwant %q", got, want)
	}
	// A read of the clock (adjtimex without modes) and a time zone's set
	// are none; a refused try is one.
	// A write to cgroup.procs moves a process out of the sample's cgroup;
	// a read of the cgroup's events is nothing.
	if p := get(records.ObsEvasion, "cgroup"); !slices.Equal(p.Paths, []string{"/sys/fs/cgroup/cgroup.procs"}) {
		t.Errorf("cgroup: %+v", p)
	}
	if p := get(records.ObsEvasion, "clock"); !slices.Equal(p.Targets, []string{"clock_settime 2026-11-25T06:00:00Z (EPERM)",
		"clock_adjtime ADJ_SETOFFSET|ADJ_NANO", "settimeofday 2001-01-01T00:00:00Z"}) {
		t.Errorf("clock: %+v", p)
	}
	if p := get(records.ObsEvasion, "ptrace"); !slices.Equal(p.Targets, []string{"PTRACE_SEIZE 500 (EPERM)"}) {
		t.Errorf("ptrace: %+v", p)
	}
	if p := get(records.ObsEvasion, "dmi"); !slices.Equal(p.Paths, []string{"/sys/class/dmi/id/product_name", "/sys/devices/virtual/dmi/id/sys_vendor"}) {
		t.Errorf("dmi: %+v", p)
	}
	if p := get(records.ObsEvasion, "tracer-check"); !slices.Equal(p.Paths, []string{"/proc/500/status"}) {
		t.Errorf("tracer-check: %+v", p)
	}
	if p := get(records.ObsEvasion, "self-delete"); !slices.Equal(p.Paths, []string{"/tmp/.x/bot"}) {
		t.Errorf("self-delete: %+v", p)
	}
	if o := sink.Get(t, records.ObsPath, "/tmp/.x/bot"); !o.Path.SelfDelete || !slices.Equal(o.Path.Ops, []string{"delete"}) {
		t.Errorf("self-deleted path: %+v", o.Path)
	}
	// The sleep was killed an hour early: its request is what counts.
	if o := sink.Get(t, records.ObsEvasion, "sleep"); o.Evasion.Longest != 3600 || !o.FirstSeen.Equal(time.Unix(1795500000, 3100000).UTC()) {
		t.Errorf("sleep: %+v %v", o.Evasion, o.FirstSeen)
	}
	p := procOf(t, sink, 500)
	if !slices.Equal(p.Names, []string{"sshd"}) || p.Exit == nil || p.Exit.Signal != "SIGKILL" || p.Exe != "/tmp/.x/bot" {
		t.Errorf("process: %+v", p)
	}
	if c := procOf(t, sink, 501); c.PPID != 500 || c.Exit == nil || c.Exit.Code != 0 || len(c.Names) != 0 {
		t.Errorf("child: %+v", c)
	}
	if tr := sink.Get(t, records.ObsTrace, "strace").Trace; tr.Unfinished != 1 || tr.LongestSleep != 3600 {
		t.Errorf("trace: %+v", tr)
	}
	// Files it wrote are dropped; a read (/etc/passwd) is no path, a
	// device is none either.
	if got, want := values(sink, records.ObsPath), []string{"/etc/cron.d/0bot", "/etc/crontab", "/etc/init.d/bot", "/etc/ld.so.preload", "/etc/rc3.d/S99bot",
		"/etc/sudoers.d/bot", "/root/.bashrc", "/root/.ssh/authorized_keys", "/tmp/.x/bot", "/tmp/.x/cron", "/var/spool/cron/crontabs/root"}; !slices.Equal(got, want) {
		t.Errorf("paths\n got %q\nwant %q", got, want)
	}
	var dropped []string
	for _, d := range res.Dropped {
		dropped = append(dropped, d.Path)
	}
	if want := []string{"/etc/crontab", "/etc/cron.d/0bot", "/etc/init.d/bot", "/var/spool/cron/crontabs/root", "/etc/ld.so.preload", "/root/.ssh/authorized_keys",
		"/root/.bashrc", "/etc/sudoers.d/bot"}; !slices.Equal(dropped, want) {
		t.Errorf("dropped\n got %q\nwant %q", dropped, want)
	}
}

// Real strace output of python3 (testdata/python.strace, the guest's
// command line): IPv6 and Unix sockets, a file name strace escapes, a
// child killed by a signal.
func TestPythonTrace(t *testing.T) {
	sink, res := parseFile(t, "testdata/python.strace", Options{})
	if res.Stats.Bad != 0 || res.Format != FormatStrace {
		t.Fatalf("%s %+v", res.Format, res.Stats)
	}
	want := []string{"connect [::1]:9/tcp", "connect unix:/nonexistent/sock", "connect unix:@tb-abstract", "listen [::1]:0/tcp", "sendto 127.0.0.1:9/udp"}
	if got := values(sink, records.ObsNetcall); !slices.Equal(got, want) {
		t.Errorf("netcalls\n got %q\nwant %q", got, want)
	}
	if n := sink.Get(t, records.ObsNetcall, "connect [::1]:9/tcp").Netcall; n.Family != "inet6" || n.Addr != "::1" || !hasResult(n, "ECONNREFUSED") {
		t.Errorf("IPv6 connect: %+v", n)
	}
	if n := sink.Get(t, records.ObsNetcall, "connect unix:/nonexistent/sock").Netcall; n.Family != "unix" || !hasResult(n, "ENOENT") {
		t.Errorf("unix connect: %+v", n)
	}
	if got := values(sink, records.ObsPath); !slices.Equal(got, []string{"/tmp/bt/fx/w\n\"q\u00e9.txt"}) {
		t.Errorf("paths %q", got)
	}
	root := procOf(t, sink, 21956)
	if !slices.Equal(root.Names, []string{"kworker/0:1"}) || root.UID == nil || *root.UID != 0 {
		t.Errorf("root %+v", root)
	}
	if p := procOf(t, sink, 21958); p.Exit == nil || p.Exit.Code != 3 || !slices.Equal(p.Names, []string{"[kthreadd]"}) || p.PPID != 21956 {
		t.Errorf("renamed child %+v", p)
	}
	if p := procOf(t, sink, 21959); p.Exit == nil || p.Exit.Signal != "SIGKILL" || p.Exe != "/usr/bin/python3" || len(p.Execs) != 0 {
		t.Errorf("killed child %+v", p)
	}
	// Its kill was of itself: no tampering. No window: no sleep evasion.
	if got := values(sink, records.ObsPersistence); len(got) != 0 {
		t.Errorf("persistence %q", got)
	}
	if got := values(sink, records.ObsEvasion); !slices.Equal(got, []string{"ptrace", "tracer-check"}) {
		t.Errorf("evasion %q", got)
	}
	if tr := sink.Get(t, records.ObsTrace, "strace").Trace; tr.LongestSleep < 0.001 || tr.Processes != 3 || tr.Execs != 2 {
		t.Errorf("trace %+v", tr)
	}
	// The tree, by start.
	var tree []string
	for _, p := range res.Processes {
		tree = append(tree, fmt.Sprintf("%d<%d", p.PID, p.PPID))
	}
	if !slices.Equal(tree, []string{"21956<0", "21958<21956", "21959<21956"}) {
		t.Errorf("tree %q", tree)
	}
}

// Real strace -y output: paths from the annotations of AT_FDCWD and of
// file descriptors (fchmod, unlinkat relative to a directory).
func TestAnnotatedTrace(t *testing.T) {
	sink, res := parseFile(t, "testdata/python-y.strace", Options{})
	if res.Stats.Bad != 0 {
		t.Fatalf("%+v", res.Stats)
	}
	if o := sink.Get(t, records.ObsPath, "/tmp/bt/y(1)"); !slices.Equal(o.Path.Ops, []string{"create", "write", "chmod+x", "delete"}) || o.Path.Dropped {
		t.Errorf("%+v", o.Path)
	}
	if o := sink.Get(t, records.ObsPath, "/tmp/bt/z"); !o.Path.Dropped {
		t.Errorf("%+v", o.Path)
	}
}

// The same without -y: the directory comes from chdir, fchdir and the
// descriptors opened before.
func TestRelativePaths(t *testing.T) {
	sink, _ := parse(t, `1 1795500000.000001 execve("/bin/x", ["x"], 0x7ffd /* 1 var */) = 0
1 1795500000.000002 chdir("/tmp/a") = 0
1 1795500000.000003 openat(AT_FDCWD, "../b/c", O_WRONLY|O_CREAT, 0644) = 3
1 1795500000.000004 fchmod(3, 0700) = 0
1 1795500000.000005 openat(AT_FDCWD, "/srv", O_RDONLY|O_DIRECTORY) = 4
1 1795500000.000006 fchdir(4) = 0
1 1795500000.000007 mkdir("d", 0755) = 0
1 1795500000.000008 openat(4, "e", O_RDWR) = 5
1 1795500000.000009 renameat2(4, "e", AT_FDCWD, "f", RENAME_NOREPLACE) = 0
1 1795500000.000010 openat(9, "g", O_WRONLY|O_CREAT, 0644) = 6
1 1795500000.000011 linkat(AT_FDCWD, "f", AT_FDCWD, "h", 0) = 0
1 1795500000.000012 fork() = 2
2 1795500000.000013 openat(AT_FDCWD, "i", O_WRONLY|O_CREAT, 0644) = 7
2 1795500000.000014 fchmod(3, 0600) = 0
`, Options{})
	want := []string{"/srv/d", "/srv/e", "/srv/f", "/srv/h", "/srv/i", "/tmp/b/c", "g"}
	if got := values(sink, records.ObsPath); !slices.Equal(got, want) {
		t.Errorf("paths\n got %q\nwant %q", got, want)
	}
	// The child's chmod of the descriptor it inherited.
	if o := sink.Get(t, records.ObsPath, "/tmp/b/c"); o.Path.Mode != "0600" || !slices.Equal(o.Path.Ops, []string{"create", "write", "chmod+x", "chmod"}) ||
		!slices.Equal(o.Path.Procs, []string{"1", "2"}) {
		t.Errorf("%+v", o.Path)
	}
	if o := sink.Get(t, records.ObsPath, "/srv/h"); !slices.Equal(o.Path.Ops, []string{"link"}) || o.Path.Dropped {
		t.Errorf("%+v", o.Path)
	}
}

// The user: getuid, then what setresuid, setreuid and setuid change when
// they succeed, inherited by a child.
func TestUID(t *testing.T) {
	sink, _ := parse(t, `1 1795500000.000001 getuid() = 1000
1 1795500000.000002 setresuid(0, 0, 0) = 0
1 1795500000.000003 fork() = 2
1 1795500000.000004 setreuid(33, 33) = 0
1 1795500000.000005 setuid(7) = -1 EPERM (Operation not permitted)
3 1795500000.000006 getuid32() = 5
`, Options{})
	for pid, want := range map[int64]int64{1: 33, 2: 0, 3: 5} {
		if p := procOf(t, sink, pid); p.UID == nil || *p.UID != want {
			t.Errorf("%d: %+v", pid, p)
		}
	}
}

// The calls read, most frequent first: the first 64.
func TestCallCounts(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 70; i++ {
		for j := 0; j <= i; j++ {
			fmt.Fprintf(&b, "1 1795500000.%06d call%d() = 0\n", i*100+j, i)
		}
	}
	_, res := parse(t, b.String(), Options{})
	cs := res.Trace.Calls
	if len(cs) != 64 || cs[0] != (records.CallCount{Name: "call69", Count: 70}) || cs[63].Name != "call6" {
		t.Errorf("%+v", cs)
	}
}

// A line longer than 1 MiB is one bad line; the rest is read.
func TestLongLine(t *testing.T) {
	sink, res := parse(t, `1 1795500000.000001 openat(AT_FDCWD, "/tmp/a", O_WRONLY|O_CREAT, 0644) = 3
1 1795500000.000002 execve("/x", ["`+strings.Repeat("a", lines.MaxLogLine)+`"], 0x7ffd /* 1 var */) = 0
1 1795500000.000003 openat(AT_FDCWD, "/tmp/b", O_WRONLY|O_CREAT, 0644) = 3
`, Options{})
	if res.Stats.Bad != 1 || !errors.Is(res.Stats.FirstBad, lines.ErrTooLong) {
		t.Errorf("%+v", res.Stats)
	}
	if got := values(sink, records.ObsPath); !slices.Equal(got, []string{"/tmp/a", "/tmp/b"}) {
		t.Errorf("%q", got)
	}
}

// Network calls in their other forms: sendmsg's address, a UDP listener's
// bind, a raw socket's datagrams (a SYN scanner's), SCTP, families left
// out, sends without an address, a listener's accepted peers.
func TestNetcallForms(t *testing.T) {
	sink, _ := parse(t, `1 1795500000.000001 socket(AF_INET, SOCK_DGRAM, IPPROTO_IP) = 3
1 1795500000.000002 sendmsg(3, {msg_name={sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("192.0.2.53")}, msg_namelen=16, msg_iov=[{iov_base="x", iov_len=1}], msg_iovlen=1, msg_controllen=0, msg_flags=0}, 0) = 1
1 1795500000.000003 sendmsg(3, {msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base="x", iov_len=1}], msg_iovlen=1, msg_controllen=0, msg_flags=0}, 0) = 1
1 1795500000.000004 socket(AF_INET, SOCK_DGRAM, IPPROTO_IP) = 4
1 1795500000.000005 bind(4, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("0.0.0.0")}, 16) = 0
1 1795500000.000006 socket(AF_INET, SOCK_RAW, IPPROTO_TCP) = 5
1 1795500000.000007 sendto(5, "E\0\0(", 40, MSG_NOSIGNAL, {sa_family=AF_INET, sin_port=htons(0), sin_addr=inet_addr("203.0.113.77")}, 16) = 40
1 1795500000.000008 socket(AF_INET6, SOCK_STREAM, IPPROTO_SCTP) = 6
1 1795500000.000009 connect(6, {sa_family=AF_INET6, sin6_port=htons(9899), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "2001:db8::9", &sin6_addr), sin6_scope_id=0}, 28) = -1 EHOSTUNREACH (No route to host)
1 1795500000.000010 socket(AF_NETLINK, SOCK_RAW|SOCK_CLOEXEC, NETLINK_ROUTE) = 7
1 1795500000.000011 bind(7, {sa_family=AF_NETLINK, nl_pid=0, nl_groups=00000000}, 12) = 0
1 1795500000.000012 connect(3, {sa_family=AF_UNSPEC, sa_data="\0\0\0\0\0\0\0\0\0\0\0\0\0\0"}, 16) = 0
1 1795500000.000013 sendto(3, "x", 1, 0, NULL, 0) = 1
1 1795500000.000014 socket(AF_INET, SOCK_STREAM, IPPROTO_TCP) = 8
1 1795500000.000015 bind(8, {sa_family=AF_INET, sin_port=htons(2323), sin_addr=inet_addr("0.0.0.0")}, 16) = 0
1 1795500000.000016 listen(8, 5) = 0
1 1795500000.000017 accept4(8, {sa_family=AF_INET, sin_port=htons(40000), sin_addr=inet_addr("198.51.100.4")}, [16], SOCK_CLOEXEC) = 9
1 1795500000.000018 accept(8, {sa_family=AF_INET, sin_port=htons(40001), sin_addr=inet_addr("198.51.100.5")}, [16]) = 10
1 1795500000.000019 connect(99, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("203.0.113.80")}, 16) = 0
`, Options{})
	want := []string{"bind 0.0.0.0:2323/tcp", "bind 0.0.0.0:53/udp", "connect 203.0.113.80:80", "connect [2001:db8::9]:9899/sctp",
		"listen 0.0.0.0:2323/tcp", "sendto 192.0.2.53:53/udp", "sendto 203.0.113.77:0/raw"}
	if got := values(sink, records.ObsNetcall); !slices.Equal(got, want) {
		t.Errorf("netcalls\n got %q\nwant %q", got, want)
	}
	if l := sink.Get(t, records.ObsNetcall, "listen 0.0.0.0:2323/tcp").Netcall; l.Accepted != 2 ||
		!slices.Equal(l.Peers, []string{"198.51.100.4:40000", "198.51.100.5:40001"}) {
		t.Errorf("%+v", l)
	}
	if n := sink.Get(t, records.ObsNetcall, "connect [2001:db8::9]:9899/sctp").Netcall; !hasResult(n, "EHOSTUNREACH") || n.Family != "inet6" {
		t.Errorf("%+v", n)
	}
}

// Sleeps: an absolute one on CLOCK_REALTIME against the line's time, one
// on another clock still running when the trace ends (until its end).
func TestSleeps(t *testing.T) {
	sink, res := parse(t, `40 1795500000.000000 clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, {tv_sec=1795503600, tv_nsec=0}, NULL) = 0 <0.000100>
41 1795500000.000000 clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, {tv_sec=23000, tv_nsec=0},  <unfinished ...>
40 1795500100.000000 exit_group(0) = ?
`, Options{Window: time.Minute})
	s := sink.Get(t, records.ObsEvasion, "sleep").Evasion
	if s.Longest != 3600 || !slices.Equal(s.Procs, []string{"40", "41"}) || res.Trace.LongestSleep != 3600 || s.Total != 100.0001 {
		t.Errorf("%+v %+v", s, res.Trace)
	}
}

// strace's <unfinished ...> and <... resumed> pairs across processes:
// a child whose lines come before its parent's clone returns, a thread
// likewise, and calls still running when the trace ends.
func TestUnfinishedAcrossPids(t *testing.T) {
	sink, res := parse(t, `10 1795500000.000001 execve("/tmp/s", ["s"], 0x7ffd /* 1 var */) = 0 <0.000100>
10 1795500000.000010 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f0 <unfinished ...>
11 1795500000.000020 execve("/bin/sh", ["sh", "-c", "x"], 0x7ffd /* 1 var */ <unfinished ...>
10 1795500000.000030 <... clone resumed>) = 11 <0.000020>
10 1795500000.000040 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM, exit_signal=0, stack=0x7f1, stack_size=0x7fff80}, 88 <unfinished ...>
12 1795500000.000050 connect(3, {sa_family=AF_INET, sin_port=htons(443), sin_addr=inet_addr("203.0.113.9")}, 16 <unfinished ...>
11 1795500000.000060 <... execve resumed>) = 0 <0.000040>
10 1795500000.000070 <... clone3 resumed> => {parent_tid=[12]}, 88) = 12 <0.000030>
12 1795500000.000080 <... connect resumed>) = -1 ETIMEDOUT (Connection timed out) <0.000030>
12 1795500000.000085 ???( <unfinished ...>
12 1795500000.000087 <... ??? resumed>) = ?
12 1795500000.000090 exit(0) = ?
12 1795500000.000100 +++ exited with 0 +++
11 1795500000.000110 connect(4, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("198.51.100.7")}, 16 <unfinished ...>
10 1795500000.000120 nanosleep({tv_sec=5, tv_nsec=0}, NULL) = 0 <5.000100>
10 1795500000.000125 [ Process PID=10 runs in 32 bit mode. ]
99 1795500000.000130 <... openat resumed>) = 3 <0.000030>
11 1795500005.000000 +++ killed by SIGKILL +++
10 1795500005.000010 connect(5, {sa_family=AF_INET, sin_port=htons(8080), sin_addr=inet_addr("192.0.2.1")}, 16`, Options{Window: 4 * time.Second})
	if res.Stats.Bad != 1 || !strings.Contains(res.Stats.FirstBad.Error(), "line 17") {
		t.Errorf("the resumed call without its start is the one bad line: %+v", res.Stats)
	}
	tr := sink.Get(t, records.ObsTrace, "strace").Trace
	if tr.Processes != 2 || tr.Threads != 1 || !tr.Truncated || tr.Unfinished != 3 || tr.Lines != 19 {
		t.Errorf("trace %+v", tr)
	}
	if c := procOf(t, sink, 11); c.PPID != 10 || c.Exe != "/bin/sh" || c.Exit == nil || c.Exit.Signal != "SIGKILL" {
		t.Errorf("child %+v", c)
	}
	// The thread's connect is its process's; the killed child's never
	// returned; the cut last line still says where it connected.
	for v, want := range map[string]string{
		"connect 203.0.113.9:443": "ETIMEDOUT",
		"connect 198.51.100.7:80": "?",
		"connect 192.0.2.1:8080":  "?",
	} {
		o := sink.Get(t, records.ObsNetcall, v)
		if !hasResult(o.Netcall, want) {
			t.Errorf("%s: %+v", v, o.Netcall)
		}
		if v == "connect 203.0.113.9:443" && !slices.Equal(o.Netcall.Procs, []string{"10"}) {
			t.Errorf("thread's connect: %+v", o.Netcall)
		}
	}
	if s := sink.Get(t, records.ObsEvasion, "sleep").Evasion; s.Longest != 5.0001 {
		t.Errorf("sleep %+v", s)
	}
}

// A last line cut inside a string loses that call only.
func TestTruncatedInString(t *testing.T) {
	sink, res := parse(t, `7 1795500000.000001 openat(AT_FDCWD, "/tmp/a", O_WRONLY|O_CREAT, 0644) = 3
7 1795500000.000002 openat(AT_FDCWD, "/tmp/b`, Options{})
	if res.Stats.Bad != 0 || !res.Trace.Truncated || res.Stats.Lines != 2 {
		t.Errorf("%+v %+v", res.Stats, res.Trace)
	}
	if got := values(sink, records.ObsPath); !slices.Equal(got, []string{"/tmp/a"}) {
		t.Errorf("%q", got)
	}
}

// A bot scanning one port is one netcall observable for the scan, plus
// the destinations it called more than once; processes, paths and
// destinations stay bounded, the rest counted.
func TestBounds(t *testing.T) {
	var b strings.Builder
	fmt.Fprintf(&b, "1 1795500000.000000 execve(\"/bot\", [\"bot\"], 0x7ffd /* 1 var */) = 0\n")
	fmt.Fprintf(&b, "1 1795500000.000001 socket(AF_INET, SOCK_STREAM|SOCK_NONBLOCK, IPPROTO_IP) = 3\n")
	n := 0
	for _, net := range []string{"192.0.2", "198.51.100", "203.0.113"} {
		for i := 0; i < 256; i++ {
			n++
			fmt.Fprintf(&b, "1 1795500001.%06d connect(3, {sa_family=AF_INET, sin_port=htons(23), sin_addr=inet_addr(\"%s.%d\")}, 16) = -1 EINPROGRESS (Operation now in progress)\n", n, net, i)
		}
	}
	fmt.Fprintf(&b, "1 1795500002.000000 connect(3, {sa_family=AF_INET, sin_port=htons(23), sin_addr=inet_addr(\"203.0.113.5\")}, 16) = 0\n")
	// Distinct ports of one address: each its own group, one destination.
	for p := 1; p <= MaxNetGroups+100; p++ {
		fmt.Fprintf(&b, "1 1795500003.%06d connect(3, {sa_family=AF_INET, sin_port=htons(%d), sin_addr=inet_addr(\"192.0.2.200\")}, 16) = -1 ECONNREFUSED (Connection refused)\n", p, 1000+p)
	}
	for i := 0; i < MaxTechniques+10; i++ {
		fmt.Fprintf(&b, "1 1795500004.%06d openat(AT_FDCWD, \"/etc/cron.d/j%d\", O_WRONLY|O_CREAT, 0644) = 4\n", i, i)
	}
	for i := 0; i < MaxPaths+10; i++ {
		fmt.Fprintf(&b, "1 1795500004.%06d openat(AT_FDCWD, \"/tmp/f%d\", O_WRONLY|O_CREAT, 0644) = 4\n", i, i)
	}
	// Execs and their arguments are bounded, and the open files.
	long := strings.Repeat("a", maxArgLen+10)
	args := strings.TrimSuffix(strings.Repeat(`"`+long+`", `, maxArgv+5), ", ")
	for i := 0; i < observe.MaxExecs+2; i++ {
		fmt.Fprintf(&b, "1 1795500004.%06d execve(\"/bot\", [%s], 0x7ffd /* 1 var */) = 0\n", 500000+i, args)
	}
	for i := 0; i < maxFDs+10; i++ {
		fmt.Fprintf(&b, "1 1795500004.%06d openat(AT_FDCWD, \"/etc/hosts\", O_RDONLY) = %d\n", 600000+i, 10+i)
	}
	for i := 0; i < MaxProcesses+20; i++ {
		fmt.Fprintf(&b, "1 1795500005.%06d fork() = %d\n", i, 1000+i)
	}
	tr := newTrace(FormatStrace, observe.Origin{Input: "trace"}, Options{})
	if err := tr.read(context.Background(), bufio.NewReader(strings.NewReader(b.String()))); err != nil {
		t.Fatal(err)
	}
	if len(tr.groups) != MaxNetGroups || len(tr.techs) != MaxTechniques || tr.fdCount != maxFDs {
		t.Errorf("%d groups, %d techniques, %d files", len(tr.groups), len(tr.techs), tr.fdCount)
	}
	sink := decodetest.New(observe.Origin{})
	tr.finish(sink)
	sink.Finish(t)
	res := tr.res
	if res.Stats.Bad != 0 {
		t.Fatal(res.Stats.FirstBad)
	}
	scan := sink.Get(t, records.ObsNetcall, "connect *:23/tcp").Netcall
	if scan.Dests != 768 || scan.Calls != 769 || scan.Addr != "" || len(scan.Sample) != observe.MaxSample || scan.Sample[0] != "192.0.2.0" {
		t.Errorf("scan %+v", scan)
	}
	// Only the destination called twice (once with success) keeps its own.
	var own []string
	for _, v := range values(sink, records.ObsNetcall) {
		if strings.HasSuffix(v, ":23/tcp") {
			own = append(own, v)
		}
	}
	if !slices.Equal(own, []string{"connect *:23/tcp", "connect 203.0.113.5:23/tcp"}) {
		t.Errorf("port 23: %q", own)
	}
	ti := sink.Get(t, records.ObsTrace, "strace").Trace
	// The first 1024 destinations were tracked (768 on port 23): of the
	// other ports, 256 have an observable and the rest are counted.
	if got := len(values(sink, records.ObsNetcall)); got != 2+256 || ti.OmittedNetcalls != MaxNetGroups+100-256 {
		t.Errorf("%d netcalls, %d omitted", got, ti.OmittedNetcalls)
	}
	if got := len(values(sink, records.ObsPersistence)); got != MaxTechniques {
		t.Errorf("%d persistence observables", got)
	}
	if got := len(values(sink, records.ObsPath)); got != MaxPaths || ti.OmittedPaths != MaxTechniques+20 || len(ti.Dropped) != observe.MaxDropped || len(res.Dropped) != MaxPaths {
		t.Errorf("%d paths, %d omitted, %d dropped", got, ti.OmittedPaths, len(ti.Dropped))
	}
	root := procOf(t, sink, 1)
	if len(root.Execs) != observe.MaxExecs || len(root.Execs[1].Argv) != maxArgv || len(root.Execs[1].Argv[0]) != maxArgLen {
		t.Errorf("%d execs, %d args of %d bytes", len(root.Execs), len(root.Execs[1].Argv), len(root.Execs[1].Argv[0]))
	}
	if got := len(values(sink, records.ObsProcess)); got != MaxProcesses || ti.OmittedProcesses != 21 || ti.Processes != int64(MaxProcesses+21) {
		t.Errorf("%d processes, %d omitted, trace %+v", got, ti.OmittedProcesses, ti)
	}
}

// QEMU's log of a program that does what TestStraceLive's does
// (testdata/helper.qemu.log, qemu-x86_64 7.2 running this test binary):
// threads' calls glued on one line, connect's address a pointer, the
// fork's child pid lost to its own " = 0".
func TestQEMUHelperLog(t *testing.T) {
	sink, res := parseFile(t, "testdata/helper.qemu.log", Options{Exe: "/tmp/scratch/behave.test", Start: time.Unix(1795500000, 0)})
	if res.Format != FormatQEMU || res.Stats.Bad != 0 {
		t.Fatalf("%s %+v", res.Format, res.Stats)
	}
	want := []string{"connect ?/tcp", "listen 127.0.0.1:0/tcp"}
	if got := values(sink, records.ObsNetcall); !slices.Equal(got, want) {
		t.Errorf("netcalls\n got %q\nwant %q", got, want)
	}
	if n := sink.Get(t, records.ObsNetcall, "connect ?/tcp").Netcall; n.Calls != 3 || !hasResult(n, "ECONNREFUSED") || !hasResult(n, "EINPROGRESS") {
		t.Errorf("%+v", n)
	}
	if n := sink.Get(t, records.ObsNetcall, "listen 127.0.0.1:0/tcp").Netcall; n.Accepted != 1 {
		t.Errorf("%+v", n)
	}
	if p := sink.Get(t, records.ObsEvasion, "ptrace").Evasion; !slices.Equal(p.Targets, []string{"PTRACE_TRACEME (ENOSYS)"}) {
		t.Errorf("%+v", p)
	}
	if p := sink.Get(t, records.ObsPersistence, "kill").Persistence; !slices.Equal(p.Targets, []string{"19369 SIGTERM"}) {
		t.Errorf("%+v", p)
	}
	root := procOf(t, sink, 19371)
	if root.Exe != "/tmp/scratch/behave.test" || !slices.Equal(root.Names, []string{"?"}) || root.Exit == nil || root.Exit.Code != 0 {
		t.Errorf("root %+v", root)
	}
	if p := procOf(t, sink, 19395); p.PPID != 19371 || !slices.Equal(p.Names, []string{"[kthreadd]"}) || p.Exe != "/bin/sh" {
		t.Errorf("child %+v", p)
	}
	// The openat glued after another thread's call on line 705 is read.
	if o := sink.Get(t, records.ObsPath, "/tmp/scratch/s/drop"); o.Provenance[0].Line != 705 || !o.Path.Dropped {
		t.Errorf("%+v", o)
	}
	if o := sink.Get(t, records.ObsPath, "/tmp/scratch/s/sub/rel"); !o.Path.Dropped {
		t.Errorf("%+v", o)
	}
	if tr := sink.Get(t, records.ObsTrace, FormatQEMU); !tr.FirstSeen.Equal(time.Unix(1795500000, 0)) || tr.Trace.Threads == 0 {
		t.Errorf("%+v", tr)
	}
}

// QEMU's forms that this host's qemu does not print for this program:
// socketcall architectures' decoded addresses, MIPS error numbers (the
// message names them), failed execs, lines that are no call.
func TestQEMUForms(t *testing.T) {
	sink, res := parse(t, `300 socket(PF_INET,SOCK_STREAM,IPPROTO_IP) = 3
300 connect(3,{sin_family=AF_INET,sin_port=htons(80),sin_addr=inet_addr("203.0.113.5")},16) = -1 errno=146 (Connection refused)
300 connect(3,{sin_family=AF_INET,sin_port=htons(80),sin_addr=inet_addr("203.0.113.5")},16) = -1 errno=150 (Operation now in progress)
300 bind(3,{sa_family=10, sa_data={00, 17, 00, 00, 00, 00, 00, 00, 00, 00, 00, 00, 00, 00}}, 28) = 0
300 execve("/usr/bin/wget",{"wget","http://203.0.113.5/x",NULL}) = -1 errno=2 (No such file or directory)
300 openat(-100,"/tmp/.m",O_WRONLY|O_CREAT|O_TRUNC,0777) = 4
300 Unknown syscall 4444
--- SIGCHLD {si_signo=SIGCHLD, si_code=1, si_pid=301, si_uid=0, si_status=0, si_utime=0, si_stime=0} ---
 = 0
300 fork() = 301
301 execve("/tmp/.m",{"/tmp/.m","-d",NULL})
300 wait4(-1,0x7fff,0,0)301 chmod("/tmp/.m",0755) = 0
 = 301
garbage that is no call
300 exit_group(7)
`, Options{Exe: "/tmp/s", Start: time.Unix(1795500000, 0)})
	if res.Format != FormatQEMU || res.Stats.Bad != 0 || res.Trace.Garbled != 1 {
		t.Fatalf("%s %+v %+v", res.Format, res.Stats, res.Trace)
	}
	n := sink.Get(t, records.ObsNetcall, "connect 203.0.113.5:80/tcp").Netcall
	if !hasResult(n, "ECONNREFUSED") || !hasResult(n, "EINPROGRESS") {
		t.Errorf("%+v", n)
	}
	if n := sink.Get(t, records.ObsNetcall, "bind ?:23/tcp").Netcall; n.Family != "inet6" {
		t.Errorf("%+v", n)
	}
	root := procOf(t, sink, 300)
	if root.FailedExecs != 1 || root.Exit == nil || root.Exit.Code != 7 || root.Exe != "/tmp/s" {
		t.Errorf("root %+v", root)
	}
	if c := procOf(t, sink, 301); c.PPID != 300 || c.Exe != "/tmp/.m" || len(c.Execs) != 1 {
		t.Errorf("child %+v", c)
	}
	if o := sink.Get(t, records.ObsPath, "/tmp/.m"); !slices.Equal(o.Path.Ops, []string{"create", "write", "chmod+x"}) {
		t.Errorf("%+v", o.Path)
	}
}

func TestDetect(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"123 1795500000.000001 execve(\"/x\", [\"x\"], 0x7ffd /* 1 var */) = 0\n", FormatStrace},
		{"1795500000.000001 execve(\"/x\", [\"x\"], 0x7ffd /* 1 var */) = 0\n", FormatStrace},
		{"123 execve(\"/x\", [\"x\"], 0x7ffd /* 1 var */) = 0\n", FormatStrace},
		{"123 brk(NULL) = 0x4000\n123 open(\"/x\", O_RDONLY) = -1 ENOENT (No such file or directory)\n", FormatStrace},
		{"123 brk(NULL) = 0x4000\n123 access(\"/etc/ld.so.preload\",R_OK) = -1 errno=2 (No such file or directory)\n", FormatQEMU},
		{"123 brk(NULL) = 0x4000\n123 bind(5,{sa_family=10, sa_data={00, 00}}, 28) = 0\n", FormatQEMU},
		{"123 brk(NULL) = 0x4000\n", FormatQEMU},
		{"#separator \\x09\n", ""},
		{`{"ts":1,"uid":"C1"}` + "\n", ""},
		{"hello world\n123 brk(NULL) = 0\n", ""},
		{"", ""},
	} {
		if got := Detect([]byte(c.in)); got != c.want {
			t.Errorf("Detect(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if _, err := Parse(context.Background(), strings.NewReader("hello\n"), observe.Origin{}, decodetest.New(observe.Origin{}), Options{}); err != ErrNotTrace {
		t.Errorf("Parse of no trace: %v", err)
	}
}

func TestUnquote(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`"/tmp/a b"`, "/tmp/a b"},
		{`"a\nb\t\"c\"\\"`, "a\nb\t\"c\"\\"},
		{`"\303\251\0"`, "é\x00"},
		{`"\xc3\xa9\x1b"`, "é\x1b"},
		{`"abc"...`, "abc"},
		{`@"abstract"`, "@abstract"},
	} {
		if got, ok := unquote(c.in, false); !ok || got != c.want {
			t.Errorf("unquote(%s) = %q %v", c.in, got, ok)
		}
	}
	// Strings and -y annotations holding parentheses do not end the call.
	c := parseCall(`3</tmp/x)y>, "a)b(", ["c)"]) = 0 <0.000010>`, false)
	if !c.ok || len(c.args) != 3 || c.args[1] != `"a)b("` || c.ret != "0" || c.dur != 0.00001 {
		t.Errorf("%+v", c)
	}
}

// Real QEMU logs of a shell whose subshell and child wrote at the same
// time as it (qemu-x86_64 7.2, QEMU_LOG_FILENAME): a call glued after
// another's, results swapped between parent and child, a call cut across
// two lines, a call written into the middle of another's arguments. Each
// still gives the same observables.
func TestQEMUInterleaved(t *testing.T) {
	for _, name := range []string{"sh-glued", "sh-swapped", "sh-split", "sh-embedded"} {
		t.Run(name, func(t *testing.T) {
			sink, res := parseFile(t, "testdata/"+name+".qemu.log", Options{Exe: "/bin/sh"})
			if res.Stats.Bad != 0 || res.Trace.Garbled != 0 {
				t.Errorf("%+v %+v", res.Stats, res.Trace)
			}
			root := findProc(t, sink, func(p *records.ProcessInfo) bool { return p.PPID == 0 })
			if root.Exe != "/bin/sh" || root.Exit == nil || root.Exit.Code != 3 {
				t.Errorf("root %+v", root)
			}
			if o := sink.Get(t, records.ObsPath, "/tmp/qtest/d/drop"); !slices.Equal(o.Path.Procs, []string{fmt.Sprint(root.PID)}) {
				t.Errorf("drop %+v", o.Path)
			}
			sub := sink.Get(t, records.ObsPath, "/tmp/qtest/d/sub")
			if !slices.Equal(sub.Path.Ops, []string{"create", "write"}) || len(sub.Path.Procs) != 1 {
				t.Fatalf("sub %+v", sub.Path)
			}
			if c := findProc(t, sink, func(p *records.ProcessInfo) bool { return fmt.Sprint(p.PID) == sub.Path.Procs[0] }); c.PPID != root.PID {
				t.Errorf("subshell %+v", c)
			}
			if rm := findProc(t, sink, func(p *records.ProcessInfo) bool { return p.Exe == "/usr/bin/rm" }); rm.PPID != root.PID {
				t.Errorf("rm %+v", rm)
			}
			if name == "sh-embedded" {
				if i := slices.IndexFunc(res.Trace.Calls, func(c records.CallCount) bool { return c.Name == "rt_sigprocmask" }); i < 0 || res.Trace.Calls[i].Count != 3 {
					t.Errorf("calls %+v", res.Trace.Calls)
				}
			}
		})
	}
}

// With two clones unfinished at once, a new process is first taken for
// the child of the latest; its parent's result corrects that.
func TestCloneGuessCorrected(t *testing.T) {
	sink, _ := parse(t, `20 1795500000.000001 execve("/tmp/s", ["s"], 0x7ffd /* 1 var */) = 0
20 1795500000.000002 fork() = 21
20 1795500000.000003 clone(child_stack=NULL, flags=SIGCHLD <unfinished ...>
21 1795500000.000004 clone(child_stack=NULL, flags=SIGCHLD <unfinished ...>
22 1795500000.000005 openat(AT_FDCWD, "/tmp/by22", O_WRONLY|O_CREAT, 0600) = 3
20 1795500000.000006 <... clone resumed>) = 22
21 1795500000.000007 <... clone resumed>) = 23
`, Options{})
	if c := procOf(t, sink, 22); c.PPID != 20 {
		t.Errorf("22: %+v", c)
	}
	if c := procOf(t, sink, 23); c.PPID != 21 {
		t.Errorf("23: %+v", c)
	}
}

// A call a signal interrupted (strace: "= ? ERESTARTSYS") is made again:
// one call, not two. A sleep's request still counts.
func TestERestart(t *testing.T) {
	sink, res := parse(t, `30 1795500000.000001 socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5 <0.000015>
30 1795500000.000002 connect(5, {sa_family=AF_INET, sin_port=htons(6667), sin_addr=inet_addr("203.0.113.66")}, 16) = ? ERESTARTSYS (To be restarted if SA_RESTART is set) <0.000100>
30 1795500000.000003 --- SIGURG {si_signo=SIGURG, si_code=SI_TKILL, si_pid=30, si_uid=0} ---
30 1795500000.000004 connect(5, {sa_family=AF_INET, sin_port=htons(6667), sin_addr=inet_addr("203.0.113.66")}, 16) = -1 ECONNREFUSED (Connection refused) <0.000096>
30 1795500000.000005 nanosleep({tv_sec=7200, tv_nsec=0}, {tv_sec=7199, tv_nsec=999}) = ? ERESTART_RESTARTBLOCK (Interrupted by signal) <0.000100>
`, Options{Window: time.Hour})
	n := sink.Get(t, records.ObsNetcall, "connect 203.0.113.66:6667/tcp").Netcall
	if n.Calls != 1 || !slices.Equal(n.Results, []records.CallCount{{Name: "ECONNREFUSED", Count: 1}}) {
		t.Errorf("%+v", n)
	}
	if s := sink.Get(t, records.ObsEvasion, "sleep").Evasion; s.Longest != 7200 || res.Trace.Unfinished != 0 {
		t.Errorf("%+v %+v", s, res.Trace)
	}
}

// Every location, device and tool tb-parse(1) lists.
func TestClassify(t *testing.T) {
	for p, want := range map[string]string{
		"/etc/init.d/x": "init", "/etc/rc.d/rc.local": "init", "/etc/rc0.d/K01x": "init", "/etc/rcS.d/S01x": "init",
		"/etc/rc.local": "init", "/etc/inittab": "init", "/etc/init/x.conf": "init",
		"/etc/crontab": "cron", "/etc/anacrontab": "cron", "/etc/cron.d/x": "cron", "/etc/cron.hourly/x": "cron",
		"/var/spool/cron/crontabs/root": "cron",
		"/etc/systemd/system/x.service": "systemd", "/lib/systemd/system/x.service": "systemd",
		"/usr/lib/systemd/system/x.service": "systemd", "/home/u/.config/systemd/user/x.service": "systemd",
		"/etc/ld.so.preload":         "ld-preload",
		"/root/.ssh/authorized_keys": "ssh-key", "/home/u/.ssh/authorized_keys2": "ssh-key",
		"/etc/profile": "profile", "/etc/profile.d/x.sh": "profile", "/etc/bash.bashrc": "profile", "/etc/bashrc": "profile",
		"/root/.bashrc": "profile", "/home/u/.bash_profile": "profile", "/home/u/.bash_login": "profile", "/home/u/.profile": "profile",
		"/etc/passwd": "account", "/etc/shadow": "account", "/etc/sudoers": "account", "/etc/sudoers.d/x": "account",
		"/etc/rc.d": "", "/etc/rcX.d/x": "", "/etc/cron": "", "/tmp/authorized_keys": "", "/etc/hosts": "",
		// Under another root: the beacon's -behave writes these.
		"/var/tmp/talkbox/behave/etc/cron.d/tb-beacon": "cron", "/mnt/root/etc/ld.so.preload": "ld-preload",
		"/srv/fs/var/spool/cron/crontabs/root": "cron", "/srv/etcetera/x": "", "/srv/x/etc/hosts": "",
	} {
		if got := persistenceKind(p); got != want {
			t.Errorf("persistenceKind(%s) = %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"/dev/watchdog", "/dev/watchdog0", "/dev/misc/watchdog"} {
		if !isWatchdog(p) {
			t.Errorf("%s is a watchdog", p)
		}
	}
	for _, n := range []string{"iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy", "iptables-nft", "ip6tables-nft",
		"iptables-restore", "ip6tables-restore", "iptables-legacy-restore", "iptables-nft-restore", "xtables-legacy-multi",
		"xtables-nft-multi", "nft", "ufw", "firewall-cmd"} {
		if !isFirewallTool(n) {
			t.Errorf("%s is a firewall tool", n)
		}
	}
	own := func(pid int) bool { return pid == 42 }
	for p, want := range map[string]string{
		"/proc/cpuinfo": "cpuinfo", "/sys/class/dmi/id/product_name": "dmi", "/sys/devices/virtual/dmi/id/sys_vendor": "dmi",
		"/proc/self/status": "tracer-check", "/proc/thread-self/status": "tracer-check", "/proc/42/status": "tracer-check",
		"/proc/42/task/43/status": "tracer-check", "/proc/7/status": "", "/proc/self/stat": "", "/proc/42/cmdline": "",
	} {
		if got := evasionRead(p, own); got != want {
			t.Errorf("evasionRead(%s) = %q, want %q", p, got, want)
		}
	}
}

// What the caller knows: the format, the start (for lines without times),
// the sample's path, directory and user.
func TestOptions(t *testing.T) {
	uid := int64(1000)
	start := time.Unix(1795500000, 0).UTC()
	sink, res := parse(t, "5 openat(AT_FDCWD, \"x\", O_WRONLY|O_CREAT, 0644) = 3\n5 unlink(\"/tmp/s\") = 0\n",
		Options{Format: FormatStrace, Start: start, Exe: "/tmp/s", Cwd: "/work", UID: &uid})
	o := sink.Get(t, records.ObsPath, "/work/x")
	if !o.FirstSeen.Equal(start) || res.Format != FormatStrace {
		t.Errorf("%+v", o)
	}
	if p := procOf(t, sink, 5); p.Exe != "/tmp/s" || p.UID == nil || *p.UID != 1000 || !p.Start.Equal(start) {
		t.Errorf("%+v", p)
	}
	sink.Get(t, records.ObsEvasion, "self-delete")
	if len(res.Processes) != 1 || res.Processes[0].PID != 5 || len(res.Dropped) != 1 || res.Dropped[0].Line != 1 ||
		res.Dropped[0].Exe != "/tmp/s" || !res.Dropped[0].At.Equal(start) {
		t.Errorf("%+v %+v", res.Processes, res.Dropped)
	}
	sink, _ = parse(t, "300 openat(-100,\"/tmp/q\",O_WRONLY|O_CREAT,0644) = 3\n", Options{Format: FormatQEMU})
	sink.Get(t, records.ObsPath, "/tmp/q")
	if _, err := Parse(context.Background(), strings.NewReader(""), observe.Origin{}, decodetest.New(observe.Origin{}), Options{Format: "ltrace"}); err == nil {
		t.Error("an unknown format")
	}
}
