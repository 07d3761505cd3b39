package capture

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// The control socket is a path socket in a directory only the daemon's
// user may enter, and the daemon also checks each peer's credentials:
// another local user can neither stop a capture (leaving its rules live)
// nor relabel its files under another cycle.
const (
	// maxRequest bounds a request line: the largest real one is an op and
	// a cycle ID, well under a hundred bytes.
	maxRequest = 4 << 10
	// maxReply bounds a reply line (artifact IDs of one rotate or stop).
	maxReply = 1 << 20
	// requestTimeout is how long a client may take to send its request or
	// read its reply; a client that dribbles is cut off then, without
	// holding up the capture or other clients meanwhile.
	requestTimeout = 5 * time.Second
)

// control is one request read from a permitted peer, waiting for the
// daemon's loop to answer on conn.
type control struct {
	conn net.Conn
	req  request
}

// controlDir holds the control sockets of a state directory's captures.
func controlDir(st *state.Store) string { return st.Path("run", "capture") }

// socketName is the name of a capture's control socket in controlDir.
func socketName(captureID string) string { return captureID + ".sock" }

// inDir calls fn with a short name for dir: a unix socket's path is limited
// to 107 bytes, which a state directory may exceed, so the socket is named
// through an open descriptor of its directory (/proc/self/fd/N). Searching
// the directory is still checked against the caller's credentials.
func inDir(dir string, fn func(short string) error) error {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	return fn("/proc/self/fd/" + strconv.Itoa(fd))
}

// listenControl creates the capture's control socket, making its directory
// private to the daemon's user first.
func listenControl(st *state.Store, captureID string) (net.Listener, error) {
	dir := controlDir(st)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	// MkdirAll leaves an existing directory's mode and owner alone; a
	// symlink there would have the chmod below follow it.
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("control socket: %s is not a directory (%v)", dir, err)
	}
	if err := os.Lchown(dir, os.Getuid(), os.Getgid()); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	name := socketName(captureID)
	var ln *net.UnixListener
	err := inDir(dir, func(short string) error {
		// A socket left by a killed daemon of this capture would make bind fail.
		if err := os.Remove(filepath.Join(short, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		var err error
		ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(short, name), Net: "unix"})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", filepath.Join(dir, name), err)
	}
	// Closing would unlink the short name, whose descriptor is gone by then.
	ln.SetUnlinkOnClose(false)
	return &controlListener{UnixListener: ln, path: filepath.Join(dir, name)}, nil
}

// controlListener removes its socket when closed.
type controlListener struct {
	*net.UnixListener
	path string
}

func (l *controlListener) Close() error {
	err := l.UnixListener.Close()
	os.Remove(l.path)
	return err
}

// dialControl connects to a capture's control socket.
func dialControl(ctx context.Context, st *state.Store, captureID string) (net.Conn, error) {
	var c net.Conn
	err := inDir(controlDir(st), func(short string) error {
		var dl net.Dialer
		var err error
		c, err = dl.DialContext(ctx, "unix", filepath.Join(short, socketName(captureID)))
		return err
	})
	return c, err
}

// accept hands each connection to its own reader until the listener
// closes, when it reports why on errc.
func (d *Daemon) accept(ctx context.Context, ln net.Listener, reqs chan<- control, errc chan<- error) {
	for {
		c, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		go d.serveConn(ctx, c, reqs)
	}
}

// serveConn checks a connection's peer and reads its request, bounded in
// size and time, off the daemon's loop; a valid request goes to the loop,
// which answers it and closes c.
func (d *Daemon) serveConn(ctx context.Context, c net.Conn, reqs chan<- control) {
	if err := permittedPeer(c); err != nil {
		d.Log.Warn("capture: control connection refused", "capture", d.ID, "err", err)
		writeReply(c, reply{Error: err.Error()})
		c.Close()
		return
	}
	req, err := readRequest(c)
	if err != nil {
		writeReply(c, reply{Error: "bad request: " + err.Error()})
		c.Close()
		return
	}
	select {
	case reqs <- control{conn: c, req: req}:
	case <-ctx.Done():
		c.Close()
	}
}

