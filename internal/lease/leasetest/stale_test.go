package leasetest

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
)

// childEnv makes the test binary a test process that brings up a lab and
// waits to be killed (TestStaleLabTakenDown).
const childEnv = "TB_LEASETEST_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		os.Exit(labChild(dir))
	}
	os.Exit(m.Run())
}

// labChild brings up a lab on the state directory dir, starts a process
// naming dir that outlives it (as a capture daemon does), prints the lab's
// tag, bridge and that process's PID, and waits.
func labChild(dir string) int {
	l, err := UpLab(context.Background(), dir, "", "", netip.Prefix{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	daemon := exec.Command("/bin/sh", "-c", "sleep 600; :", "tb-capture", filepath.Join(dir, "captures"))
	daemon.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := daemon.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(l.tag, l.Bridge, daemon.Process.Pid)
	select {}
}

type child struct {
	cmd         *exec.Cmd
	tag, bridge string
	daemon      int
	stateDir    string
}

func startChild(t *testing.T) *child {
	t.Helper()
	c := &child{stateDir: t.TempDir()}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childEnv+"="+c.stateDir)
	c.cmd.Stderr = os.Stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.cmd.Process.Kill(); c.cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 3 {
		t.Fatalf("the child test process said %q: %v", line, err)
	}
	c.tag, c.bridge = f[0], f[1]
	c.daemon, _ = strconv.Atoi(f[2])
	t.Cleanup(func() { syscall.Kill(c.daemon, syscall.SIGKILL) })
	return c
}

// left lists what of the child's lab is left.
func (c *child) left() []string {
	var left []string
	if _, err := netlink.LinkByName(c.bridge); err == nil {
		left = append(left, "bridge "+c.bridge)
	}
	if exec.Command("nft", "list", "table", "inet", "talkboxlt"+c.tag).Run() == nil {
		left = append(left, "table inet talkboxlt"+c.tag)
	}
	if _, err := os.Stat("/run/netns/tblts" + c.tag); err == nil {
		left = append(left, "netns tblts"+c.tag)
	}
	if _, err := os.Stat(ownerPath(c.tag)); err == nil {
		left = append(left, "record "+ownerPath(c.tag))
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(c.daemon) + "/stat"); err == nil && !strings.Contains(string(b), ") Z ") {
		left = append(left, "daemon "+strconv.Itoa(c.daemon))
	}
	return left
}

// TestStaleLabTakenDown: a test process killed with its lab up (its
// cleanup never runs) leaves the lab, its record and a process on its
// state; the next lab brought up takes them down, and leaves alone the
// lab of a test process that still runs.
func TestStaleLabTakenDown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (bridges, namespaces, nftables); run it with make test")
	}
	killed, running := startChild(t), startChild(t)
	if left := killed.left(); len(left) != 5 {
		t.Fatalf("the lab of the test process to kill is not all up: %v", left)
	}
	killed.cmd.Process.Kill()
	killed.cmd.Wait()
	if left := killed.left(); len(left) != 5 {
		t.Fatalf("the killed test process's lab went with it: only %v left", left)
	}

	l, err := UpLab(context.Background(), t.TempDir(), "", "", netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Down()
	if left := killed.left(); len(left) > 0 {
		t.Errorf("left of the killed test process's lab: %v", left)
	}
	if left := running.left(); len(left) != 5 {
		t.Errorf("the lab of a test process that runs was taken down: only %v left", left)
	}

	running.cmd.Process.Kill()
	running.cmd.Wait()
	lock, err := lockNets()
	if err != nil {
		t.Fatal(err)
	}
	reapStale(context.Background())
	lock.Close()
	if left := running.left(); len(left) > 0 {
		t.Errorf("left of the second test process's lab, once killed: %v", left)
	}
}
