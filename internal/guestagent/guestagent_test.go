package guestagent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAgent is a guest agent in memory that answers as qemu-ga does, for
// the protocol's logic; the real agent is driven by the VM tests (image
// smoke tests, tb-lease, cycle.TestRealGuest).
type fakeAgent struct {
	mu      sync.Mutex
	files   map[string][]byte
	handles map[int]*handle
	next    int
	procs   map[int]*proc
	cmds    []string // every command, as sent
	writes  []int    // the size of every guest-file-write
	reads   []int    // the count every guest-file-read asked for
	// notReady is how many more commands are answered ErrNotReady; gone
	// makes every command ErrGone.
	notReady int
	gone     bool
	// statusNotReady is how many more guest-exec-status commands are
	// answered ErrNotReady (libvirt's "Guest agent not available for now"
	// when the agent stalls), and lostExit whether such an answer also
	// makes the agent forget the process, as the late reply of an exit does.
	statusNotReady int
	lostExit       bool
	// reply, when it returns true, replaces the answer to a command.
	reply func(execute string, args map[string]any) (string, bool)
	// clock is the guest's wall clock, nanoseconds since the epoch;
	// guest-set-time sets it and then fails as Debian 12's qemu-ga does
	// without hwclock.
	clock int64
}

type handle struct {
	path  string
	pos   int
	write bool
}

// proc answers "not exited" polls times, then its exit.
type proc struct {
	argv, env []string
	capture   bool
	input     string // input-data, base64
	polls     int
	code, sig int
	out, err  string
}

func newFakeAgent() *fakeAgent {
	return &fakeAgent{files: map[string][]byte{}, handles: map[int]*handle{}, next: 1000, procs: map[int]*proc{}}
}

func ok(v any) (string, error) {
	b, err := json.Marshal(map[string]any{"return": v})
	return string(b), err
}

