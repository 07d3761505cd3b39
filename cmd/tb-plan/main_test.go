package main

import (
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/clitest"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"tb-plan": main})
}

func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{Dir: "testdata/script", Setup: clitest.Setup, Cmds: clitest.Cmds()})
}

// TestExamples fails when a command has no --help example or an example no
// longer parses as its command (a renamed flag, a removed argument).
func TestExamples(t *testing.T) {
	for _, p := range cli.CheckExamples(tool(), &tbPlan{}) {
		t.Error(p)
	}
}
