package cycle

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/observe/behave"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Guest is the boundary to a lease's guest, through its agent. The agent
// implementation speaks the QEMU guest agent's protocol through libvirt;
// unit tests use a fake, and the integration and end-to-end tests cover the
// real one.
type Guest interface {
	Ping(ctx context.Context) error
	// Addresses are the guest's interface addresses, "ip/prefix".
	Addresses(ctx context.Context) ([]string, error)
	WriteFile(ctx context.Context, path string, r io.Reader) (int64, error)
	ReadFileAt(ctx context.Context, path string, off int64, max int) ([]byte, error)
	// Run runs a short helper command and waits for it.
	Run(ctx context.Context, argv ...string) (*ExecResult, error)
	Spawn(ctx context.Context, argv, env []string) (int, error)
	Status(ctx context.Context, pid int) (Proc, error)
	Close() error
}

// ExecResult is a finished guest process.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// Proc is the state of a process started with Spawn.
type Proc struct {
	Exited   bool
	ExitCode int
	Signal   int
}

// Connector opens the guest of a lease.
type Connector func(ctx context.Context, l *records.SandboxLease) (Guest, error)

// AgentFunc sends one guest-agent command (QMP-style JSON) to a guest and
// returns the raw reply.
type AgentFunc func(ctx context.Context, cmd string) (string, error)

// agentGuest is Guest over a guest-agent channel.
type agentGuest struct {
	cmd   AgentFunc
	chunk int
	close func() error
}

// NewAgentGuest is a Guest over cmd, pushing files in chunks of chunk
// bytes; close is called by Close.
func NewAgentGuest(cmd AgentFunc, chunk int, close func() error) Guest {
	return &agentGuest{cmd: cmd, chunk: chunk, close: close}
}

func (a *agentGuest) Close() error {
	if a.close == nil {
		return nil
	}
	return a.close()
}

func (a *agentGuest) Ping(ctx context.Context) error {
	_, err := a.cmd(ctx, `{"execute":"guest-ping"}`)
	return err
}

