// Command c2server is the demo's fake C2: it serves HTTP on -listen and logs
// each check-in as a JSON line to -log (see internal/demo/c2).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/demo/c2"
)

func main() {
	listen := flag.String("listen", ":80", "address to serve HTTP on")
	logPath := flag.String("log", "-", "JSON-lines log of check-ins ('-': stdout)")
	ready := flag.String("ready", "", "file written once listening (for scripts)")
	flag.Parse()
	out := os.Stdout
	if *logPath != "-" {
		f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "c2server:", err)
			os.Exit(1)
		}
		out = f
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "c2server:", err)
		os.Exit(1)
	}
	if *ready != "" {
		os.WriteFile(*ready, []byte(ln.Addr().String()+"\n"), 0o644)
	}
	srv := &http.Server{Handler: c2.NewHandler(out), ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); srv.Close() }()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, "c2server:", err)
		os.Exit(1)
	}
}
