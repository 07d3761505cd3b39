package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/clitest"
	"github.com/talkbox-sandbox/talkbox/internal/crashhook"
	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"tb-build": main})
}

func TestScripts(t *testing.T) {
	if !crashhook.Enabled {
		t.Fatal("build_amd64.txtar kill tb-build through its crash hooks: run go test -tags talkboxtest (make test does)")
	}
	testscript.Run(t, testscript.Params{
		Dir:   "testdata/script",
		Setup: setup,
		Cmds:  map[string]func(*testscript.TestScript, bool, []string){"exits": exits, "kinds": clitest.Kinds},
	})
}

// setup gives each script a state directory libvirt's unprivileged QEMU can
// reach (the work directory's parents are private), the directory holding
// tb-build (for scripts that empty PATH), and a .deb cache shared between
// runs so that only the first run on a machine downloads.
func setup(env *testscript.Env) error {
	for d := env.WorkDir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
			return err
		}
	}
	env.Setenv("TB_STATE", filepath.Join(env.WorkDir, "state"))
	env.Setenv("TB_SPECS", filepath.Join(env.WorkDir, "specs"))
	env.Setenv("TB_APT_CACHE", leasetest.AptCache())
	self, err := exec.LookPath("tb-build")
	if err != nil {
		return err
	}
	env.Setenv("TB_BIN", filepath.Dir(self))
	return nil
}

// exits N CMD ARGS... runs a program and checks its exit status.
func exits(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exits STATUS COMMAND [ARG...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil {
		ts.Fatalf("exits: bad status %q", args[0])
	}
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		got = ee.ExitCode()
	} else if err != nil {
		ts.Fatalf("exits: %v", err)
	}
	if got != want {
		ts.Fatalf("%s exited %d, want %d", strings.Join(args[1:], " "), got, want)
	}
}

// TestExamples fails when a command has no --help example or an example no
// longer parses as its command (a renamed flag, a removed argument).
func TestExamples(t *testing.T) {
	for _, p := range cli.CheckExamples(tool(), &tbBuild{}) {
		t.Error(p)
	}
}
