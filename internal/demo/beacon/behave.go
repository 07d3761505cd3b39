package beacon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ProcessName is what the beacon renames itself to with -behave, as
// Mirai-family bots hide under a kernel thread's name.
const ProcessName = "kworker/u:tb"

// Behaviour is what -behave DIR makes the beacon do inside the guest,
// before it scans and beacons: each thing the behaviour trace must see,
// done harmlessly, inside DIR (the scratch directory the test names) and on
// the lab network. Child is the process -behave forks (the beacon's own
// binary again, with -behave-child), Self the binary deleted at the end.
type Behaviour struct {
	Dir    string
	Listen int // TCP port a listener is opened on (0: none)
	Self   string
}

// Persistence are the files -behave writes under its directory, named as a
// bot's persistence would be under /.
var Persistence = []string{"etc/cron.d/tb-beacon", "etc/rc.local", "etc/ld.so.preload"}

// Dropped is the file -behave drops (written, made executable, left).
const Dropped = ".tbdrop"

// Do carries the behaviour out and returns the listener it opened (nil
// when Listen is 0), which the caller closes when it ends. log receives one
// line per action.
func (b *Behaviour) Do(ctx context.Context, log func(format string, a ...any)) (net.Listener, error) {
	name, err := unix.BytePtrFromString(ProcessName)
	if err != nil {
		return nil, err
	}
	if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0); err != nil {
		return nil, fmt.Errorf("renaming the process: %w", err)
	}
	log("behave renamed=%s", ProcessName)
	// A child process: the beacon's binary again, which only exits.
	child := exec.CommandContext(ctx, b.Self, "-behave-child")
	if err := child.Run(); err != nil {
		return nil, fmt.Errorf("running a child: %w", err)
	}
	log("behave child=%d", child.ProcessState.Pid())
	drop := filepath.Join(b.Dir, Dropped)
	if err := os.MkdirAll(b.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(drop, []byte("#!/bin/sh\n# dropped by the Talkbox test beacon: does nothing\nexit 0\n"), 0o644); err != nil {
		return nil, err
	}
	if err := os.Chmod(drop, 0o755); err != nil {
		return nil, err
	}
	log("behave dropped=%s", drop)
	for _, p := range Persistence {
		path := filepath.Join(b.Dir, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, []byte("# written by the Talkbox test beacon: "+drop+"\n"), 0o644); err != nil {
			return nil, err
		}
		log("behave persistence=%s", path)
	}
	// What bots read to tell a sandbox or a debugger: harmless reads.
	status, _ := os.ReadFile("/proc/self/status")
	traced := false
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
			traced = strings.TrimSpace(v) != "0"
		}
	}
	os.ReadFile("/proc/cpuinfo")
	log("behave traced=%v", traced)
	var ln net.Listener
	if b.Listen != 0 {
		var err error
		if ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", b.Listen)); err != nil {
			return nil, fmt.Errorf("listening: %w", err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		log("behave listen=%s", ln.Addr())
	}
	if err := os.Remove(b.Self); err != nil && !errors.Is(err, os.ErrNotExist) {
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("deleting its own binary: %w", err)
	}
	log("behave deleted=%s", b.Self)
	return ln, nil
}
