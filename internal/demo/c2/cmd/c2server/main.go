// Command c2server is the demo's fake C2: it speaks -proto's C2 side on
// -listen (HTTP check-ins, or Mirai, Gafgyt or IRC sessions), sends the
// -order attack order once to each bot (HTTP) or session, and logs each
// check-in, registration, keep-alive and order sent as a JSON line to -log
// (see internal/demo/c2 and internal/demo/beacon/botwire).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon/botwire"
	"github.com/talkbox-sandbox/talkbox/internal/demo/c2"
)

func main() {
	proto := flag.String("proto", botwire.HTTP, "protocol: "+strings.Join(botwire.Protocols, ", "))
	listen := flag.String("listen", ":80", "address to serve on")
	orderText := flag.String("order", "", `attack order sent once to each bot, "VECTOR TARGET PORT SECONDS" (e.g. "udp 203.0.113.77 9 4"); none when empty`)
	interval := flag.Duration("interval", 2*time.Second, "period of the server's PING (gafgyt, irc)")
	logPath := flag.String("log", "-", "JSON-lines log of check-ins, keep-alives and orders ('-': stdout)")
	ready := flag.String("ready", "", "file written once listening (for scripts)")
	flag.Parse()
	if err := run(*proto, *listen, *orderText, *interval, *logPath, *ready); err != nil {
		fmt.Fprintln(os.Stderr, "c2server:", err)
		os.Exit(1)
	}
}

func run(proto, listen, orderText string, interval time.Duration, logPath, ready string) error {
	var order *botwire.Order
	if orderText != "" {
		o, err := botwire.ParseOrder(orderText)
		if err != nil {
			return fmt.Errorf("-order: %w", err)
		}
		order = &o
	}
	if !botwire.Known(proto) {
		return fmt.Errorf("-proto %q: want one of %s", proto, strings.Join(botwire.Protocols, ", "))
	}
	out := os.Stdout
	if logPath != "-" {
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	var server *c2.Server
	if proto != botwire.HTTP {
		var err error
		if server, err = c2.NewServer(proto, order, interval, out); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	if ready != "" {
		os.WriteFile(ready, []byte(ln.Addr().String()+"\n"), 0o644)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if server != nil {
		return server.Serve(ctx, ln)
	}
	srv := &http.Server{Handler: c2.NewOrderHandler(out, order), ReadHeaderTimeout: 10 * time.Second}
	go func() { <-ctx.Done(); srv.Close() }()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		return err
	}
	return nil
}
