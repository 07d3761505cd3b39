package capture_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// controlChildEnv names the socket a re-executed test binary (running as
// another user) sends a stop request to; see TestMain.
const controlChildEnv = "TALKBOX_TEST_CONTROL_SOCKET"

func TestMain(m *testing.M) {
	if sock := os.Getenv(controlChildEnv); sock != "" {
		os.Exit(controlChild(sock))
	}
	os.Exit(m.Run())
}

// controlChild asks the daemon at sock to stop and prints what happened:
// "dial: ERROR" or the reply line.
func controlChild(sock string) int {
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Println("dial:", err)
		return 0
	}
	defer c.Close()
	fmt.Fprintln(c, `{"op":"stop"}`)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Println("read:", err)
		return 0
	}
	fmt.Print(line)
	return 0
}

// asNobody runs the test binary as uid 65534 against the socket, with caps
// as its ambient capabilities, and returns what it printed.
func asNobody(t *testing.T, sock string, caps ...uintptr) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// go test's build directory is private to root: nobody runs a copy.
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "child")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	// The child reaches the socket through a descriptor of its directory,
	// as the daemon's own clients do (a path may exceed 107 bytes), so the
	// state directory's own modes do not hide it.
	dfd, err := unix.Open(filepath.Dir(sock), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	df := os.NewFile(uintptr(dfd), "control dir")
	defer df.Close()
	cmd := exec.Command(bin)
	cmd.ExtraFiles = []*os.File{df}
	cmd.Env = []string{controlChildEnv + "=/proc/self/fd/3/" + filepath.Base(sock)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}, AmbientCaps: caps}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child as nobody: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestControlRefusesOtherUsers: another local user can neither reach a
// capture's control socket (its directory is private) nor, with the
// permission checks bypassed (CAP_DAC_OVERRIDE), have a stop obeyed
// (SO_PEERCRED): the capture keeps running.
func TestControlRefusesOtherUsers(t *testing.T) {
	l := newLink(t)
	r := startDaemon(t, l, t.TempDir(), "udp dst port 9")
	ctx := context.Background()
	sock := capture.ControlSocket(r.st, r.rec.ID)

	if out := asNobody(t, sock); !strings.HasPrefix(out, "dial:") || !strings.Contains(out, "permission denied") {
		t.Fatalf("nobody reached the control socket: %s", out)
	}
	out := asNobody(t, sock, unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH)
	var rep struct{ Error string }
	if err := json.Unmarshal([]byte(out), &rep); err != nil || !strings.Contains(rep.Error, "refused: uid 65534") {
		t.Fatalf("nobody with CAP_DAC_OVERRIDE: %s", out)
	}
	var c records.Capture
	if err := r.st.Get(r.rec.ID, &c); err != nil || c.State != capture.StateRunning {
		t.Fatalf("capture after nobody's stop: %s %v", c.State, err)
	}
	if _, err := capture.Call(ctx, r.st, r.rec.ID, "stop", ""); err != nil {
		t.Fatal(err)
	}
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
}

// TestControlBoundedRequests: a client that never finishes its request
// line and one that sends an endless one hold up neither the capture nor
// its other clients: packets sent meanwhile are captured and a rotate is
// answered while the first client is still being read; the second is cut
// off after a bounded read.
func TestControlBoundedRequests(t *testing.T) {
	l := newLink(t)
	r := startDaemon(t, l, t.TempDir(), "udp dst port 9")
	ctx := context.Background()

	slow, err := capture.DialControl(ctx, r.st, r.rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := io.WriteString(slow, `{"op":"st`); err != nil {
		t.Fatal(err)
	}

	flood, err := capture.DialControl(ctx, r.st, r.rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Close()
	// The daemon must stop reading long before 64 MiB: the write fails
	// once it closes the connection.
	if _, err := flood.Write(bytes.Repeat([]byte{'x'}, 64<<20)); err == nil {
		t.Fatal("the daemon read a 64 MiB request line")
	}
	if line, _ := bufio.NewReader(flood).ReadString('\n'); !strings.Contains(line, "longer than") {
		t.Fatalf("reply to the flood: %q", line)
	}

	l.send(t, 200, "busy")
	arts, err := capture.Rotate(ctx, r.st, r.rec, "")
	if err != nil || len(arts) != 1 {
		t.Fatalf("rotate beside a stalled client: %v %v", arts, err)
	}
	if payloads, _ := readPcap(t, r.st, arts[0]); len(payloads) != 200 {
		t.Fatalf("%d of 200 datagrams captured beside a stalled client", len(payloads))
	}
	// The rotate was answered while the stalled client was still being
	// read: it can finish its request and have it answered.
	if _, err := io.WriteString(slow, "atus\"}\n"); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Packets uint64
		Error   string
	}
	line, err := bufio.NewReader(slow).ReadString('\n')
	if err != nil || json.Unmarshal([]byte(line), &rep) != nil || rep.Error != "" || rep.Packets < 200 {
		t.Fatalf("the stalled client, finishing after the rotate: %q %v", line, err)
	}
	if _, err := capture.Call(ctx, r.st, r.rec.ID, "stop", ""); err != nil {
		t.Fatal(err)
	}
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
}
