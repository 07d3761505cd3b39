package lease

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

func testImage(platform, abi string, emulators ...string) *records.SandboxImage {
	img := &records.SandboxImage{Spec: "debian-bookworm-" + platform, Version: "1.0.0+build.1", Platform: platform,
		ABI: abi, UserEmulators: emulators, Status: records.ImageActive, PublishedAt: time.Now(), Dir: os.TempDir()}
	records.Init(img, records.KindImage, time.Now())
	return img
}

func testPlan(platform, abi string, features ...string) *records.Plan {
	p := &records.Plan{Runnable: true, Image: records.ImageNeeds{Platform: platform, ABI: abi, Features: features}}
	records.Init(p, records.KindPlan, time.Now())
	return p
}

// emulated is tb-plan's plan for a static big-endian MIPS binary.
func emulated(target string) *records.Plan {
	p := testPlan("amd64", "", "static", "qemu-user:"+target)
	p.Emulation = &records.Emulation{Mode: "user", Target: target, Emulator: "qemu-" + target + "-static", Platform: target}
	return p
}

func TestImageMismatch(t *testing.T) {
	armelDyn := testPlan("armel", "eabi5-sf", "interpreter:/lib/ld-linux.so.3")
	// --platform armhf on a dynamic soft-float binary: the platform fits,
	// the libraries do not.
	forcedHF := testPlan("armhf", "eabi5-sf", "interpreter:/lib/ld-linux.so.3")
	cases := []struct {
		name string
		img  *records.SandboxImage
		plan *records.Plan
		want string // substring of the mismatch; "" when the image fits
	}{
		{"armel sample, armhf image", testImage("armhf", "eabi5-hf"), armelDyn, "is armhf, the plan needs armel"},
		{"armel sample, armel image", testImage("armel", "eabi5-sf"), armelDyn, ""},
		{"armel sample, armel image without abi", testImage("armel", ""), armelDyn, ""},
		{"forced armhf, armhf image", testImage("armhf", "eabi5-hf"), forcedHF, "has abi eabi5-hf, the plan needs eabi5-sf"},
		{"forced armhf, old armhf image", testImage("armhf", ""), forcedHF, "has abi eabi5-hf, the plan needs eabi5-sf"},
		{"static soft-float on armhf", testImage("armhf", "eabi5-hf"), testPlan("armhf", "eabi5-sf", "static"), ""},
		{"float unknown on armhf", testImage("armhf", "eabi5-hf"), testPlan("armhf", "eabi5", "interpreter:/lib/ld-linux-armhf.so.3"), ""},
		{"hard-float on armhf", testImage("armhf", "eabi5-hf"), testPlan("armhf", "eabi5-hf", "interpreter:/lib/ld-linux-armhf.so.3"), ""},
		{"mipsel o32", testImage("mipsel", "o32"), testPlan("mipsel", "o32", "interpreter:/lib/ld.so.1"), ""},
		{"ppc64el elfv1 dynamic", testImage("ppc64el", ""), testPlan("ppc64el", "elfv1", "interpreter:/lib64/ld64.so.1"), "the plan needs elfv1"},
		{"amd64 has no abi", testImage("amd64", ""), testPlan("amd64", "", "interpreter:/lib64/ld-linux-x86-64.so.2"), ""},
		{"emulated, emulator present", testImage("amd64", "", "mips", "ppc", "sh4"), emulated("mips"), ""},
		{"emulated, emulator absent", testImage("amd64", "", "ppc", "mipsel"), emulated("mips"), "lacks qemu-user:mips"},
		{"emulated, image without emulators", testImage("amd64", ""), emulated("sparc32plus"), "lacks qemu-user:sparc32plus"},
		{"emulated on the wrong platform", testImage("i386", "", "mips"), emulated("mips"), "is i386, the plan needs amd64"},
	}
	for _, c := range cases {
		got := imageMismatch(c.img, c.plan)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: mismatch %q, want ~%q", c.name, got, c.want)
		}
	}
}

