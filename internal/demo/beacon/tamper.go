package beacon

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// TamperModes are what -tamper MODE[,MODE] does to the evidence of the
// beacon's own run, as a sample with root in its guest could (for the
// tests that the sandbox sees through it): kill its tracer (strace, or
// under qemu-user, where the tracer is the emulator itself, the launcher
// that waits for it), or forge trace lines into the tracer's output,
// found through /proc, and onto its own stdout; noexec, last, writes
// bash's "cannot execute binary file: Exec format error" to its stderr
// and exits 126, as if the guest could not run it (NoExec); clock sets
// the system clock to ClockTamperTime (in a Talkbox guest only: see
// setClock).
var TamperModes = []string{"kill", "forge", "noexec", "clock"}

// ClockTamperTime is what -tamper clock sets the guest's clock to.
var ClockTamperTime = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)

// TamperArg takes "-tamper MODE[,MODE]" (or -tamper=MODE[,MODE]) out of
// args.
func TamperArg(args []string) (rest, modes []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		var list string
		switch {
		case a == "-tamper" || a == "--tamper":
			if i+1 == len(args) {
				return nil, nil, errors.New("-tamper needs a mode: " + strings.Join(TamperModes, ", "))
			}
			list = args[i+1]
			i++
		case strings.HasPrefix(a, "-tamper=") || strings.HasPrefix(a, "--tamper="):
			_, list, _ = strings.Cut(a, "=")
		default:
			rest = append(rest, a)
			continue
		}
		for _, m := range strings.Split(list, ",") {
			if !slices.Contains(TamperModes, m) {
				return nil, nil, fmt.Errorf("-tamper %q: the modes are %s", m, strings.Join(TamperModes, ", "))
			}
			modes = append(modes, m)
		}
	}
	return rest, modes, nil
}

// Tamper does what -tamper mode says, logging one line to out; noexec is
// NoExec's.
func Tamper(mode string, out io.Writer) error {
	tracer := tracerPID()
	switch mode {
	case "kill":
		target := tracer
		if target == 0 {
			target = os.Getppid()
		}
		fmt.Fprintf(out, "tamper kill=%d\n", target)
		return syscall.Kill(target, syscall.SIGKILL)
	case "forge":
		return forge(tracer, out)
	case "clock":
		return setClock(out)
	}
	return fmt.Errorf("-tamper %q: unknown mode", mode)
}

// setClock sets the system clock to ClockTamperTime, as a sample with root
// does to dodge a date check or to break the sandbox's timeline. The
// machine's own clock is at stake, so it refuses on any machine whose
// kernel command line has no talkbox.net= (tb-lease boots every lease's
// guest with one): run by mistake on a host, the beacon would set the
// host's clock.
func setClock(out io.Writer) error {
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil || !talkboxGuest(cmdline) {
		return errors.New("-tamper clock: not a Talkbox guest (no talkbox.net= in /proc/cmdline); the clock is left alone")
	}
	tv := syscall.NsecToTimeval(ClockTamperTime.UnixNano())
	fmt.Fprintf(out, "tamper clock=%s\n", ClockTamperTime.Format(time.RFC3339))
	return syscall.Settimeofday(&tv)
}

// NoExec is -tamper noexec's claim, which the caller makes and then exits
// with NoExecStatus: the line bash writes when the kernel refuses to
// execute a file (a binary of another architecture).
func NoExec(errOut io.Writer, self string) {
	fmt.Fprintf(errOut, "bash: line 1: %s: cannot execute binary file: Exec format error\n", self)
}

// NoExecStatus is bash's status for a file it could not execute.
const NoExecStatus = 126

// tracerPID is the process tracing this one (0: none).
func tracerPID() int {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "TracerPid:"); ok {
			pid, _ := strconv.Atoi(strings.TrimSpace(v))
			return pid
		}
	}
	return 0
}

// forge writes lines in the trace's format — a process that never ran
// writing /etc/tb-forged and exiting — onto stdout and into every file
// the tracer (under qemu-user, the beacon itself) holds open for writing
// other than the beacon's own stdout and stderr.
func forge(tracer int, out io.Writer) error {
	now := float64(time.Now().UnixMicro()) / 1e6
	lines := fmt.Sprintf("4242 %.6f openat(AT_FDCWD, \"/etc/tb-forged\", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3 <0.000010>\n4242 %.6f +++ exited with 0 +++\n", now, now)
	holder := "self"
	if tracer == 0 {
		lines = "4242 openat(AT_FDCWD,\"/etc/tb-forged\",O_WRONLY|O_CREAT|O_TRUNC,0644) = 3\n4242 exit_group(0)\n"
	} else {
		holder = strconv.Itoa(tracer)
	}
	io.WriteString(out, lines)
	own := map[string]bool{}
	for _, fd := range []string{"0", "1", "2"} {
		if l, err := os.Readlink("/proc/self/fd/" + fd); err == nil {
			own[l] = true
		}
	}
	dir := "/proc/" + holder + "/fd/"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	wrote := 0
	for _, e := range entries {
		link, err := os.Readlink(dir + e.Name())
		if err != nil || !strings.HasPrefix(link, "/") || strings.HasPrefix(link, "/dev/") || strings.HasPrefix(link, "/proc/") || own[link] {
			continue
		}
		if fi, err := os.Stat(link); err != nil || !fi.Mode().IsRegular() || !openForWriting("/proc/"+holder+"/fdinfo/"+e.Name()) {
			continue
		}
		f, err := os.OpenFile(dir+e.Name(), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		_, err = io.WriteString(f, lines)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "tamper forged=%s\n", link)
		wrote++
	}
	if wrote == 0 {
		return errors.New("tamper: found no trace to forge lines into")
	}
	return nil
}

// openForWriting reads a descriptor's flags (octal) from its fdinfo.
func openForWriting(fdinfo string) bool {
	b, err := os.ReadFile(fdinfo)
	if err != nil {
		return false
	}
	for _, l := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(l, []byte("flags:")); ok {
			flags, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 8, 64)
			return err == nil && flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0
		}
	}
	return false
}

// talkboxGuest tells a lease's guest by its kernel command line.
func talkboxGuest(cmdline []byte) bool {
	return slices.ContainsFunc(strings.Fields(string(cmdline)), func(f string) bool { return strings.HasPrefix(f, "talkbox.net=") })
}
