// Package clitest holds testscript commands shared by the tb-* CLI tests.
package clitest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/talkbox-sandbox/talkbox/internal/elftest"
)

// Cmds returns the shared commands: status CODE PROG ARGS..., mkelf PATH KEY=VALUE...
// and kinds [KIND...].
func Cmds() map[string]func(ts *testscript.TestScript, neg bool, args []string) {
	return map[string]func(ts *testscript.TestScript, neg bool, args []string){
		"kinds":  Kinds,
		"mkelf":  mkelf,
		"status": status,
	}
}

// Setup points the tools at a state directory inside the script's work dir.
func Setup(env *testscript.Env) error {
	env.Setenv("TB_STATE", env.WorkDir+"/state")
	env.Setenv("TB_PROFILES", env.WorkDir+"/profiles")
	return nil
}

// mkelf PATH key=value...: writes a minimal ELF (machine=, bits=, big, flags=,
// interp=, type=, osabi=, stripped, truncate=N).
func mkelf(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 1 {
		ts.Fatalf("usage: mkelf PATH [key=value...]")
	}
	s := elftest.Spec{Machine: 62, Bits: 64}
	truncate := -1
	for _, a := range args[1:] {
		k, v, _ := strings.Cut(a, "=")
		n, _ := strconv.ParseUint(v, 0, 32)
		switch k {
		case "machine":
			s.Machine = uint16(n)
		case "bits":
			s.Bits = int(n)
		case "big":
			s.Big = true
		case "flags":
			s.Flags = uint32(n)
		case "osabi":
			s.OSABI = byte(n)
		case "type":
			s.Type = uint16(n)
		case "interp":
			s.Interp = v
		case "stripped":
			s.Stripped = true
		case "truncate":
			truncate = int(n)
		default:
			ts.Fatalf("mkelf: unknown key %q", k)
		}
	}
	b := elftest.Build(s)
	if truncate >= 0 && truncate < len(b) {
		b = b[:truncate]
	}
	path := ts.MkAbs(args[0])
	ts.Check(os.MkdirAll(filepath.Dir(path), 0o755))
	ts.Check(os.WriteFile(path, b, 0o755))
}

// status CODE PROG ARGS...: runs a command and checks its exact exit code;
// its stdout and stderr are then available to the stdout/stderr commands.
func status(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: status CODE PROG [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		got = ee.ExitCode()
	case err != nil:
		ts.Fatalf("%s: %v", args[1], err)
	}
	if got != want {
		ts.Fatalf("%s exited %d, want %d", args[1], got, want)
	}
}
