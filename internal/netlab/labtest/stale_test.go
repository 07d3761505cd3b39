package labtest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestMain(m *testing.M) {
	ChildMain(labChild)
	os.Exit(m.Run())
}

// childTB is the TB of a Child: it fails by panicking, and runs no cleanup
// (it is to be killed).
type childTB struct{}

func (childTB) Helper()                           {}
func (childTB) Fatal(args ...any)                 { panic(args) }
func (childTB) Fatalf(format string, args ...any) { panic(format) }
func (childTB) Cleanup(func())                    {}
func (childTB) TempDir() string {
	d, err := os.MkdirTemp("", "labtest-child")
	if err != nil {
		panic(err)
	}
	return d
}

// labChild makes a lab and a Waiter naming its directory (as a sinkhole
// service does): the lab's ID and the Waiter's PID.
func labChild(string) ([]string, error) {
	l := New(childTB{})
	pid, err := StartWaiter(filepath.Join(l.Config.Dir, "dnsmasq.conf"))
	return []string{l.ID, strconv.Itoa(pid)}, err
}

// left lists what of a Child's lab is left.
func left(c *Child) []string {
	id := c.Fields[0]
	var left []string
	for _, ns := range []string{id + "h", id + "i"} {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			left = append(left, "netns "+ns)
		}
	}
	if _, err := os.Stat(OwnerPath(id)); err == nil {
		left = append(left, "record "+OwnerPath(id))
	}
	if c.WaiterLeft() {
		left = append(left, "waiter "+strconv.Itoa(c.Waiter))
	}
	return left
}

// TestStaleLabsTakenDown: a test process killed with its lab made (its
// cleanup never runs) leaves the lab's namespaces, its record and a
// process naming its directory; the next lab made takes them down, and
// leaves alone the lab of a test process that still runs.
func TestStaleLabsTakenDown(t *testing.T) {
	Require(t)
	killed, running := StartChild(t, ""), StartChild(t, "")
	if l := left(killed); len(l) != 4 {
		t.Fatalf("the lab of the test process to kill is not all there: %v", l)
	}
	killed.Kill()
	if l := left(killed); len(l) != 4 {
		t.Fatalf("the killed test process's lab went with it: only %v left", l)
	}

	New(t)
	if l := left(killed); len(l) > 0 {
		t.Errorf("left of the killed test process's lab: %v", l)
	}
	if l := left(running); len(l) != 4 {
		t.Errorf("the lab of a test process that runs was taken down: only %v left", l)
	}

	running.Kill()
	ReapStale(context.Background(), "labtest", takeDown)
	if l := left(running); len(l) > 0 {
		t.Errorf("left of the second test process's lab, once killed: %v", l)
	}
}

func TestCommandLineNames(t *testing.T) {
	for _, tc := range []struct {
		cmdline string
		want    bool
	}{
		{"sh\x00-c\x00/tmp/t/001\x00", true},
		{"tb-capture\x00--state=/tmp/t/001/state\x00", true},
		{"tb-capture\x00/tmp/t/0010\x00", false},
		{"x\x00/tmp/t/0010:/tmp/t/001\x00", true},
		{"x\x00/tmp/t/00\x00", false},
	} {
		if got := names([]byte(tc.cmdline), "/tmp/t/001"); got != tc.want {
			t.Errorf("names(%q) = %v", tc.cmdline, got)
		}
	}
}
