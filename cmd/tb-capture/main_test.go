package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/clitest"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"tb-capture": main})
}

// TestScripts runs the CLI for real as root: each script gets its own lab
// (namespaces, bridge, tables with unique names) from the mklab command.
func TestScripts(t *testing.T) {
	labtest.Require(t)
	// Started by the first script that asks for a fleet's database (mkpg).
	var pg *pgtest.Cluster
	var pgOnce sync.Once
	mkpg := func(ts *testscript.TestScript, neg bool, args []string) {
		pgOnce.Do(func() { pg = pgtest.Start(t, pgtest.WithoutFsync()) })
		mkpgIn(ts, pg.NewDatabase(t))
	}
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			state := filepath.Join(env.WorkDir, "state")
			env.Setenv("TB_STATE", state)
			env.Values[labKey{}] = &labtest.Lab{}
			env.Defer(func() { killDaemons(state) })
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"mklab":      mklab,
			"mkguest":    mkguest,
			"mkplan":     mkplan,
			"mklease":    mklease,
			"rmlease":    rmlease,
			"sendudp":    sendudp,
			"killdaemon": killdaemon,
			"nsexists":   nsexists,
			"kinds":      clitest.Kinds,
			"status":     clitest.Cmds()["status"],
			"mounttmpfs": mounttmpfs,
			"fillto":     fillto,
			"waitstate":  waitstate,
			"mkpg":       mkpg,
			"daemonproc": daemonproc,
		},
	})
}

// tsTB lets labtest build labs for a script.
type tsTB struct{ ts *testscript.TestScript }

func (t tsTB) Helper()                      {}
func (t tsTB) Fatal(args ...any)            { t.ts.Fatalf("%s", fmt.Sprint(args...)) }
func (t tsTB) Fatalf(f string, args ...any) { t.ts.Fatalf(f, args...) }
func (t tsTB) Cleanup(fn func())            { t.ts.Defer(fn) }
func (t tsTB) TempDir() string              { d, _ := os.MkdirTemp(t.ts.Getenv("WORK"), "lab"); return d }

// mklab makes host and internet namespaces for a private lab and sets
// LAB, HOSTNS, BRIDGE, SINKNS, SINKVETH, TABLE, UPLINK for "net up".
func mklab(ts *testscript.TestScript, neg bool, args []string) {
	l := labtest.New(tsTB{ts})
	c := l.Config
	for k, v := range map[string]string{"LAB": c.Name, "HOSTNS": c.HostNS, "BRIDGE": c.Bridge, "SINKNS": c.SinkNS,
		"SINKVETH": c.SinkVeth, "TABLE": c.Table, "UPLINK": c.Uplink} {
		ts.Setenv(k, v)
	}
	// Whatever a failed script leaves up is taken down.
	ts.Defer(func() {
		st, err := state.Open(context.Background(), ts.Getenv("TB_STATE"))
		if err == nil {
			killDaemons(st.Root())
			netlab.Down(context.Background(), netlab.Dir(st, c.Name))
		}
	})
	*ts.Value(labKey{}).(*labtest.Lab) = *l
}

// labKey holds the script's lab in its testscript values.
type labKey struct{}

// mkguest NAME IP: a guest namespace whose port is $NAME_PORT and whose
// interface's MAC (what the lab binds its port to) is $NAME_MAC.
func mkguest(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: mkguest NAME IP")
	}
	l := ts.Value(labKey{}).(*labtest.Lab)
	g := l.AddGuest(args[0], netip.MustParseAddr(args[1]))
	ts.Setenv(args[0]+"_PORT", g.Port)
	ts.Setenv(args[0]+"_NS", g.NS)
	ts.Setenv(args[0]+"_IP", args[1])
	ts.Setenv(args[0]+"_MAC", g.MAC.String())
}

// mkplan VAR MODE [RATE [SMTP]]: a plan record; its ID goes in $VAR.
func mkplan(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 {
		ts.Fatalf("usage: mkplan VAR MODE [RATE [allow-smtp]]")
	}
	p := &records.Plan{Network: records.NetPolicy{Mode: args[1]}}
	if len(args) > 2 {
		p.Network.RateLimit = args[2]
	}
	p.Network.AllowSMTP = len(args) > 3
	put(ts, p, records.KindPlan)
	ts.Setenv(args[0], p.ID)
}

