package lease_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"github.com/talkbox-sandbox/talkbox/internal/lease"
	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// TestMain lets the test binary be tb-capture's daemon ("... --state DIR
// daemon ID", as capture.Start runs it), so the real-guest test runs real
// captures without building tb-capture.
func TestMain(m *testing.M) {
	if n := len(os.Args); n >= 5 && os.Args[n-2] == "daemon" && os.Args[1] == "--state" {
		os.Exit(captureDaemon(os.Args[2], os.Args[n-1]))
	}
	os.Exit(m.Run())
}

func captureDaemon(stateDir, id string) int {
	ctx := context.Background()
	st, err := state.Open(ctx, stateDir)
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	defer st.Close()
	if err := capture.RunDaemon(ctx, st, slog.New(slog.NewTextHandler(os.Stderr, nil)), id); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	return 0
}

// behaveDir is where sample X (the beacon's -behave) writes its
// persistence files in the guest.
const behaveDir = "/var/tmp/talkbox/behave"

// TestRevertRealGuest: sample X, with root in its guest, leaves a
// persistence file and its process running, and its lease is allowed a
// destination and captured under X's plan's rules; the lease goes back to
// the pool (release --keep, as a fleet worker does) and is handed to
// sample Y. Y's guest has neither X's file nor X's process, X's allowed
// destination is not in the lease's live set, and the capture Y's cycle
// gets is one started with Y's plan's rules. That first revert boots; the
// next, to sample Z, restores the clean state saved after that boot, and
// Z's guest has neither Y's file nor Y's process. Then Z stops its guest
// agent for good: Z's own next cycle gets the guest reverted, not silent.
func TestRevertRealGuest(t *testing.T) {
	h := newRealGuestHost(t, leasetest.Spec, documentationLab)
	ctx := context.Background()
	st, m, lab, stderr := h.st, h.m, h.lab, h.stderr
	labH, err := netlab.Open(st, lab.Name)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := labH.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	bin := buildBeacon(t)

	// Sample X's plan forwards SMTP at its own rate; Y's does neither.
	px := storePlan(t, st, "aaaa", records.NetPolicy{Mode: "allowlist", AllowSMTP: true, RateLimit: "24kbytes/second"})
	py := storePlan(t, st, "bbbb", records.NetPolicy{Mode: "allowlist"})
	lx, err := m.Acquire(ctx, lease.Request{Plan: px, Holder: "cycle_x"})
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	capX := cycleCapture(t, st, lab.Name, lx.ID)
	if capX.Rules == nil || !capX.Rules.AllowSMTP {
		t.Fatalf("X's capture does not have X's rules: %+v", capX.Rules)
	}
	// X's cycles earned an allowed destination (a day long, as promote
	// gives), enforced in the lease's live set.
	book := &allowlist.Book{St: st}
	allowed := firewall.Element{Dst: netip.MustParseAddr("203.0.113.7"), Proto: "tcp", Port: 443, Verdict: firewall.Forward}
	promote(t, book, lx.ID, "203.0.113.7:443/tcp")
	if _, err := book.Reconcile(ctx, fw, lx.ID); err != nil {
		t.Fatal(err)
	}
	if set := liveSet(t, fw, lx.ID); !slices.ContainsFunc(set, sameElement(allowed)) {
		t.Fatalf("X's allowed destination is not enforced before the revert: %v", set)
	}

	// X runs: persistence files, and its process renamed and left running.
	conn, err := virt.Connect(lx.ConnectURI)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	_, err = guestagent.New(conn, lx.VMName).WriteFile(ctx, "/var/tmp/x-sample", f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	marker := behaveDir + "/" + beacon.Persistence[0]
	// The agent cannot wait for a detached process's step: the shell in
	// the guest waits (bounded) for X's last persistence file.
	last := behaveDir + "/" + beacon.Persistence[len(beacon.Persistence)-1]
	guestSh(t, m, lx.ID, "chmod 755 /var/tmp/x-sample && (setsid /var/tmp/x-sample -behave "+behaveDir+
		" -c2 192.0.2.1 -interval 1s >/dev/null 2>&1 </dev/null &) && i=0 && while [ ! -e "+last+" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done && sync && test -e "+marker)
	if out := guestSh(t, m, lx.ID, xProcesses); !runsX(out) {
		t.Fatalf("X's process is not running in its guest: %q", out)
	}

	// The worker's release --keep, then Y's cycle acquires.
	if _, err := m.Release(ctx, lx.ID, true); err != nil {
		t.Fatal(err)
	}
	ly, err := m.Acquire(ctx, lease.Request{Plan: py, Holder: "cycle_y"})
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	if ly.ID != lx.ID {
		t.Fatalf("Y got lease %s, not the idle %s", ly.ID, lx.ID)
	}
	// Until Y's cycle starts a capture, the lease has no allow set at all.
	if set, err := fw.AllowSet(ctx, ly.ID); !errors.Is(err, firewall.ErrNoLease) && slices.ContainsFunc(set, sameElement(allowed)) {
		t.Errorf("after the revert X's allowed destination is still enforced: %v", set)
	}
	// Y's cycle: the lease's capture (tb-run's EnsureCapture), then
	// tb-allow apply.
	capY := cycleCapture(t, st, lab.Name, ly.ID)
	if capY.ID == capX.ID || capY.Plan != py.ID || capY.Rules == nil || capY.Rules.AllowSMTP || capY.Rules.RateLimit == capX.Rules.RateLimit {
		t.Errorf("Y's cycle captures with %s (plan %s, rules %+v), not a capture with Y's plan's rules", capY.ID, capY.Plan, capY.Rules)
	}
	if _, err := book.Reconcile(ctx, fw, ly.ID); err != nil {
		t.Fatal(err)
	}
	if set := liveSet(t, fw, ly.ID); slices.ContainsFunc(set, sameElement(allowed)) {
		t.Errorf("X's allowed destination is enforced for Y: %v", set)
	}
	// Y's guest, through the agent, as Y's cycle sees it.
	if out := guestSh(t, m, ly.ID, "if [ -e "+marker+" ]; then echo present; else echo absent; fi"); strings.TrimSpace(out) != "absent" {
		t.Errorf("X's persistence file %s is in Y's guest", marker)
	}
	if out := guestSh(t, m, ly.ID, xProcesses); runsX(out) {
		t.Errorf("X's process runs in Y's guest: %q", out)
	}
	if _, _, err := capture.Stop(ctx, st, capY); err != nil {
		t.Error(err)
	}

	// Y leaves a file on disk and a process; sample Z's guest comes from
	// the clean state the first revert saved, without a boot, and has
	// neither.
	guestSh(t, m, ly.ID, "echo "+yContent+" > /var/tmp/y-marker && sync && (setsid sleep "+ySleep+" >/dev/null 2>&1 </dev/null &)")
	if b, err := os.ReadFile(ly.Overlay); err != nil || !bytes.Contains(b, []byte(yContent)) {
		t.Fatalf("Y's file is not on its disk (%v)", err)
	}
	if out := guestSh(t, m, ly.ID, commandLines); !strings.Contains(out, "sleep "+ySleep) {
		t.Fatalf("Y's process is not running in its guest: %q", out)
	}
	if _, err := m.Release(ctx, ly.ID, true); err != nil {
		t.Fatal(err)
	}
	pz := storePlan(t, st, "dddd", records.NetPolicy{Mode: "sinkhole"})
	lz, err := m.Acquire(ctx, lease.Request{Plan: pz, Holder: "cycle_z"})
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	if lz.ID != lx.ID || len(lz.Reverts) != 2 || lz.Reverts[0].How != "boot" || lz.Reverts[1].How != "snapshot" {
		t.Fatalf("Z's lease %s, reverts %+v", lz.ID, lz.Reverts)
	}
	if out := guestSh(t, m, lz.ID, "if [ -e /var/tmp/y-marker ]; then echo present; else echo absent; fi"); strings.TrimSpace(out) != "absent" {
		t.Error("Y's file is in Z's guest")
	}
	// The restored memory would not show it from a disk that kept it: the
	// disk itself must not hold it.
	if b, err := os.ReadFile(lz.Overlay); err != nil || bytes.Contains(b, []byte(yContent)) {
		t.Errorf("Y's file is on Z's disk (%v)", err)
	}
	if out := guestSh(t, m, lz.ID, commandLines); strings.Contains(out, "sleep "+ySleep) {
		t.Errorf("Y's process runs in Z's guest: %q", out)
	}
	if out := guestSh(t, m, lz.ID, xProcesses); runsX(out) {
		t.Errorf("X's process runs in Z's guest: %q", out)
	}

	// Z, root in its guest, leaves a file and stops the guest agent for
	// good (SIGSTOP: the agent's channel stays open and never answers),
	// from a process of its own that outlives the command (2 s later, so
	// that the command's own exit is collected first); the lease goes
	// back to the pool. Z's next cycle must not get the silent guest back,
	// though the guest has run only Z: the idle lease is reverted before
	// it is handed out, and the guest it gets answers and lacks Z's file.
	guestSh(t, m, lz.ID, "echo z > /var/tmp/z-marker && sync && "+agentPID+
		` && (setsid sh -c "sleep 2; kill -STOP $ga" </dev/null >/dev/null 2>&1 &)`)
	agent := guestagent.New(conn, lz.VMName)
	for deadline := time.Now().Add(time.Minute); ; {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := agent.Ping(pctx)
		cancel()
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the guest agent still answers a minute after Z stopped it")
		}
	}
	if _, err := m.Release(ctx, lz.ID, true); err != nil {
		t.Fatal(err)
	}
	lz2, err := m.Acquire(ctx, lease.Request{Plan: pz, Holder: "cycle_z2"})
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	if lz2.ID != lx.ID || len(lz2.Reverts) != 3 || lz2.Health != records.HealthHealthy {
		t.Fatalf("Z's next cycle got lease %s (%s), reverts %+v: not its silent guest reverted", lz2.ID, lz2.Health, lz2.Reverts)
	}
	if out := guestSh(t, m, lz2.ID, "if [ -e /var/tmp/z-marker ]; then echo present; else echo absent; fi"); strings.TrimSpace(out) != "absent" {
		t.Error("Z's file is in the guest its next cycle got")
	}
	if _, err := m.Release(ctx, lz2.ID, false); err != nil {
		t.Error(err)
	}
}

