package image

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

type fixture struct {
	t    *testing.T
	ctx  context.Context
	st   *state.Store
	key  Key
	out  *bytes.Buffer
	errs *bytes.Buffer
	l    *Lifecycle
	spec *Spec
}

func newFixture(t *testing.T) *fixture {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "state")
	st, err := state.Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	k, err := LoadOrCreateKey(ctx, root, st.Lock)
	if err != nil {
		t.Fatal(err)
	}
	out, errs := &bytes.Buffer{}, &bytes.Buffer{}
	o := cmdout.New("tb-build", out, errs, nil)
	ss, _ := LoadSpecs("")
	spec, _ := ss.Get("debian-bookworm-amd64")
	return &fixture{t: t, ctx: ctx, st: st, key: k, out: out, errs: errs, l: &Lifecycle{St: st, Out: o}, spec: spec}
}

// publishFake publishes a fake image as a build would after its smoke test.
func (f *fixture) publishFake(build int) *records.SandboxImage {
	t := f.t
	ver := Version{Spec: "1.0.0", Build: build}
	b := &records.ImageBuildRun{Spec: f.spec.ID, SpecVersion: "1.0.0", Version: ver.String(), BuildNumber: build, Status: records.BuildRunning}
	records.Init(b, records.KindBuild, f.st.Now())
	if err := f.st.Create(f.ctx, b); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmpDir(f.st), f.spec.ID+"."+b.ID, "out")
	m := fakeImage(t, out, f.key, f.spec.ID, ver.String(), b.ID)
	img, err := publish(f.ctx, f.st, f.spec, ver, b, out, m, f.key, &records.SmokeResult{Passed: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Dir(out))
	return img
}

func (f *fixture) status(id string) (string, bool) {
	var img records.SandboxImage
	if err := f.st.Get(id, &img); err != nil {
		return "gone", false
	}
	return img.Status, img.Pinned
}

func (f *fixture) wantStatus(want map[string]string) {
	f.t.Helper()
	for id, w := range want {
		if s, _ := f.status(id); s != w {
			f.t.Errorf("%s: status %s, want %s", id, s, w)
		}
	}
}

