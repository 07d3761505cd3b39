package main

import (
	"bytes"
	"context"
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

	"github.com/talkbox-sandbox/talkbox/internal/behave"
	"github.com/talkbox-sandbox/talkbox/internal/cycle"
	"github.com/talkbox-sandbox/talkbox/internal/demo/c2"
	"github.com/talkbox-sandbox/talkbox/internal/image"
	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// demoArches are the architectures the end-to-end test runs the demo on:
// every image spec with the beacon native to it, and the long tail under
// user-mode emulation inside the amd64 guest (the C beacon; sh4's is linked
// against trixie's sh4 C library, see internal/demo/cbeacon/sh4-sysroot.sh).
var demoArches = []string{
	"amd64", "i386", "arm64", "armhf", "armel", "mipsel", "mips64el", "ppc64el", "s390x",
	"mips", "powerpc", "m68k", "sparc64", "sh4",
}

// TestDemoEndToEnd runs scripts/demo.sh for real on every architecture —
// a VM under libvirtd, the lab's nftables, a capture on the lease's tap,
// the real beacon and a C2 in a namespace on documentation addresses — and
// asserts on the records and on the C2 server's log: cycle 1 sinkholed,
// the C2 promoted and the scan refused; cycle 2 reaching the C2. Every
// cycle is traced (TB_DEMO_TRACE), natively or around the emulator, and
// its trace parses into the beacon's process, untampered — except on
// mipsel and mips64el (untracedDemo) and the demos whose beacon speaks a bot protocol
// and is ordered to attack in cycle 2 (botproto_e2e_test.go): strace
// slowed the amd64 guest's flood below tb-parse's 50 packets a second,
// and the trace of those architectures is proven without them.
func TestDemoEndToEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the end-to-end test needs root (bridges, namespaces, VMs); run it with make test")
	}
	bin, goBin := demoTools(t)
	// Two guests at a time: one per core under TCG.
	slots := make(chan struct{}, 2)
	for _, c := range demoCases() {
		t.Run(c.name(), func(t *testing.T) {
			t.Parallel()
			slots <- struct{}{}
			defer func() { <-slots }()
			demoEndToEnd(t, c, bin, goBin)
		})
	}
}

// demoTools names the directory of the tools scripts/demo.sh runs, built
// once for the package's tests (builtTools), and the go command that builds
// the beacon. A build of the seven under the guests' load took about 20 s,
// and seven tests each paid it on cmd/tb-run's critical path.
func demoTools(t testing.TB) (bin, goBin string) {
	t.Helper()
	goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	bin, err := builtTools.get(goBin)
	if err != nil {
		t.Fatal(err)
	}
	return bin, goBin
}

// toolBuild is the one build of the tools for the package's tests, in a
// directory TestMain removes when they end.
type toolBuild struct {
	once sync.Once
	dir  string
	err  error
}

var builtTools toolBuild

func (b *toolBuild) get(goBin string) (string, error) {
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "tb-run-tools-"); b.err != nil {
			return
		}
		// One go build of the seven packages: it compiles and links them
		// in parallel.
		args := []string{"build", "-o", b.dir + "/"}
		for _, tool := range []string{"tb-plan", "tb-lease", "tb-capture", "tb-run", "tb-parse", "tb-allow", "tb-build"} {
			args = append(args, "../"+tool)
		}
		if out, err := exec.Command(goBin, args...).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building the tools: %v\n%s", err, out)
		}
	})
	return b.dir, b.err
}

// remove removes the tools' directory, if they were built.
func (b *toolBuild) remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// demoRun is one run of scripts/demo.sh: its state directory, the files
// it left for the test (TB_DEMO_OUT) and its output.
type demoRun struct {
	stateDir, outDir string
	out              []byte
}

