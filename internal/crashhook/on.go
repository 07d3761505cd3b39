//go:build talkboxtest

package crashhook

import (
	"context"
	"os"
	"syscall"
)

// Enabled reports whether this binary was built with the hooks.
const Enabled = true

// At kills the process when the environment variable env names point:
// "<point>" sends SIGKILL, "<point>:INT" sends SIGINT and waits until ctx,
// which the signal cancels, is done.
func At(ctx context.Context, env, point string) {
	switch os.Getenv(env) {
	case point:
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is delivered asynchronously
	case point + ":INT":
		syscall.Kill(os.Getpid(), syscall.SIGINT)
		<-ctx.Done()
	}
}

// Panic panics when the environment variable env names point, as a bug in
// the code there would.
func Panic(env, point string) {
	if os.Getenv(env) == point {
		panic("crashhook: " + env + "=" + point)
	}
}
