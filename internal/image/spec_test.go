package image

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func TestEmbeddedSpecsResolve(t *testing.T) {
	ss, err := LoadSpecs("")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"amd64", "i386", "arm64", "armhf", "armel", "mipsel", "mips64el", "ppc64el", "s390x"}
	got := map[string]bool{}
	for _, id := range ss.IDs() {
		s, err := ss.Get(id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		got[s.Arch] = true
		has := strings.Join(s.Packages, " ")
		for _, p := range []string{"qemu-guest-agent", "busybox-static", s.Kernel.Package} {
			if !strings.Contains(has, p) {
				t.Errorf("%s: packages %v lack %s", id, s.Packages, p)
			}
		}
		if s.VM.Emulator == "" || s.VM.Machine == "" || s.VM.QEMUArch == "" || s.Boot.Console == "" {
			t.Errorf("%s: VM not resolved: %+v %+v", id, s.VM, s.Boot)
		}
		if s.Smoke.Commands[0].Expect != UnameMachine(s.Arch) || s.Smoke.Commands[0].Expect == "" {
			t.Errorf("%s: smoke command %+v", id, s.Smoke.Commands)
		}
		if len(s.SHA256()) != 64 {
			t.Errorf("%s: spec digest %q", id, s.SHA256())
		}
	}
	for _, a := range want {
		if !got[a] {
			t.Errorf("no embedded spec for %s", a)
		}
	}
}

func TestImageABI(t *testing.T) {
	// The names must be those internal/triage gives a sample's ABI.Name.
	for arch, want := range map[string]string{"armhf": "eabi5-hf", "armel": "eabi5-sf", "mipsel": "o32", "mips64el": "n64",
		"ppc64el": "elfv2", "amd64": "", "i386": "", "arm64": "", "s390x": ""} {
		if got := ABI(arch); got != want {
			t.Errorf("ABI(%s) = %q, want %q", arch, got, want)
		}
	}
}

func TestArmelSpec(t *testing.T) {
	ss, _ := LoadSpecs("")
	s, err := ss.Get("debian-bookworm-armel")
	if err != nil {
		t.Fatal(err)
	}
	if s.Kernel.Package != "linux-image-armmp:armhf" || strings.Join(s.foreignArches(), ",") != "armhf" ||
		s.VM.Emulator != "qemu-system-arm" || s.VM.Machine != "virt" || s.VM.CPU != "cortex-a15" || UnameMachine("armel") != "armv7l" {
		t.Fatalf("armel spec: kernel %s foreign %v vm %+v", s.Kernel.Package, s.foreignArches(), s.VM)
	}
	if a, _ := ss.Get("debian-bookworm-armhf"); len(a.foreignArches()) != 0 {
		t.Errorf("armhf spec installs foreign architectures %v", a.foreignArches())
	}
}