// runDemo runs scripts/demo.sh on arch's guest, with the fixture image
// installed in a state of its own and env added to the environment; it
// fails the test when the script fails.
func runDemo(t *testing.T, arch, bin, goBin string, env ...string) *demoRun {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	if err := leasetest.Reachable(dir); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(dir, "state")
	// The guest the demo's plan asks for: the architecture's own image,
	// or amd64 for the long tail.
	specs, err := image.LoadSpecs("")
	if err != nil {
		t.Fatal(err)
	}
	spec := "debian-bookworm-" + arch
	if _, err := specs.Get(spec); err != nil {
		spec = leasetest.Spec
	}
	fx, err := leasetest.ImageFor(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := fx.Install(ctx, stateDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { leasetest.Cleanup(stateDir) })
	outDir := filepath.Join(dir, "out")
	cmd := exec.Command("bash", "../../scripts/demo.sh")
	cmd.Env = append(append(os.Environ(), "ARCH="+arch, "TB_DEMO_STATE="+stateDir, "TB_DEMO_BIN="+bin, "TB_DEMO_OUT="+outDir, "GO="+goBin), env...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start).Round(time.Second)
	logOutput := func() {
		t.Logf("demo.sh %s (%s):\n%s", strings.Join(append([]string{"ARCH=" + arch}, env...), " "), took, out)
		logConsole(t, outDir)
	}
	if err == nil {
		// After the test's own failures: a CI log that keeps only the
		// start of a long failure still says why.
		t.Cleanup(func() {
			if t.Failed() {
				logOutput()
			}
		})
		return &demoRun{stateDir: stateDir, outDir: outDir, out: out}
	}
	// The end of the output first, for the same reason.
	t.Logf("demo.sh failed after %s (%v); its last lines:\n%s", took, err, lastLines(out, 25))
	logOutput()
	t.Fatalf("demo.sh: %v", err)
	return nil
}

// logConsole logs the end of the guest's console that scripts/demo.sh
// kept in outDir: what the guest said is what tells a hung guest from a
// slow one.
func logConsole(t *testing.T, outDir string) {
	b, err := os.ReadFile(filepath.Join(outDir, "console.log"))
	if err != nil {
		t.Logf("the guest's console: %v", err)
		return
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	t.Logf("the guest's console (last 4 KiB):\n%s", b)
}

// lastLines is the last n lines of out.
func lastLines(out []byte, n int) []byte {
	out = bytes.TrimRight(out, "\n")
	i := len(out)
	for ; n > 0 && i > 0; n-- {
		i = bytes.LastIndexByte(out[:i], '\n')
		if i < 0 {
			return out
		}
	}
	return out[i+1:]
}

// untracedDemo are the architectures whose demo runs untraced: the
// one-vCPU Malta guests, where a traced Go beacon under TCG on a host
// loaded by other guests left the guest agent unanswered, failing the
// cycle: mipsel's for over two minutes in a fresh-clone make test
// (2026-11-28), mips64el's through both its cycles (over a minute,
// 2026-11-30). The MIPS trace is proven by TestBehaviourEndToEnd/mipsel
// (the C beacon) instead. The agent's silences had one cause found since:
// Malta's edge-triggered PCI interrupt line, shared by the agent and the
// disk, which tb-lease now sets level-triggered (TestMaltaSharedInterruptLine);
// these demos have not been traced again since.
var untracedDemo = []string{"mipsel", "mips64el"}

func demoEndToEnd(t *testing.T, c demoCase, bin, goBin string) {
	ctx := context.Background()
	arch := c.arch
	tracedDemo := c.proto == "" && !slices.Contains(untracedDemo, arch)
	var env []string
	if tracedDemo {
		env = append(env, "TB_DEMO_TRACE=1")
	}
	if c.proto != "" {
		env = append(env, "TB_DEMO_PROTO="+c.proto)
	}
	r := runDemo(t, arch, bin, goBin, env...)
	stateDir, outDir, out := r.stateDir, r.outDir, r.out
	st, err := state.Open(ctx, stateDir)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := st.List(records.KindCycle)
	if err != nil || len(ids) != 2 {
		t.Fatalf("cycles %v, %v", ids, err)
	}
	var cs [2]records.Cycle
	var as [2]records.RunAnalysis
	for i, id := range ids {
		if err := st.Get(id, &cs[i]); err != nil {
			t.Fatal(err)
		}
		if cs[i].State != records.CycleCompleted {
			t.Fatalf("cycle %d: %s %s", i+1, cs[i].State, cs[i].Error)
		}
		if err := st.Get(cs[i].Analysis, &as[i]); err != nil {
			t.Fatal(err)
		}
		var ex records.ExecutionSnapshot
		if err := st.Get(cs[i].Execution, &ex); err != nil {
			t.Fatal(err)
		}
		if ex.ExitCode == nil || ex.TimedOut || ex.StdoutBytes == 0 {
			t.Fatalf("cycle %d execution = %+v", i+1, ex)
		}
		// The guest's agent sets its clock to the host's on every
		// architecture (cycle 1's guest is the lease's restored clean
		// state, with the clock it was saved with).
		if gc := cs[i].GuestClock; gc == nil || gc.Left.D().Abs() > records.ClockTolerance {
			t.Errorf("cycle %d: the guest's clock %+v, want it within %s of the host's", i+1, gc, records.ClockTolerance)
		} else {
			t.Logf("cycle %d: the guest's clock was %s off the host's, set to %s off", i+1, gc.Found, gc.Left)
		}
		if tracedDemo {
			traced(t, st, &cs[i])
		}
	}
	// The demo ends with the lease's HTML report (internal/leasereport's
	// browser test checks what it draws).
	page, err := os.ReadFile(filepath.Join(stateDir, "reports", cs[0].Lease+".html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`id="timeline"`, `id="checkins"`, cs[0].ID, cs[1].ID, "c2.example"} {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("the lease's report has no %s", want)
		}
	}
	// Cycle 1: everything sinkholed; the name and the scan seen; the C2
	// promoted, the scan refused.
	a1 := as[0]
	if cs[0].Revision != "" || cs[0].Allowed != 0 || !slices.Contains(a1.Domains, "c2.example") ||
		a1.Recommendation != records.RecommendRerun {
		t.Fatalf("cycle 1 analysis = %+v", a1)
	}
	addr, err := os.ReadFile(filepath.Join(outDir, "c2.addr"))
	if err != nil {
		t.Fatal(err)
	}
	c2addr := strings.TrimSpace(string(addr))
	c2endpoint := c2addr + ":" + demoPorts[c.proto] + "/tcp"
	if !slices.Contains(a1.Promoted, "endpoint "+c2endpoint) {
		t.Fatalf("cycle 1 promoted %v", a1.Promoted)
	}
	scanRefused := false
	for _, f := range append(a1.Refused, as[1].Refused...) {
		scanRefused = scanRefused || f.Class == "scan"
	}
	if !scanRefused {
		t.Fatalf("the scan was not refused: %+v", a1.Refused)
	}
	// Cycle 2: follows cycle 1 under its revision; the C2 answered.
	if cs[1].Previous != cs[0].ID || cs[1].Revision != cs[0].Promoted || cs[1].Allowed == 0 {
		t.Fatalf("cycle 2 lineage = %+v", cs[1])
	}
	if len(as[1].Promoted) != 0 {
		t.Fatalf("cycle 2 analysis = %+v", as[1])
	}
	if !strings.Contains(string(out), "promoted: endpoint "+c2endpoint) {
		t.Fatal("the summary does not say what was promoted")
	}
	if c.proto != "" {
		botProtoEndToEnd(t, st, r, c.proto, c2addr, cs, as)
	}
	if c.proto != "" && c.proto != "http" {
		return
	}
	// An ordered bot's cycle 2 escalates (botProtoEndToEnd); one only
	// checking in is done.
	if c.proto == "" && as[1].Recommendation != records.RecommendDone {
		t.Fatalf("cycle 2 analysis = %+v", as[1])
	}
	f, err := os.Open(filepath.Join(outDir, "c2.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hits, err := c2.ReadHits(f)
	if err != nil {
		t.Fatal(err)
	}
	var fromCycle2 int
	for _, h := range hits {
		if h.Host == "c2.example" && h.Bot == "tb-beacon" && h.Path == "/gate" && !h.Time.Before(*cs[1].StartedAt) {
			fromCycle2++
		}
		if h.Time.Before(*cs[1].StartedAt) {
			t.Errorf("the C2 was reached before cycle 2: %+v", h)
		}
	}
	if fromCycle2 < 4 {
		t.Fatalf("the C2 saw %d check-ins in cycle 2, want at least 4: %+v", fromCycle2, hits)
	}
}

// traced checks that a cycle's trace was stored and parsed into the
// process of its sample, the beacon's binary whatever runs it, and that
// it was not seen as tampered with.
func traced(t *testing.T, st *state.Store, c *records.Cycle) {
	t.Helper()
	traces := 0
	for _, id := range c.Artifacts {
		var a records.Artifact
		if err := st.Get(id, &a); err != nil {
			t.Fatal(err)
		}
		if a.Type == cycle.ArtifactTrace {
			traces++
		}
	}
	obs, err := state.FindBy(st, records.KindObservable, records.KeyCycle, c.ID, func(o *records.Observable) bool {
		return o.Process != nil || o.Evasion != nil && o.Evasion.Technique == behave.TechTraceTampered
	})
	if err != nil {
		t.Fatal(err)
	}
	beacon := false
	for _, o := range obs {
		if o.Evasion != nil {
			t.Errorf("cycle %s: the beacon's clean trace seen as tampered: %q", c.ID, o.Evasion.Paths)
			continue
		}
		beacon = beacon || o.Process.Exe == c.GuestPath
	}
	if c.Tracer != cycle.TracerStrace || traces != 1 || !beacon {
		t.Errorf("cycle %s: tracer %q, %d traces, %d observables, none of the beacon's process (%s)", c.ID, c.Tracer, traces, len(obs), c.GuestPath)
	}
}
