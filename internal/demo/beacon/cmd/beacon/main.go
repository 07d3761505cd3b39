// Command beacon is the benign test sample Talkbox runs in its demo and
// end-to-end test (see internal/demo/beacon). It contacts only the C2 and
// the scan targets it is given, within the documentation ranges and the
// lab, and aims the short UDP flood its C2 may order only at the
// documentation ranges.
package main

import (
	"context"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "-behave-child" {
		return // the child process of -behave: it only exists
	}
	args, tamper, err := beacon.TamperArg(os.Args[1:])
	if err == nil && len(tamper) > 0 {
		// Before anything else, as a sample hiding what it does next.
		for _, mode := range tamper {
			if mode == "noexec" {
				beacon.NoExec(os.Stderr, os.Args[0])
				os.Exit(beacon.NoExecStatus)
			}
			if err := beacon.Tamper(mode, os.Stdout); err != nil {
				os.Stderr.WriteString("beacon: " + err.Error() + "\n")
				os.Exit(1)
			}
		}
		if len(args) == 0 {
			return
		}
	}
	var cfg *beacon.Config
	if err == nil {
		cfg, err = beacon.Parse(args, os.Stderr)
	}
	if err != nil {
		os.Stderr.WriteString("beacon: " + err.Error() + "\n")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b := beacon.New(cfg, os.Stdout)
	if cfg.Behave != "" {
		// The rename is the calling thread's: the main thread's is the
		// process's name in ps and /proc/PID/comm.
		runtime.LockOSThread()
		self, err := os.Executable()
		if err == nil {
			bh := &beacon.Behaviour{Dir: cfg.Behave, Listen: cfg.BehaveListen, Self: self}
			var ln net.Listener
			ln, err = bh.Do(ctx, b.Logf)
			if ln != nil {
				defer ln.Close()
			}
		}
		if err != nil {
			os.Stderr.WriteString("beacon: " + err.Error() + "\n")
			os.Exit(1)
		}
	}
	if cfg.Hostile != nil {
		// A hostile mode's failure is in the log; the beacon still beacons.
		if err := b.RunHostile(ctx, cfg.Hostile); err != nil {
			os.Stderr.WriteString("beacon: " + err.Error() + "\n")
		}
		if cfg.C2 == "" {
			return
		}
	}
	st := b.Run(ctx)
	if st.Answered == 0 {
		os.Exit(3)
	}
}
