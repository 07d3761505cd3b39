package triage

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// The real corpus: a tiny Go program cross-compiled for every GOOS/GOARCH
// that yields ELF, PE, Mach-O (or XCOFF, which must come out "unknown"),
// cached under the user cache dir keyed by Go version and this recipe.

const corpusProgram = `package main

func main() { println("talkbox triage corpus") }
`

// corpusRecipe changes whenever the build recipe below changes, so stale
// caches are not reused.
const corpusRecipe = "v2 -trimpath CGO_ENABLED=0 every-arch-for-linux-windows-darwin"

// inCorpus keeps every GOARCH where samples come from (Linux, Windows, macOS)
// and one target for each other OS: the other OSes share their ELF code
// paths, and each build costs seconds of CI time on two cores.
func inCorpus(goos, goarch string) bool {
	switch goos {
	case "linux", "windows", "darwin":
		return true
	case "aix":
		return true
	case "android", "ios":
		return goarch == "arm64"
	}
	return goarch == "amd64"
}

type goTarget struct {
	goos, goarch string
	env          []string // GOARM=…, GOMIPS=…
	stripped     bool
}

func (g goTarget) name() string {
	n := g.goos + "_" + g.goarch
	for _, e := range g.env {
		n += "_" + strings.ToLower(strings.ReplaceAll(e, "=", ""))
	}
	if g.stripped {
		n += "_stripped"
	}
	return n
}

func (g goTarget) setting(key string) string {
	for _, e := range g.env {
		if k, v, _ := strings.Cut(e, "="); k == key {
			return v
		}
	}
	return ""
}

type corpusFile struct {
	target goTarget
	path   string
}

type corpusSet struct {
	dir       string
	goVersion string
	files     []corpusFile
	skipped   []string
	built     int
	elapsed   time.Duration
}

// The corpus is built once per test binary and shared by the tests, the
// fuzz seeds and the benchmarks.
var loadCorpus = sync.OnceValues(buildCorpus)

func goCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// corpusDir is where the corpus lives, and whether it is complete.
func corpusDir() (dir, goVersion string, complete bool, err error) {
	out, err := exec.Command(goCommand(), "env", "GOVERSION").Output()
	if err != nil {
		return "", "", false, fmt.Errorf("go env GOVERSION: %w", err)
	}
	goVersion = strings.TrimSpace(string(out))
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	h := sha256.Sum256([]byte(corpusProgram + corpusRecipe))
	dir = filepath.Join(cache, "talkbox-triage-corpus", goVersion, hex.EncodeToString(h[:6]))
	_, err = os.Stat(filepath.Join(dir, "complete"))
	return dir, goVersion, err == nil, nil
}

func corpusTargets() ([]goTarget, error) {
	out, err := exec.Command(goCommand(), "tool", "dist", "list", "-json").Output()
	if err != nil {
		return nil, fmt.Errorf("go tool dist list: %w", err)
	}
	var list []struct{ GOOS, GOARCH string }
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, err
	}
	var ts []goTarget
	have := map[string]bool{}
	for _, p := range list {
		if p.GOARCH == "wasm" || p.GOOS == "plan9" {
			continue // neither ELF, PE nor Mach-O
		}
		if !inCorpus(p.GOOS, p.GOARCH) {
			continue
		}
		t := goTarget{goos: p.GOOS, goarch: p.GOARCH}
		// Pin the sub-architecture: the default depends on the host.
		switch p.GOARCH {
		case "arm":
			t.env = []string{"GOARM=7"}
		case "mips", "mipsle":
			t.env = []string{"GOMIPS=hardfloat"}
		case "mips64", "mips64le":
			t.env = []string{"GOMIPS64=hardfloat"}
		}
		ts = append(ts, t)
		have[p.GOOS+"/"+p.GOARCH] = true
	}
	for _, v := range []goTarget{
		{goos: "linux", goarch: "arm", env: []string{"GOARM=5"}},
		{goos: "linux", goarch: "arm", env: []string{"GOARM=6"}},
		{goos: "linux", goarch: "mips", env: []string{"GOMIPS=softfloat"}},
		{goos: "linux", goarch: "mipsle", env: []string{"GOMIPS=softfloat"}},
		{goos: "linux", goarch: "mips64le", env: []string{"GOMIPS64=softfloat"}},
	} {
		if have[v.goos+"/"+v.goarch] {
			ts = append(ts, v)
		}
	}
	// Stripped variants only relink, so they are cheap.
	for _, s := range []string{"linux/amd64", "linux/386", "linux/arm64", "linux/mipsle", "linux/riscv64",
		"freebsd/amd64", "openbsd/amd64", "android/arm64", "windows/amd64", "windows/386", "darwin/arm64", "darwin/amd64"} {
		for _, t := range ts {
			if t.goos+"/"+t.goarch == s && !t.stripped {
				t.stripped = true
				ts = append(ts, t)
				break
			}
		}
	}
	return ts, nil
}