// agentPID sets ga, in a guest's shell, to qemu-ga's PID (exit 9 if none).
const agentPID = `{ ga=$(for p in /proc/[0-9]*; do [ "$(cat "$p/comm" 2>/dev/null)" = qemu-ga ] && echo "${p#/proc/}"; done); [ -n "$ga" ] || exit 9; }`

// xProcesses lists the guest's process names.
const xProcesses = "cat /proc/[0-9]*/comm 2>/dev/null; true"

// commandLines lists the guest's processes' command lines, one a line.
const commandLines = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done 2>/dev/null; true"

// yContent is what Y writes to its file.
const yContent = "talkbox-revert-test-y-was-here"

// ySleep is the argument of Y's process, which no other process has.
const ySleep = "123457"

// runsX tells whether X's process is among the names: its binary's, or
// the kernel thread's it renames itself to.
func runsX(names string) bool {
	for _, n := range strings.Split(names, "\n") {
		if n == "x-sample" || n == beacon.ProcessName {
			return true
		}
	}
	return false
}

// guestSh runs a shell command in the lease's guest and returns its
// output; it must exit 0.
func guestSh(t *testing.T, m *lease.Manager, id, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := m.Exec(ctx, id, []string{"/bin/busybox", "sh", "-c", script})
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("in the guest: %s: exit %d: %s", script, r.ExitCode, r.Stderr)
	}
	return string(r.Stdout)
}

