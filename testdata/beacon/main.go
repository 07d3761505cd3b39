// Command beacon is the benign test sample Talkbox runs in its demo and
// end-to-end test (see internal/demo/beacon). It contacts only the C2 and
// the scan targets it is given, within the documentation ranges and the lab.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon"
)

func main() {
	cfg, err := beacon.Parse(os.Args[1:], os.Stderr)
	if err != nil {
		os.Stderr.WriteString("beacon: " + err.Error() + "\n")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	st := beacon.New(cfg, os.Stdout).Run(ctx)
	if st.Answered == 0 {
		os.Exit(3)
	}
}