// buildEnv is the environment with every knob that changes the output
// replaced by ours.
func buildEnv(t goTarget) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "GO") && k != "GOCACHE" && k != "GOPATH" && k != "GOROOT" && k != "GOTMPDIR" ||
			k == "CGO_ENABLED" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "CGO_ENABLED=0", "GOOS="+t.goos, "GOARCH="+t.goarch, "GOTOOLCHAIN=local",
		"GOWORK=off", "GOFLAGS=", "GOPROXY=off", "GO111MODULE=on")
	return append(env, t.env...)
}

func buildCorpus() (*corpusSet, error) {
	start := time.Now()
	dir, goVersion, _, err := corpusDir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	targets, err := corpusTargets()
	if err != nil {
		return nil, err
	}
	src, err := os.MkdirTemp("", "triage-corpus-src")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(src)
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(corpusProgram), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module triagecorpus\n\ngo 1.22\n"), 0o644); err != nil {
		return nil, err
	}

	cs := &corpusSet{dir: dir, goVersion: goVersion}
	var mu sync.Mutex
	var errs []error
	build := func(t goTarget) {
		final := filepath.Join(dir, t.name())
		skip := final + ".skip"
		if _, err := os.Stat(final); err == nil {
			mu.Lock()
			cs.files = append(cs.files, corpusFile{t, final})
			mu.Unlock()
			return
		}
		if _, err := os.Stat(skip); err == nil {
			mu.Lock()
			cs.skipped = append(cs.skipped, t.name())
			mu.Unlock()
			return
		}
		tmp := fmt.Sprintf("%s.tmp%d", final, os.Getpid())
		args := []string{"build", "-trimpath", "-o", tmp}
		if t.stripped {
			args = append(args, "-ldflags=-s -w")
		}
		cmd := exec.Command(goCommand(), append(args, ".")...)
		cmd.Dir, cmd.Env = src, buildEnv(t)
		out, err := cmd.CombinedOutput()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil && (t.goos == "android" || t.goos == "ios") &&
			bytes.Contains(out, []byte("requires external (cgo) linking")):
			// These ports need the platform's C toolchain.
			os.WriteFile(skip, out, 0o644)
			cs.skipped = append(cs.skipped, t.name())
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %v\n%s", t.name(), err, out))
		default:
			if err := os.Rename(tmp, final); err != nil {
				errs = append(errs, err)
				return
			}
			cs.files = append(cs.files, corpusFile{t, final})
			cs.built++
		}
	}
	// Stripped variants go second so they reuse the compiled packages
	// rather than racing to compile them.
	for _, phase := range []bool{false, true} {
		sem := make(chan struct{}, runtime.GOMAXPROCS(0))
		var wg sync.WaitGroup
		for _, t := range targets {
			if t.stripped != phase {
				continue
			}
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				build(t)
			}()
		}
		wg.Wait()
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	os.WriteFile(filepath.Join(dir, "complete"), nil, 0o644)
	slices.SortFunc(cs.files, func(a, b corpusFile) int { return strings.Compare(a.path, b.path) })
	cs.elapsed = time.Since(start)
	return cs, nil
}

// corpus returns the built corpus, or skips: in -short mode it is only used
// when already cached.
func corpus(tb testing.TB) *corpusSet {
	tb.Helper()
	if testing.Short() {
		if _, _, complete, err := corpusDir(); err != nil || !complete {
			tb.Skip("-short: Go cross-compiled corpus not cached")
		}
	}
	cs, err := loadCorpus()
	if err != nil {
		tb.Fatalf("building corpus: %v", err)
	}
	return cs
}

type goArchInfo struct {
	arch   string
	bits   int
	endian string
}

var goArches = map[string]goArchInfo{
	"386":      {"x86", 32, "little"},
	"amd64":    {"x86_64", 64, "little"},
	"arm":      {"arm", 32, "little"},
	"arm64":    {"aarch64", 64, "little"},
	"loong64":  {"loongarch64", 64, "little"},
	"mips":     {"mips", 32, "big"},
	"mipsle":   {"mips", 32, "little"},
	"mips64":   {"mips64", 64, "big"},
	"mips64le": {"mips64", 64, "little"},
	"ppc64":    {"ppc64", 64, "big"},
	"ppc64le":  {"ppc64", 64, "little"},
	"riscv64":  {"riscv64", 64, "little"},
	"s390x":    {"s390x", 64, "big"},
}

