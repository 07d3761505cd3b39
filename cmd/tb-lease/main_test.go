package main

import (
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/talkbox-sandbox/talkbox/internal/clitest"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"tb-lease": main})
}

func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{Dir: "testdata/script", Setup: clitest.Setup, Cmds: clitest.Cmds()})
}
