package cycle

import (
	"context"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/behave"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Guest is the boundary to a lease's guest, through its agent:
// guestagent's client, over libvirt (libvirt.go) or virsh (virsh.go); unit
// tests use a fake, and the integration and end-to-end tests cover the
// real one.
type Guest interface {
	Ping(ctx context.Context) error
	// Addresses are the guest's interface addresses, "ip/prefix".
	Addresses(ctx context.Context) ([]string, error)
	WriteFile(ctx context.Context, path string, r io.Reader) (int64, error)
	ReadFileAt(ctx context.Context, path string, off int64, max int) ([]byte, error)
	// Run runs a short helper command and waits for it. Every helper a
	// cycle runs only reads or does what is done already (mkdir -p, a kill
	// of the sample's tree), and may run again: one whose exit the agent
	// lost (guestagent.ErrExitLost) is.
	Run(ctx context.Context, argv ...string) (*guestagent.Result, error)
	// Spawn starts a program and does not wait; stdin, when not nil, is
	// what it reads on its standard input.
	Spawn(ctx context.Context, argv, env []string, stdin []byte) (int, error)
	Status(ctx context.Context, pid int) (Proc, error)
	// Clock reads the guest's wall clock; SetClock sets it (an error may
	// come after the clock was set: Clock tells).
	Clock(ctx context.Context) (time.Time, error)
	SetClock(ctx context.Context, t time.Time) error
	Close() error
}

// Proc is the state of a process started with Spawn.
type Proc = guestagent.Proc

// Connector opens the guest of a lease.
type Connector func(ctx context.Context, l *records.SandboxLease) (Guest, error)

// agentGuest is a lease's guest agent and the connection it goes through
// (nil: virsh, which connects per command).
type agentGuest struct {
	*guestagent.Client
	conn io.Closer
}

func (g agentGuest) Run(ctx context.Context, argv ...string) (*guestagent.Result, error) {
	return g.Client.RunRepeatable(ctx, argv...)
}

func (g agentGuest) Close() error {
	if g.conn == nil {
		return nil
	}
	return g.conn.Close()
}

// VirshGuest talks to a lease's guest agent through virsh: the Connector
// of a tb-run built without cgo (no libvirt C library; virsh.go). Each
// command is a virsh process, so a cycle's overhead grows by tens of
// milliseconds per agent command.
func VirshGuest(ctx context.Context, l *records.SandboxLease) (Guest, error) {
	v, err := guestagent.NewVirsh(l.ConnectURI)
	if err != nil {
		return nil, fault.Unavailable(fmt.Errorf("lease %s: %w", l.ID, err))
	}
	return agentGuest{Client: guestagent.New(v, l.VMName)}, nil
}

// launcher is the bash script that starts the sample. It reads the
// cycle's end key on its standard input (trace.go), sends its own errors
// to the sample's stderr file, records its PID (which an untraced sample
// keeps through exec) before anything else, so that a resumed cycle can
// tell whether the sample was started, moves itself into the cycle's own
// cgroup (sampleCgroup: cgroup v2, mounted if the guest's init did not,
// with busybox's mount where the image has no util-linux one; without it
// the sample runs as before, and the kill walks its tree only),
// then runs the sample in its working directory (created if missing).
// The earlier cycles' cgroups that are empty are removed first (rmdir
// refuses the others): a lease's guest lives for thousands of cycles, and
// each cgroup holds kernel memory until it is removed. Only builtins run
// before the sample but the cgroups' rmdir and mkdir (and mkdir for a new
// working or trace directory): every fork costs tens of milliseconds
// under TCG. bash, unlike dash, reports a binary it cannot
// run ("Exec format error", status 126) instead of running it as a script.
// A traced sample runs with strace at nice 10 (on a one-vCPU TCG guest a
// traced Go bot otherwise left the guest agent unanswered for minutes), as
// a child the launcher waits for: once it has, the launcher writes the
// trace's end record and exits with the sample's status. A sample under
// user-mode emulation is traced the same way: binfmt_misc hands each exec
// of a foreign binary to qemu-user in the same process, whose host calls
// strace sees with their paths and addresses (behave.Options.Emulator
// drops QEMU's own start), into the one file the tracer alone writes.
// QEMU's own log (QEMU_LOG=strace), which tb-run used before, opens one
// file per process with "w", so an exec truncated what the process had
// logged, and it printed neither connect's address nor prctl's name.
const launcher = `IFS= read -r k
exec 2>"$4" </dev/null || exit 125
echo $$ > "$2" || exit 125
g=${2%.pid} && g=` + cgroupRoot + `/${g##*/}
{ [ -f /sys/fs/cgroup/cgroup.procs ] || mount -t cgroup2 cgroup2 /sys/fs/cgroup || busybox mount -t cgroup2 cgroup2 /sys/fs/cgroup; } 2>/dev/null && { rmdir "${g%/*}"/cycle_* 2>/dev/null; mkdir -p "$g" 2>/dev/null; } && echo $$ 2>/dev/null >"$g/cgroup.procs"
[ -d "$1" ] || mkdir -p "$1" || exit 125
cd "$1" || exit 125
[ -x "$6" ] || chmod 0755 "$6" || exit 125
o=$3 m=${5%%:*} t=${5#*:}
shift 5
[ -n "$m" ] || exec "$@" >"$o"
[ -d "${t%/*}" ] || mkdir -m 0700 "${t%/*}" || exit 125
if command -v strace >/dev/null; then
  ( echo $BASHPID >"$t.pid"; exec nice -n 10 strace ` + behave.StraceOptions + ` -o "$t" -- "$@" >"$o" )
else
  echo "` + untraced + `" >"$t"
  "$@" >"$o"
fi
x=$?
set -- $(printf '%s %s' "$k" "$x" | sha256sum)
echo "$x $1" >"$t.end"
exit $x`

// Tracers (records.Cycle.Tracer).
const (
	TracerStrace = "strace"
)

// traceSpec tells the launcher how to trace the sample into path.
func traceSpec(tracer, path string) string {
	if tracer == "" {
		return ""
	}
	return tracer + ":" + path
}

// launchArgv is the guest command line that starts a sample; trace is
// traceSpec's.
func launchArgv(workdir, pidfile, stdout, stderr, trace string, argv []string) []string {
	return append([]string{"/bin/bash", "-c", launcher, "tb-run", workdir, pidfile, stdout, stderr, trace}, argv...)
}

// killArgv kills a sample and all its descendants: each process is
// stopped before its children are listed (so it cannot fork more or react
// to their death), then all are killed. The first spare levels of the tree
// from pid are spared: the launcher of a traced sample and its tracer,
// which writes each kill into the trace, then ends, so that the launcher
// writes the end record. The processes a spared tracer traces are killed
// too, wherever they are in the tree: a daemon that left it (reparented
// to init) would otherwise keep strace, and so the launcher, running.
// Before all that, the spared processes leave the sample's cgroup
// (sampleCgroup), which is then frozen: nothing in it runs or forks while
// the tree is walked, so a sample that forks a child and exits, without
// pause, is not one step ahead of the walk (the walk found each process
// gone and missed its child), while the tracer, never frozen, goes on
// recording every fork and exit (frozen with its tracees, it had events
// of theirs to catch up with when they died: under load, a trace read as
// tampered, once in a make test); then everything left in the cgroup is
// killed at once (cgroup.kill). The walk still stops and kills what it finds: a
// process that moved itself out of the cgroup (root can).
func killArgv(pid, spare int, cgroup string) []string {
	return []string{"/bin/sh", "-c", `pids=$1 spare=$2 g=$3 all= tracers=
if [ -w "$g/cgroup.freeze" ]; then
  level=$pids s=$spare
  while [ "$s" -gt 0 ] && [ -n "$level" ]; do
    next=
    for p in $level; do
      echo "$p" 2>/dev/null >/sys/fs/cgroup/cgroup.procs
      next="$next $(cat /proc/$p/task/*/children 2>/dev/null)"
    done
    s=$((s - 1)) level=$next
  done
  if echo 1 2>/dev/null >"$g/cgroup.freeze"; then
    n=0 f=
    while [ "$f" != 1 ] && [ $n -lt 2000 ]; do
      while read -r k v; do [ "$k" = frozen ] && f=$v; done <"$g/cgroup.events"
      n=$((n + 1))
    done
  fi
fi
while [ -n "$pids" ]; do
  next=
  for p in $pids; do
    if [ "$spare" -gt 0 ]; then
      [ "$spare" -eq 1 ] && tracers="$tracers $p"
      next="$next $(cat /proc/$p/task/*/children 2>/dev/null)"
    else
      kill -STOP "$p" 2>/dev/null && all="$all $p" && next="$next $(cat /proc/$p/task/*/children 2>/dev/null)"
    fi
  done
  spare=$((spare - 1)) pids=$next
done
[ -w "$g/cgroup.kill" ] && echo 1 2>/dev/null >"$g/cgroup.kill"
for t in $tracers; do
  for s in $(grep -l "^TracerPid:[[:space:]]*$t\$" /proc/[0-9]*/status 2>/dev/null); do
    s=${s#/proc/} && kill -STOP "${s%/status}" 2>/dev/null && all="$all ${s%/status}"
  done
done
[ -n "$all" ] && kill -KILL $all 2>/dev/null
true`, "tb-run", fmt.Sprint(pid), fmt.Sprint(spare), cgroup}
}

// cgroupRoot holds the cycles' cgroups in the guest.
const cgroupRoot = "/sys/fs/cgroup/talkbox"

// sampleCgroup is the cgroup the launcher moves itself into before it runs
// the sample, so that the sample and everything it forks are in it however
// they fork and whoever they are reparented to (unless, root, one moves
// itself out): named by the cycle's guest files (an attached cycle's are
// the first cycle's).
func sampleCgroup(c *records.Cycle) string { return cgroupRoot + "/" + path.Base(c.GuestOut) }

// spared is how many levels of the process tree from the launcher a kill
// spares (killArgv): the launcher and its tracer when the sample is traced.
func spared(tracer string) int {
	if tracer != "" {
		return 2
	}
	return 0
}

// findLaunchArgv prints the PID of a cycle's launcher: from its pidfile,
// or, before it wrote it, from its command line (which names the pidfile);
// exit 3 if there is neither.
func findLaunchArgv(pidfile string) []string {
	return []string{"/bin/sh", "-c", `if [ -s "$1" ]; then cat "$1"; exit 0; fi
for f in /proc/[0-9]*/cmdline; do
  if tr '\0' '\n' < "$f" 2>/dev/null | grep -qxF "$1"; then p=${f#/proc/}; echo "${p%/cmdline}"; exit 0; fi
done
exit 3`, "tb-run", pidfile}
}

// aliveArgv exits 0 while pid runs (a zombie counts as gone).
func aliveArgv(pid int) []string {
	return []string{"/bin/sh", "-c", `test -d /proc/$1 && ! grep -q '^State:.*Z' /proc/$1/status`, "tb-run", fmt.Sprint(pid)}
}

// guestEnv is the sample's whole environment.
func guestEnv(env map[string]string) []string {
	out := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C"}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if k == "PATH" || k == "HOME" || k == "LANG" {
			for i, kv := range out {
				if strings.HasPrefix(kv, k+"=") {
					out[i] = k + "=" + env[k]
				}
			}
			continue
		}
		out = append(out, k+"="+env[k])
	}
	return out
}