// mklease VAR GUEST [PLAN]: a lease record (as tb-lease writes it) for a
// guest made by mkguest; its ID goes in $VAR.
func mklease(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 {
		ts.Fatalf("usage: mklease VAR GUEST [PLAN]")
	}
	g := args[1]
	l := &capture.Lease{Tap: ts.Getenv(g + "_PORT"), IP: ts.Getenv(g + "_IP"), MAC: ts.Getenv(g + "_MAC"),
		VMName: "tb-" + g, State: "active"}
	if len(args) > 2 {
		l.Plan = args[2]
	}
	put(ts, l, "lease")
	ts.Setenv(args[0], l.ID)
}

func put(ts *testscript.TestScript, r records.Record, kind string) {
	st, err := state.Open(context.Background(), ts.Getenv("TB_STATE"))
	if err != nil {
		ts.Fatalf("%v", err)
	}
	records.Init(r, kind, st.Now())
	if err := st.Create(context.Background(), r); err != nil {
		ts.Fatalf("%v", err)
	}
}

// rmlease ID: the lease is released (its record deleted).
func rmlease(ts *testscript.TestScript, neg bool, args []string) {
	st, err := state.Open(context.Background(), ts.Getenv("TB_STATE"))
	if err != nil {
		ts.Fatalf("%v", err)
	}
	if err := st.Delete(context.Background(), args[0]); err != nil {
		ts.Fatalf("%v", err)
	}
}

// sendudp GUEST ADDR:PORT COUNT: datagrams from a guest namespace.
func sendudp(ts *testscript.TestScript, neg bool, args []string) {
	n, _ := strconv.Atoi(args[2])
	err := netns.Do(netns.Path(ts.Getenv(args[0]+"_NS")), func() error {
		c, err := net.ListenPacket("udp", ":0")
		if err != nil {
			return err
		}
		defer c.Close()
		to, err := net.ResolveUDPAddr("udp", args[1])
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if _, err := c.WriteTo([]byte(fmt.Sprintf("probe-%d", i)), to); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		ts.Fatalf("sendudp: %v", err)
	}
}

// killdaemon LEASE: SIGKILL the capture daemon of a lease (a crash).
func killdaemon(ts *testscript.TestScript, neg bool, args []string) {
	st, err := state.Open(context.Background(), ts.Getenv("TB_STATE"))
	if err != nil {
		ts.Fatalf("%v", err)
	}
	c, err := capture.Find(st, "", args[0])
	if err != nil || c.PID == 0 {
		ts.Fatalf("no daemon for %s: %v", args[0], err)
	}
	syscall.Kill(c.PID, syscall.SIGKILL)
	// Wait for it to be gone: its control socket stops answering.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := capture.Call(ctx, st, c.ID, "status", "")
		cancel()
		if err != nil {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("daemon %d still answers", c.PID)
		}
		time.Sleep(10 * time.Millisecond) // no event for another process's death
	}
}

// mounttmpfs DIR SIZE: a tmpfs of SIZE (e.g. 64m) on DIR, unmounted at
// the end of the script (after what later commands deferred).
func mounttmpfs(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: mounttmpfs DIR SIZE")
	}
	dir := ts.MkAbs(args[0])
	ts.Check(os.MkdirAll(dir, 0o750))
	ts.Check(unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+args[1]))
	ts.Defer(func() { unix.Unmount(dir, unix.MNT_DETACH) })
}

// fillto DIR SIZE: a file in DIR takes the space until SIZE is left free.
func fillto(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: fillto DIR SIZE")
	}
	dir := ts.MkAbs(args[0])
	want, err := diskspace.ParseSize(args[1])
	ts.Check(err)
	f, err := diskspace.Check(dir)
	ts.Check(err)
	if f.Avail <= int64(want) {
		ts.Fatalf("%s: only %d bytes free", dir, f.Avail)
	}
	ts.Check(os.WriteFile(filepath.Join(dir, "filler"), make([]byte, f.Avail-int64(want)), 0o600))
}

