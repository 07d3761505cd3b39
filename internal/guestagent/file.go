package guestagent

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
)

// maxArg is the most one argument of a process may hold on Linux
// (MAX_ARG_STRLEN, 32 pages, less its NUL); virsh takes a command as one.
const maxArg = 32*4096 - 1

// Chunk is the most data one guest-file-write carries and one
// guest-file-read asks for, whatever the transport: the largest whole KiB
// whose guest-file-write (base64, 4 bytes for 3, and up to 100 bytes of
// JSON around it) fits in maxArg, 95 KiB. Writes of 256 KiB leave QEMU
// 7.2's agent "not responding". Against the sizes tb-run used over libvirt
// before (128 KiB writes, 1 MiB reads) it costs a TCG guest ~10% per
// megabyte; over virsh, whose every command is a process, 1 MiB reads
// would take less than half the time (cycle.BenchmarkTransfer;
// docs/performance.md).
const Chunk = (maxArg - 100) / 4 * 3 >> 10 << 10

func (c *Client) open(ctx context.Context, path, mode string) (int, error) {
	var h *int
	if err := c.call(ctx, "guest-file-open", path, map[string]string{"path": path, "mode": mode}, &h); err != nil {
		return 0, err
	}
	if h == nil {
		return 0, fmt.Errorf("guest-file-open %s: no handle in the reply", path)
	}
	return *h, nil
}

func (c *Client) closeFile(ctx context.Context, path string, h int) error {
	return c.call(ctx, "guest-file-close", path, map[string]int{"handle": h}, nil)
}

// WriteFile writes what r gives to path in the guest (created or
// truncated), a Chunk per command, and returns how many bytes it wrote.
// The agent reports a count, not a digest: a caller that must trust the
// content verifies it inside the guest.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader) (int64, error) {
	h, err := c.open(ctx, path, "w")
	if err != nil {
		return 0, err
	}
	closed := false
	defer func() {
		if !closed {
			c.closeFile(context.WithoutCancel(ctx), path, h)
		}
	}()
	buf := make([]byte, Chunk)
	var n int64
	for {
		k, rerr := io.ReadFull(r, buf)
		if k > 0 {
			var wr struct {
				Count int `json:"count"`
			}
			args := map[string]any{"handle": h, "buf-b64": base64.StdEncoding.EncodeToString(buf[:k])}
			if err := c.call(ctx, "guest-file-write", path, args, &wr); err != nil {
				return n, err
			}
			if wr.Count != k {
				return n, fmt.Errorf("guest-file-write %s: short write (%d of %d bytes)", path, wr.Count, k)
			}
			n += int64(k)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return n, fmt.Errorf("reading what is written to %s: %w", path, rerr)
		}
	}
	closed = true
	return n, c.closeFile(ctx, path, h)
}

// ReadFileAt reads at most max bytes of path from offset off, a Chunk per
// command; fewer at the end of the file, none past it. An agent that does
// not answer is asked again, the whole read from its open, as long as the
// client's patience lasts (patiently): reading is safe to repeat, and a
// loaded host's TCG guest has left its agent unanswered for tens of
// seconds right after its sample exited, when tb-run reads the sample's
// output (a fresh-clone make test, 2026-11-30).
func (c *Client) ReadFileAt(ctx context.Context, path string, off int64, max int) ([]byte, error) {
	var out []byte
	err := c.patiently(ctx, func() error {
		var err error
		out, err = c.readFileAt(ctx, path, off, max)
		return err
	})
	return out, err
}

func (c *Client) readFileAt(ctx context.Context, path string, off int64, max int) ([]byte, error) {
	h, err := c.open(ctx, path, "r")
	if err != nil {
		return nil, err
	}
	defer c.closeFile(context.WithoutCancel(ctx), path, h)
	if off > 0 {
		if err := c.call(ctx, "guest-file-seek", path, map[string]any{"handle": h, "offset": off, "whence": "set"}, nil); err != nil {
			return nil, err
		}
	}
	var out []byte
	for len(out) < max {
		var rd struct {
			Count int    `json:"count"`
			Buf   string `json:"buf-b64"`
			EOF   bool   `json:"eof"`
		}
		ask := min(max-len(out), Chunk)
		if err := c.call(ctx, "guest-file-read", path, map[string]int{"handle": h, "count": ask}, &rd); err != nil {
			return nil, err
		}
		// The agent is the guest's: a reply of more than was asked for
		// would take a read past its bound.
		if rd.Count > ask || base64.StdEncoding.DecodedLen(len(rd.Buf)) > ask+2 {
			return nil, fmt.Errorf("guest-file-read %s: a reply of more than the %d bytes asked for (it counts %d)", path, ask, rd.Count)
		}
		b, err := base64.StdEncoding.DecodeString(rd.Buf)
		if err != nil {
			return nil, fmt.Errorf("guest-file-read %s: %w", path, err)
		}
		if len(b) != rd.Count {
			return nil, fmt.Errorf("guest-file-read %s: %d bytes where the reply counts %d", path, len(b), rd.Count)
		}
		out = append(out, b...)
		if rd.EOF || rd.Count == 0 {
			break
		}
	}
	return out, nil
}