// Go links against the system libc (so with an interpreter) on these.
var goDynamicOS = map[string]string{
	"android": "/system/bin/linker64",
	"openbsd": "/usr/libexec/ld.so",
	"solaris": "/lib/amd64/ld.so.1",
	"illumos": "/lib/amd64/ld.so.1",
}

// expectGo is what a Go binary for t must triage as.
func expectGo(t goTarget, goVersion string) (want, error) {
	var w want
	switch t.goos {
	case "windows":
		w.format = "pe"
	case "darwin", "ios":
		w.format = "macho"
	case "aix":
		return want{format: "unknown"}, nil // XCOFF
	default:
		w.format = "elf"
	}
	ai, ok := goArches[t.goarch]
	if !ok {
		return w, fmt.Errorf("no expectation for GOARCH=%s: add it to goArches", t.goarch)
	}
	w.arch, w.bits, w.endian = ai.arch, ai.bits, ai.endian
	w.os = t.goos
	w.stripped = ptr(t.stripped)
	switch w.format {
	case "pe":
		w.typ = "exe"
		w.details = map[string]any{"subsystem": "console"}
		return w, nil
	case "macho":
		w.os, w.typ, w.interp = "darwin", "pie", "/usr/lib/dyld"
		return w, nil
	}
	w.details = map[string]any{"go": goVersion}
	interp, dynamic := goDynamicOS[t.goos]
	w.static = ptr(!dynamic)
	w.interp = interp
	w.typ = "exec"
	if t.goos == "android" {
		w.typ = "pie"
	}
	switch t.goarch {
	case "arm":
		w.isa = "armv" + t.setting("GOARM")
		if t.goos != "openbsd" { // Go writes e_flags 0 there
			w.eabi, w.abiName, w.float = 5, "eabi5-sf", "soft"
		}
	case "mips", "mipsle":
		w.abiName, w.isa = "o32", "mips32"
		w.float = map[string]string{"hardfloat": "hard", "softfloat": "soft"}[t.setting("GOMIPS")]
	case "mips64", "mips64le":
		w.abiName, w.isa = "n64", "mips3"
		w.float = map[string]string{"hardfloat": "hard", "softfloat": "soft"}[t.setting("GOMIPS64")]
	case "ppc64":
		w.abiName = "elfv2"
		if t.goos == "linux" { // Go still writes ELFv1 for big-endian Linux
			w.abiName = "elfv1"
		}
	case "ppc64le":
		w.abiName = "elfv2"
	case "riscv64":
		w.abiName, w.float, w.isa = "lp64d", "double", "rv64"
	case "loong64":
		w.abiName, w.float = "lp64d", "double"
	}
	return w, nil
}

func TestGoCorpus(t *testing.T) {
	cs := corpus(t)
	t.Logf("corpus: %d files (%d built now, %d skipped: %v) in %s, %v", len(cs.files), cs.built,
		len(cs.skipped), cs.skipped, cs.dir, cs.elapsed.Round(time.Millisecond))
	seen := map[string]bool{}
	for _, f := range cs.files {
		w, err := expectGo(f.target, cs.goVersion)
		if err != nil {
			t.Error(err)
			continue
		}
		got, err := inspectFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		check(t, f.target.name(), got, w)
		seen[got.Format] = true
		if got.ABI != nil && w.format == "elf" {
			// Fields the want-struct cannot say must be empty.
			if w.abiName == "" && got.ABI.Name != "" || w.eabi == 0 && got.ABI.EABI != 0 {
				t.Errorf("%s: unexpected ABI %+v", f.target.name(), *got.ABI)
			}
		}
	}
	for _, f := range []string{"elf", "pe", "macho", "unknown"} {
		if !seen[f] {
			t.Errorf("corpus has no %s file", f)
		}
	}
}

// TestGoFat joins the real darwin binaries into a universal binary.
func TestGoFat(t *testing.T) {
	cs := corpus(t)
	var amd, arm []byte
	for _, f := range cs.files {
		switch f.target.name() {
		case "darwin_amd64":
			amd, _ = os.ReadFile(f.path)
		case "darwin_arm64":
			arm, _ = os.ReadFile(f.path)
		}
	}
	if amd == nil || arm == nil {
		t.Skip("no darwin binaries in corpus")
	}
	fat := machoFat(1<<14, amd, arm)
	check(t, "fat", inspectBytes(fat), want{format: "macho", os: "darwin", typ: "pie", endian: "little",
		details: map[string]any{"fat": true, "slices": []string{"x86_64", "aarch64"}}})
}

func inspectFile(path string) (got records.Triage, err error) {
	f, err := os.Open(path)
	if err != nil {
		return got, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return got, err
	}
	return Inspect(f, fi.Size()), nil
}
