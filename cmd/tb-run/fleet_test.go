package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// fleetHost is one host of the fleet test: its own directory, libvirtd,
// lab (bridge, sinkhole, nftables) and worker, in its own network
// namespace for the second host.
type fleetHost struct {
	name, local, lab, ns string
	uri                  string
	bin                  string // the tools
	second               *leasetest.Host
	serve                string // the address its worker serves its blobs on
	worker               *exec.Cmd
	log                  bytes.Buffer
}

// TestFleetOfTwoHosts runs a batch of beacon cycles over two hosts on one
// PostgreSQL store: this machine, and a second libvirtd in its own
// namespaces with its own lab there. Each host keeps its own blobs; the
// second fetches the sample from the first's worker. Each host's worker leases, contains
// and captures on its own host; the second host dies mid-batch (its worker
// killed, its libvirtd gone) and its cycle is done again on the first, on
// a fresh lease, with lineage saying so. Every cycle of the batch ends
// completed once, and the C2 is promoted in the shared allow-list.
// fleet is a fleet of hosts on this machine sharing a throw-away
// PostgreSQL store: host-a is this machine's libvirtd, host-b (when there
// are two) a second libvirtd in its own namespaces. Each host has its own
// directory and blobs, lab (in its namespace), "internet" behind the lab's
// uplink, and worker, which serves its blobs to the other host.
type fleet struct {
	t     testing.TB
	bin   string
	goBin string
	work  string
	env   []string
	hosts []*fleetHost
	st    *state.Store
}

// fleetC2 is the beacon's C2 address, nothing answers there, and
// fleetResolver the labs' upstream. Like the internet they are on no
// network of a host (the allow-list never lets a guest reach those): each
// host's uplink is on 198.51.100.64/28, whose .66 routes to them.
const (
	fleetC2       = "198.51.100.242"
	fleetResolver = "198.51.100.243"
	fleetGateway  = "198.51.100.66"
)

