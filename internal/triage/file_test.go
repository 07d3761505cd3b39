package triage

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// fileArch lists what file(1) prints for each arch (any one must appear).
var fileArch = map[string][]string{
	"x86":         {"Intel 80386", "Intel i386"},
	"x86_64":      {"x86-64"},
	"arm":         {"ARM,"},
	"aarch64":     {"ARM aarch64"},
	"mips":        {"MIPS,"},
	"mips64":      {"MIPS,"},
	"ppc":         {"PowerPC or cisco 4500"},
	"ppc64":       {"64-bit PowerPC"},
	"s390":        {"IBM S/390"},
	"s390x":       {"IBM S/390"},
	"sparc":       {"SPARC,", "SPARC32PLUS"},
	"sparc64":     {"SPARC V9"},
	"m68k":        {"Motorola m68k"},
	"sh":          {"Renesas SH"},
	"arc":         {"ARCompact", "ARCv2", "Argonaut RISC Core"},
	"riscv32":     {"UCB RISC-V"},
	"riscv64":     {"UCB RISC-V"},
	"loongarch64": {"LoongArch"},
	"alpha":       {"Alpha"},
	"hppa":        {"PA-RISC"},
	"ia64":        {"IA-64"},
	"microblaze":  {"MicroBlaze"},
	"xtensa":      {"Xtensa"},
	"openrisc":    {"OpenRISC"},
	"nios2":       {"Nios II"},
	"csky":        {"C-SKY"},
}

// fileOS maps file(1)'s OS words (from EI_OSABI or notes) to ours.
var fileOS = map[string]string{
	"(FreeBSD)": "freebsd", "for FreeBSD": "freebsd",
	"(NetBSD)": "netbsd", "for NetBSD": "netbsd",
	"(OpenBSD)": "openbsd", "for OpenBSD": "openbsd",
	"(GNU/Linux)": "linux", "for GNU/Linux": "linux",
	"(Solaris)": "solaris", "for Solaris": "solaris",
}

// fileDisagreements compares an ELF triage with file -b output.
func fileDisagreements(tr records.Triage, text string) []string {
	var errs []string
	bad := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }
	if !strings.HasPrefix(text, fmt.Sprintf("ELF %d-bit ", tr.Bits)) {
		bad("bits %d", tr.Bits)
	}
	if e := map[string]string{"little": " LSB ", "big": " MSB "}[tr.Endianness]; e == "" || !strings.Contains(text, e) {
		bad("endianness %q", tr.Endianness)
	}
	names, ok := fileArch[tr.Arch]
	if !ok {
		bad("arch %q has no file(1) name", tr.Arch)
	}
	found := false
	for _, n := range names {
		found = found || strings.Contains(text, n)
	}
	if ok && !found {
		bad("arch %q (want one of %q)", tr.Arch, names)
	}
	if tr.Arch == "arm" && strings.Contains(text, "aarch64") {
		bad("arch arm, file says aarch64")
	}
	switch {
	case strings.Contains(text, "pie executable"):
		if tr.Type != "pie" {
			bad("type %q, file says pie", tr.Type)
		}
	case strings.Contains(text, "shared object"):
		// file calls ET_DYN with an interpreter but no DF_1_PIE a shared
		// object; we call it pie.
		if tr.Type != "pie" && tr.Type != "shared" {
			bad("type %q, file says shared object", tr.Type)
		}
	case strings.Contains(text, " executable,"):
		if tr.Type != "exec" {
			bad("type %q, file says executable", tr.Type)
		}
	case strings.Contains(text, "relocatable"):
		if tr.Type != "object" {
			bad("type %q, file says relocatable", tr.Type)
		}
	case strings.Contains(text, "core file"):
		if tr.Type != "core" {
			bad("type %q, file says core", tr.Type)
		}
	}
	static := tr.Static != nil && *tr.Static
	switch {
	case strings.Contains(text, "dynamically linked") && static,
		strings.Contains(text, "static-pie linked") && !static,
		// file says "statically linked" for anything without PT_DYNAMIC,
		// even with an interpreter; then we say dynamic.
		strings.Contains(text, "statically linked") && !static && tr.Interpreter == "":
		bad("static=%v", static)
	}
	if i := strings.Index(text, "interpreter "); i >= 0 {
		interp, _, _ := strings.Cut(text[i+len("interpreter "):], ",")
		if interp != tr.Interpreter {
			bad("interpreter %q, file says %q", tr.Interpreter, interp)
		}
	}
	stripped := tr.Stripped != nil && *tr.Stripped
	if strings.Contains(text, "not stripped") == stripped && strings.Contains(text, "stripped") {
		bad("stripped=%v", stripped)
	}
	for k, os := range fileOS {
		if strings.Contains(text, k) && tr.OS != os {
			bad("os %q, file says %q", tr.OS, k)
		}
	}
	return errs
}

