// Package cli is the command layer every tb-* tool shares: global flags,
// logging, the kong entry point, stdin detection, the configuration
// directories and the exit code of an error (its class, from package
// fault).
package cli

import (
	"cmp"
	"context"
	"fmt"
	"github.com/talkbox-sandbox/talkbox/internal/progress"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"

	"github.com/alecthomas/kong"

	"github.com/talkbox-sandbox/talkbox/internal/blobshare"
	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/version"
)

// Globals are the flags every tool takes. Embed it in each tool's CLI struct.
type Globals struct {
	State     string           `name:"state" env:"TB_STATE" placeholder:"DIR|URL" help:"State directory (default /var/lib/talkbox as root, $$XDG_STATE_HOME/talkbox otherwise), or the postgres:// URL of a fleet's shared database."`
	Local     string           `name:"local" env:"TB_LOCAL" type:"path" placeholder:"DIR" help:"This host's own directory (blobs, images, leases, captures) when --state is a database URL (default as --state's)."`
	Blobs     string           `name:"blobs" env:"TB_BLOBS" type:"path" placeholder:"DIR" help:"A blob directory the hosts of a fleet share (samples, captures), instead of the state directory's own."`
	LogFormat string           `name:"log-format" enum:"text,json" default:"text" help:"Log format on stderr: text or json."`
	LogLevel  string           `name:"log-level" enum:"debug,info,warn,error" default:"info" help:"Least severe log level shown."`
	Version   kong.VersionFlag `name:"version" help:"Print the version and exit."`
}

// Env is what a command's Run method receives: the streams, a context
// cancelled on SIGINT/SIGTERM, a logger and the global flags.
type Env struct {
	Ctx    context.Context
	Tool   string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Log    *slog.Logger
	G      *Globals

	// logTo is where Log writes, rerouted above the bars while a
	// progress meter draws (Progress).
	logTo *progress.LogWriter
}

// StateDir is this host's state directory: --state, TB_STATE or the
// default; with a database URL there, --local, TB_LOCAL or the default.
func (e *Env) StateDir() string {
	if state.IsSharedURL(e.G.State) {
		return cmp.Or(e.G.Local, defaultStateDir())
	}
	if e.G.State != "" {
		return absPath(e.G.State)
	}
	return defaultStateDir()
}

// OpenState opens (creating if needed) the state directory, and connects
// to the shared database when --state names one. Each host of such a
// fleet keeps its own blobs unless --blobs names a directory they share,
// so the store's EnsureBlob then fetches a blob the host lacks from the
// live workers' blob servers (tb-run worker --serve-blobs).
func (e *Env) OpenState(opts ...state.Option) (*state.Store, error) {
	if state.IsSharedURL(e.G.State) {
		if e.G.Blobs == "" {
			// First, so that a command's own fetcher replaces it.
			opts = append([]state.Option{state.WithBlobFetcher(blobshare.FromWorkers(blobshare.NewClient(), ""))}, opts...)
		}
		// The programs this one starts (a capture's daemon, the tools
		// tb-run drives) get the URL from state.Store.Environ, never on a
		// command line that any user can read (Store.Flags leaves it out).
		opts = append(opts, state.WithShared(e.G.State))
	}
	if e.G.Blobs != "" {
		opts = append(opts, state.WithSharedBlobs(e.G.Blobs))
	}
	// Blobs (a guest's stdout, trace, pcaps) keep the room a capture keeps
	// by default, so that a cycle's output cannot fill the disk its
	// records still need; first, so that a command's own replaces it.
	opts = append([]state.Option{state.WithMinFree(diskspace.DefaultThreshold())}, opts...)
	s, err := state.Open(e.Ctx, e.StateDir(), opts...)
	if err != nil {
		if fault.Code(err) != fault.ExitFailure {
			return nil, fmt.Errorf("opening state: %w", err)
		}
		return nil, fault.Failure(fmt.Errorf("opening state: %w", err))
	}
	return s, nil
}

// Warnf prints a one-line problem with one input, "tool: message", without
// stopping the command.
func (e *Env) Warnf(format string, a ...any) { e.Sink().Warnf(format, a...) }

// Sink is where domain code that a command calls prints records, warns and
// logs: the command's stdout, its stderr and its logger.
func (e *Env) Sink() cmdout.Sink { return cmdout.New(e.Tool, e.Stdout, e.Stderr, e.Log) }

// Progress is the command's progress meter: bars on stderr when it is a
// terminal, nothing (nil) otherwise. The command calls Wait when it ends.
func (e *Env) Progress() *progress.Meter {
	f, _ := e.Stderr.(*os.File)
	m := progress.ForTerminal(e.Ctx, f)
	if m != nil && e.logTo != nil {
		e.logTo.Route(m)
	}
	return m
}

