package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/demo/c2"
	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// examplesDir is the repository's examples/, relative to this package.
const examplesDir = "../../examples"

// TestExampleFiles runs every file in examples/ for real, as an analyst
// would, against the test image: the cron entry's command line, after the
// one-time setup its comment gives, and the Makefile, which runs
// pipeline.sh. The sample is the benign beacon, whose arguments (its C2 on
// a documentation address) come from a site profile named default, as a
// site's own defaults would; the lab is the demo's, with a C2 in an
// "internet" namespace. Both share one state directory and lab, each with
// a guest of its own: an idle lease handed from one to the other would
// carry its allow-list over, and pipeline.sh's cycle 1 would find the C2
// allowed already. examples/sensors is run by internal/capture's
// TestAnalystSensor; a file no test runs fails this test.
func TestExampleFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the examples test needs root (bridges, namespaces, VMs); run it with make test")
	}
	runs := map[string]func(*testing.T, *exampleLab){
		"cron":     runCronExample,
		"Makefile": runMakefileExample,
	}
	// Run by another example, or by another test.
	elsewhere := map[string]string{
		"pipeline.sh": "the Makefile",
		"sensors":     "internal/capture's TestAnalystSensor",
	}
	ents, err := os.ReadDir(examplesDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if runs[e.Name()] == nil && elsewhere[e.Name()] == "" {
			t.Errorf("examples/%s is run by no test: add it to TestExampleFiles", e.Name())
		}
	}
	mk, err := os.ReadFile(filepath.Join(examplesDir, "Makefile"))
	if err != nil || !strings.Contains(string(mk), "pipeline.sh") {
		t.Fatalf("the Makefile no longer runs pipeline.sh (%v)", err)
	}
	bin, goBin := demoTools(t)
	lab := newExampleLab(t, bin, goBin)
	for _, name := range slices.Sorted(maps.Keys(runs)) {
		t.Run(name, func(t *testing.T) { runs[name](t, lab) })
	}
}

// exampleLab is what the examples run in: a state directory with the test
// image, a lab named default (the examples name none), a C2 on a
// documentation address, the beacon as the sample, and the environment
// the tools find all of that in.
type exampleLab struct {
	dir, stateDir, sample string
	env                   []string // TB_* settings, as a site would have them
	bin                   string
	c2addr, c2log         string
}