func (a *agentGuest) Addresses(ctx context.Context) ([]string, error) {
	raw, err := a.cmd(ctx, `{"execute":"guest-network-get-interfaces"}`)
	if err != nil {
		return nil, fmt.Errorf("guest-network-get-interfaces: %w", err)
	}
	var rep struct {
		Return []struct {
			IPs []struct {
				Addr   string `json:"ip-address"`
				Prefix int    `json:"prefix"`
			} `json:"ip-addresses"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(raw), &rep); err != nil {
		return nil, fmt.Errorf("guest-network-get-interfaces: bad reply %q", raw)
	}
	var out []string
	for _, i := range rep.Return {
		for _, a := range i.IPs {
			out = append(out, fmt.Sprintf("%s/%d", a.Addr, a.Prefix))
		}
	}
	return out, nil
}

func (a *agentGuest) open(ctx context.Context, path, mode string) (int, error) {
	req, _ := json.Marshal(map[string]any{"execute": "guest-file-open", "arguments": map[string]any{"path": path, "mode": mode}})
	raw, err := a.cmd(ctx, string(req))
	if err != nil {
		return 0, fmt.Errorf("guest-file-open %s: %w", path, err)
	}
	var open struct {
		Return *int `json:"return"`
	}
	if err := json.Unmarshal([]byte(raw), &open); err != nil || open.Return == nil {
		return 0, fmt.Errorf("guest-file-open %s: bad reply %q", path, raw)
	}
	return *open.Return, nil
}

func (a *agentGuest) closeFile(ctx context.Context, h int) error {
	_, err := a.cmd(ctx, fmt.Sprintf(`{"execute":"guest-file-close","arguments":{"handle":%d}}`, h))
	return err
}

// WriteFile writes r to path in the guest (created or truncated) in
// chunks; the caller verifies the content inside the guest.
func (a *agentGuest) WriteFile(ctx context.Context, path string, r io.Reader) (int64, error) {
	h, err := a.open(ctx, path, "w")
	if err != nil {
		return 0, err
	}
	closed := false
	defer func() {
		if !closed {
			a.closeFile(context.WithoutCancel(ctx), h)
		}
	}()
	buf := make([]byte, a.chunk)
	var n int64
	for {
		k, rerr := io.ReadFull(r, buf)
		if k > 0 {
			raw, err := a.cmd(ctx, fmt.Sprintf(`{"execute":"guest-file-write","arguments":{"handle":%d,"buf-b64":%q}}`, h, base64.StdEncoding.EncodeToString(buf[:k])))
			if err != nil {
				return n, fmt.Errorf("guest-file-write %s: %w", path, err)
			}
			var wr struct {
				Return struct {
					Count int `json:"count"`
				} `json:"return"`
			}
			if err := json.Unmarshal([]byte(raw), &wr); err != nil {
				return n, fmt.Errorf("guest-file-write %s: bad reply %q", path, raw)
			}
			if wr.Return.Count != k {
				return n, fmt.Errorf("guest-file-write %s: short write (%d of %d bytes)", path, wr.Return.Count, k)
			}
			n += int64(k)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return n, fmt.Errorf("reading what is pushed to %s: %w", path, rerr)
		}
	}
	closed = true
	if err := a.closeFile(ctx, h); err != nil {
		return n, fmt.Errorf("guest-file-close %s: %w", path, err)
	}
	return n, nil
}

// ReadFileAt reads at most max bytes of path from offset off.
func (a *agentGuest) ReadFileAt(ctx context.Context, path string, off int64, max int) ([]byte, error) {
	h, err := a.open(ctx, path, "r")
	if err != nil {
		return nil, err
	}
	defer a.closeFile(context.WithoutCancel(ctx), h)
	if off > 0 {
		if _, err := a.cmd(ctx, fmt.Sprintf(`{"execute":"guest-file-seek","arguments":{"handle":%d,"offset":%d,"whence":"set"}}`, h, off)); err != nil {
			return nil, fmt.Errorf("guest-file-seek %s: %w", path, err)
		}
	}
	var out []byte
	for len(out) < max {
		raw, err := a.cmd(ctx, fmt.Sprintf(`{"execute":"guest-file-read","arguments":{"handle":%d,"count":%d}}`, h, min(max-len(out), 1<<20)))
		if err != nil {
			return nil, fmt.Errorf("guest-file-read %s: %w", path, err)
		}
		var rd struct {
			Return struct {
				Count int    `json:"count"`
				Buf   string `json:"buf-b64"`
				EOF   bool   `json:"eof"`
			} `json:"return"`
		}
		if err := json.Unmarshal([]byte(raw), &rd); err != nil {
			return nil, fmt.Errorf("guest-file-read %s: bad reply %q", path, raw)
		}
		b, err := base64.StdEncoding.DecodeString(rd.Return.Buf)
		if err != nil {
			return nil, fmt.Errorf("guest-file-read %s: %w", path, err)
		}
		out = append(out, b...)
		if rd.Return.EOF || rd.Return.Count == 0 {
			break
		}
	}
	return out, nil
}

func (a *agentGuest) exec(ctx context.Context, argv, env []string, capture bool) (int, error) {
	if len(argv) == 0 {
		return 0, errors.New("guest-exec: empty command")
	}
	args := map[string]any{"path": argv[0], "arg": argv[1:], "capture-output": capture}
	if env != nil {
		args["env"] = env
	}
	req, _ := json.Marshal(map[string]any{"execute": "guest-exec", "arguments": args})
	raw, err := a.cmd(ctx, string(req))
	if err != nil {
		return 0, fmt.Errorf("guest-exec %s: %w", argv[0], err)
	}
	var started struct {
		Return struct {
			PID int `json:"pid"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(raw), &started); err != nil || started.Return.PID <= 0 {
		return 0, fmt.Errorf("guest-exec %s: bad reply %q", argv[0], raw)
	}
	return started.Return.PID, nil
}

type execStatus struct {
	Return struct {
		Exited   bool   `json:"exited"`
		ExitCode int    `json:"exitcode"`
		Signal   int    `json:"signal"`
		Out      string `json:"out-data"`
		Err      string `json:"err-data"`
	} `json:"return"`
}

func (a *agentGuest) status(ctx context.Context, pid int) (*execStatus, error) {
	raw, err := a.cmd(ctx, fmt.Sprintf(`{"execute":"guest-exec-status","arguments":{"pid":%d}}`, pid))
	if err != nil {
		return nil, fmt.Errorf("guest-exec-status %d: %w", pid, err)
	}
	var st execStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return nil, fmt.Errorf("guest-exec-status %d: bad reply %q", pid, raw)
	}
	return &st, nil
}

