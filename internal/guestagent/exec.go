package guestagent

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Result is a finished guest process.
type Result struct {
	// ExitCode is the process's status, or 128 plus the signal that
	// killed it, as a shell reports it.
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

// Code is the exit status as a shell reports it: 128 plus the signal that
// killed the process, else its exit code.
func (p Proc) Code() int {
	if p.Signal != 0 {
		return 128 + p.Signal
	}
	return p.ExitCode
}

// execStatus is guest-exec-status's reply.
type execStatus struct {
	Exited   bool   `json:"exited"`
	ExitCode int    `json:"exitcode"`
	Signal   int    `json:"signal"`
	Out      string `json:"out-data"`
	Err      string `json:"err-data"`
}

func (s *execStatus) proc() Proc {
	return Proc{Exited: s.Exited, ExitCode: s.ExitCode, Signal: s.Signal}
}

// exec starts argv; env, when not nil, is its whole environment ("K=V");
// stdin, when not nil, is what it reads on its standard input. capture
// keeps its output for guest-exec-status.
func (c *Client) exec(ctx context.Context, argv, env []string, stdin []byte, capture bool) (int, error) {
	if len(argv) == 0 {
		return 0, errors.New("guest-exec: empty command")
	}
	args := map[string]any{"path": argv[0], "arg": argv[1:], "capture-output": capture}
	if env != nil {
		args["env"] = env
	}
	if stdin != nil {
		args["input-data"] = base64.StdEncoding.EncodeToString(stdin)
	}
	var started struct {
		PID int `json:"pid"`
	}
	if err := c.call(ctx, "guest-exec", argv[0], args, &started); err != nil {
		return 0, err
	}
	if started.PID <= 0 {
		return 0, fmt.Errorf("guest-exec %s: no pid in the reply", argv[0])
	}
	return started.PID, nil
}

func (c *Client) status(ctx context.Context, pid int) (*execStatus, error) {
	var st execStatus
	if err := c.call(ctx, "guest-exec-status", fmt.Sprint(pid), map[string]int{"pid": pid}, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// Spawn starts a program without waiting for it or keeping its output;
// env, when not nil, is its whole environment ("K=V"); stdin, when not
// nil, is what it reads on its standard input (a secret given so is in no
// command line, environment or file of the guest). It returns the guest's
// PID for Status.
func (c *Client) Spawn(ctx context.Context, argv, env []string, stdin []byte) (int, error) {
	return c.exec(ctx, argv, env, stdin, false)
}

// Status asks once about a process started with Spawn. The agent forgets a
// process once it has reported its exit, and all of them when it restarts:
// asking again is an error.
func (c *Client) Status(ctx context.Context, pid int) (Proc, error) {
	st, err := c.status(ctx, pid)
	if err != nil {
		return Proc{}, err
	}
	return st.proc(), nil
}

// ErrExitLost is a Run whose process the agent forgot after a status
// query it was late to answer: that answer, to no one, was the exit, and
// the exit code and output are lost with it.
var ErrExitLost = errors.New("the guest agent answered the exit to a query given up on, and forgot the process")

// unknownPID is what qemu-ga answers a guest-exec-status of a process it
// does not know (QERR_INVALID_PARAMETER).
const unknownPID = "Invalid parameter 'pid'"

// RunRepeatable is Run for a command that is safe to run again (it only
// reads, or does what is done already): one whose exit was lost
// (ErrExitLost) is run again, at most twice. The agent being the guest's,
// a sample can make it answer so; it gains three runs of the command.
func (c *Client) RunRepeatable(ctx context.Context, argv ...string) (*Result, error) {
	for try := 1; ; try++ {
		res, err := c.Run(ctx, argv...)
		if !errors.Is(err, ErrExitLost) || try == 3 || ctx.Err() != nil {
			return res, err
		}
	}
}

// Run runs a program, waits for it and returns its output (which the agent
// cuts at its own limit, 16 MiB in qemu-ga). ctx ending stops the waiting,
// not the program: the agent cannot signal a process.
//
// The exit is polled from 2 ms doubling to 16 ms (a status query is a ~3 ms
// agent round trip): helper commands take 50–200 ms under TCG, and a fixed
// 100 ms poll would add up to 100 ms to each.
func (c *Client) Run(ctx context.Context, argv ...string) (*Result, error) {
	pid, err := c.exec(ctx, argv, nil, nil, true)
	if err != nil {
		return nil, err
	}
	var st *execStatus
	// A status query the agent left unanswered is asked again, patiently
	// (within the client's grace, its silence shared with file reads).
	// Asking again is safe, not always fruitful: libvirt, once in sync
	// with the agent, sends a command without a guest-sync, so a query it
	// gave up on may still reach the agent and be answered to no one. If
	// that answer was the exit, the agent has forgotten the process, and
	// the next query fails Run with ErrExitLost.
	unanswered := false
	err = poll(ctx, 2*time.Millisecond, 16*time.Millisecond, func() (bool, error) {
		err := c.patiently(ctx, func() error {
			var err error
			st, err = c.status(ctx, pid)
			if errors.Is(err, ErrNotReady) {
				unanswered = true
			}
			return err
		})
		return err == nil && st.Exited, err
	})
	if err != nil {
		if unanswered && strings.Contains(err.Error(), unknownPID) {
			err = fmt.Errorf("%w (%v)", ErrExitLost, err)
		}
		return nil, fmt.Errorf("guest-exec %s: %w", argv[0], err)
	}
	r := &Result{ExitCode: st.proc().Code()}
	if r.Stdout, err = base64.StdEncoding.DecodeString(st.Out); err != nil {
		return nil, fmt.Errorf("guest-exec %s: stdout: %w", argv[0], err)
	}
	if r.Stderr, err = base64.StdEncoding.DecodeString(st.Err); err != nil {
		return nil, fmt.Errorf("guest-exec %s: stderr: %w", argv[0], err)
	}
	return r, nil
}