// buildBeacon cross-compiles the test beacon for the amd64 guest.
func buildBeacon(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "beacon")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "github.com/talkbox-sandbox/talkbox/internal/demo/beacon/cmd/beacon")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the beacon: %v: %s", err, b)
	}
	return out
}

// storePlan stores a sample (sha256 repeated from hex) and its amd64 plan.
func storePlan(t *testing.T, st *state.Store, hex string, net records.NetPolicy) *records.Plan {
	t.Helper()
	ctx := context.Background()
	s := &records.Sample{SHA256: strings.Repeat(hex, 64/len(hex))}
	records.Init(s, records.KindSample, st.Now())
	if err := st.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	p := &records.Plan{Sample: s.ID, SampleSHA256: s.SHA256, Runnable: true, Image: records.ImageNeeds{Platform: "amd64"},
		Lease:    records.LeaseNeeds{VCPUs: 1, MemoryMiB: 512, TTL: records.Duration(time.Hour)},
		Timeouts: records.Timeouts{Boot: records.Duration(3 * time.Minute)}, Network: net}
	records.Init(p, records.KindPlan, st.Now())
	if err := st.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// cycleCapture is what a cycle's EnsureCapture does: the lease's running
// capture, else a new one.
func cycleCapture(t *testing.T, st *state.Store, lab, id string) *records.Capture {
	t.Helper()
	c, err := state.LatestBy(st, records.KindCapture, records.KeyLease, id, func(c *records.Capture) bool {
		return c.State == capture.StateRunning || c.State == capture.StateStarting
	})
	if err == nil {
		return c
	}
	if !errors.Is(err, state.ErrNotFound) {
		t.Fatal(err)
	}
	c, err = capture.Start(context.Background(), st, slog.New(slog.DiscardHandler),
		capture.StartRequest{Lease: id, Lab: lab, Daemon: []string{os.Args[0]}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// promote writes an active endpoint entry, for a day, to the lease's chain.
func promote(t *testing.T, b *allowlist.Book, id, endpoint string) {
	t.Helper()
	ctx := context.Background()
	ch := allowlist.Chain{Scope: records.ScopeLease, Lease: id}
	unlock, err := b.Lock(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	exp := b.St.Now().Add(24 * time.Hour)
	e := &records.AllowEntry{Type: records.AllowEndpoint, Value: endpoint, Scope: records.ScopeLease, Lease: id,
		Status: records.StatusActive, Class: allowlist.ClassC2, Score: 1, Verdict: string(firewall.Forward), ExpiresAt: &exp}
	if _, _, err := b.Write(ctx, allowlist.Commit{Chain: ch, Cause: "promote"}, nil, nil, []*records.AllowEntry{e}); err != nil {
		t.Fatal(err)
	}
}

func liveSet(t *testing.T, fw firewall.Firewall, id string) []firewall.Element {
	t.Helper()
	set, err := fw.AllowSet(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func sameElement(want firewall.Element) func(firewall.Element) bool {
	return func(e firewall.Element) bool {
		return e.Dst == want.Dst && e.Proto == want.Proto && e.Port == want.Port
	}
}