// waitstate LEASE STATE: wait until the lease's capture is in STATE.
func waitstate(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: waitstate LEASE STATE")
	}
	st, err := state.Open(context.Background(), ts.Getenv("TB_STATE"))
	ts.Check(err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := capture.Find(st, "", args[0])
		ts.Check(err)
		if c.State == args[1] {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("capture %s is %s, not %s", c.ID, c.State, args[1])
		}
		time.Sleep(50 * time.Millisecond) // no event for another process's record change
	}
}

// nsexists NAME: the named network namespace exists.
func nsexists(ts *testscript.TestScript, neg bool, args []string) {
	if netns.Exists(args[0]) == neg {
		ts.Fatalf("namespace %s exists: %v", args[0], !neg)
	}
}

// mkpgIn sets $PGURL to the URL of a new database of the fleet, with a
// password in it (the test cluster trusts its socket, so any will do), and
// TB_LOCAL to the host's directory; TB_STATE is emptied, so that a tool
// knows the database from its --state only. The captures a failed script
// leaves running are stopped.
func mkpgIn(ts *testscript.TestScript, url string) {
	url = strings.Replace(url, "postgres://postgres@", "postgres://postgres:hunter2@", 1)
	ts.Setenv("PGURL", url)
	ts.Setenv("TB_LOCAL", ts.MkAbs("state"))
	ts.Setenv("TB_STATE", "")
	ts.Defer(func() {
		st, err := state.Open(context.Background(), ts.MkAbs("state"), state.WithShared(url))
		if err != nil {
			return
		}
		defer st.Close()
		running, _ := state.Find(st, records.KindCapture, func(c *records.Capture) bool { return c.State == capture.StateRunning })
		for _, c := range running {
			capture.Stop(context.Background(), st, c)
		}
	})
}

// daemonproc: the running capture's daemon has the database URL in its
// environment (TB_STATE) and nothing of it on its command line, which any
// user of the host reads in /proc.
func daemonproc(ts *testscript.TestScript, neg bool, args []string) {
	url := ts.Getenv("PGURL")
	st, err := state.Open(context.Background(), ts.MkAbs("state"), state.WithShared(url))
	ts.Check(err)
	defer st.Close()
	running, err := state.Find(st, records.KindCapture, func(c *records.Capture) bool { return c.State == capture.StateRunning })
	if err != nil || len(running) != 1 || running[0].PID == 0 {
		ts.Fatalf("running captures: %v %v", running, err)
	}
	pid := strconv.Itoa(running[0].PID)
	cmdline, err := os.ReadFile("/proc/" + pid + "/cmdline")
	ts.Check(err)
	environ, err := os.ReadFile("/proc/" + pid + "/environ")
	ts.Check(err)
	args = strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	ts.Logf("daemon %s: %q", pid, args)
	if strings.Contains(string(cmdline), "hunter2") || strings.Contains(string(cmdline), "postgres") || !slices.Contains(args, "daemon") {
		ts.Fatalf("the daemon's command line holds the database URL: %q", args)
	}
	if !slices.Contains(strings.Split(string(environ), "\x00"), "TB_STATE="+url) {
		ts.Fatalf("the daemon's environment lacks TB_STATE=%s", url)
	}
}

// killDaemons ends the capture daemons a script started and left running.
func killDaemons(root string) {
	st, err := state.Open(context.Background(), root)
	if err != nil {
		return
	}
	ids, _ := st.List(records.KindCapture)
	for _, id := range ids {
		var c records.Capture
		if st.Get(id, &c) == nil && c.PID > 0 && (c.State == capture.StateRunning || c.State == capture.StateStarting) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if _, err := capture.Call(ctx, st, c.ID, "stop", ""); err != nil {
				syscall.Kill(c.PID, syscall.SIGKILL)
			}
			cancel()
		}
	}
}

// TestExamples fails when a command has no --help example or an example no
// longer parses as its command (a renamed flag, a removed argument).
func TestExamples(t *testing.T) {
	for _, p := range cli.CheckExamples(tool(), &tbCapture{}) {
		t.Error(p)
	}
}
