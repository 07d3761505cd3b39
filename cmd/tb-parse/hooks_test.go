//go:build talkboxtest

package main

import (
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/talkbox-sandbox/talkbox/internal/clitest"
)

// TestHookScripts runs the scripts that need the talkboxtest build's hooks
// (internal/crashhook): make test builds its test binaries with the tag.
func TestHookScripts(t *testing.T) {
	cmds := clitest.Cmds()
	cmds["mkpcap"] = mkpcap
	testscript.Run(t, testscript.Params{Dir: "testdata/hooks", Setup: clitest.Setup, Cmds: cmds})
}
