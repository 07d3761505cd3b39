package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// debianArches are Debian bookworm's release architectures.
var debianArches = []string{"amd64", "arm64", "armel", "armhf", "i386", "mips64el", "mipsel", "ppc64el", "s390x"}

// foreignWant is what tb-plan must make of a binary.
type foreignWant struct {
	arch, endian string
	bits         int
	abi          string
	static       bool
	platform     string // the plan's guest platform; "" not checked
}

// TestPlanForeignBinaries plans Debian's own busybox-static and coreutils
// (ls) of every release architecture, and the C beacon of every
// architecture the Makefile builds it for, and checks what tb-plan's
// triage says of each. The long tail's platform is not checked: whether and
// how it runs (user-mode emulation in a guest) is the platform package's
// business.
func TestPlanForeignBinaries(t *testing.T) {
	debs := fetchDebs(t, []string{"busybox-static", "coreutils"}, debianArches)
	root := t.TempDir()
	var files []string
	want := map[string]foreignWant{}
	for _, arch := range debianArches {
		w := releaseWant[arch]
		for _, pkg := range []string{"busybox-static", "coreutils"} {
			dir := filepath.Join(root, arch, pkg)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("dpkg-deb", "-x", debs[pkg+":"+arch], dir).CombinedOutput(); err != nil {
				t.Fatalf("dpkg-deb -x %s: %v\n%s", debs[pkg+":"+arch], err, out)
			}
			f := filepath.Join(dir, "bin", "busybox")
			if pkg == "coreutils" {
				f = filepath.Join(dir, "bin", "ls")
			}
			w.static, w.platform = pkg == "busybox-static", arch
			if arch == "armel" && w.static {
				w.platform = "armhf" // the armhf kernel runs any static EABI binary
			}
			files = append(files, f)
			want[f] = w
		}
	}
	cdir := filepath.Join(root, "cbeacon")
	cmd := exec.Command("make", "-s", "-C", "../..", "CBEACON_DIR="+cdir, "cbeacons")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make cbeacons (scripts/deps.sh test installs the cross compilers): %v\n%s", err, out)
	}
	for arch, w := range cbeaconWant {
		f := filepath.Join(cdir, "cbeacon-"+arch)
		files = append(files, f)
		want[f] = w
	}

	cmd = exec.Command("tb-plan", files...)
	cmd.Env = append(os.Environ(), "TB_STATE="+filepath.Join(root, "state"), "TB_PROFILES="+filepath.Join(root, "profiles"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tb-plan: %v\n%s", err, stderr.Bytes())
	}
	samples := map[string]records.Sample{}
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var kind struct{ Kind string }
		if err := json.Unmarshal(sc.Bytes(), &kind); err != nil {
			t.Fatalf("tb-plan output %q: %v", sc.Text(), err)
		}
		switch kind.Kind {
		case records.KindSample:
			var s records.Sample
			if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
				t.Fatal(err)
			}
			samples[s.ID] = s
		case records.KindPlan:
			var p records.Plan
			if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
				t.Fatal(err)
			}
			s := samples[p.Sample]
			w, ok := want[s.Source]
			if !ok {
				t.Fatalf("plan %s for an unexpected sample %q", p.ID, s.Source)
			}
			seen++
			checkForeign(t, root, s, p, w)
		}
	}
	if seen != len(files) {
		t.Fatalf("tb-plan planned %d of %d files\n%s", seen, len(files), stderr.Bytes())
	}
}

func checkForeign(t *testing.T, root string, s records.Sample, p records.Plan, w foreignWant) {
	t.Helper()
	name := strings.TrimPrefix(s.Source, root+"/")
	abi, static := "", false
	if s.ABI != nil {
		abi = s.ABI.Name
	}
	if s.Static != nil {
		static = *s.Static
	}
	t.Logf("%-32s arch=%s endian=%s bits=%d abi=%s static=%v -> platform=%s runnable=%v", name, s.Arch, s.Endianness, s.Bits, abi, static, p.Image.Platform, p.Runnable)
	if s.Format != "elf" || s.OS != "linux" || s.Arch != w.arch || s.Endianness != w.endian || s.Bits != w.bits ||
		abi != w.abi || s.Static == nil || static != w.static || s.Problem != "" {
		t.Errorf("%s: triage arch=%s endian=%s bits=%d abi=%q static=%v problem=%q, want arch=%s endian=%s bits=%d abi=%q static=%v",
			name, s.Arch, s.Endianness, s.Bits, abi, static, s.Problem, w.arch, w.endian, w.bits, w.abi, w.static)
	}
	if w.platform != "" && p.Image.Platform != w.platform {
		t.Errorf("%s: plan platform %q, want %q", name, p.Image.Platform, w.platform)
	}
}