func TestChooseImageByABIAndEmulator(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{St: st}
	armhf, armel, amd64 := testImage("armhf", "eabi5-hf"), testImage("armel", "eabi5-sf"), testImage("amd64", "", "ppc", "sh4")
	for _, img := range []*records.SandboxImage{armhf, armel, amd64} {
		if err := st.Create(ctx, img); err != nil {
			t.Fatal(err)
		}
	}
	pick := func(p *records.Plan) (string, error) {
		img, err := m.chooseImage(&Request{Plan: p})
		if err != nil {
			return "", err
		}
		return img.ID, nil
	}
	if id, err := pick(testPlan("armel", "eabi5-sf", "interpreter:/lib/ld-linux.so.3")); err != nil || id != armel.ID {
		t.Errorf("dynamic armel plan got %s %v, want %s", id, err, armel.ID)
	}
	if id, err := pick(testPlan("armhf", "eabi5-sf", "static")); err != nil || id != armhf.ID {
		t.Errorf("static soft-float plan got %s %v, want %s", id, err, armhf.ID)
	}
	_, err = pick(testPlan("armhf", "eabi5-sf", "interpreter:/lib/ld-linux.so.3"))
	if err == nil || !strings.Contains(err.Error(), "no image matches") || !strings.Contains(err.Error(), "abi eabi5-sf") ||
		!strings.Contains(err.Error(), "has abi eabi5-hf") {
		t.Errorf("plan with an abi no image has: %v", err)
	}
	if id, err := pick(emulated("ppc")); err != nil || id != amd64.ID {
		t.Errorf("emulated ppc plan got %s %v, want %s", id, err, amd64.ID)
	}
	_, err = pick(emulated("mips"))
	if err == nil || !strings.Contains(err.Error(), "user_emulators include mips") || !strings.Contains(err.Error(), "lacks qemu-user:mips") {
		t.Errorf("emulated plan without its emulator: %v", err)
	}
	// A preferred image that lacks the emulator is passed over, not used.
	p := emulated("mips")
	p.Image.Preferred = []string{amd64.ID}
	if _, err := pick(p); err == nil {
		t.Error("preferred image without qemu-mips-static was chosen")
	}
	// A newer image whose files another host of the fleet has is passed
	// over for the one this host has; pinned, it is refused saying so.
	elsewhere := testImage("amd64", "")
	elsewhere.Files = []records.ImageFile{{Name: "disk.qcow2", Size: 1 << 30}}
	elsewhere.Dir = filepath.Join(t.TempDir(), "built-on-another-host")
	if err := st.Create(ctx, elsewhere); err != nil {
		t.Fatal(err)
	}
	if id, err := pick(testPlan("amd64", "")); err != nil || id != amd64.ID {
		t.Errorf("amd64 plan with a newer image elsewhere got %s %v, want %s", id, err, amd64.ID)
	}
	if _, err := m.chooseImage(&Request{Plan: testPlan("amd64", ""), Image: elsewhere.ID}); err == nil || !strings.Contains(err.Error(), "not on this host") {
		t.Errorf("pinned image whose files are elsewhere: %v", err)
	}
}

// TestBootable: what "inspect host" says a host can lease, which a fleet
// worker advertises: the platforms of the active images whose files are
// here, and of those the ones the host runs under KVM.
func TestBootable(t *testing.T) {
	img := func(platform, arch string) *records.SandboxImage {
		i := testImage(platform, "")
		i.Boot.Arch = arch
		return i
	}
	amd64, arm64, gone, retired := img("amd64", "x86_64"), img("arm64", "aarch64"), img("mipsel", "mipsel"), img("s390x", "s390x")
	gone.Dir = filepath.Join(t.TempDir(), "built-elsewhere")
	gone.Files = []records.ImageFile{{Name: "disk.qcow2", Size: 1}}
	retired.Status = records.ImageSuperseded
	imgs := []*records.SandboxImage{amd64, arm64, gone, retired, img("amd64", "x86_64")}
	platforms, native := bootable(HostConfig{Name: "h"}, "kvm", imgs)
	wantNative := []string{}
	if debArch() == "amd64" {
		wantNative = []string{"amd64"}
	}
	if strings.Join(platforms, ",") != "amd64,arm64" || strings.Join(native, ",") != strings.Join(wantNative, ",") {
		t.Errorf("a KVM host: platforms %q, native %q", platforms, native)
	}
	if _, native := bootable(HostConfig{Name: "h"}, "tcg", imgs); len(native) != 0 {
		t.Errorf("a TCG host runs %q natively", native)
	}
	if _, native := bootable(HostConfig{Name: "h", Arch: "arm64"}, "kvm", imgs); debArch() != "arm64" && len(native) != 0 {
		t.Errorf("an arm64 host configured here runs %q natively", native)
	}
}