func (f *fakeAgent) AgentCommand(ctx context.Context, domain, cmd string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return "", err
	}
	f.cmds = append(f.cmds, cmd)
	if f.gone {
		return "", fmt.Errorf("%s: %w", domain, ErrGone)
	}
	if f.notReady > 0 {
		f.notReady--
		return "", fmt.Errorf("%w: Guest agent is not responding: QEMU guest agent is not connected", ErrNotReady)
	}
	var req struct {
		Execute   string         `json:"execute"`
		Arguments map[string]any `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(cmd), &req); err != nil {
		return "", fmt.Errorf("fake agent: bad command %q", cmd)
	}
	if req.Execute == "guest-exec-status" && f.statusNotReady > 0 {
		f.statusNotReady--
		if f.lostExit {
			f.procs = map[int]*proc{}
		}
		return "", fmt.Errorf("%w: Guest agent is not responding: Guest agent not available for now", ErrNotReady)
	}
	if f.reply != nil {
		if r, done := f.reply(req.Execute, req.Arguments); done {
			return r, nil
		}
	}
	a := req.Arguments
	num := func(k string) int { n, _ := a[k].(float64); return int(n) }
	h := f.handles[num("handle")]
	switch req.Execute {
	case "guest-ping":
		return ok(map[string]any{})
	case "guest-get-time":
		return ok(f.clock)
	case "guest-set-time":
		t, isNum := a["time"].(float64)
		if !isNum {
			return "", fmt.Errorf("fake agent: guest-set-time without a time: %v", a)
		}
		f.clock = int64(t)
		return "", errors.New("internal error: hwclock failed to set hardware clock to system time")
	case "guest-file-open":
		path, mode := a["path"].(string), a["mode"].(string)
		switch mode {
		case "w":
			f.files[path] = nil
		case "r":
			if _, found := f.files[path]; !found {
				return "", fmt.Errorf("unable to execute QEMU agent command 'guest-file-open': failed to open file '%s' (mode: 'r'): No such file or directory", path)
			}
		default:
			return "", fmt.Errorf("fake agent: mode %q", mode)
		}
		f.next++
		f.handles[f.next] = &handle{path: path, write: mode == "w"}
		return ok(f.next)
	case "guest-file-write":
		if h == nil || !h.write {
			return "", errors.New("fake agent: bad handle")
		}
		b, err := base64.StdEncoding.DecodeString(a["buf-b64"].(string))
		if err != nil {
			return "", err
		}
		f.writes = append(f.writes, len(b))
		f.files[h.path] = append(f.files[h.path], b...)
		return ok(map[string]any{"count": len(b), "eof": false})
	case "guest-file-seek":
		if h == nil || a["whence"] != "set" {
			return "", fmt.Errorf("fake agent: bad seek %v", a)
		}
		h.pos = num("offset")
		return ok(map[string]any{"position": h.pos, "eof": false})
	case "guest-file-read":
		if h == nil || h.write {
			return "", errors.New("fake agent: bad handle")
		}
		n := num("count")
		f.reads = append(f.reads, n)
		data := f.files[h.path]
		b := data[min(h.pos, len(data)):min(h.pos+n, len(data))]
		h.pos += len(b)
		return ok(map[string]any{"count": len(b), "buf-b64": base64.StdEncoding.EncodeToString(b), "eof": h.pos >= len(data)})
	case "guest-file-close":
		if h == nil {
			return "", errors.New("fake agent: bad handle")
		}
		delete(f.handles, num("handle"))
		return ok(map[string]any{})
	case "guest-exec":
		var p proc
		for _, s := range a["arg"].([]any) {
			p.argv = append(p.argv, s.(string))
		}
		if env, found := a["env"].([]any); found {
			for _, s := range env {
				p.env = append(p.env, s.(string))
			}
		}
		p.capture, _ = a["capture-output"].(bool)
		p.input, _ = a["input-data"].(string)
		prog := a["path"].(string)
		switch prog {
		case "/bin/slow": // exits 3 after some polls, with output
			p.polls, p.code, p.out, p.err = 4, 3, "mips\n", "warn\n"
		case "/bin/killed":
			p.polls, p.sig = 1, 9
		case "/bin/hang":
			p.polls = 1 << 30
		}
		f.next++
		f.procs[f.next] = &p
		return ok(map[string]any{"pid": f.next})
	case "guest-exec-status":
		pid := num("pid")
		p := f.procs[pid]
		if p == nil {
			return "", fmt.Errorf("unable to execute QEMU agent command 'guest-exec-status': Invalid parameter 'pid'")
		}
		if p.polls > 0 {
			p.polls--
			return ok(map[string]any{"exited": false})
		}
		delete(f.procs, pid) // qemu-ga forgets a process once it reported its exit
		st := map[string]any{"exited": true}
		if p.sig != 0 {
			st["signal"] = p.sig
		} else {
			st["exitcode"] = p.code
		}
		if p.capture {
			st["out-data"] = base64.StdEncoding.EncodeToString([]byte(p.out))
			st["err-data"] = base64.StdEncoding.EncodeToString([]byte(p.err))
		}
		return ok(st)
	case "guest-network-get-interfaces":
		return `{"return":[{"name":"lo","hardware-address":"00:00:00:00:00:00","ip-addresses":[{"ip-address-type":"ipv4","ip-address":"127.0.0.1","prefix":8}]},{"name":"eth0","hardware-address":"52:54:00:00:00:01","ip-addresses":[{"ip-address-type":"ipv4","ip-address":"10.13.37.10","prefix":24},{"ip-address-type":"ipv6","ip-address":"fe80::1","prefix":64}]}]}`, nil
	}
	return "", fmt.Errorf("fake agent: unknown command %s", req.Execute)
}

// allClosed fails t if a file handle was left open.
func (f *fakeAgent) allClosed(t *testing.T, when string) {
	t.Helper()
	if len(f.handles) != 0 {
		t.Fatalf("%s: handles left open: %v", when, f.handles)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// agentWithFile is a client of a fake agent whose guest holds n random
// bytes at path.
func agentWithFile(t *testing.T, path string, n int) (context.Context, *fakeAgent, *Client, []byte) {
	f := newFakeAgent()
	data := randomBytes(n)
	f.files[path] = data
	return testCtx(t), f, New(f, "g"), data
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.IntN(256))
	}
	return b
}

// errReader gives n bytes, then fails.
type errReader struct{ n int }

func (r *errReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, errors.New("disk on fire")
	}
	k := min(len(p), r.n)
	r.n -= k
	return k, nil
}

func TestWriteFileInChunks(t *testing.T) {
	ctx := testCtx(t)
	f := newFakeAgent()
	c := New(f, "g")
	for _, size := range []int{0, 1, Chunk - 1, Chunk, Chunk + 1, 5*Chunk/2 + 7} {
		f.writes = nil
		data := randomBytes(size)
		n, err := c.WriteFile(ctx, "/tmp/x", bytes.NewReader(data))
		if err != nil || n != int64(size) {
			t.Fatalf("%d bytes: wrote %d, %v", size, n, err)
		}
		if !bytes.Equal(f.files["/tmp/x"], data) {
			t.Fatalf("%d bytes: the guest's file differs", size)
		}
		want := (size + Chunk - 1) / Chunk
		if len(f.writes) != want {
			t.Fatalf("%d bytes in %d writes %v, want %d", size, len(f.writes), f.writes, want)
		}
		for i, w := range f.writes {
			if w > Chunk || (i < len(f.writes)-1 && w != Chunk) {
				t.Fatalf("%d bytes: writes %v (Chunk %d)", size, f.writes, Chunk)
			}
		}
	}
	// Every command, a full chunk's write too, fits in one argument of
	// virsh, with a handle number as long as any.
	f.next = 1 << 40
	if _, err := c.WriteFile(ctx, "/tmp/x", bytes.NewReader(randomBytes(Chunk))); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range f.cmds {
		if len(cmd) > maxArg {
			t.Fatalf("a %d-byte command does not fit in one argument of virsh (%d bytes)", len(cmd), maxArg)
		}
	}
	f.allClosed(t, "writes")
}

func TestWriteFileFailures(t *testing.T) {
	ctx := testCtx(t)
	f := newFakeAgent()
	c := New(f, "g")

	// The reader fails after a chunk: the error says so, the handle is closed.
	n, err := c.WriteFile(ctx, "/tmp/x", &errReader{n: Chunk + 10})
	if err == nil || !strings.Contains(err.Error(), "disk on fire") || n != Chunk+10 {
		t.Fatalf("reader failing: %d %v", n, err)
	}
	f.allClosed(t, "reader failing")

	// A short write (a full guest disk) is an error.
	f.reply = func(execute string, args map[string]any) (string, bool) {
		if execute != "guest-file-write" {
			return "", false
		}
		return `{"return":{"count":3,"eof":false}}`, true
	}
	if _, err := c.WriteFile(ctx, "/tmp/x", strings.NewReader("hello")); err == nil || !strings.Contains(err.Error(), "short write (3 of 5 bytes)") {
		t.Fatalf("short write: %v", err)
	}
	f.allClosed(t, "short write")

	// Cancelled while writing: the handle is still closed.
	cctx, cancel := context.WithCancel(ctx)
	f.reply = func(execute string, args map[string]any) (string, bool) {
		if execute == "guest-file-write" {
			cancel()
		}
		return "", false
	}
	if _, err := c.WriteFile(cctx, "/tmp/x", bytes.NewReader(randomBytes(3*Chunk))); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	f.allClosed(t, "cancelled")
}

func TestReadFileAt(t *testing.T) {
	ctx, f, c, data := agentWithFile(t, "/var/log/x", 3*Chunk+5)
	for _, r := range []struct {
		off int64
		max int
	}{{0, len(data) + 100}, {0, 10}, {10, 2*Chunk + 3}, {int64(Chunk), Chunk}, {int64(len(data)) - 1, 100}, {int64(len(data)), 100}, {int64(len(data)) + 50, 100}} {
		f.reads = nil
		got, err := c.ReadFileAt(ctx, "/var/log/x", r.off, r.max)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		want := data[min(int(r.off), len(data)):min(int(r.off)+r.max, len(data))]
		if !bytes.Equal(got, want) {
			t.Fatalf("%+v: read %d bytes, want %d (or other bytes)", r, len(got), len(want))
		}
		for _, n := range f.reads {
			if n > Chunk || n <= 0 {
				t.Fatalf("%+v: asked for %v", r, f.reads)
			}
		}
	}
	f.allClosed(t, "reads")
	if _, err := c.ReadFileAt(ctx, "/nope", 0, 10); err == nil || !strings.Contains(err.Error(), "guest-file-open /nope") || !strings.Contains(err.Error(), "No such file") {
		t.Fatalf("missing file: %v", err)
	}

	for name, reply := range map[string]string{
		"bad base64":    `{"return":{"count":4,"buf-b64":"!!!!","eof":true}}`,
		"count differs": `{"return":{"count":4,"buf-b64":"aGk=","eof":true}}`,
		"not JSON":      `{"return":{"count":`,
		// A hostile agent's: more than was asked for (10 bytes), which a
		// read's bound would not hold.
		"more than asked": `{"return":{"count":12,"buf-b64":"` + base64.StdEncoding.EncodeToString(make([]byte, 12)) + `","eof":false}}`,
	} {
		f.reply = func(execute string, args map[string]any) (string, bool) { return reply, execute == "guest-file-read" }
		if _, err := c.ReadFileAt(ctx, "/var/log/x", 0, 10); err == nil || !strings.Contains(err.Error(), "guest-file-read /var/log/x") {
			t.Errorf("%s: %v", name, err)
		}
		f.allClosed(t, name)
	}
}

// TestReadFileAtAsksAgainAnAgentThatStalls: a read rides over an agent
// that stops answering for a while, and an agent that stays away costs the
// client one grace, not one a read.
func TestReadFileAtAsksAgainAnAgentThatStalls(t *testing.T) {
	ctx, f, c, data := agentWithFile(t, "/var/tmp/out", 2*Chunk+7)
	f.notReady = 3
	if got, err := c.ReadFileAt(ctx, "/var/tmp/out", 0, len(data)); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after 3 unanswered commands: %d bytes, %v", len(got), err)
	}
	f.allClosed(t, "after a stall")

	// Stalled between two reads of one file (its second read and the
	// close unanswered): the read starts again from its open.
	stalled := false
	f.reply = func(execute string, args map[string]any) (string, bool) {
		if execute == "guest-file-read" && !stalled {
			stalled, f.notReady = true, 2
		}
		return "", false
	}
	f.reads = nil
	if got, err := c.ReadFileAt(ctx, "/var/tmp/out", 5, Chunk+1); err != nil || !bytes.Equal(got, data[5:5+Chunk+1]) || len(f.reads) != 3 {
		t.Fatalf("stalled mid-read: %d bytes, %v, reads %v", len(got), err, f.reads)
	}
	f.reply = nil

	// An agent that stays away fails the read when the grace ends, and
	// the next read at once.
	c.grace = 300 * time.Millisecond
	f.notReady = 1 << 30
	if _, err := c.ReadFileAt(ctx, "/var/tmp/out", 0, 10); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "no answer for") {
		t.Fatalf("an agent that never answers again: %v", err)
	}
	sent := len(f.cmds)
	if _, err := c.ReadFileAt(ctx, "/var/tmp/out", 0, 10); !errors.Is(err, ErrNotReady) || len(f.cmds) != sent+1 {
		t.Fatalf("the next read: %v after %d commands, want 1", err, len(f.cmds)-sent)
	}
	// Once it answers again, its silence is over.
	f.notReady = 0
	if _, err := c.ReadFileAt(ctx, "/var/tmp/out", 0, 10); err != nil {
		t.Fatal(err)
	}
	f.notReady = 1
	if _, err := c.ReadFileAt(ctx, "/var/tmp/out", 0, 10); err != nil {
		t.Fatalf("a new stall after the agent answered: %v", err)
	}
}

func TestRun(t *testing.T) {
	ctx := testCtx(t)
	f := newFakeAgent()
	c := New(f, "g")

	r, err := c.Run(ctx, "/bin/slow", "-m")
	if err != nil || r.ExitCode != 3 || string(r.Stdout) != "mips\n" || string(r.Stderr) != "warn\n" {
		t.Fatalf("run: %+v %v", r, err)
	}
	var polls int
	for _, cmd := range f.cmds {
		if strings.Contains(cmd, "guest-exec-status") {
			polls++
		}
	}
	if polls != 5 {
		t.Fatalf("%d status queries for a process that exits at the 5th", polls)
	}
	if !strings.Contains(f.cmds[0], `"arg":["-m"]`) || !strings.Contains(f.cmds[0], `"capture-output":true`) || strings.Contains(f.cmds[0], `"env"`) {
		t.Fatalf("guest-exec sent %s", f.cmds[0])
	}

	if r, err := c.Run(ctx, "/bin/killed"); err != nil || r.ExitCode != 128+9 {
		t.Fatalf("killed by SIGKILL: %+v %v", r, err)
	}
	if _, err := c.Run(ctx); err == nil {
		t.Fatal("an empty command ran")
	}

	// Waiting ends with ctx; the error says what was run.
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.Run(cctx, "/bin/hang"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "guest-exec /bin/hang") {
		t.Fatalf("hanging: %v", err)
	}

	// Output that is not base64 is an error, not empty output.
	f.reply = func(execute string, args map[string]any) (string, bool) {
		return `{"return":{"exited":true,"exitcode":0,"out-data":"!!"}}`, execute == "guest-exec-status"
	}
	if _, err := c.Run(ctx, "/bin/true"); err == nil || !strings.Contains(err.Error(), "stdout") {
		t.Fatalf("bad output: %v", err)
	}
	// An agent that lost the process (it restarted) is an error.
	f.reply = func(execute string, args map[string]any) (string, bool) {
		if execute == "guest-exec-status" {
			f.procs = map[int]*proc{}
		}
		return "", false
	}
	if _, err := c.Run(ctx, "/bin/true"); err == nil || !strings.Contains(err.Error(), "Invalid parameter 'pid'") {
		t.Fatalf("lost process: %v", err)
	}
}

// TestRunAsksAgainAnAgentThatStalls: Run's wait for the exit rides over a
// stalled agent for the client's grace (the real stall, QEMU stopped under
// a live libvirt, is cycle.TestRealGuest's "an agent that stalls").
func TestRunAsksAgainAnAgentThatStalls(t *testing.T) {
	ctx := testCtx(t)
	f := newFakeAgent()
	c := New(f, "g")
	f.statusNotReady = 3
	r, err := c.Run(ctx, "/bin/slow", "-m")
	if err != nil || r.ExitCode != 3 || string(r.Stdout) != "mips\n" {
		t.Fatalf("after 3 unanswered queries: %+v %v", r, err)
	}
	if n := strings.Count(strings.Join(f.cmds, "\n"), "guest-exec-status"); n != 3+5 {
		t.Fatalf("%d status queries, want 3 unanswered and 5 answered", n)
	}

	// An agent that stays away fails Run when the grace ends.
	c.grace = 300 * time.Millisecond
	f.statusNotReady = 1 << 30
	if _, err := c.Run(ctx, "/bin/true"); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "no answer for") {
		t.Fatalf("an agent that never answers again: %v", err)
	}

	// An exit whose answer was lost is not taken for a process still
	// running: the agent has forgotten the process, and Run says so.
	f.statusNotReady, f.lostExit = 1, true
	c.grace = Grace
	if _, err := c.Run(ctx, "/bin/true"); !errors.Is(err, ErrExitLost) || !strings.Contains(err.Error(), "Invalid parameter 'pid'") {
		t.Fatalf("lost exit: %v", err)
	}
	// A process the agent never knew is not a lost exit.
	f.reply = func(execute string, args map[string]any) (string, bool) {
		if execute == "guest-exec" {
			r, _ := ok(map[string]any{"pid": 4242})
			return r, true
		}
		return "", false
	}
	if _, err := c.Run(ctx, "/bin/true"); err == nil || errors.Is(err, ErrExitLost) {
		t.Fatalf("an unknown process without an unanswered query: %v", err)
	}
	f.reply = nil

	// RunRepeatable runs again a command whose exit was lost: once lost,
	// the second run answers.
	f.statusNotReady, f.cmds = 1, nil
	r, err = c.RunRepeatable(ctx, "/bin/slow", "-m")
	if err != nil || r.ExitCode != 3 || string(r.Stdout) != "mips\n" {
		t.Fatalf("RunRepeatable after a lost exit: %+v %v", r, err)
	}
	if n := strings.Count(strings.Join(f.cmds, "\n"), `"guest-exec"`); n != 2 {
		t.Fatalf("%d runs, want 2", n)
	}
	// ... at most three times.
	f.cmds = nil
	f.reply = func(execute string, args map[string]any) (string, bool) {
		if execute == "guest-exec" {
			f.statusNotReady = 1 // every run's exit is lost
		}
		return "", false
	}
	if _, err := c.RunRepeatable(ctx, "/bin/true"); !errors.Is(err, ErrExitLost) {
		t.Fatalf("an exit lost every time: %v", err)
	}
	if n := strings.Count(strings.Join(f.cmds, "\n"), `"guest-exec"`); n != 3 {
		t.Fatalf("%d runs, want 3", n)
	}
}

func TestSpawnAndStatus(t *testing.T) {
	ctx := testCtx(t)
	f := newFakeAgent()
	c := New(f, "g")
	pid, err := c.Spawn(ctx, []string{"/bin/killed", "a b"}, []string{"PATH=/bin", "FOO=bar"}, []byte("key\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := f.procs[pid]
	if p.capture || strings.Join(p.argv, "|") != "a b" || strings.Join(p.env, "|") != "PATH=/bin|FOO=bar" || p.input != "a2V5Cg==" {
		t.Fatalf("spawned %+v", p)
	}
	st, err := c.Status(ctx, pid)
	if err != nil || st.Exited {
		t.Fatalf("first status: %+v %v", st, err)
	}
	st, err = c.Status(ctx, pid)
	if err != nil || !st.Exited || st.Signal != 9 || st.Code() != 137 {
		t.Fatalf("second status: %+v %v", st, err)
	}
	if _, err := c.Status(ctx, pid); err == nil {
		t.Fatal("the agent answered for a process it forgot")
	}
	if (Proc{Exited: true, ExitCode: 2}).Code() != 2 {
		t.Fatal("Code of an exit")
	}
	f.reply = func(execute string, args map[string]any) (string, bool) { return `{"return":{}}`, true }
	if _, err := c.Spawn(ctx, []string{"/bin/x"}, nil, nil); err == nil {
		t.Fatal("a reply without a pid was taken")
	}
}

func TestReplies(t *testing.T) {
	ctx := testCtx(t)
	f := newFakeAgent()
	c := New(f, "g")
	for name, tc := range map[string]struct{ reply, want string }{
		"agent error": {`{"error":{"class":"GenericError","desc":"Guest agent command failed"}}`, "guest-ping: GenericError: Guest agent command failed"},
		"not JSON":    {`<html>`, `guest-ping: bad reply "<html>"`},
		"no return":   {`{}`, `guest-ping: bad reply "{}"`},
		"long":        {strings.Repeat("x", 10000), "…"},
	} {
		f.reply = func(string, map[string]any) (string, bool) { return tc.reply, true }
		if err := c.Ping(ctx); err == nil || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 300 {
			t.Errorf("%s: %v", name, err)
		}
	}
	f.reply = nil
	f.gone = true
	if err := c.Ping(ctx); !errors.Is(err, ErrGone) {
		t.Fatalf("gone: %v", err)
	}
	f.gone = false
	f.reply = func(execute string, args map[string]any) (string, bool) {
		return `{"return":{"count":1}}`, execute == "guest-file-open"
	}
	if _, err := c.ReadFileAt(ctx, "/x", 0, 1); err == nil {
		t.Fatal("a handle that is not a number was taken")
	}
}

func TestWait(t *testing.T) {
	ctx := testCtx(t)
	f := newFakeAgent()
	c := New(f, "g")
	f.notReady = 3
	if err := c.Wait(ctx); err != nil || len(f.cmds) != 4 {
		t.Fatalf("%v after %d pings", err, len(f.cmds))
	}

	// Waiting ends with ctx; an error other than "not ready" is kept for
	// then.
	f.notReady = 1 << 30
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := c.Wait(sctx); !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "last agent error") {
		t.Fatalf("never ready: %v", err)
	}
	f.notReady = 0
	f.reply = func(string, map[string]any) (string, bool) { return "garbage", true }
	sctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := c.Wait(sctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `last agent error: guest-ping: bad reply "garbage"`) {
		t.Fatalf("bad replies: %v", err)
	}

	// A guest that is gone is said at once.
	f.reply, f.gone = nil, true
	start := time.Now()
	if err := c.Wait(ctx); !errors.Is(err, ErrGone) || time.Since(start) > 5*time.Second {
		t.Fatalf("gone: %v after %s", err, time.Since(start))
	}
}

func TestInterfaces(t *testing.T) {
	ctx := testCtx(t)
	c := New(newFakeAgent(), "g")
	ifs, err := c.Interfaces(ctx)
	if err != nil || len(ifs) != 2 || ifs[1].Name != "eth0" || ifs[1].MAC != "52:54:00:00:00:01" || strings.Join(ifs[1].Addresses, " ") != "10.13.37.10/24 fe80::1/64" {
		t.Fatalf("interfaces: %+v %v", ifs, err)
	}
	addrs, err := c.Addresses(ctx)
	if err != nil || strings.Join(addrs, " ") != "127.0.0.1/8 10.13.37.10/24 fe80::1/64" {
		t.Fatalf("addresses: %v %v", addrs, err)
	}
}

// TestClock: the guest's clock is read and set through the agent; a set
// that qemu-ga reports failed after setting it (no hwclock) is an error
// the caller checks with a read; a reply that is no time in nanoseconds
// is an error, never a time.
func TestClock(t *testing.T) {
	ctx := context.Background()
	fa := newFakeAgent()
	fa.clock = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	c := New(fa, "g")
	got, err := c.Clock(ctx)
	if err != nil || !got.Equal(time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("Clock: %v, %v", got, err)
	}
	want := time.Now()
	if err := c.SetClock(ctx, want); err == nil || !strings.Contains(err.Error(), "hwclock") {
		t.Errorf("SetClock: %v, want the agent's hwclock error", err)
	}
	if got, err := c.Clock(ctx); err != nil || got.Sub(want).Abs() > time.Microsecond {
		t.Errorf("the clock after SetClock: %v (%v), want %v", got, err, want)
	}
	for _, reply := range []string{`{"return":1.5e30}`, `{"return":"now"}`, `{"return":1.5}`, `{"return":{}}`} {
		fa.reply = func(execute string, _ map[string]any) (string, bool) { return reply, execute == "guest-get-time" }
		if got, err := c.Clock(ctx); err == nil {
			t.Errorf("reply %s: %v, want an error", reply, got)
		}
	}
}
