package leasetest

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
)

func TestMain(m *testing.M) {
	labtest.ChildMain(labChild)
	os.Exit(m.Run())
}

// labChild brings up a lab on the state directory dir and a Waiter naming
// dir (as a capture daemon does): the lab's tag and bridge, and the
// Waiter's PID.
func labChild(dir string) ([]string, error) {
	l, err := UpLab(context.Background(), dir, "", "", netip.Prefix{})
	if err != nil {
		return nil, err
	}
	pid, err := labtest.StartWaiter(filepath.Join(dir, "captures"))
	return []string{l.tag, l.Bridge, strconv.Itoa(pid)}, err
}

// left lists what of a Child's lab is left.
func left(c *labtest.Child) []string {
	tag, bridge := c.Fields[0], c.Fields[1]
	var left []string
	if _, err := netlink.LinkByName(bridge); err == nil {
		left = append(left, "bridge "+bridge)
	}
	if exec.Command("nft", "list", "table", "inet", "talkboxlt"+tag).Run() == nil {
		left = append(left, "table inet talkboxlt"+tag)
	}
	if _, err := os.Stat("/run/netns/tblts" + tag); err == nil {
		left = append(left, "netns tblts"+tag)
	}
	if _, err := os.Stat(labtest.OwnerPath(tag)); err == nil {
		left = append(left, "record "+labtest.OwnerPath(tag))
	}
	if c.WaiterLeft() {
		left = append(left, "waiter "+strconv.Itoa(c.Waiter))
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
	killed, running := labtest.StartChild(t, t.TempDir()), labtest.StartChild(t, t.TempDir())
	if l := left(killed); len(l) != 5 {
		t.Fatalf("the lab of the test process to kill is not all up: %v", l)
	}
	killed.Kill()
	if l := left(killed); len(l) != 5 {
		t.Fatalf("the killed test process's lab went with it: only %v left", l)
	}

	lab, err := UpLab(context.Background(), t.TempDir(), "", "", netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Down()
	if l := left(killed); len(l) > 0 {
		t.Errorf("left of the killed test process's lab: %v", l)
	}
	if l := left(running); len(l) != 5 {
		t.Errorf("the lab of a test process that runs was taken down: only %v left", l)
	}

	running.Kill()
	lock, err := lockNets()
	if err != nil {
		t.Fatal(err)
	}
	labtest.ReapStale(context.Background(), ownerKind, takeDown)
	lock.Close()
	if l := left(running); len(l) > 0 {
		t.Errorf("left of the second test process's lab, once killed: %v", l)
	}
}