func newFleet(t testing.TB, n int) *fleet {
	if os.Geteuid() != 0 {
		t.Fatal("the fleet test needs root (bridges, namespaces, VMs); run it with make test")
	}
	ctx := context.Background()
	f := &fleet{t: t}
	f.bin, f.goBin = demoTools(t)
	f.work = t.TempDir()
	if err := leasetest.Reachable(f.work); err != nil {
		t.Fatal(err)
	}
	pg := pgtest.Start(t, pgtest.WithoutFsync())
	url := pg.NewDatabase(t)
	var tb [3]byte
	rand.Read(tb[:])
	tag := hex.EncodeToString(tb[:])
	f.hosts = []*fleetHost{{name: "host-a", uri: "qemu:///system", lab: "fa" + tag}}
	if n == 2 {
		second, err := leasetest.SecondHost(ctx, "tbfx"+tag)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(second.Stop)
		// Each host serves its blobs to the other on its end of the veth
		// between them: host B fetches the sample planned on host A.
		f.hosts[0].serve = second.HostIP + ":0"
		f.hosts = append(f.hosts, &fleetHost{name: "host-b", uri: second.SocketURI, lab: "fb" + tag, ns: second.NS, second: second,
			serve: second.NSIP + ":0"})
	}
	fx, err := leasetest.Image(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f.env = append(os.Environ(), "PATH="+f.bin+":"+os.Getenv("PATH"), "TB_STATE="+url,
		"TB_ALLOW_POLICY="+filepath.Join(f.work, "policy.json"))
	if err := os.WriteFile(filepath.Join(f.work, "policy.json"), []byte(`{"documentation": true}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, h := range f.hosts {
		h.local, h.bin = filepath.Join(f.work, h.name), f.bin
		if err := fx.Install(ctx, h.local, state.WithShared(url)); err != nil {
			t.Fatal(err)
		}
		x := string(rune('a' + i))
		bridge, labNet := "tbf"+x+tag, fmt.Sprintf("10.223.%d.0/24", i+1)
		cfg := fmt.Sprintf(`{"hosts": [{"name": %q, "uri": %q, "accel": "tcg"}], "bridge": %q, "lab_net": %q}`, h.name, h.uri, bridge, labNet)
		if err := os.MkdirAll(filepath.Join(h.local, "tb-lease"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(h.local, "tb-lease", "config.json"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		// The host's "internet": a namespace of its own behind the lab's
		// uplink, where the C2's address answers nothing.
		inet, uplink := "tbfi"+x+tag, "tbfu"+x+tag
		ip := func(ns string, args ...string) {
			t.Helper()
			if ns != "" {
				args = append([]string{"-n", ns}, args...)
			}
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
		ip("", "netns", "add", inet)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", inet).Run() })
		ip(h.ns, "link", "add", uplink, "type", "veth", "peer", "name", "up0", "netns", inet)
		t.Cleanup(func() { h.command(f.env, "ip", "link", "del", uplink).Run() })
		ip(h.ns, "addr", "add", "198.51.100.65/28", "dev", uplink)
		ip(h.ns, "link", "set", uplink, "up")
		ip(inet, "addr", "add", fleetGateway+"/28", "dev", "up0")
		ip(inet, "addr", "add", fleetC2+"/32", "dev", "up0")
		ip(inet, "link", "set", "up0", "up")
		// The lab's and the sinkhole's traffic leaves through a routing
		// table of its own, whose default route is the uplink: the host's
		// own default route stays as it is.
		sinkNet := fmt.Sprintf("10.224.%d.0/24", i+1)
		table := strconv.Itoa(3900 + i)
		if h.ns == "" {
			// A run killed before its cleanups left its table's route and
			// its rules in the root namespace: the numbers are this test's.
			exec.Command("ip", "route", "flush", "table", table).Run()
			for prio := 3900 + 4*i; prio < 3900+4*i+4; prio++ {
				for exec.Command("ip", "rule", "del", "priority", strconv.Itoa(prio)).Run() == nil {
				}
			}
		}
		ip(h.ns, "route", "add", "default", "via", fleetGateway, "dev", uplink, "table", table)
		for j, from := range []string{labNet, sinkNet} {
			prio := 3900 + 4*i + 2*j
			for _, r := range [][]string{
				{"from", from, "lookup", "main", "suppress_prefixlength", "0", "priority", strconv.Itoa(prio)},
				{"from", from, "lookup", table, "priority", strconv.Itoa(prio + 1)},
			} {
				ip(h.ns, append([]string{"rule", "add"}, r...)...)
				del := append([]string{"rule", "del"}, r...)
				if h.ns != "" {
					del = append([]string{"-n", h.ns}, del...)
				}
				t.Cleanup(func() { exec.Command("ip", del...).Run() })
			}
		}
		// Registered before net up, which may fail half way. A host killed
		// by the test has lost its namespace: its lab's sinkhole and
		// services are taken down from here.
		t.Cleanup(func() {
			down := h.command(f.env, "tb-capture", "net", "down", "--lab", h.lab)
			if _, err := os.Stat("/run/netns/" + h.ns); h.ns != "" && err != nil {
				down = exec.Command(filepath.Join(f.bin, "tb-capture"), "net", "down", "--lab", h.lab)
				down.Env = append(slices.Clone(f.env), "TB_LOCAL="+h.local)
			}
			if out, err := down.CombinedOutput(); err != nil {
				t.Logf("%s: net down: %v: %s", h.name, err, out)
			}
		})
		f.run(h, "", "tb-capture", "net", "up", "--lab", h.lab, "--bridge", bridge, "--lab-net", labNet, "--uplink", uplink,
			"--sink-ns", "tbfs"+x+tag, "--sink-veth", "tbfk"+x+tag, "--sink-net", sinkNet,
			"--table", "talkboxf"+x+tag, "--documentation", "--upstream", fleetResolver)
	}
	if f.st, err = state.Open(ctx, f.hosts[0].local, state.WithShared(url)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Captures and guests outlive a failed test unless stopped here.
		leases, _ := state.Find[records.SandboxLease](f.st, records.KindLease, nil)
		for _, l := range leases {
			for _, h := range f.hosts {
				if l.Host == h.name {
					// Not in the host's namespace: it may be gone.
					stop := exec.Command(filepath.Join(f.bin, "tb-capture"), "stop", "--lease", l.ID)
					stop.Env = append(slices.Clone(f.env), "TB_LOCAL="+h.local)
					if out, err := stop.CombinedOutput(); err != nil {
						t.Logf("stopping the capture of %s: %v: %s", l.ID, err, out)
					}
				}
			}
		}
		leasetest.Cleanup(f.hosts[0].local, state.WithShared(url))
	})
	return f
}

// run runs a tool as host h would: in its namespace, on its directory.
func (f *fleet) run(h *fleetHost, stdin string, args ...string) string {
	f.t.Helper()
	cmd := h.command(f.env, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		f.t.Fatalf("%s: %s: %v\n%s", h.name, strings.Join(args, " "), err, errb.Bytes())
	}
	return out.String()
}

// plan plans the Go beacon (count check-ins 2 s apart to the C2) on
// host A, its blob in the shared directory, and returns the plan's line.
func (f *fleet) plan(count int) string {
	t := f.t
	beacon := filepath.Join(f.work, "beacon")
	build := exec.Command(f.goBin, "build", "-trimpath", "-o", beacon, "../../internal/demo/beacon/cmd/beacon")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the beacon: %v\n%s", err, out)
	}
	planned := f.run(f.hosts[0], "", "tb-plan", "--network", "allowlist", "--promote", "--timeout", "120s",
		"--arg=-c2", "--arg=c2.example", "--arg=-c2-addr", "--arg="+fleetC2, "--arg=-interval", "--arg=2s", "--arg=-count", fmt.Sprintf("--arg=%d", count), beacon)
	for _, l := range strings.Split(planned, "\n") {
		if strings.Contains(l, `"kind":"plan"`) && strings.Contains(l, `"runnable":true`) {
			return l
		}
	}
	t.Fatalf("the beacon's plan is not runnable: %s", planned)
	return ""
}

// submit submits n cycles of the plan and returns their IDs.
func (f *fleet) submit(plan string, n int) []string {
	t := f.t
	submitted := f.run(f.hosts[0], strings.Repeat(plan+"\n", n), "tb-run", "submit")
	var ids []string
	for _, l := range strings.Split(strings.TrimSpace(submitted), "\n") {
		rec, err := records.Decode([]byte(l))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rec.Header().ID)
	}
	if len(ids) != n {
		t.Fatalf("submitted %d cycles, want %d: %s", len(ids), n, submitted)
	}
	return ids
}

// startWorkers starts every host's worker, which exits once nothing is
// left to drive.
func (f *fleet) startWorkers() {
	for _, h := range f.hosts {
		args := []string{"tb-run", "worker", "--host", h.name, "--lab", h.lab, "--heartbeat", "1s", "--dead-after", "10s", "--until-idle"}
		if h.serve != "" {
			args = append(args, "--serve-blobs", h.serve)
		}
		h.worker = h.command(f.env, args...)
		h.worker.Stdout, h.worker.Stderr = &h.log, &h.log
		h.worker.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := h.worker.Start(); err != nil {
			f.t.Fatal(err)
		}
		f.t.Cleanup(func() { h.worker.Process.Kill(); h.worker.Wait() })
	}
}

// wait waits for host h's worker to end, and fails unless it ended well.
func (f *fleet) wait(h *fleetHost, limit time.Duration) {
	done := make(chan error, 1)
	go func() { done <- h.worker.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			f.t.Fatalf("%s's worker: %v\n%s", h.name, err, &h.log)
		}
	case <-time.After(limit):
		f.t.Fatalf("%s's worker did not finish the batch:\n%s", h.name, &h.log)
	}
}

// leaseHost is the host of a lease ("" for none).
func (f *fleet) leaseHost(id string) string {
	var l records.SandboxLease
	if id == "" || f.st.Get(id, &l) != nil {
		return ""
	}
	return l.Host
}

func TestFleetOfTwoHosts(t *testing.T) {
	f := newFleet(t, 2)
	hosts, st := f.hosts, f.st
	const batch = 4
	ids := f.submit(f.plan(5), batch)
	const c2 = fleetC2

	start := time.Now()
	f.startWorkers()
	leaseHost := f.leaseHost
	// Host B dies once it executes a cycle: its worker is killed and its
	// libvirtd (with its guests) goes.
	var killed string
	for deadline := time.Now().Add(10 * time.Minute); killed == ""; {
		if time.Now().After(deadline) {
			t.Fatalf("host B never executed a cycle; its worker said:\n%s", &hosts[1].log)
		}
		cs, err := state.Find(st, records.KindCycle, func(c *records.Cycle) bool {
			return c.State == records.CycleExecuting && leaseHost(c.Lease) == "host-b"
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) > 0 {
			killed = cs[0].ID
			break
		}
		time.Sleep(200 * time.Millisecond) // polling the shared store; the test has no other signal
	}
	hosts[1].worker.Process.Kill()
	hosts[1].worker.Wait()
	hosts[1].second.Stop()
	t.Logf("host B killed while it executed %s, %s after the workers started", killed, time.Since(start).Round(time.Second))

	f.wait(hosts[0], 15*time.Minute)
	t.Logf("the batch of %d took %s", batch, time.Since(start).Round(time.Second))

	cycles, err := state.Find[records.Cycle](st, records.KindCycle, nil)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*records.Cycle{}
	for _, c := range cycles {
		byID[c.ID] = c
	}
	var finished []*records.Cycle
	for _, id := range ids {
		c := byID[id]
		for c.ReplacedBy != "" {
			n := byID[c.ReplacedBy]
			if c.State != records.CycleFailed || n == nil || n.Replaces != c.ID || !strings.Contains(c.Error, "host host-b went silent") {
				t.Fatalf("%s (%s, %q) and its replacement %s disagree", c.ID, c.State, c.Error, c.ReplacedBy)
			}
			c = n
		}
		if c.State != records.CycleCompleted {
			t.Fatalf("cycle %s of the batch ended %s: %s\nhost A's worker:\n%s", c.ID, c.State, c.Error, &hosts[0].log)
		}
		finished = append(finished, c)
	}
	if r := byID[killed]; r.ReplacedBy == "" || leaseHost(byID[r.ReplacedBy].Lease) != "host-a" {
		t.Fatalf("the cycle host B died in (%s, %s) was not done again on host A", killed, r.State)
	}
	// Host B ran the sample planned on host A: it fetched it from A's
	// worker into its own blob store.
	sha := byID[killed].Sample
	if _, err := os.Stat(filepath.Join(hosts[1].local, "blobs", "sha256", sha[:2], sha)); err != nil {
		t.Errorf("host B's blob store has no sample: %v", err)
	}
	// Every lease was contained and captured by its own host's lab.
	for _, c := range finished {
		var capt records.Capture
		if err := st.Get(c.Capture, &capt); err != nil {
			t.Fatalf("cycle %s: capture %q: %v", c.ID, c.Capture, err)
		}
		want := hosts[slices.IndexFunc(hosts, func(h *fleetHost) bool { return h.name == leaseHost(c.Lease) })].lab
		if capt.Lab != want || capt.Lease != c.Lease || len(c.Artifacts) == 0 {
			t.Errorf("cycle %s on %s: captured by lab %q (want %q), artifacts %v", c.ID, leaseHost(c.Lease), capt.Lab, want, c.Artifacts)
		}
	}
	leases, err := state.Find[records.SandboxLease](st, records.KindLease, nil)
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]int{}
	for _, l := range leases {
		on[l.Host]++
		var captures []*records.Capture
		if captures, err = state.FindBy[records.Capture](st, records.KindCapture, records.KeyLease, l.ID, nil); err != nil || len(captures) == 0 {
			t.Errorf("lease %s on %s was never captured (%v)", l.ID, l.Host, err)
		}
	}
	if on["host-a"] == 0 || on["host-b"] == 0 {
		t.Errorf("leases per host %v: the batch did not spread", on)
	}
	// A finished cycle's lease went back to its host's pool: host A's
	// cycles that did not ask for a fresh lease shared theirs.
	pooled := map[string]bool{}
	var onA int
	for _, c := range cycles {
		if !c.FreshLease && leaseHost(c.Lease) == "host-a" {
			onA++
			pooled[c.Lease] = true
		}
	}
	if onA >= 2 && len(pooled) >= onA {
		t.Errorf("host A's %d cycles booted %d leases: none was reused from the pool", onA, len(pooled))
	}
	// Nothing completed twice.
	events, err := state.Find[records.Event](st, records.KindEvent, nil)
	if err != nil {
		t.Fatal(err)
	}
	completed := map[string]int{}
	for _, e := range events {
		if e.To == records.CycleCompleted {
			completed[e.Cycle]++
		}
	}
	for id, n := range completed {
		if n != 1 {
			t.Errorf("cycle %s completed %d times", id, n)
		}
	}
	// The C2, promoted in the fleet's shared allow-list.
	promoted := false
	for _, c := range finished {
		var a records.RunAnalysis
		if err := st.Get(c.Analysis, &a); err != nil {
			t.Fatal(err)
		}
		promoted = promoted || slices.Contains(a.Promoted, "endpoint "+c2+":80/tcp")
	}
	revs, err := state.Find[records.AllowRevision](st, records.KindRevision, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !promoted || len(revs) == 0 {
		t.Fatalf("the C2 %s was not promoted (%d revisions)", c2, len(revs))
	}
	t.Logf("leases per host %v; host A's worker:\n%s", on, lastLogLines(hosts[0].log.String(), 20))
}

// command is a tool run on host h: in its network namespace, with its
// directory.
func (h *fleetHost) command(env []string, args ...string) *exec.Cmd {
	args = slices.Clone(args)
	if strings.HasPrefix(args[0], "tb-") {
		args[0] = filepath.Join(h.bin, args[0])
	}
	if h.ns != "" {
		// nsenter, not ip netns exec: that one also unshares the mount
		// namespace, where the namespaces tb-capture names would stay.
		args = append([]string{"nsenter", "--net=/run/netns/" + h.ns}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(slices.Clone(env), "TB_LOCAL="+h.local)
	return cmd
}

func lastLogLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// fleetBenchBatch is the batch BenchmarkFleetCycles runs on each fleet.
const fleetBenchBatch = 8

// BenchmarkFleetCycles runs the same batch of beacon cycles (5 check-ins
// 2 s apart, traced, post-processed and promoted, as tb-plan's default
// profile has it) on a fleet of one host and of two on this machine, from
// the workers' start to the last cycle's end (lease boots included), and
// reports cycles per hour. bench/fleet/run.sh runs it.
func BenchmarkFleetCycles(b *testing.B) {
	for _, n := range []int{1, 2} {
		// No "=" in the name: it is in b.TempDir's path, which INetSim
		// refuses in its --config.
		b.Run(fmt.Sprintf("%d-hosts", n), func(b *testing.B) {
			f := newFleet(b, n)
			ids := f.submit(f.plan(5), fleetBenchBatch)
			b.ResetTimer()
			start := time.Now()
			f.startWorkers()
			for _, h := range f.hosts {
				f.wait(h, time.Hour)
			}
			took := time.Since(start)
			b.StopTimer()
			for _, id := range ids {
				var c records.Cycle
				if err := f.st.Get(id, &c); err != nil || c.State != records.CycleCompleted {
					b.Fatalf("cycle %s: %s %s (%v)", id, c.State, c.Error, err)
				}
			}
			b.ReportMetric(float64(len(ids))/took.Hours(), "cycles/hour")
			b.ReportMetric(took.Seconds()/float64(len(ids)), "s/cycle")
		})
	}
}
