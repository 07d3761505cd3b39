package cli

import (
	"os"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
)

type panicCLI struct {
	Globals
	Boom boomCmd `cmd:"" help:"Panics."`
}

type boomCmd struct{}

func (boomCmd) Run(*Env) error { panic("index out of range [5] with length 4") }

// TestPanicExitsOne: a command that panics (a bug, which a sample's bytes
// may reach) exits 1 with one line naming the tool and the panic, and its
// stack in the log; not 2, which says the command line was wrong.
func TestPanicExitsOne(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stderr := os.Stderr
	os.Stderr = f
	code := Run(Tool{Name: "tb-test"}, &panicCLI{}, []string{"boom"})
	os.Stderr = stderr
	out, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if code != fault.ExitFailure {
		t.Errorf("exit %d, want %d", code, fault.ExitFailure)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	want := "tb-test: internal error (a bug in tb-test: please report it with its input): index out of range [5] with length 4"
	if len(lines) != 2 || lines[1] != want || !strings.Contains(lines[0], "msg=\"internal error\"") || !strings.Contains(lines[0], "stack=") {
		t.Errorf("stderr:\n%s\nwant a log line with the stack, then %q", out, want)
	}
}
