package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/clitest"
	"github.com/talkbox-sandbox/talkbox/internal/crashhook"
	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"tb-lease": main})
}

var (
	fixtureOnce sync.Once
	fixture     *leasetest.Fixture
	fixtureErr  error
)

// TestScripts boots real guests under the system libvirtd, from the amd64
// image tb-build builds once per machine (see leasetest.Image), each script
// on its own state directory and throw-away bridge.
func TestScripts(t *testing.T) {
	if !crashhook.Enabled {
		t.Fatal("crash.txtar kill tb-lease through its crash hooks: run go test -tags talkboxtest (make test does)")
	}
	cmds := clitest.Cmds()
	cmds["field"] = field
	cmds["host2"] = host2
	testscript.Run(t, testscript.Params{Dir: "testdata/script", Setup: setup, Cmds: cmds})
}

func setup(env *testscript.Env) error {
	if err := clitest.Setup(env); err != nil {
		return err
	}
	if err := leasetest.Reachable(env.WorkDir); err != nil {
		return err
	}
	ctx := context.Background()
	fixtureOnce.Do(func() { fixture, fixtureErr = leasetest.Image(ctx) })
	if fixtureErr != nil {
		return fixtureErr
	}
	stateDir := filepath.Join(env.WorkDir, "state")
	if err := fixture.Install(ctx, stateDir); err != nil {
		return err
	}
	// tb-lease starts guests only on a checked lab's bridge.
	lab, err := leasetest.UpLab(ctx, stateDir, "", "", netip.Prefix{})
	if err != nil {
		return err
	}
	env.Defer(func() {
		leasetest.Cleanup(stateDir)
		lab.Down()
	})
	// tb-lease takes the bridge and network from the lab.
	env.Setenv("TB_LEASE_LAB", lab.Name)
	env.Setenv("LAB", lab.Name)
	env.Setenv("LABNET", lab.LabNet.String())
	env.Setenv("BRIDGE", lab.Bridge)
	env.Setenv("SINKNS", lab.SinkNS)
	// $LABNET24 is the lab network's first three octets, as a regexp.
	a := lab.LabNet.Addr().As4()
	env.Setenv("LABNET24", fmt.Sprintf(`%d\.%d\.%d`, a[0], a[1], a[2]))
	env.Setenv("IMAGE", fixture.Image.ID)
	return nil
}

// field NAME KEY [LINE]: sets $NAME to a field of the JSON record on the
// last (or LINE-th, 1-based) line of the previous command's stdout.
func field(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: field NAME KEY [LINE]")
	}
	lines := strings.Split(strings.TrimSpace(ts.ReadFile("stdout")), "\n")
	line := lines[len(lines)-1]
	if len(args) > 2 {
		var n int
		for _, c := range args[2] {
			n = n*10 + int(c-'0')
		}
		if n < 1 || n > len(lines) {
			ts.Fatalf("field: no line %d", n)
		}
		line = lines[n-1]
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		ts.Fatalf("field: %v in %q", err, line)
	}
	v, ok := m[args[1]]
	if !ok {
		ts.Fatalf("field: no %q in %s", args[1], line)
	}
	s, ok := v.(string)
	if !ok {
		b, _ := json.Marshal(v)
		s = string(b)
	}
	ts.Setenv(args[0], s)
}

// host2: starts a second libvirtd (leasetest.SecondHost) with a lab of
// its own in its namespace, and writes $WORK/hosts.json naming both hosts;
// $HOST2 is its URI over TCP, which tb-lease refuses (another machine's),
// and $HOST2_SOCKET over its Unix socket, which it uses.
func host2(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 {
		ts.Fatalf("usage: host2")
	}
	ctx := context.Background()
	h, err := leasetest.SecondHost(ctx, ts.Getenv("BRIDGE"))
	ts.Check(err)
	ts.Defer(h.Stop)
	// Both hosts' leases come from one lab network, the first lab's
	// (tb-lease --lab), on a bridge of the same name in each namespace.
	lab, err := leasetest.UpLab(ctx, ts.MkAbs("state"), h.NS, ts.Getenv("BRIDGE"), netip.MustParsePrefix(ts.Getenv("LABNET")))
	ts.Check(err)
	ts.Defer(lab.Down)
	ts.Setenv("HOST2", h.URI)
	ts.Setenv("HOST2_SOCKET", h.SocketURI)
	ts.Setenv("NS2", h.NS)
	cfg := fmt.Sprintf(`{"hosts": [{"name": "local", "uri": "qemu:///system"}, {"name": "second", "uri": %q, "netns": %q, "accel": "tcg", "max_leases": 1}]}`, h.SocketURI, h.NS)
	ts.Check(os.WriteFile(ts.MkAbs("hosts.json"), []byte(cfg), 0o644))
}

// TestExamples fails when a command has no --help example or an example no
// longer parses as its command (a renamed flag, a removed argument).
func TestExamples(t *testing.T) {
	for _, p := range cli.CheckExamples(tool(), &tbLease{}) {
		t.Error(p)
	}
}
