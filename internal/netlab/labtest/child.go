package labtest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
)

// The tests of ReapStale (here and in leasetest) run the test binary again
// as the test process that is killed with its lab up (a Child), and as the
// daemon such a test leaves running (a Waiter): their TestMain calls
// ChildMain first.

// childEnv carries what a Child is given; waiterEnv marks a Waiter.
const (
	childEnv  = "TB_LABTEST_CHILD"
	waiterEnv = "TB_LABTEST_WAITER"
)

// ChildMain runs the test binary as a Waiter (it waits to be killed) or a
// Child (it runs child with what StartChild gave it, prints the fields it
// returns on one line and waits to be killed); it returns when the binary
// is neither, for TestMain to run the tests.
func ChildMain(child func(arg string) ([]string, error)) {
	if os.Getenv(waiterEnv) != "" {
		select {}
	}
	arg, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	fields, err := child(arg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(strings.Join(fields, " "))
	select {}
}

// StartWaiter starts a Waiter, in a session of its own, whose command line
// names path: one process (a shell would leave its sleep behind), as a
// daemon a test started on its lab. It returns its PID.
func StartWaiter(path string) (int, error) {
	w := exec.Command(os.Args[0], path)
	w.Env = append(os.Environ(), waiterEnv+"=1")
	w.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := w.Start(); err != nil {
		return 0, err
	}
	return w.Process.Pid, nil
}

// Child is a test process started by StartChild.
type Child struct {
	Cmd    *exec.Cmd
	Fields []string // what it printed
	Waiter int      // the PID of the Waiter it started: its last field
}

// StartChild runs the test binary as a Child given arg and reads the line
// it prints; the test's cleanup kills it and its Waiter.
func StartChild(t TB, arg string) *Child {
	t.Helper()
	c := &Child{Cmd: exec.Command(os.Args[0], "-test.run=^$")}
	c.Cmd.Env = append(os.Environ(), childEnv+"="+arg)
	c.Cmd.Stderr = os.Stderr
	out, err := c.Cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Cmd.Process.Kill(); c.Cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	c.Fields = strings.Fields(line)
	if err != nil || len(c.Fields) < 2 {
		t.Fatalf("the child test process said %q: %v", line, err)
	}
	c.Waiter, _ = strconv.Atoi(c.Fields[len(c.Fields)-1])
	t.Cleanup(func() { syscall.Kill(c.Waiter, syscall.SIGKILL) })
	return c
}

// Kill kills the Child (not its Waiter) and waits for its end.
func (c *Child) Kill() {
	c.Cmd.Process.Kill()
	c.Cmd.Wait()
}

// WaiterLeft reports whether the Child's Waiter still runs (a zombie has
// ended).
func (c *Child) WaiterLeft() bool {
	_, ok := netlab.ProcStart(c.Waiter)
	return ok
}