// permittedPeer admits root and the daemon's own user.
func permittedPeer(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return errors.New("not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if gerr != nil {
		return fmt.Errorf("peer credentials: %w", gerr)
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Getuid() {
		return fmt.Errorf("refused: uid %d (pid %d) is neither root nor the capture's user", cred.Uid, cred.Pid)
	}
	return nil
}

// readRequest reads one JSON line of at most maxRequest bytes within
// requestTimeout.
func readRequest(c net.Conn) (request, error) {
	var req request
	c.SetReadDeadline(time.Now().Add(requestTimeout))
	line, err := bufio.NewReaderSize(io.LimitReader(c, maxRequest), maxRequest).ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull), errors.Is(err, io.EOF) && len(line) == maxRequest:
		return req, fmt.Errorf("longer than %d bytes", maxRequest)
	case err != nil:
		return req, err
	}
	return req, json.Unmarshal(line, &req)
}

// writeReply sends one reply line; a client that does not read it within
// requestTimeout loses it.
func writeReply(c net.Conn, rep reply) {
	b, _ := json.Marshal(rep)
	c.SetWriteDeadline(time.Now().Add(requestTimeout))
	c.Write(append(b, '\n'))
}

// request and reply are the control protocol: one JSON line each way.
type request struct {
	Op    string `json:"op"` // rotate, stop, status
	Cycle string `json:"cycle,omitempty"`
}

type reply struct {
	Artifacts []string `json:"artifacts,omitempty"`
	Packets   uint64   `json:"packets"`
	Drops     uint64   `json:"drops"`
	// Unwritten counts packets the kernel accepted that a rotate or stop
	// gave up waiting for (the kernel handed nothing over for a second).
	Unwritten uint64 `json:"unwritten,omitempty"`
	Error     string `json:"error,omitempty"`
}

// handle answers one control request, read and checked by serveConn; it
// reports whether the daemon is done.
func (d *Daemon) handle(ctx context.Context, r control, cancel context.CancelFunc, capErr chan error) bool {
	defer r.conn.Close()
	var rep reply
	var err error
	stop := false
	switch req := r.req; {
	case req.Op == "status":
	case req.Op == "rotate":
		if req.Cycle != "" {
			if err := d.update(ctx, func(c *records.Capture) { c.Cycle = req.Cycle }); err != nil {
				rep.Error = err.Error()
				break
			}
		}
		d.drain(ctx)
		rep.Artifacts, err = d.rotate(ctx, "rotate", true)
		if err != nil {
			rep.Error = err.Error()
		}
	case req.Op == "stop":
		// Stop the source first, so that every packet in the ring is
		// written before the last file is closed.
		d.drain(ctx)
		cancel()
		<-capErr
		arts, err := d.rotate(context.WithoutCancel(ctx), "stop", false)
		rep.Artifacts = arts
		d.stopSensors(context.WithoutCancel(ctx))
		rep.Artifacts = append(rep.Artifacts, d.collectSensors(context.WithoutCancel(ctx))...)
		uerr := d.update(context.WithoutCancel(ctx), func(c *records.Capture) {
			c.State = StateStopped
			now := d.St.Now()
			c.StoppedAt = &now
		})
		if err = errors.Join(err, uerr); err != nil {
			rep.Error = err.Error()
		}
		stop = true
	default:
		rep.Error = "unknown op " + req.Op
	}
	d.mu.Lock()
	// Every drop the kernel counted: those of registered files, of queued
	// ones and of the open one.
	rep.Packets, rep.Drops, rep.Unwritten = d.pktsTotal, d.kernDrops, d.unwritten
	d.mu.Unlock()
	writeReply(r.conn, rep)
	return stop
}

// Call sends one request to a capture's daemon and returns its reply.
func Call(ctx context.Context, st *state.Store, captureID string, op, cycle string) (*reply, error) {
	c, err := dialControl(ctx, st, captureID)
	if err != nil {
		return nil, fmt.Errorf("capture %s is not running: %w (%w)", captureID, errNotRunning, err)
	}
	defer c.Close()
	b, _ := json.Marshal(request{Op: op, Cycle: cycle})
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	line, err := bufio.NewReader(io.LimitReader(c, maxReply)).ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("capture %s: no answer: %w", captureID, err)
	}
	var rep reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return nil, err
	}
	if rep.Error != "" {
		return &rep, errors.New(rep.Error)
	}
	return &rep, nil
}

var errNotRunning = errors.New("no daemon")
