package plan

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func mustProfiles(t *testing.T, dir string) *Profiles {
	t.Helper()
	ps, err := LoadProfiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestEmbeddedProfilesAreValid(t *testing.T) {
	ps := mustProfiles(t, "")
	for _, want := range []string{"default", "quick", "long-running"} {
		p, err := ps.Get(want)
		if err != nil {
			t.Fatal(err)
		}
		if p.Source != "embedded" || p.Version == "" {
			t.Errorf("%s: %+v", want, p)
		}
		if p.Network.Mode != "sinkhole" || p.Network.AllowSMTP {
			t.Errorf("%s: an embedded profile must start contained (sinkhole, no SMTP): %+v", want, p.Network)
		}
	}
	if _, err := ps.Get("nope"); err == nil || !strings.Contains(err.Error(), "default") {
		t.Fatalf("unknown profile error should list the known ones: %v", err)
	}
}

func TestUserProfileShadowsEmbeddedAndTyposAreErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("default.json", `{"name":"default","version":"9.0.0","lease":{"vcpus":2,"memory_mib":1024,"disk_gib":8,"ttl":"1h"},
	  "timeouts":{"boot":"1m","execution":"1m","window":"1m"},"network":{"mode":"sinkhole"},"instrumentation":"pcap","execution":{"cycles":3}}`)
	p, err := mustProfiles(t, dir).Get("default")
	if err != nil || p.Version != "9.0.0" || p.Lease.VCPUs != 2 {
		t.Fatalf("user profile did not replace embedded: %+v %v", p, err)
	}
	write("typo.json", `{"name":"typo","version":"1","lease":{"vcpu":2}}`)
	if _, err := LoadProfiles(dir); err == nil || !strings.Contains(err.Error(), "typo.json") || !strings.Contains(err.Error(), "vcpu") {
		t.Fatalf("unknown key in a profile must be an error naming the file and key, got %v", err)
	}
}

func TestMergeOrderProfileFileFlags(t *testing.T) {
	prof, _ := mustProfiles(t, "").Get("default")
	file := filepath.Join(t.TempDir(), "o.json")
	os.WriteFile(file, []byte(`{"lease":{"memory_mib":2048,"vcpus":2},"execution":{"args":["-v"],"env":{"A":"file","B":"file"}},"timeouts":{"window":"10m"}}`), 0o644)
	yes := true
	got, applied, err := Resolve(prof, Overrides{File: file, VCPUs: 4, Detach: &yes, Env: map[string]string{"B": "flag"}})
	if err != nil {
		t.Fatal(err)
	}
	// flags beat the file, the file beats the profile, untouched fields keep the profile's value.
	if got.Lease.VCPUs != 4 || got.Lease.MemoryMiB != 2048 || got.Lease.DiskGiB != prof.Lease.DiskGiB {
		t.Fatalf("lease %+v", got.Lease)
	}
	if got.Timeouts.Window.D() != 10*time.Minute || got.Timeouts.Boot != prof.Timeouts.Boot {
		t.Fatalf("timeouts %+v", got.Timeouts)
	}
	if !got.Execution.Detach || got.Execution.Env["A"] != "file" || got.Execution.Env["B"] != "flag" || got.Execution.Args[0] != "-v" {
		t.Fatalf("execution %+v", got.Execution)
	}
	if got.Name != "default" || got.Version != prof.Version {
		t.Fatalf("the file must not rename the profile: %s %s", got.Name, got.Version)
	}
	want := []string{"file:" + file, "flag:--vcpus=4", "flag:--detach=true", "flag:--env=map[B:flag]"}
	if strings.Join(applied, "|") != strings.Join(want, "|") {
		t.Fatalf("applied = %q, want %q", applied, want)
	}
	// Deterministic: the same layers give the same result.
	again, _, _ := Resolve(prof, Overrides{File: file, VCPUs: 4, Detach: &yes, Env: map[string]string{"B": "flag"}})
	if again.Lease != got.Lease || again.Execution.Env["B"] != "flag" {
		t.Fatal("Resolve is not deterministic")
	}
}