func TestPublishRollbackSupersede(t *testing.T) {
	f := newFixture(t)
	a := f.publishFake(1)
	if a.Status != records.ImageActive {
		t.Fatalf("first image is %s", a.Status)
	}
	b := f.publishFake(2)
	c := f.publishFake(3)
	f.wantStatus(map[string]string{a.ID: "stable", b.ID: "stable", c.ID: "active"})
	if act, _ := Active(f.st, f.spec.ID); act.ID != c.ID {
		t.Fatalf("active is %s", act.ID)
	}
	if img, err := Resolve(f.st, f.spec.ID+"@1.0.0+build.2"); err != nil || img.ID != b.ID {
		t.Fatalf("resolve by version: %v", err)
	}

	if err := f.l.Rollback(f.ctx, f.spec.ID); err != nil {
		t.Fatal(err)
	}
	f.wantStatus(map[string]string{a.ID: "stable", b.ID: "active", c.ID: "superseded"})
	if err := f.l.Rollback(f.ctx, f.spec.ID); err != nil {
		t.Fatal(err)
	}
	f.wantStatus(map[string]string{a.ID: "active", b.ID: "superseded", c.ID: "superseded"})
	if err := f.l.Rollback(f.ctx, f.spec.ID); err == nil || !strings.Contains(err.Error(), "no stable image") {
		t.Fatalf("rollback past the oldest: %v", err)
	}

	d := f.publishFake(4)
	f.wantStatus(map[string]string{a.ID: "stable", d.ID: "active"})
	if err := f.l.Supersede(f.ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	f.wantStatus(map[string]string{a.ID: "active", d.ID: "superseded"})
}

func TestPinKeepsActiveAndBlocksRm(t *testing.T) {
	f := newFixture(t)
	a := f.publishFake(1)
	if err := f.l.Pin(f.ctx, a.ID, true); err != nil {
		t.Fatal(err)
	}
	b := f.publishFake(2)
	f.wantStatus(map[string]string{a.ID: "active", b.ID: "stable"})
	if err := f.l.Rm(f.ctx, a.ID, false); err == nil || !strings.Contains(err.Error(), "pinned") {
		t.Fatalf("rm of a pinned image: %v", err)
	}
	if err := f.l.Rm(f.ctx, b.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.Dir); !os.IsNotExist(err) {
		t.Fatalf("rm left %s", b.Dir)
	}
	if s, _ := f.status(b.ID); s != "gone" {
		t.Fatalf("rm left the record (%s)", s)
	}
	if err := f.l.Pin(f.ctx, a.ID, false); err != nil {
		t.Fatal(err)
	}
	if err := f.l.Rm(f.ctx, a.ID, false); err == nil || !strings.Contains(err.Error(), "active") {
		t.Fatalf("rm of the active image: %v", err)
	}
	if err := f.l.Rm(f.ctx, a.ID, true); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyThroughLifecycle(t *testing.T) {
	f := newFixture(t)
	a := f.publishFake(1)
	if err := f.l.Verify(f.spec.ID); err != nil {
		t.Fatalf("%v\n%s", err, f.errs)
	}
	if !strings.Contains(f.out.String(), "ok") {
		t.Fatalf("verify printed %q", f.out)
	}
	flipByte(t, filepath.Join(a.Dir, DiskFile), 10)
	err := f.l.Verify(a.ID)
	if fault.Code(err) != fault.ExitDataErr || !strings.Contains(err.Error(), DiskFile) || !strings.Contains(f.errs.String(), DiskFile) {
		t.Fatalf("tampered disk: %v (exit %d)\n%s", err, fault.Code(err), f.errs)
	}
}

func TestGCRemovesLeftoversAndSuperseded(t *testing.T) {
	f := newFixture(t)
	a := f.publishFake(1)
	b := f.publishFake(2)
	if err := f.l.Supersede(f.ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	// What a build killed mid-way leaves: a work tree, a running record,
	// and an image directory without a record.
	dead := &records.ImageBuildRun{Spec: f.spec.ID, Status: records.BuildRunning, PID: 1 << 22}
	records.Init(dead, records.KindBuild, f.st.Now())
	f.st.Create(f.ctx, dead)
	work := filepath.Join(tmpDir(f.st), f.spec.ID+"."+dead.ID, "rootfs", "etc")
	os.MkdirAll(work, 0o755)
	orphan := filepath.Join(imagesDir(f.st), f.spec.ID, "1.0.0+build.9")
	os.MkdirAll(orphan, 0o755)

	if err := f.l.GC(f.ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Dir(filepath.Dir(work)), orphan, a.Dir} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("gc left %s", p)
		}
	}
	if _, err := os.Stat(filepath.Join(b.Dir, DiskFile)); err != nil {
		t.Errorf("gc removed the active image: %v", err)
	}
	var got records.ImageBuildRun
	if err := f.st.Get(dead.ID, &got); err != nil || got.Status != records.BuildInterrupted {
		t.Fatalf("dead build is %s (%v)", got.Status, err)
	}
	f.wantStatus(map[string]string{a.ID: "gone", b.ID: "active"})
}

func TestGCRepairsTwoActive(t *testing.T) {
	f := newFixture(t)
	a := f.publishFake(1)
	b := f.publishFake(2)
	// A crash between the two writes of a publish leaves both active.
	if err := setStatus(f.ctx, f.st, a.ID, records.ImageActive); err != nil {
		t.Fatal(err)
	}
	if act, _ := Active(f.st, f.spec.ID); act.ID != b.ID {
		t.Fatalf("with two active images the newest should count, got %s", act.ID)
	}
	if err := f.l.GC(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.wantStatus(map[string]string{a.ID: "stable", b.ID: "active"})
}

func TestNextBuildNumber(t *testing.T) {
	f := newFixture(t)
	f.publishFake(1)
	f.publishFake(2)
	n, err := nextBuildNumber(f.st, f.spec)
	if err != nil || n != 3 {
		t.Fatalf("next build %d %v", n, err)
	}
}