// TestFileAgreement runs file(1) once over every ELF we have, real and
// hand-built, and checks it agrees with us.
func TestFileAgreement(t *testing.T) {
	fileCmd, err := exec.LookPath("file")
	if err != nil {
		t.Skip("file(1) not on PATH")
	}
	type item struct {
		name, path string
		tr         records.Triage
	}
	var items []item
	tmp := t.TempDir()
	for _, s := range handSamples() {
		if s.want.format != "elf" {
			continue
		}
		p := filepath.Join(tmp, s.name)
		if err := os.WriteFile(p, s.data, 0o644); err != nil {
			t.Fatal(err)
		}
		items = append(items, item{s.name, p, inspectBytes(s.data)})
	}
	nHand := len(items)
	if !testing.Short() || corpusCached() {
		for _, f := range corpus(t).files {
			tr, err := inspectFile(f.path)
			if err != nil {
				t.Fatal(err)
			}
			if tr.Format == "elf" {
				items = append(items, item{f.target.name(), f.path, tr})
			}
		}
	}
	args := []string{"-b", "--"}
	for _, it := range items {
		args = append(args, it.path)
	}
	out, err := exec.Command(fileCmd, args...).Output()
	if err != nil {
		t.Fatalf("file: %v", err)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(items) {
		t.Fatalf("file printed %d lines for %d files", len(lines), len(items))
	}
	for i, it := range items {
		if it.tr.Arch == "" {
			continue // unknown machine: nothing to compare
		}
		if errs := fileDisagreements(it.tr, lines[i]); len(errs) > 0 {
			t.Errorf("%s: disagrees with file(1): %s\n\tfile: %s", it.name, strings.Join(errs, "; "), lines[i])
		}
	}
	t.Logf("file(1) agrees on %d ELF files (%d hand-built, %d from the Go corpus)", len(items), nHand, len(items)-nHand)
}

func corpusCached() bool {
	_, _, complete, err := corpusDir()
	return err == nil && complete
}

// TestFileDisagreementDetected makes sure the comparison can fail.
func TestFileDisagreementDetected(t *testing.T) {
	tr := inspectBytes(elfSpec{big: true, etype: etExec, machine: emSPARC}.build())
	if errs := fileDisagreements(tr, "ELF 32-bit MSB executable, SPARC, version 1 (SYSV), no program header, stripped"); len(errs) > 0 {
		t.Fatalf("matching text rejected: %v", errs)
	}
	for _, text := range []string{
		"ELF 32-bit LSB executable, SPARC, version 1 (SYSV), stripped",
		"ELF 64-bit MSB executable, SPARC, version 1 (SYSV), stripped",
		"ELF 32-bit MSB executable, Motorola m68k, version 1 (SYSV), stripped",
		"ELF 32-bit MSB executable, SPARC, version 1 (SYSV), not stripped",
		"ELF 32-bit MSB executable, SPARC, version 1 (SYSV), dynamically linked, stripped",
		"ELF 32-bit MSB executable, SPARC, version 1 (FreeBSD), stripped",
	} {
		if errs := fileDisagreements(tr, text); len(errs) == 0 {
			t.Errorf("no disagreement found with %q", text)
		}
	}
}
