package virt

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// PushChunk is the default size of one guest-file-write. Measured on a TCG
// amd64 guest (QEMU 7.2's agent): 16 KiB chunks push 2 MiB in 6.8 s, 48 KiB
// in 4.3 s, 128 KiB in 3.6 s; 256 KiB and larger writes leave the agent
// "not responding".
const PushChunk = 128 << 10

// WriteFile writes r to path in the guest (created or truncated) in chunks
// of at most chunk bytes (PushChunk if chunk <= 0) and returns the bytes
// written. The caller verifies the content inside the guest.
func (g *Guest) WriteFile(ctx context.Context, path string, r io.Reader, chunk int) (int64, error) {
	if chunk <= 0 {
		chunk = PushChunk
	}
	req, _ := json.Marshal(map[string]any{"execute": "guest-file-open", "arguments": map[string]any{"path": path, "mode": "w"}})
	raw, err := g.H.AgentCommand(ctx, g.Name, string(req))
	if err != nil {
		return 0, fmt.Errorf("guest-file-open %s: %w", path, err)
	}
	var open struct {
		Return *int `json:"return"`
	}
	if err := json.Unmarshal([]byte(raw), &open); err != nil || open.Return == nil {
		return 0, fmt.Errorf("guest-file-open %s: bad reply %q", path, raw)
	}
	h := *open.Return
	closed := false
	closeFile := func(ctx context.Context) error {
		closed = true
		_, err := g.H.AgentCommand(ctx, g.Name, fmt.Sprintf(`{"execute":"guest-file-close","arguments":{"handle":%d}}`, h))
		return err
	}
	defer func() {
		if !closed {
			closeFile(context.WithoutCancel(ctx))
		}
	}()
	buf := make([]byte, chunk)
	var n int64
	for {
		k, rerr := io.ReadFull(r, buf)
		if k > 0 {
			req := fmt.Sprintf(`{"execute":"guest-file-write","arguments":{"handle":%d,"buf-b64":%q}}`, h, base64.StdEncoding.EncodeToString(buf[:k]))
			raw, err := g.H.AgentCommand(ctx, g.Name, req)
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
	if err := closeFile(ctx); err != nil {
		return n, fmt.Errorf("guest-file-close %s: %w", path, err)
	}
	return n, nil
}

// ReadFileAt reads at most max bytes of path in the guest from offset off.
// A file shorter than off gives no bytes.
func (g *Guest) ReadFileAt(ctx context.Context, path string, off int64, max int) ([]byte, error) {
	req, _ := json.Marshal(map[string]any{"execute": "guest-file-open", "arguments": map[string]any{"path": path, "mode": "r"}})
	raw, err := g.H.AgentCommand(ctx, g.Name, string(req))
	if err != nil {
		return nil, fmt.Errorf("guest-file-open %s: %w", path, err)
	}
	var open struct {
		Return *int `json:"return"`
	}
	if err := json.Unmarshal([]byte(raw), &open); err != nil || open.Return == nil {
		return nil, fmt.Errorf("guest-file-open %s: bad reply %q", path, raw)
	}
	h := *open.Return
	defer g.H.AgentCommand(context.WithoutCancel(ctx), g.Name, fmt.Sprintf(`{"execute":"guest-file-close","arguments":{"handle":%d}}`, h))
	if off > 0 {
		if _, err := g.H.AgentCommand(ctx, g.Name, fmt.Sprintf(`{"execute":"guest-file-seek","arguments":{"handle":%d,"offset":%d,"whence":"set"}}`, h, off)); err != nil {
			return nil, fmt.Errorf("guest-file-seek %s: %w", path, err)
		}
	}
	var out []byte
	for len(out) < max {
		raw, err := g.H.AgentCommand(ctx, g.Name, fmt.Sprintf(`{"execute":"guest-file-read","arguments":{"handle":%d,"count":%d}}`, h, min(max-len(out), PushChunk)))
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

// Proc is the state of a process started with Spawn.
type Proc struct {
	Exited   bool
	ExitCode int
	Signal   int
}

// Spawn starts a program in the guest without waiting for it and returns
// its PID. env, when not nil, is its whole environment ("K=V").
func (g *Guest) Spawn(ctx context.Context, argv, env []string) (int, error) {
	if len(argv) == 0 {
		return 0, errors.New("guest-exec: empty command")
	}
	args := map[string]any{"path": argv[0], "arg": argv[1:]}
	if env != nil {
		args["env"] = env
	}
	req, _ := json.Marshal(map[string]any{"execute": "guest-exec", "arguments": args})
	raw, err := g.H.AgentCommand(ctx, g.Name, string(req))
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

// Status asks once about a process started with Spawn.
func (g *Guest) Status(ctx context.Context, pid int) (Proc, error) {
	raw, err := g.H.AgentCommand(ctx, g.Name, fmt.Sprintf(`{"execute":"guest-exec-status","arguments":{"pid":%d}}`, pid))
	if err != nil {
		return Proc{}, fmt.Errorf("guest-exec-status %d: %w", pid, err)
	}
	var st struct {
		Return struct {
			Exited   bool `json:"exited"`
			ExitCode int  `json:"exitcode"`
			Signal   int  `json:"signal"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return Proc{}, fmt.Errorf("guest-exec-status %d: bad reply %q", pid, raw)
	}
	return Proc{Exited: st.Return.Exited, ExitCode: st.Return.ExitCode, Signal: st.Return.Signal}, nil
}
