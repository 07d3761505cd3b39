package main

import (
	"regexp"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/clitest"
)

func TestMain(m *testing.M) {
	testscript.Main(removingTools{m}, map[string]func(){"tb-run": main})
}

// removingTools runs the tests, then removes the tools they built
// (builtTools): testscript.Main exits when they end.
type removingTools struct{ m *testing.M }

func (r removingTools) Run() int {
	defer builtTools.remove()
	return r.m.Run()
}

func TestScripts(t *testing.T) {
	cmds := clitest.Cmds()
	cmds["idof"] = idof
	testscript.Run(t, testscript.Params{Dir: "testdata/script", Setup: clitest.Setup, Cmds: cmds})
}

// idof KIND VAR: sets $VAR to the last ID of that kind in the last stdout.
func idof(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: idof KIND VAR")
	}
	m := regexp.MustCompile(`"id":"(`+args[0]+`_[0-9A-Z]{26})"`).FindAllStringSubmatch(ts.ReadFile("stdout"), -1)
	if len(m) == 0 {
		ts.Fatalf("no %s id in stdout", args[0])
	}
	ts.Setenv(args[1], m[len(m)-1][1])
}

// TestExamples fails when a command has no --help example or an example no
// longer parses as its command (a renamed flag, a removed argument).
func TestExamples(t *testing.T) {
	for _, p := range cli.CheckExamples(tool(), &tbRun{}) {
		t.Error(p)
	}
}