func newExampleLab(t *testing.T, bin, goBin string) *exampleLab {
	ctx := context.Background()
	dir := t.TempDir()
	if err := leasetest.Reachable(dir); err != nil {
		t.Fatal(err)
	}
	l := &exampleLab{dir: dir, stateDir: filepath.Join(dir, "state"), bin: bin,
		sample: filepath.Join(dir, "samples", "beacon"), c2log: filepath.Join(dir, "c2.log")}
	fx, err := leasetest.Image(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := fx.Install(ctx, l.stateDir); err != nil {
		t.Fatal(err)
	}
	build := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", l.sample, "./internal/demo/beacon/cmd/beacon")
	build.Dir = "../.."
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the beacon: %v\n%s", err, out)
	}

	// The demo's internet: a namespace behind an uplink, on a slot of
	// documentation addresses and lab subnets no other run holds.
	var tag [3]byte
	rand.Read(tag[:])
	id := hex.EncodeToString(tag[:])
	inet, uplink := "tbxi"+id, "tbxu"+id
	demoNet := func(script string) *exec.Cmd {
		cmd := exec.Command("bash", "-c", ". scripts/demo-net.sh && "+script, "demo-net", inet, uplink)
		cmd.Dir = "../.."
		return cmd
	}
	out, err := demoNet(`demo_net_up "$1" "$2" && demo_net_internet "$1" "$2" && echo "$c2 $resolver $labnet $sinknet"`).Output()
	t.Cleanup(func() { demoNet(`demo_net_down "$1" "$2"`).Run() })
	if err != nil {
		t.Fatalf("demo_net_up: %v", err)
	}
	var resolver, labnet, sinknet string
	if _, err := fmt.Sscan(string(out), &l.c2addr, &resolver, &labnet, &sinknet); err != nil {
		t.Fatalf("demo_net_up said %q: %v", out, err)
	}
	l.serveC2(t, inet)
	// A resolver for the C2's name, the lab's upstream.
	pid := filepath.Join(dir, "dnsmasq.pid")
	if out, err := exec.Command("ip", "netns", "exec", inet, "dnsmasq", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
		"--bind-interfaces", "--listen-address="+resolver, "--address=/c2.example/"+l.c2addr, "--pid-file="+pid, "--user=root").CombinedOutput(); err != nil {
		t.Fatalf("dnsmasq: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(pid); err == nil {
			exec.Command("kill", strings.TrimSpace(string(b))).Run()
		}
	})

	// The site's settings: where the state is, the lab's bridge and
	// network, a policy counting documentation addresses as the internet,
	// and a default profile giving the beacon its C2.
	bridge := "tbxb" + id
	policy := filepath.Join(dir, "policy.json")
	profiles := filepath.Join(dir, "profiles")
	if err := os.MkdirAll(profiles, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(policy, []byte(`{"documentation": true}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	profile := fmt.Sprintf(`{
  "name": "default", "version": "1.1.0-examples",
  "description": "The examples test's site default: the beacon, checking in with its C2 four times.",
  "lease": {"vcpus": 1, "memory_mib": 512, "disk_gib": 4, "ttl": "2h"},
  "timeouts": {"boot": "3m", "execution": "3m", "window": "5m"},
  "network": {"mode": "sinkhole", "rate_limit": "64 kbytes/second", "allow_smtp": false, "promote": true},
  "instrumentation": "pcap",
  "execution": {"args": ["-c2", "c2.example", "-c2-addr", %q, "-interval", "2s", "-count", "4"],
    "workdir": "/tmp/talkbox", "detach": false, "cycles": 2}
}
`, l.c2addr)
	if err := os.WriteFile(filepath.Join(profiles, "default.json"), []byte(profile), 0o644); err != nil {
		t.Fatal(err)
	}
	l.env = []string{"TB_STATE=" + l.stateDir, "TB_LEASE_BRIDGE=" + bridge, "TB_LEASE_LAB_NET=" + labnet,
		"TB_ALLOW_POLICY=" + policy, "TB_PROFILES=" + profiles}

	// Cleanups run last first: the guests go, then their captures, then
	// the lab (what of it net up recorded, had it failed halfway).
	t.Cleanup(func() { l.run("tb-capture", "net", "down") })
	l.tool(t, "tb-capture", "net", "up", "--bridge", bridge, "--lab-net", labnet, "--sink-ns", "tbxs"+id, "--sink-veth", "tbxk"+id,
		"--sink-net", sinknet, "--table", "talkbox"+id, "--uplink", uplink, "--upstream", resolver, "--documentation")
	t.Cleanup(func() {
		for _, id := range l.ids(t, records.KindLease) {
			l.run("tb-capture", "stop", "--lease", id)
		}
	})
	t.Cleanup(func() { leasetest.Cleanup(l.stateDir) })
	return l
}

// serveC2 serves the demo's C2 on the documentation address in the
// internet namespace, logging check-ins to c2log.
func (l *exampleLab) serveC2(t *testing.T, inet string) {
	var ln net.Listener
	labtest.In(t, inet, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(l.c2addr, "80"))
		return err
	})
	f, err := os.Create(l.c2log)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: c2.NewHandler(f), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); f.Close() })
}

// environ is the environment of the tools: base (without its PATH and
// TB_ settings), PATH with the test's tools first, and the site's
// settings.
func (l *exampleLab) environ(base []string, path string) []string {
	env := slices.DeleteFunc(slices.Clone(base), func(kv string) bool {
		return strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "TB_")
	})
	return append(append(env, "PATH="+l.bin+":"+path), l.env...)
}

const stdPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// run runs one of the tools and returns its output and error.
func (l *exampleLab) run(tool string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(l.bin, tool), args...)
	cmd.Env = l.environ(os.Environ(), stdPath)
	return cmd.CombinedOutput()
}

// tool runs one of the tools, failing the test when it fails.
func (l *exampleLab) tool(t *testing.T, tool string, args ...string) []byte {
	t.Helper()
	out, err := l.run(tool, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
	return out
}

func (l *exampleLab) ids(t *testing.T, kind string) []string {
	st, err := state.Open(context.Background(), l.stateDir)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer st.Close()
	ids, err := st.List(kind)
	if err != nil {
		t.Error(err)
	}
	return ids
}

// get reads one record of the lab's state.
func (l *exampleLab) get(t *testing.T, id string, r records.Record) {
	t.Helper()
	st, err := state.Open(context.Background(), l.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Get(id, r); err != nil {
		t.Fatal(err)
	}
}

// cycles are the cycles of a plan, oldest first, with their analyses.
func (l *exampleLab) cycles(t *testing.T, plan string) ([]records.Cycle, []records.RunAnalysis) {
	t.Helper()
	var cs []records.Cycle
	var as []records.RunAnalysis
	for _, id := range l.ids(t, records.KindCycle) {
		var c records.Cycle
		l.get(t, id, &c)
		if c.Plan != plan {
			continue
		}
		var a records.RunAnalysis
		if c.Analysis != "" {
			l.get(t, c.Analysis, &a)
		}
		cs, as = append(cs, c), append(as, a)
	}
	return cs, as
}

// cronFile is examples/cron taken apart: the one-time setup its comment
// gives, the variables it sets and the command of its one entry.
type cronFile struct {
	setup   []string
	vars    []string
	command string
}

// cronVar is a crontab line that sets a variable.
var cronVar = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

func parseCron(t *testing.T, path string) cronFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var c cronFile
	inSetup := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
			if strings.Contains(line, "Once, by hand") {
				inSetup = true
			} else if cmd, ok := strings.CutPrefix(line, "#   "); ok && inSetup {
				c.setup = append(c.setup, cmd)
			} else if strings.TrimSpace(line) == "#" {
				inSetup = false
			}
		case strings.TrimSpace(line) == "":
		case cronVar.MatchString(line):
			c.vars = append(c.vars, line)
		default:
			// minute hour day month weekday user command
			rest := line
			for range 6 {
				rest = strings.TrimLeft(rest, " \t")
				i := strings.IndexAny(rest, " \t")
				if i < 0 {
					t.Fatalf("%s: an entry without a command: %q", path, line)
				}
				rest = rest[i:]
			}
			if c.command != "" {
				t.Fatalf("%s: more than one entry", path)
			}
			c.command = strings.TrimSpace(rest)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(c.setup) == 0 || c.command == "" {
		t.Fatalf("%s: setup %q, command %q", path, c.setup, c.command)
	}
	// cron turns an unescaped % into a line break: the command would not
	// be what the file shows.
	if strings.Contains(c.command, "%") {
		t.Fatalf("%s: the command has a %%, which cron turns into a line break", path)
	}
	return c
}

// localise points the absolute paths of an example at the test's own
// directory, failing when one of them is no longer in the text (the test
// would otherwise run something else than the example).
func localise(t *testing.T, text string, paths map[string]string) string {
	t.Helper()
	for from, to := range paths {
		if !strings.Contains(text, from) {
			t.Fatalf("%q is not in %q any more", from, text)
		}
		text = strings.ReplaceAll(text, from, to)
	}
	return text
}

// runCronExample does the cron example's setup by hand, as its comment
// says (with the test's sample and a 20 s window instead of 55 min), then
// runs its entry's command line as cron would: with the file's variables
// (the test's tools first in its PATH), and the site's settings.
func runCronExample(t *testing.T, l *exampleLab) {
	c := parseCron(t, filepath.Join(examplesDir, "cron"))
	etc, run, log, metrics := filepath.Join(l.dir, "etc"), filepath.Join(l.dir, "run"), filepath.Join(l.dir, "log"), filepath.Join(l.dir, "textfile")
	for _, d := range []string{etc, run, log, metrics} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	envFile := filepath.Join(etc, "hourly.env")
	setup := localise(t, strings.Join(c.setup, "\n"), map[string]string{
		"bot.arm":                 l.sample,
		"--window 55m":            "--window 20s",
		"/etc/talkbox/hourly.env": envFile,
	})
	sh := exec.Command("bash", "-euo", "pipefail", "-c", setup)
	sh.Env = l.environ(os.Environ(), stdPath)
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("the cron example's setup:\n%s\n: %v\n%s", setup, err, out)
	}
	b, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	var plan, lease string
	if _, err := fmt.Sscanf(string(b), "P=%s L=%s", &plan, &lease); err != nil || records.CheckID(plan) != nil || records.CheckID(lease) != nil {
		t.Fatalf("the setup wrote %q (%v)", b, err)
	}

	command := localise(t, c.command, map[string]string{
		"/etc/talkbox/hourly.env":                    envFile,
		"/run/talkbox-hourly.lock":                   filepath.Join(run, "talkbox-hourly.lock"),
		"/var/lib/node_exporter/textfile_collector/": metrics + "/",
		"/var/log/talkbox-hourly.log":                filepath.Join(log, "talkbox-hourly.log"),
	})
	// cron's environment: HOME, LOGNAME and SHELL, then the file's
	// variables.
	shell, path := "/bin/sh", "/usr/bin:/bin"
	env := []string{"HOME=/root", "LOGNAME=root", "SHELL=" + shell}
	for _, v := range c.vars {
		k, val, _ := strings.Cut(v, "=")
		switch k {
		case "SHELL":
			shell = val
		case "PATH":
			path = val
		}
		env = append(env, v)
	}
	start := time.Now()
	cron := exec.Command(shell, "-c", command)
	cron.Env = l.environ(env, path)
	cron.Dir = "/"
	out, err := cron.CombinedOutput()
	logged, _ := os.ReadFile(filepath.Join(log, "talkbox-hourly.log"))
	t.Logf("cron: %s (%s)\n%s\nits log:\n%s", command, time.Since(start).Round(time.Second), out, logged)
	if err != nil {
		t.Fatalf("the cron entry's command: %v", err)
	}

	// One detached cycle of P on L, completed; the lease renewed for 720 h;
	// the metrics written.
	cs, _ := l.cycles(t, plan)
	if len(cs) != 1 || cs[0].Lease != lease || cs[0].State != records.CycleCompleted {
		t.Fatalf("cycles of %s: %+v", plan, cs)
	}
	var ls records.SandboxLease
	l.get(t, lease, &ls)
	if ls.ExpiresAt == nil || ls.ExpiresAt.Before(start.Add(719*time.Hour)) {
		t.Errorf("lease %s expires at %v: not renewed for 720 h", lease, ls.ExpiresAt)
	}
	// The metrics are the state's, written after the cycle: the lease's
	// health and every completed cycle, this one included.
	completed := 0
	for _, id := range l.ids(t, records.KindCycle) {
		var c records.Cycle
		if l.get(t, id, &c); c.State == records.CycleCompleted {
			completed++
		}
	}
	prom, err := os.ReadFile(filepath.Join(metrics, "talkbox.prom"))
	if err != nil || !strings.Contains(string(prom), fmt.Sprintf("talkbox_cycles{state=%q} %d\n", "completed", completed)) ||
		!strings.Contains(string(prom), fmt.Sprintf("talkbox_lease_healthy{lease=%q", lease)) {
		t.Errorf("metrics (%v), want %d cycles completed and lease %s:\n%s", err, completed, lease, prom)
	}
	if !strings.Contains(string(logged), `"id":"`+cs[0].ID+`"`) {
		t.Errorf("the log does not show cycle %s", cs[0].ID)
	}
}

// runMakefileExample runs the Makefile on a directory holding the beacon
// (its pipeline.sh plans it, leases a guest, captures and runs cycles
// until the analysis says done) and checks the report and what the
// cycles did: cycle 1 sinkholed and promoting the C2, cycle 2 reaching it.
func runMakefileExample(t *testing.T, l *exampleLab) {
	out := filepath.Join(l.dir, "out")
	before := l.ids(t, records.KindPlan)
	start := time.Now()
	makefile, err := filepath.Abs(filepath.Join(examplesDir, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	// Elsewhere than the repository: the Makefile finds pipeline.sh.
	mk := exec.Command("make", "-j2", "-f", makefile, "SAMPLES="+filepath.Dir(l.sample), "OUT="+out, "CYCLES=3")
	mk.Dir = l.dir
	mk.Env = l.environ(os.Environ(), stdPath)
	b, err := mk.CombinedOutput()
	log, _ := os.ReadFile(filepath.Join(out, "beacon.log"))
	t.Logf("make (%s):\n%s\npipeline.sh's stderr:\n%s", time.Since(start).Round(time.Second), b, log)
	if err != nil {
		t.Fatalf("make -f examples/Makefile: %v", err)
	}
	report, err := os.ReadFile(filepath.Join(out, "beacon.report"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the report:\n%s", report)

	plans := slices.DeleteFunc(l.ids(t, records.KindPlan), func(id string) bool { return slices.Contains(before, id) })
	if len(plans) != 1 {
		t.Fatalf("the pipeline made plans %v, want one", plans)
	}
	cs, as := l.cycles(t, plans[0])
	if len(cs) != 2 {
		t.Fatalf("%d cycles, want 2 (the C2 promoted by cycle 1, reached by cycle 2): %+v", len(cs), cs)
	}
	c2ep := "endpoint " + l.c2addr + ":80/tcp"
	for i, c := range cs {
		if c.State != records.CycleCompleted || c.Lease != cs[0].Lease {
			t.Fatalf("cycle %d: %s on %s (%s)", i+1, c.State, c.Lease, c.Error)
		}
		if !strings.Contains(string(report), c.ID) {
			t.Errorf("the report does not show cycle %s", c.ID)
		}
	}
	if as[0].Recommendation != records.RecommendRerun || !slices.Contains(as[0].Promoted, c2ep) {
		t.Errorf("cycle 1: %s, promoted %v; want rerun after promoting %s", as[0].Recommendation, as[0].Promoted, c2ep)
	}
	if as[1].Recommendation != records.RecommendDone {
		t.Errorf("cycle 2: %s, want done", as[1].Recommendation)
	}
	f, err := os.Open(l.c2log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hits, err := c2.ReadHits(f)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(hits, func(h c2.Hit) bool { return h.Bot == "tb-beacon" && !h.Time.Before(*cs[1].StartedAt) }) {
		t.Errorf("the C2 saw no check-in from cycle 2: %+v", hits)
	}
	// pipeline.sh's trap: the lease released, its captures stopped.
	var ls records.SandboxLease
	l.get(t, cs[0].Lease, &ls)
	if ls.State != records.LeaseReleased {
		t.Errorf("lease %s is %s after the pipeline, want released", ls.ID, ls.State)
	}
	for _, id := range l.ids(t, records.KindCapture) {
		var c records.Capture
		if l.get(t, id, &c); c.Lease == ls.ID && c.State != "stopped" {
			t.Errorf("capture %s of lease %s is %s after the pipeline, want stopped", c.ID, ls.ID, c.State)
		}
	}
}
