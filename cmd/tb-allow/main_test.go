package main

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/clitest"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"tb-allow": main})
}

func TestScripts(t *testing.T) {
	cmds := clitest.Cmds()
	cmds["idof"] = idof
	cmds["tamper"] = tamper
	cmds["idwith"] = idwith
	testscript.Run(t, testscript.Params{Dir: "testdata/script", Setup: clitest.Setup, Cmds: cmds})
}

// recordPath is the N-th (1-based, oldest first) stored record of a kind.
func recordPath(ts *testscript.TestScript, kind, n string) string {
	i, err := strconv.Atoi(n)
	ts.Check(err)
	files, err := filepath.Glob(filepath.Join(ts.Getenv("TB_STATE"), "records", kind, "*.json"))
	ts.Check(err)
	sort.Strings(files)
	if i < 1 || i > len(files) {
		ts.Fatalf("no %s number %d (%d stored)", kind, i, len(files))
	}
	return files[i-1]
}

// idof KIND N VAR: sets VAR to the ID of the N-th stored record of KIND.
func idof(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: idof KIND N VAR")
	}
	ts.Setenv(args[2], strings.TrimSuffix(filepath.Base(recordPath(ts, args[0], args[1])), ".json"))
}

// tamper KIND N OLD NEW: edits the N-th stored record of KIND behind the
// tools' back.
func tamper(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 4 {
		ts.Fatalf("usage: tamper KIND N OLD NEW")
	}
	p := recordPath(ts, args[0], args[1])
	b, err := os.ReadFile(p)
	ts.Check(err)
	if !strings.Contains(string(b), args[2]) {
		ts.Fatalf("%s has no %s", p, args[2])
	}
	ts.Check(os.WriteFile(p, []byte(strings.Replace(string(b), args[2], args[3], 1)), 0o644))
}

// idwith REGEXP VAR: sets VAR to the ID of the first allow-list entry in
// the stored revision contents (blobs) whose JSON matches REGEXP.
func idwith(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: idwith REGEXP VAR")
	}
	re, err := regexp.Compile(args[0])
	ts.Check(err)
	id := regexp.MustCompile(`"id":"(allow_[0-9A-Z]{26})"`)
	var found string
	ts.Check(filepath.WalkDir(filepath.Join(ts.Getenv("TB_STATE"), "blobs"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || found != "" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if m := id.FindStringSubmatch(line); m != nil && re.MatchString(line) {
				found = m[1]
				return nil
			}
		}
		return nil
	}))
	if found == "" {
		ts.Fatalf("no entry matches %s", args[0])
	}
	ts.Setenv(args[1], found)
}

// TestExamples fails when a command has no --help example or an example no
// longer parses as its command (a renamed flag, a removed argument).
func TestExamples(t *testing.T) {
	for _, p := range cli.CheckExamples(tool(), &tbAllow{}) {
		t.Error(p)
	}
}