// StdinPiped tells whether stdin is input to read: anything but a terminal
// or another character device (/dev/null is one), or a descriptor that
// cannot be examined. A command whose input may come from stdin reads it
// when no input is named and this holds, and otherwise says what it expects
// instead of waiting on a terminal.
func (e *Env) StdinPiped() bool {
	f, ok := e.Stdin.(interface{ Stat() (fs.FileInfo, error) })
	if !ok {
		return e.Stdin != nil
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&fs.ModeCharDevice == 0
}

// hasGlobals lets Run find the embedded Globals of any tool's CLI struct.
type hasGlobals interface{ globals() *Globals }

func (g *Globals) globals() *Globals { return g }

// Tool describes one tb-* binary for Run.
type Tool struct {
	Name        string
	Description string
	// Kinds are the record kinds its "list" command shows by default.
	Kinds string
	// Examples are shell lines that --help prints last, keyed by the command
	// path as typed ("" for the tool itself, "net up"), so that help shows
	// real invocations as the man pages do. CheckExamples keeps them runnable.
	Examples map[string][]string
}

// parser builds the kong parser of t for cli, with t's help printer.
func (t Tool) parser(cli any, opts ...kong.Option) (*kong.Kong, error) {
	return kong.New(cli, append([]kong.Option{
		kong.Name(t.Name),
		kong.Description(t.Description),
		kong.Vars{"version": version.String(t.Name), "kinds": t.Kinds},
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.Help(t.help),
	}, opts...)...)
}

// Run parses args into cli (a kong struct embedding Globals) and runs the
// selected command. It returns the process exit code.
func Run(t Tool, cli any, args []string) int {
	tool := t.Name
	hg, ok := cli.(hasGlobals)
	if !ok {
		panic("cli.Run: the CLI struct must embed cli.Globals")
	}
	g := hg.globals()
	exit := -1
	parser, err := t.parser(cli, kong.Exit(func(code int) { exit = code; panic(exitPanic{}) }))
	if err != nil {
		panic(err)
	}
	kctx, code, done := parse(parser, args, &exit)
	if done {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logTo := &progress.LogWriter{W: os.Stderr}
	env := &Env{
		Ctx: ctx, Tool: tool, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		Log: newLogger(logTo, g.LogFormat, g.LogLevel).With("tool", tool), G: g, logTo: logTo,
	}
	err = runCommand(kctx, env)
	if err == nil {
		return fault.ExitOK
	}
	if !fault.Reported(err) {
		fmt.Fprintf(os.Stderr, "%s: %s\n", tool, printable(err.Error()))
	}
	return fault.Code(err)
}

// printable escapes what a terminal would act on in an error that quotes
// what a sample wrote (a file name, a guest's answer): control bytes and
// bytes that are not UTF-8 as \xNN, other unprintable runes (a
// bidirectional override) Go-quoted. Newlines stay: errors.Join makes them.
func printable(msg string) string {
	if strings.IndexFunc(msg, func(r rune) bool { return r != '\n' && !unicode.IsPrint(r) }) < 0 && utf8.ValidString(msg) {
		return msg
	}
	var b strings.Builder
	for len(msg) > 0 {
		r, n := utf8.DecodeRuneInString(msg)
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, "\\x%02x", msg[0])
		case r == '\n' || unicode.IsPrint(r):
			b.WriteString(msg[:n])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		msg = msg[n:]
	}
	return b.String()
}

// runCommand runs the command kctx selected. A panic of the command's
// goroutine (a bug, which what a sample wrote may reach) ends it with exit
// 1 and one line saying so, its stack in the log, not with Go's exit 2,
// which this project's tools give to a wrong command line alone.
func runCommand(kctx *kong.Context, env *Env) (err error) {
	defer func() {
		if r := recover(); r != nil {
			stack := debug.Stack()
			if p, ok := r.(interface{ PanicStack() []byte }); ok {
				stack = p.PanicStack() // another goroutine's, raised again here
			}
			env.Log.Error("internal error", "panic", fmt.Sprint(r), "stack", string(stack))
			err = fault.Failure(fmt.Errorf("internal error (a bug in %s: please report it with its input): %v", env.Tool, r))
		}
	}()
	return kctx.Run(env)
}

type exitPanic struct{}

// parse runs kong's parser, turning its exits (help, version) and errors into
// exit codes instead of os.Exit, so that tests can call Run in process.
func parse(parser *kong.Kong, args []string, exit *int) (kctx *kong.Context, code int, done bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(exitPanic); !ok {
				panic(r)
			}
			kctx, code, done = nil, *exit, true
		}
	}()
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v (see %s --help)\n", parser.Model.Name, err, parser.Model.Name)
		return nil, fault.ExitUsage, true
	}
	return kctx, 0, false
}

func newLogger(w io.Writer, format, level string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