var releaseWant = map[string]foreignWant{
	"amd64":    {arch: "x86_64", endian: "little", bits: 64},
	"arm64":    {arch: "aarch64", endian: "little", bits: 64},
	"armel":    {arch: "arm", endian: "little", bits: 32, abi: "eabi5-sf"},
	"armhf":    {arch: "arm", endian: "little", bits: 32, abi: "eabi5-hf"},
	"i386":     {arch: "x86", endian: "little", bits: 32},
	"mips64el": {arch: "mips64", endian: "little", bits: 64, abi: "n64"},
	"mipsel":   {arch: "mips", endian: "little", bits: 32, abi: "o32"},
	"ppc64el":  {arch: "ppc64", endian: "little", bits: 64, abi: "elfv2"},
	"s390x":    {arch: "s390x", endian: "big", bits: 64},
}

// cbeaconWant: the Makefile's C beacons (static, -march=armv5te soft-float
// for armel); the long tail's platform is left to the platform package.
var cbeaconWant = map[string]foreignWant{
	"armel":   {arch: "arm", endian: "little", bits: 32, abi: "eabi5-sf", static: true, platform: "armhf"},
	"armhf":   {arch: "arm", endian: "little", bits: 32, abi: "eabi5-hf", static: true, platform: "armhf"},
	"i386":    {arch: "x86", endian: "little", bits: 32, static: true, platform: "i386"},
	"mipsel":  {arch: "mips", endian: "little", bits: 32, abi: "o32", static: true, platform: "mipsel"},
	"mips":    {arch: "mips", endian: "big", bits: 32, abi: "o32", static: true},
	"powerpc": {arch: "ppc", endian: "big", bits: 32, static: true},
	"sh4":     {arch: "sh", endian: "little", bits: 32, static: true},
	"m68k":    {arch: "m68k", endian: "big", bits: 32, static: true},
	"sparc64": {arch: "sparc64", endian: "big", bits: 64, static: true},
}

// fetchDebs returns the .deb of every package for every architecture,
// downloaded from Debian bookworm once into $TMPDIR/talkbox-test-debs.
// apt works on a private copy of its lists, with every architecture
// enabled there, so the host's dpkg configuration and apt lock are left
// alone.
func fetchDebs(t *testing.T, pkgs, arches []string) map[string]string {
	t.Helper()
	cache := filepath.Join(os.TempDir(), "talkbox-test-debs")
	found := func() (map[string]string, []string) {
		got, missing := map[string]string{}, []string(nil)
		for _, p := range pkgs {
			for _, a := range arches {
				m, _ := filepath.Glob(filepath.Join(cache, p+"_*_"+a+".deb"))
				if len(m) == 0 {
					missing = append(missing, p+":"+a)
					continue
				}
				got[p+":"+a] = m[len(m)-1]
			}
		}
		return got, missing
	}
	got, missing := found()
	if len(missing) == 0 {
		return got
	}
	apt := filepath.Join(cache, "apt")
	for _, d := range []string{"lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(apt, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sources := filepath.Join(apt, "sources.list")
	if err := os.WriteFile(sources, []byte("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := []string{"-q", "-o", "Dir::State::Lists=" + filepath.Join(apt, "lists"), "-o", "Dir::Cache=" + filepath.Join(apt, "cache"),
		"-o", "Dir::Etc::SourceList=" + sources, "-o", "Dir::Etc::SourceParts=" + filepath.Join(apt, "none"),
		"-o", "Acquire::Languages=none", "-o", "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"}
	for _, a := range arches {
		opts = append(opts, "-o", "APT::Architectures::="+a)
	}
	if out, err := exec.Command("apt-get", append(opts, "update")...).CombinedOutput(); err != nil {
		t.Fatalf("apt-get update (private lists in %s): %v\n%s", apt, err, out)
	}
	// Download into a fresh directory and move each file in whole, so the
	// cache never holds half a package.
	tmp, err := os.MkdirTemp(cache, "download")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("apt-get", append(append(opts, "download"), missing...)...)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("apt-get download %s: %v\n%s", strings.Join(missing, " "), err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	for _, d := range debs {
		if err := os.Rename(d, filepath.Join(cache, filepath.Base(d))); err != nil {
			t.Fatal(err)
		}
	}
	if got, missing = found(); len(missing) > 0 {
		t.Fatalf("%s: not downloaded", fmt.Sprint(missing))
	}
	return got
}