// Spawn starts a program without waiting for it; env, when not nil, is
// its whole environment ("K=V").
func (a *agentGuest) Spawn(ctx context.Context, argv, env []string) (int, error) {
	return a.exec(ctx, argv, env, false)
}

// Status asks once about a process started with Spawn.
func (a *agentGuest) Status(ctx context.Context, pid int) (Proc, error) {
	st, err := a.status(ctx, pid)
	if err != nil {
		return Proc{}, err
	}
	return Proc{Exited: st.Return.Exited, ExitCode: st.Return.ExitCode, Signal: st.Return.Signal}, nil
}

// Run is guest-exec with captured output, polled from 2 ms doubling to
// 16 ms (a status query is a ~3 ms agent round trip): helper commands take
// 50–200 ms under TCG, and a fixed 100 ms poll would add up to 100 ms to
// each.
func (a *agentGuest) Run(ctx context.Context, argv ...string) (*ExecResult, error) {
	pid, err := a.exec(ctx, argv, nil, true)
	if err != nil {
		return nil, err
	}
	wait := 2 * time.Millisecond
	for {
		st, err := a.status(ctx, pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", argv[0], err)
		}
		if st.Return.Exited {
			r := &ExecResult{ExitCode: st.Return.ExitCode}
			if st.Return.Signal != 0 {
				r.ExitCode = 128 + st.Return.Signal
			}
			r.Stdout, _ = base64.StdEncoding.DecodeString(st.Return.Out)
			r.Stderr, _ = base64.StdEncoding.DecodeString(st.Return.Err)
			return r, nil
		}
		if err := sleepCtx(ctx, wait); err != nil {
			return nil, fmt.Errorf("guest-exec %s: %w", argv[0], err)
		}
		wait = min(2*wait, 16*time.Millisecond)
	}
}

// sleepCtx waits d or until ctx ends. Polling is how the guest agent is
// used: it has no events for process exit or file growth.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// launcher is the bash script that starts the sample. It sends its own
// errors to the sample's stderr file, records its PID (which the sample
// keeps through exec) before anything else, so that a resumed cycle can
// tell whether the sample was started, then runs the sample in its working
// directory (created if missing). Only builtins run before the sample
// (mkdir only for a new working directory): every fork costs tens of
// milliseconds under TCG. bash, unlike dash, reports a binary it cannot run
// ("Exec format error", status 126) instead of running it as a script.
// A traced sample runs with strace at nice 10: on a one-vCPU TCG guest a
// traced Go bot otherwise left the guest agent unanswered for minutes.
const launcher = `exec 2>"$4" </dev/null || exit 125
echo $$ > "$2" || exit 125
[ -d "$1" ] || mkdir -p "$1" || exit 125
cd "$1" || exit 125
[ -x "$6" ] || chmod 0755 "$6" || exit 125
o=$3 t=$5
shift 5
case $t in
strace:*)
  if command -v strace >/dev/null; then
    exec nice -n 10 strace ` + behave.StraceOptions + ` -o "${t#strace:}" -- "$@" >"$o"
  fi
  echo "# tb-run: strace not found in the guest; the sample runs untraced" >"${t#strace:}" ;;
qemu:*)
  export QEMU_LOG=strace QEMU_LOG_FILENAME="${t#qemu:}.%d" ;;
esac
exec "$@" >"$o"`

// Tracers (records.Cycle.Tracer).
const (
	TracerStrace = "strace"
	TracerQEMU   = "qemu"
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

// gatherTraceArgv writes the logs QEMU kept per emulated process
// (path.<pid>) into path, in PID order.
func gatherTraceArgv(path string) []string {
	return []string{"/bin/sh", "-c", `for f in "$1".[0-9]*; do [ -f "$f" ] && cat "$f"; done > "$1"; true`, "tb-run", path}
}

// killArgv kills a sample and all its descendants: each process is
// stopped before its children are listed (so it cannot fork more or react
// to their death), then all are killed.
func killArgv(pid int) []string {
	return []string{"/bin/sh", "-c", `pids=$1 all=
while [ -n "$pids" ]; do
  next=
  for p in $pids; do
    kill -STOP "$p" 2>/dev/null && all="$all $p" && next="$next $(cat /proc/$p/task/*/children 2>/dev/null)"
  done
  pids=$next
done
[ -n "$all" ] && kill -KILL $all 2>/dev/null
true`, "tb-run", fmt.Sprint(pid)}
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
	for _, k := range sortedKeys(env) {
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