func TestMaltaCmdlineFits(t *testing.T) {
	ss, _ := LoadSpecs("")
	for _, id := range []string{"debian-bookworm-mipsel", "debian-bookworm-mips64el"} {
		s, err := ss.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		full := MaltaCmdline(bootFor(s).Cmdline, s.Network.Interface)
		if len(full) > maltaCmdlineMax || strings.Contains(full, "tsc=") || !strings.HasSuffix(full, " nohz=off highres=off") {
			t.Errorf("%s: %d-byte command line on Malta: %s", id, len(full), full)
		}
	}
	// The lease's parameters are as long as internal/lease makes them.
	if got, want := LeaseCmdline("eth0", "198.51.100.200", 24, "198.51.100.1"), "talkbox.net=static talkbox.if=eth0 talkbox.ip=198.51.100.200/24 talkbox.gw=198.51.100.1 talkbox.dns=198.51.100.1"; got != want {
		t.Errorf("LeaseCmdline = %q, want %q", got, want)
	}
	dir := t.TempDir()
	long := strings.Repeat("x", 50)
	writeSpec(t, dir, "m.json", `{"id":"long-mipsel","arch":"mipsel","boot":{"cmdline":"quiet `+long+`"}}`)
	writeSpec(t, dir, "n.json", `{"id":"long-armhf","arch":"armhf","boot":{"cmdline":"quiet `+long+`"}}`)
	// talkbox.init=/sbin/init tips this one over; the same line fits talkbox-init.
	writeSpec(t, dir, "s.json", `{"id":"mipsel-systemd","arch":"mipsel","boot":{"mode":"systemd","cmdline":"quiet `+long[:30]+`"}}`)
	writeSpec(t, dir, "t.json", `{"id":"mipsel-init","arch":"mipsel","boot":{"cmdline":"quiet `+long[:30]+`"}}`)
	ss, _ = LoadSpecs(dir)
	for _, id := range []string{"long-mipsel", "mipsel-systemd"} {
		_, err := ss.Get(id)
		if err == nil || fault.Code(err) != fault.ExitDataErr || !strings.Contains(err.Error(), id) || !strings.Contains(err.Error(), "Malta") ||
			strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v (exit %d), want a one-line data error naming the spec and Malta", id, err, fault.Code(err))
		}
	}
	if _, err := ss.Get("long-armhf"); err != nil {
		t.Errorf("the Malta limit was applied to the virt board: %v", err)
	}
	if _, err := ss.Get("mipsel-init"); err != nil {
		t.Errorf("a command line that fits was refused: %v", err)
	}
}

func TestSpecDigestFollowsContent(t *testing.T) {
	ss, _ := LoadSpecs("")
	a, _ := ss.Get("debian-bookworm-amd64")
	b, _ := ss.Get("debian-bookworm-amd64")
	if a.SHA256() != b.SHA256() {
		t.Fatal("the same spec resolves to different digests")
	}
	b.Packages = append(b.Packages, "curl")
	if a.SHA256() == b.SHA256() {
		t.Fatal("a changed package list keeps the digest")
	}
}

func writeSpec(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestUserSpecsOverrideAndDefaults(t *testing.T) {
	dir := t.TempDir()
	writeSpec(t, dir, "a.json", `{"id":"debian-bookworm-amd64","version":"2.1.0","arch":"amd64","packages":["curl"],"network":{"mode":"none"}}`)
	writeSpec(t, dir, "b.json", `{"id":"tiny-armhf","arch":"armhf","disk":{"size_mib":512}}`)
	ss, err := LoadSpecs(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ss.Get("debian-bookworm-amd64")
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != "2.1.0" || s.Source != filepath.Join(dir, "a.json") || s.Network.Mode != "none" {
		t.Fatalf("user spec did not replace the embedded one: %+v", s)
	}
	if !strings.Contains(strings.Join(s.Packages, ","), "curl") || s.Kernel.Package != "linux-image-amd64" {
		t.Fatalf("packages %v kernel %s", s.Packages, s.Kernel.Package)
	}
	a, err := ss.Get("tiny-armhf")
	if err != nil {
		t.Fatal(err)
	}
	if a.Version != "1.0.0" || a.VM.Emulator != "qemu-system-arm" || a.VM.Machine != "virt" || a.Boot.Console != "ttyAMA0" ||
		a.Network.Address != "10.13.37.10/24" || a.Disk.SizeMiB != 512 || a.OS.Release != "bookworm" {
		t.Fatalf("defaults not applied: %+v", a)
	}
}

func TestBadSpecs(t *testing.T) {
	for name, c := range map[string]struct {
		body string
		code int
		want string
	}{
		"arch":     {`{"id":"x","arch":"sparc64"}`, fault.ExitUnavailable, `unsupported architecture "sparc64"`},
		"bigmips":  {`{"id":"x","arch":"mips"}`, fault.ExitUnavailable, "no big-endian MIPS port"},
		"version":  {`{"id":"x","arch":"amd64","version":"1.0"}`, fault.ExitDataErr, "MAJOR.MINOR.PATCH"},
		"gateway":  {`{"id":"x","arch":"amd64","network":{"address":"10.0.0.5/24","gateway":"10.1.0.1"}}`, fault.ExitDataErr, "network.gateway"},
		"address":  {`{"id":"x","arch":"amd64","network":{"address":"nonsense"}}`, fault.ExitDataErr, "network.address"},
		"bootmode": {`{"id":"x","arch":"amd64","boot":{"mode":"openrc"}}`, fault.ExitDataErr, "boot.mode"},
		"disk":     {`{"id":"x","arch":"amd64","disk":{"size_mib":10}}`, fault.ExitDataErr, "too small"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeSpec(t, dir, "x.json", c.body)
			ss, err := LoadSpecs(dir)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ss.Get("x")
			if err == nil || fault.Code(err) != c.code || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("got %v (exit %d), want one line with %q, exit %d", err, fault.Code(err), c.want, c.code)
			}
		})
	}
	dir := t.TempDir()
	writeSpec(t, dir, "bad.json", `{"id":"x","arch":"amd64","pakages":[]}`)
	if _, err := LoadSpecs(dir); err == nil || fault.Code(err) != fault.ExitDataErr || !strings.Contains(err.Error(), "bad.json") {
		t.Fatalf("unknown field: %v", err)
	}
	ss, _ := LoadSpecs("")
	_, err := ss.Get("nope")
	var ce *fault.Error
	if !errors.As(err, &ce) || ce.Code != fault.ExitUnavailable || !strings.Contains(err.Error(), "debian-bookworm-amd64") {
		t.Fatalf("unknown spec: %v", err)
	}
}

