// Package guestagent speaks the QEMU guest agent's protocol (qemu-ga, on a
// virtio-serial channel): ping, processes (guest-exec, guest-exec-status)
// with their exit status and output, files (guest-file-open, -read, -write,
// -seek, -close), network interfaces and the guest's clock (guest-get-time,
// guest-set-time). It is the one agent client of
// tb-build's smoke test, tb-lease and tb-run.
//
// A Transport carries one JSON command to a domain's agent and brings back
// the reply: virt.Libvirt (libvirt's C library, through cgo) or Virsh
// (virsh qemu-agent-command, no cgo, so that tb-run builds without it).
package guestagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Transport sends one QMP-style JSON command to the guest agent of a domain
// and returns the raw JSON reply. An agent that is not connected or does
// not answer in CommandTimeout is ErrNotReady; a domain that is not running
// is ErrGone.
type Transport interface {
	AgentCommand(ctx context.Context, domain, cmd string) (string, error)
}

// CommandTimeout bounds one agent command, in seconds (libvirt's and
// virsh's unit): the agent answers in milliseconds once it runs, and the
// largest command, a Chunk's guest-file-write, in well under a second even
// under TCG; but a one-vCPU mipsel guest under TCG on a host loaded by
// other guests left a guest-exec-status unanswered past 5 s (a fresh-clone
// make test, 2026-11-28), and libvirt then calls the agent unresponsive,
// which failed the cycle. 15 s still finds a dead agent quickly.
const CommandTimeout = 15

// ErrNotReady is a guest agent that is not connected or does not answer.
var ErrNotReady = errors.New("guest agent not ready")

// Grace is how long a guest agent that stops answering is waited for where
// asking again is safe (the exit of a process Run started, a running
// sample's watch, a file's read) before the command fails. A guest under TCG on a loaded
// host, a Malta guest most of all, has left its agent unanswered past
// libvirt's timeouts and then answered again: a fresh-clone make test of
// 2026-11-29 failed a cycle on a guest-exec-status libvirt gave up on
// ("Guest agent not available for now").
const Grace = 2 * time.Minute

// ErrGone is a guest that is not running any more (it powered off,
// panicked or was destroyed).
var ErrGone = errors.New("guest is not running")

// Client is the guest agent of one domain.
type Client struct {
	t      Transport
	domain string
	grace  time.Duration // Grace, shorter in tests

	mu sync.Mutex
	// silentSince is when the agent left a command unanswered, since it
	// last answered one (zero: it answered the last).
	silentSince time.Time
}

// New is the agent of domain, reached through t.
func New(t Transport, domain string) *Client {
	return &Client{t: t, domain: domain, grace: Grace}
}

// call sends execute with args (nil: none) and decodes the reply's
// "return" into ret (nil: only checked for being there). Errors begin with
// the command and what, the thing it was about (a path, a program).
func (c *Client) call(ctx context.Context, execute, what string, args, ret any) error {
	name := execute
	if what != "" {
		name += " " + what
	}
	req, err := json.Marshal(struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
	}{execute, args})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	raw, err := c.t.AgentCommand(ctx, c.domain, string(req))
	if !errors.Is(err, ErrNotReady) {
		// Answered, if only with an error (a missing file, say): the
		// agent's silence, if any, is over.
		c.mu.Lock()
		c.silentSince = time.Time{}
		c.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	// libvirt and virsh turn an agent's error reply into an error; one
	// that comes through as a reply is one too.
	var rep struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(raw), &rep); err != nil {
		return fmt.Errorf("%s: bad reply %q", name, clip(raw))
	}
	if rep.Error != nil {
		return fmt.Errorf("%s: %s: %s", name, rep.Error.Class, rep.Error.Desc)
	}
	if rep.Return == nil {
		return fmt.Errorf("%s: bad reply %q", name, clip(raw))
	}
	if ret != nil {
		if err := json.Unmarshal(rep.Return, ret); err != nil {
			return fmt.Errorf("%s: bad reply %q", name, clip(raw))
		}
	}
	return nil
}

