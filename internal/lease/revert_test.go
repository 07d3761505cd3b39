package lease

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// The manager's decisions about which guest serves which sample, over the
// fake host; TestRevertRealGuest (revert_guest_test.go) performs the attack
// on a real guest.

const (
	sampleX = "1111111111111111111111111111111111111111111111111111111111111111"
	sampleY = "2222222222222222222222222222222222222222222222222222222222222222"
)

// revertFixture is a manager over a fake host with an image whose files
// are here, and an idle lease whose guest has run sample X.
func revertFixture(t *testing.T) (*Manager, *fakeHost, *records.SandboxLease) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Fatal("qemu-img is needed (scripts/deps.sh installs it)")
	}
	ctx := context.Background()
	h := newFakeHost(fakeURI("h"), 4096, 2048)
	m := fakeManager(t, &Config{Hosts: []HostConfig{{Name: "h", URI: fakeURI("h")}}}, map[string]*fakeHost{"h": h})
	img := testImage("amd64", "")
	img.Dir = m.St.Path("images", "test")
	img.Boot = records.ImageBoot{Arch: "x86_64", Kernel: "vmlinuz", Initrd: "initrd.img", Disk: "disk.qcow2", Emulator: "qemu-system-x86_64"}
	if err := os.MkdirAll(img.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"vmlinuz", "initrd.img"} {
		if err := os.WriteFile(filepath.Join(img.Dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := qemuImg(ctx, "create", "-q", "-f", "qcow2", filepath.Join(img.Dir, "disk.qcow2"), "16M"); err != nil {
		t.Fatal(err)
	}
	if err := m.St.Create(ctx, img); err != nil {
		t.Fatal(err)
	}
	l := storedLease(t, m, h, "h", img.ID, false)
	if _, err := m.update(ctx, l.ID, func(x *records.SandboxLease) error {
		x.State, x.Platform, x.Samples, x.TTL, x.Tap = records.LeaseIdle, "amd64", []string{sampleX}, records.Duration(time.Hour), tapName(x.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := m.mkdirReachable(l.Dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.Overlay, []byte("the overlay sample X ran on"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The running domain's agent answers; so does a rebooted one's.
	h.creates, h.answersAfter = 1, 1
	return m, h, l
}

// samplePlan is a plan for sample sha (with a stored sample record of that
// content, dropped on the leases of drops).
func samplePlan(t *testing.T, m *Manager, sha string, drops ...records.Drop) *records.Plan {
	t.Helper()
	s := &records.Sample{SHA256: sha, DroppedBy: drops}
	records.Init(s, records.KindSample, m.St.Now())
	if err := m.St.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	p := testPlan("amd64", "")
	p.Sample, p.SampleSHA256 = s.ID, sha
	return p
}

func acquired(t *testing.T, m *Manager, p *records.Plan, holder string) *records.SandboxLease {
	t.Helper()
	l, err := m.Acquire(context.Background(), Request{Plan: p, Holder: holder, Accel: "tcg", BootTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestReuseKeepsItsSample: the same sample, and a file it dropped on this
// lease, get the guest as it is; release --keep keeps it for them.
func TestReuseKeepsItsSample(t *testing.T) {
	m, h, idle := revertFixture(t)
	ctx := context.Background()
	l := acquired(t, m, samplePlan(t, m, sampleX), "cycle_a")
	if l.ID != idle.ID || h.creates != 1 || len(h.destroyed) != 0 || len(l.Reverts) != 0 {
		t.Fatalf("the same sample: lease %s (want %s), %d creates, destroyed %v, reverts %v", l.ID, idle.ID, h.creates, h.destroyed, l.Reverts)
	}
	if l, err := m.Release(ctx, l.ID, true); err != nil || l.State != records.LeaseIdle || !slices.Equal(l.Samples, []string{sampleX}) {
		t.Fatalf("release --keep: %+v %v", l, err)
	}
	child := "3333333333333333333333333333333333333333333333333333333333333333"
	l = acquired(t, m, samplePlan(t, m, child, records.Drop{Cycle: "cycle_a", Lease: idle.ID, Sample: sampleX, Path: "/tmp/x"}), "cycle_b")
	if l.ID != idle.ID || h.creates != 1 || len(l.Reverts) != 0 || !slices.Equal(l.Samples, []string{sampleX, child}) {
		t.Fatalf("a file X dropped on the lease: lease %s, %d creates, samples %v, reverts %v", l.ID, h.creates, l.Samples, l.Reverts)
	}
}

// TestReuseRevertsASilentGuest: a sample that stopped its guest agent for
// good (root in the guest can) does not get its silent guest back for its
// next cycle: the idle lease, which does not answer, is reverted (a fresh
// boot of its image) before it is handed out, its own sample or not.
func TestReuseRevertsASilentGuest(t *testing.T) {
	m, h, idle := revertFixture(t)
	h.answersAfter = 2 // the kept guest (create 1) is silent; a rebooted one answers
	l := acquired(t, m, samplePlan(t, m, sampleX), "cycle_b")
	if !slices.Contains(h.destroyed, idle.VMName) || h.creates != 2 || len(l.Reverts) != 1 {
		t.Fatalf("the silent guest was handed out: destroyed %v, %d creates, reverts %+v", h.destroyed, h.creates, l.Reverts)
	}
	if rv := l.Reverts[0]; l.ID != idle.ID || l.Health != records.HealthHealthy || rv.To != sampleX || rv.Holder != "cycle_b" {
		t.Errorf("after the revert: lease %s (%s), revert %+v", l.ID, l.Health, rv)
	}
}

// TestRevertForAnotherSample: a lease handed to another sample (or to a
// file its sample dropped elsewhere, or as an old lease that does not say
// what it ran) is reverted first: its domain destroyed, booted on a fresh
// overlay, its capture stopped, its allow chain's entries revoked, and the
// revert recorded.
func TestRevertForAnotherSample(t *testing.T) {
	m, h, idle := revertFixture(t)
	ctx := context.Background()
	b := &allowlist.Book{St: m.St}
	ch := allowlist.Chain{Scope: records.ScopeLease, Lease: idle.ID}
	exp := m.St.Now().Add(24 * time.Hour)
	entry := &records.AllowEntry{Type: records.AllowEndpoint, Value: "203.0.113.7:443/tcp", Scope: records.ScopeLease, Lease: idle.ID,
		Status: records.StatusActive, Class: allowlist.ClassC2, Score: 1, Verdict: "forward", ExpiresAt: &exp}
	onProbation := *entry
	onProbation.Value, onProbation.Status = "198.51.100.7:443/tcp", records.StatusProbation
	expired := *entry
	expired.Value, expired.Status = "192.0.2.7:443/tcp", records.StatusExpired
	unlock, err := b.Lock(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Write(ctx, allowlist.Commit{Chain: ch, Cause: "promote"}, nil, nil, []*records.AllowEntry{entry, &onProbation, &expired}); err != nil {
		t.Fatal(err)
	}
	unlock()
	// A capture of the lease whose daemon is gone: stopped all the same.
	capRec := &records.Capture{Lease: idle.ID, State: capture.StateRunning, Plan: "plan_x"}
	records.Init(capRec, records.KindCapture, m.St.Now())
	if err := m.St.Create(ctx, capRec); err != nil {
		t.Fatal(err)
	}

	labs := m.Labs.(*fakeLabs)
	labs.host = h
	py := samplePlan(t, m, sampleY)
	l := acquired(t, m, py, "cycle_y")
	// The rebooted guest ran only once its tap was bound, and so did its
	// resume from the clean state saved right after that boot.
	if want := l.Tap + " " + l.MAC + " " + l.IP + " paused"; !slices.Equal(labs.attached, []string{want, want}) {
		t.Errorf("ports bound: %q, want %q twice", labs.attached, want)
	}
	if h.saves != 1 || h.restores != 1 {
		t.Errorf("the clean state: %d saves, %d restores", h.saves, h.restores)
	}
	if d, _, _ := h.DomainStatusOf(l.VMName); d.State != "running" {
		t.Errorf("the rebooted guest is %s", d.State)
	}
	if l.ID != idle.ID || l.State != records.LeaseBusy || l.Holder != "cycle_y" || l.Plan != py.ID || !slices.Equal(l.Samples, []string{sampleY}) {
		t.Fatalf("after the revert: %+v", l)
	}
	if !slices.Contains(h.destroyed, idle.VMName) || h.creates != 2 {
		t.Errorf("the guest was not rebooted: destroyed %v, %d creates", h.destroyed, h.creates)
	}
	if b, err := os.ReadFile(idle.Overlay); err != nil || string(b) == "the overlay sample X ran on" {
		t.Errorf("the overlay sample X ran on is still there (%v)", err)
	}
	if len(l.Reverts) != 1 {
		t.Fatalf("reverts: %+v", l.Reverts)
	}
	rv := l.Reverts[0]
	if !slices.Equal(rv.From, []string{sampleX}) || rv.To != sampleY || rv.Holder != "cycle_y" || rv.How != "boot" ||
		rv.Revision == "" || !slices.Equal(rv.Captures, []string{capRec.ID}) {
		t.Errorf("revert record: %+v", rv)
	}
	head, es, err := b.Head(ctx, ch)
	if err != nil || head.ID != rv.Revision || head.Cause != "revert" || len(es) != 3 {
		t.Fatalf("the lease chain after the revert: %+v %+v %v", head, es, err)
	}
	for _, e := range es {
		if want := records.StatusRevoked; e.Value == expired.Value && e.Status != records.StatusExpired || e.Value != expired.Value && e.Status != want {
			t.Errorf("after the revert %s is %s", e.Value, e.Status)
		}
	}
	var c records.Capture
	if err := m.St.Get(capRec.ID, &c); err != nil || c.State != capture.StateStopped {
		t.Errorf("the lease's capture is %s (%v)", c.State, err)
	}

	// A file sample Y dropped on another lease is not Y's on this one; the
	// lease now has a clean state, which replaces the guest without a boot.
	if _, err := m.Release(ctx, l.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.Overlay, []byte("the overlay sample Y ran on"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := "4444444444444444444444444444444444444444444444444444444444444444"
	l = acquired(t, m, samplePlan(t, m, other, records.Drop{Cycle: "cycle_z", Lease: "lease_elsewhere", Sample: sampleY, Path: "/tmp/y"}), "cycle_o")
	if len(l.Reverts) != 2 || l.Reverts[1].How != "snapshot" || !slices.Equal(l.Samples, []string{other}) || h.creates != 2 || h.restores != 2 {
		t.Errorf("a file dropped elsewhere: samples %v, reverts %+v, creates %d, restores %d", l.Samples, l.Reverts, h.creates, h.restores)
	}
	_, disk := goldenPaths(l)
	if b, err := os.ReadFile(l.Overlay); err != nil || string(b) == "the overlay sample Y ran on" {
		t.Errorf("the overlay sample Y ran on is still there (%v)", err)
	} else if g, _ := os.ReadFile(disk); string(g) != string(b) {
		t.Error("the overlay is not the clean state's disk")
	}

	// A lease that does not say what its guest ran is clean for no one.
	if _, err := m.Release(ctx, l.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := m.update(ctx, l.ID, func(x *records.SandboxLease) error { x.Samples = nil; return nil }); err != nil {
		t.Fatal(err)
	}
	l = acquired(t, m, samplePlan(t, m, other), "cycle_p")
	if len(l.Reverts) != 3 || h.restores != 3 {
		t.Errorf("a lease without samples: reverts %d, restores %d", len(l.Reverts), h.restores)
	}

	// The dry run says so.
	if _, err := m.Release(ctx, l.ID, true); err != nil {
		t.Fatal(err)
	}
	d, err := m.Decide(ctx, Request{Plan: samplePlan(t, m, sampleX), Accel: "tcg"})
	if err != nil || d.Reuse != l.ID || !d.Revert {
		t.Errorf("dry run for another sample: %+v %v", d, err)
	}
	d, err = m.Decide(ctx, Request{Plan: samplePlan(t, m, other), Accel: "tcg"})
	if err != nil || d.Reuse != l.ID || d.Revert {
		t.Errorf("dry run for its sample: %+v %v", d, err)
	}
	// Released, its tap's binding goes, so that its address can be another
	// lease's.
	if _, err := m.Release(ctx, l.ID, false); err != nil || !slices.Equal(labs.unbound, []string{l.Tap}) {
		t.Errorf("release: unbound %v, %v", labs.unbound, err)
	}
}

// TestRevertBootsWithoutCleanState: a guest that cannot be saved is
// booted again at each revert.
func TestRevertBootsWithoutCleanState(t *testing.T) {
	m, h, idle := revertFixture(t)
	h.unsaveable = true
	l := acquired(t, m, samplePlan(t, m, sampleY), "cycle_y")
	if _, err := m.Release(context.Background(), l.ID, true); err != nil {
		t.Fatal(err)
	}
	l = acquired(t, m, samplePlan(t, m, sampleX), "cycle_x")
	if l.ID != idle.ID || len(l.Reverts) != 2 || l.Reverts[0].How != "boot" || l.Reverts[1].How != "boot" || h.creates != 3 {
		t.Errorf("reverts %+v, creates %d", l.Reverts, h.creates)
	}
	if mem, _ := goldenPaths(l); fileExists(mem) {
		t.Errorf("a clean state was kept: %s", mem)
	}
	if d, _, _ := h.DomainStatusOf(l.VMName); d.State != "running" {
		t.Errorf("the guest is %s", d.State)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestRevertBootsWhenTheCleanStateDoesNotSettle: a clean state whose
// restored guest's timers do not run (as QEMU 7.2's pseries under TCG can
// come back, see timers.go) is not handed out: the revert boots instead,
// and the lease is healthy and running.
func TestRevertBootsWhenTheCleanStateDoesNotSettle(t *testing.T) {
	m, h, idle := revertFixture(t)
	// The first revert boots and keeps the clean state, which settles.
	l := acquired(t, m, samplePlan(t, m, sampleY), "cycle_y")
	if len(l.Reverts) != 1 || l.Reverts[0].How != "boot" || h.restores != 1 {
		t.Fatalf("reverts %+v, restores %d", l.Reverts, h.restores)
	}
	if !slices.Equal(h.scripts, []string{timersRun}) {
		t.Fatalf("the clean state was not checked: scripts %q", h.scripts)
	}
	if _, err := m.Release(context.Background(), l.ID, true); err != nil {
		t.Fatal(err)
	}
	// The next restores it, and its timers stay stopped: it boots, and
	// the clean state saved after that boot does not settle either, so
	// it is not kept and the guest is booted once more.
	h.timersStopped = true
	creates := h.creates
	l = acquired(t, m, samplePlan(t, m, sampleX), "cycle_x")
	if l.ID != idle.ID || len(l.Reverts) != 2 || l.Reverts[1].How != "boot" || h.creates != creates+2 {
		t.Errorf("reverts %+v, creates %d (was %d)", l.Reverts, h.creates, creates)
	}
	if l.State != records.LeaseBusy || l.Health != records.HealthHealthy {
		t.Errorf("the lease is %s, %s", l.State, l.Health)
	}
	if d, _, _ := h.DomainStatusOf(l.VMName); d.State != "running" {
		t.Errorf("the guest is %s", d.State)
	}
	if mem, _ := goldenPaths(l); fileExists(mem) {
		t.Errorf("a clean state that does not settle was kept: %s", mem)
	}
}

// TestSettleKicksOnlyPseriesUnderTCG: the timer kick is for the machine
// that needs it; every restored guest gets the check.
func TestSettleKicksOnlyPseriesUnderTCG(t *testing.T) {
	for _, c := range []struct {
		platform, accel string
		kick            bool
	}{{"ppc64el", "tcg", true}, {"ppc64el", "kvm", false}, {"amd64", "tcg", false}, {"mipsel", "tcg", false}} {
		h := newFakeHost(fakeURI("h"), 4096, 2048)
		h.creates, h.answersAfter = 1, 1
		h.domains["tb-x"] = virt.DomainStatus{Name: "tb-x", Active: true, State: "running"}
		l := &records.SandboxLease{Platform: c.platform, Accel: c.accel}
		if err := settleRestored(context.Background(), virt.NewGuest(h, "tb-x", ""), l, ""); err != nil {
			t.Fatal(err)
		}
		if len(h.scripts) != 1 || strings.Contains(h.scripts[0], "trace_marker") != c.kick || !strings.HasSuffix(h.scripts[0], timersRun) {
			t.Errorf("%s under %s: scripts %q, want the kick %v and the check", c.platform, c.accel, h.scripts, c.kick)
		}
	}
}

// TestMaltaCleanState: a Malta lease on this machine keeps its clean state
// and reverts by restoring it, its timer re-armed while the guest is
// paused (rearmsTimer); one on another host, whose QEMU's gdbstub socket
// is not a file here, keeps none: each revert boots, nothing is saved.
func TestMaltaCleanState(t *testing.T) {
	m, h, l := revertFixture(t)
	ctx := context.Background()
	revert := func(want string) {
		t.Helper()
		if err := h.Destroy(ctx, l.VMName); err != nil {
			t.Fatal(err)
		}
		if how, _, err := m.clean(ctx, h, l, time.Second); err != nil || how != want {
			t.Fatalf("%s on %s: revert %q, %v; want %q", l.Platform, l.ConnectURI, how, err, want)
		}
	}
	for _, p := range []string{"mipsel", "mips64el"} {
		l.Platform, l.ConnectURI = p, "qemu+tcp://198.51.100.7/system"
		revert("boot")
		revert("boot")
		if mem, _ := goldenPaths(l); h.saves != 0 || h.rearms != 0 || fileExists(mem) {
			t.Errorf("a remote Malta lease's clean state was saved (%d saves, %d re-arms)", h.saves, h.rearms)
		}
	}
	l.Platform, l.ConnectURI = "mipsel", fakeURI("h")
	revert("boot")
	if h.saves != 1 || h.rearms != 1 {
		t.Errorf("mipsel here: %d saves, %d re-arms after its first revert; want its clean state saved and restored re-armed", h.saves, h.rearms)
	}
	revert("snapshot")
	if h.rearms != 2 {
		t.Errorf("mipsel here: %d re-arms after a revert from its clean state, want 2", h.rearms)
	}
}