func TestVersions(t *testing.T) {
	v, err := ParseVersion("1.2.3+build.10")
	if err != nil || v.Spec != "1.2.3" || v.Build != 10 || v.String() != "1.2.3+build.10" {
		t.Fatalf("%+v %v", v, err)
	}
	order := []string{"0.9.9+build.5", "1.0.0+build.1", "1.0.0+build.2", "1.0.0+build.10", "1.2.0+build.1", "10.0.0+build.1"}
	for i := 0; i+1 < len(order); i++ {
		a, _ := ParseVersion(order[i])
		b, _ := ParseVersion(order[i+1])
		if !a.Less(b) || b.Less(a) {
			t.Errorf("%s should sort before %s", order[i], order[i+1])
		}
	}
	for _, bad := range []string{"1.0.0", "1.0.0+build.0", "1.0+build.1", "1.0.0+build.x"} {
		if _, err := ParseVersion(bad); err == nil {
			t.Errorf("ParseVersion(%q) accepted", bad)
		}
	}
}

func TestPublishedImageCarriesABIAndEmulators(t *testing.T) {
	f := newFixture(t)
	ss, err := LoadSpecs("")
	if err != nil {
		t.Fatal(err)
	}
	if f.spec, err = ss.Get("debian-bookworm-armel"); err != nil {
		t.Fatal(err)
	}
	ver := Version{Spec: "1.0.0", Build: 1}
	b := &records.ImageBuildRun{Spec: f.spec.ID, SpecVersion: "1.0.0", Version: ver.String(), BuildNumber: 1, Status: records.BuildRunning}
	records.Init(b, records.KindBuild, f.st.Now())
	if err := f.st.Create(f.ctx, b); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmpDir(f.st), f.spec.ID+"."+b.ID, "out")
	m := fakeImage(t, out, f.key, f.spec.ID, ver.String(), b.ID)
	img, err := publish(f.ctx, f.st, f.spec, ver, b, out, m, f.key, &records.SmokeResult{Passed: true}, []string{"mips", "sh4"})
	if err != nil {
		t.Fatal(err)
	}
	// Written with the record itself: no moment at which the image is
	// active without them.
	var got records.SandboxImage
	if err := f.st.Get(img.ID, &got); err != nil {
		t.Fatal(err)
	}
	if got.ABI != "eabi5-sf" || img.ABI != "eabi5-sf" || got.Status != records.ImageActive ||
		strings.Join(got.UserEmulators, ",") != "mips,sh4" || got.Rev != 2 {
		t.Fatalf("stored %+v", got)
	}
}