func TestResolveRejectsInvalidResults(t *testing.T) {
	prof, _ := mustProfiles(t, "").Get("default")
	for name, o := range map[string]Overrides{
		"network": {Network: "open"},
		"memory":  {MemoryMiB: 1},
	} {
		if _, _, err := Resolve(prof, o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	file := filepath.Join(t.TempDir(), "o.json")
	os.WriteFile(file, []byte(`[1]`), 0o644)
	if _, _, err := Resolve(prof, Overrides{File: file}); err == nil {
		t.Error("non-object overrides file accepted")
	}
}

func elfSample(arch, endian string, bits int, abi string, static bool) *records.Sample {
	s := &records.Sample{SHA256: strings.Repeat("a", 64)}
	s.Format, s.Arch, s.Endianness, s.Bits, s.OS, s.Type = "elf", arch, endian, bits, "linux", "exec"
	s.Static = &static
	if abi != "" {
		s.ABI = &records.ABI{Name: abi}
	}
	records.Init(s, records.KindSample, time.Now())
	return s
}

func TestMakePlansAndRunnability(t *testing.T) {
	prof, _ := mustProfiles(t, "").Get("default")
	cases := []struct {
		s        *records.Sample
		platform string
		runnable bool
		reason   string
	}{
		{elfSample("x86_64", "little", 64, "", true), "amd64", true, ""},
		{elfSample("x86", "little", 32, "", false), "i386", true, ""},
		{elfSample("arm", "little", 32, "eabi5-hf", false), "armhf", true, ""},
		{elfSample("arm", "little", 32, "eabi5-sf", true), "armhf", true, ""},
		{elfSample("arm", "little", 32, "eabi5-sf", false), "armel", true, ""},
		{elfSample("mips", "little", 32, "o32", true), "mipsel", true, ""},
		{elfSample("mips", "big", 32, "o32", true), "amd64", true, "user-mode emulated: static mips binary runs under qemu-mips-static via binfmt_misc in the amd64 guest (native: needs a mips guest: Debian bookworm has no big-endian MIPS port)"},
		{elfSample("mips", "big", 32, "o32", false), "mips", false, "only static mips binaries run under qemu-mips-static"},
		{elfSample("ppc", "big", 32, "", true), "amd64", true, "qemu-ppc-static"},
		{elfSample("sh", "little", 32, "", true), "amd64", true, "qemu-sh4-static"},
		{elfSample("mips64", "little", 64, "n64", false), "mips64el", true, ""},
		{elfSample("ppc64", "little", 64, "elfv2", false), "ppc64el", true, ""},
		{elfSample("s390x", "big", 64, "", true), "s390x", true, ""},
		{elfSample("sparc", "big", 32, "", true), "amd64", true, "qemu-sparc-static"},
		{elfSample("m68k", "big", 32, "", true), "amd64", true, "qemu-m68k-static"},
		{elfSample("sparc", "big", 32, "", false), "", false, "dynamic"},
	}
	for _, c := range cases {
		pl, err := Make(c.s, prof, nil, "", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if pl.Image.Platform != c.platform || pl.Runnable != c.runnable || !strings.Contains(pl.Reason, c.reason) {
			t.Errorf("%s/%s/%+v: platform=%q runnable=%v reason=%q; want %q %v ~%q",
				c.s.Arch, c.s.Endianness, c.s.ABI, pl.Image.Platform, pl.Runnable, pl.Reason, c.platform, c.runnable, c.reason)
		}
		if e := pl.Emulation; e != nil {
			// The image needs the emulator, not the sample's ABI.
			if !pl.Runnable || e.Mode != "user" || e.Emulator != "qemu-"+e.Target+"-static" || !strings.Contains(pl.Reason, e.Emulator) ||
				!slices.Contains(pl.Image.Features, "qemu-user:"+e.Target) || pl.Image.ABI != "" || pl.Image.Arch != "x86_64" {
				t.Errorf("%s: emulated plan %+v image %+v", c.s.Arch, e, pl.Image)
			}
		} else if pl.Runnable && pl.Reason != "" {
			t.Errorf("runnable native plan with a reason: %q", pl.Reason)
		}
		if pl.Network.Mode != "sinkhole" || pl.Sample != c.s.ID || records.KindOf(pl.ID) != "plan" {
			t.Errorf("plan fields: %+v", pl)
		}
	}
	pe := &records.Sample{}
	pe.Format, pe.Arch = "pe", "x86_64"
	records.Init(pe, records.KindSample, time.Now())
	pl, _ := Make(pe, prof, nil, "", time.Now())
	if pl.Runnable || !strings.Contains(pl.Reason, "Windows") {
		t.Errorf("PE plan: %+v", pl)
	}
	if _, err := Make(pe, prof, nil, "vax", time.Now()); err == nil {
		t.Error("unknown forced platform accepted")
	}
	mips := elfSample("mips", "big", 32, "o32", true)
	if pl, _ := Make(mips, prof, nil, "", time.Now()); pl.Emulation == nil || pl.Emulation.Platform != "mips" || pl.Emulation.Target != "mips" {
		t.Errorf("static big-endian MIPS: %+v", pl.Emulation)
	}
	// --platform amd64 is where the emulator runs: the emulation stays.
	if pl, _ := Make(mips, prof, nil, "amd64", time.Now()); pl.Emulation == nil || !pl.Runnable {
		t.Errorf("--platform amd64 dropped the emulation: %+v", pl)
	}
	if pl, _ := Make(mips, prof, nil, "mipsel", time.Now()); pl.Emulation != nil || pl.Image.Platform != "mipsel" {
		t.Errorf("--platform mipsel must force a native plan: %+v", pl)
	}
	forced, _ := Make(pe, prof, nil, "amd64", time.Now())
	if !forced.Runnable || forced.Image.Platform != "amd64" {
		t.Errorf("--platform amd64 should force a runnable plan: %+v", forced)
	}
}