// patiently runs f, commands that are safe to repeat, again every
// notReadyPause while the agent does not answer, until it has been silent
// for the client's grace. The silence is the client's, counted from the
// first command it left unanswered since it last answered one: an agent
// gone for good (a sample stopped it) costs a cycle one grace, not one
// for each read.
func (c *Client) patiently(ctx context.Context, f func() error) error {
	for {
		err := f()
		if !errors.Is(err, ErrNotReady) || ctx.Err() != nil {
			return err
		}
		if silent := c.silence(); silent >= c.grace {
			return fmt.Errorf("%w (no answer for %s)", err, silent.Round(time.Millisecond))
		}
		if err := Pause(ctx, notReadyPause); err != nil {
			return err
		}
	}
}

// silence is how long the agent has not answered, a command it just left
// unanswered included.
func (c *Client) silence() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.silentSince.IsZero() {
		c.silentSince = time.Now()
	}
	return time.Since(c.silentSince)
}

// clip shortens a reply quoted in an error: a file read's is megabytes.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// Ping asks the agent once whether it is there.
func (c *Client) Ping(ctx context.Context) error {
	return c.call(ctx, "guest-ping", "", nil, nil)
}

// Wait pings until the agent answers. It returns ErrGone at once when the
// guest stopped, and ctx's error, with the last error other than
// ErrNotReady, when ctx ends first.
func (c *Client) Wait(ctx context.Context) error {
	var last error
	// The agent gives no event when it comes up: pinging again is the
	// protocol's way to find out. A guest that is up answers the first
	// ping; one that boots takes seconds, for which 200 ms is precise enough.
	err := poll(ctx, 10*time.Millisecond, 200*time.Millisecond, func() (bool, error) {
		err := c.Ping(ctx)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, ErrGone):
			return true, err
		case ctx.Err() == nil && !errors.Is(err, ErrNotReady):
			last = err
		}
		return false, nil
	})
	if err != nil && last != nil && !errors.Is(err, ErrGone) {
		return fmt.Errorf("%w (last agent error: %v)", err, last)
	}
	return err
}

// notReadyPause is the wait before asking an agent that did not answer
// again: a disconnected agent is said at once, and asking it every few
// milliseconds for minutes is only load.
const notReadyPause = 200 * time.Millisecond

// Pause waits d, or less when ctx ends first (its error): asking again
// after a pause is how the agent is used, since it has no events (a
// process's exit, a file's growth, its own start).
func Pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// poll calls try until it is done or fails, waiting between calls from
// first, doubling, up to most; it returns ctx's error if ctx ends first.
// The agent has no events (a process's exit, its own start): asking again
// is how it is used.
func poll(ctx context.Context, first, most time.Duration, try func() (done bool, err error)) error {
	for wait := first; ; wait = min(2*wait, most) {
		if done, err := try(); done || err != nil {
			return err
		}
		if err := Pause(ctx, wait); err != nil {
			return err
		}
	}
}

// Interface is one guest network interface as the agent reports it.
type Interface struct {
	Name string
	MAC  string
	// Addresses are "ip/prefix".
	Addresses []string
}

// Interfaces lists the guest's network interfaces and their addresses.
func (c *Client) Interfaces(ctx context.Context) ([]Interface, error) {
	var rep []struct {
		Name string `json:"name"`
		MAC  string `json:"hardware-address"`
		IPs  []struct {
			Addr   string `json:"ip-address"`
			Prefix int    `json:"prefix"`
		} `json:"ip-addresses"`
	}
	if err := c.call(ctx, "guest-network-get-interfaces", "", nil, &rep); err != nil {
		return nil, err
	}
	out := make([]Interface, 0, len(rep))
	for _, r := range rep {
		i := Interface{Name: r.Name, MAC: r.MAC}
		for _, a := range r.IPs {
			i.Addresses = append(i.Addresses, fmt.Sprintf("%s/%d", a.Addr, a.Prefix))
		}
		out = append(out, i)
	}
	return out, nil
}

// Addresses are the addresses of all the guest's interfaces, "ip/prefix".
func (c *Client) Addresses(ctx context.Context) ([]string, error) {
	ifs, err := c.Interfaces(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, i := range ifs {
		out = append(out, i.Addresses...)
	}
	return out, nil
}
