package crashhook_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// TestNotInReleaseBinaries builds the tools that have crash hooks as a
// release is built (no talkboxtest tag) and checks that no hook's
// environment variable is left in them.
func TestNotInReleaseBinaries(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for tool, env := range map[string]string{"tb-lease": "TB_LEASE_CRASH_AFTER", "tb-build": "TB_BUILD_CRASH_AFTER", "tb-parse": "TB_PARSE_FAULT_AT"} {
		bin := filepath.Join(t.TempDir(), tool)
		cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "./cmd/"+tool)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", tool, err, out)
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(env)) {
			t.Errorf("%s built without the talkboxtest tag contains %s", tool, env)
		}
	}
}
