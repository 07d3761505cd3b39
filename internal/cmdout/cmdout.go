// Package cmdout is where a command's results and problems go, as the
// domain packages see them: records (or text for a person) on an
// io.Writer, one-line problems with single inputs that do not stop a batch,
// and the log. The command layer (internal/cli) makes one from its streams;
// tests make one from buffers.
package cmdout

import (
	"fmt"
	"io"
	"log/slog"
)

// Sink is a command's output.
type Sink struct {
	// Stdout receives the records a command prints.
	Stdout io.Writer
	// Log is for progress and decisions (stderr, in the tool's format).
	Log *slog.Logger
	// Warnf reports one bad input without stopping the command.
	Warnf func(format string, a ...any)
}

// New is the sink of the tool named tool: records to stdout, warnings to
// stderr as "tool: message" lines, logs to log (nil: discarded).
func New(tool string, stdout, stderr io.Writer, log *slog.Logger) Sink {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return Sink{Stdout: stdout, Log: log, Warnf: func(format string, a ...any) {
		fmt.Fprintf(stderr, "%s: %s\n", tool, fmt.Sprintf(format, a...))
	}}
}
