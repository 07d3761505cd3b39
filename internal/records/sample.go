package records

import "time"

// Kind names used by the tools.
const (
	KindSample = "sample"
	KindPlan   = "plan"
)

// Sample is a submitted file, stored once in the blob store.
type Sample struct {
	Meta
	SHA256  string  `json:"sha256"`
	SHA1    string  `json:"sha1"`
	MD5     string  `json:"md5"`
	Size    int64   `json:"size"`
	Entropy float64 `json:"entropy"`
	// Blob is the blob-store URI of the content.
	Blob string `json:"blob"`
	Triage
	// Source is the path (or "stdin") the sample was first submitted from;
	// Names collects every file name it was submitted under.
	Source      string    `json:"source,omitempty"`
	Names       []string  `json:"names,omitempty"`
	Priority    int       `json:"priority"`
	SubmittedAt time.Time `json:"submitted_at"`
	// DroppedBy is the sample's lineage: the cycles in which another sample
	// wrote this file in a guest (tb-run copies dropped files out and plans
	// them), each once.
	DroppedBy []Drop `json:"dropped_by,omitempty"`
}

// Drop is where a dropped file came from.
type Drop struct {
	Cycle string `json:"cycle"`
	Lease string `json:"lease,omitempty"`
	// Path is the file's path in the guest; Sample the sha256 of the
	// sample that ran in the cycle.
	Path   string `json:"path"`
	Sample string `json:"sample,omitempty"`
}

// Triage is what static inspection of the file headers found.
type Triage struct {
	// Format is elf, pe, macho, script, zip, gzip, tar or unknown.
	Format string `json:"format"`
	// Arch is a canonical architecture name: x86, x86_64, arm, aarch64,
	// mips, mips64, ppc, ppc64, s390, s390x, sparc, sparc64, m68k, sh, arc,
	// riscv32, riscv64, … ("" when the format has none).
	Arch       string `json:"arch,omitempty"`
	Endianness string `json:"endianness,omitempty"` // little or big
	Bits       int    `json:"bits,omitempty"`
	OS         string `json:"os,omitempty"`   // linux, windows, darwin, freebsd, …
	Type       string `json:"type,omitempty"` // exec, pie, shared, object, core (ELF); exe, dll (PE)
	ABI        *ABI   `json:"abi,omitempty"`
	// Static is true for an ELF without an interpreter or dynamic section.
	Static      *bool  `json:"static,omitempty"`
	Interpreter string `json:"interpreter,omitempty"`
	Stripped    *bool  `json:"stripped,omitempty"`
	// Packer names a recognised packer ("upx").
	Packer string `json:"packer,omitempty"`
	// Details holds format-specific facts (PE subsystem and .NET, Mach-O fat
	// slices, script interpreter, archive member count, …).
	Details map[string]any `json:"details,omitempty"`
	// Problem explains a file whose headers are cut short or inconsistent.
	Problem string `json:"problem,omitempty"`
}

// ABI holds the ELF details that decide which VM can run a binary.
type ABI struct {
	// Name summarises the ABI: eabi5-hf, eabi5-sf, oabi, o32, n32, n64,
	// elfv1, elfv2, lp64d, ilp32d, …
	Name  string `json:"name,omitempty"`
	EABI  int    `json:"eabi,omitempty"`  // ARM EABI version
	Float string `json:"float,omitempty"` // hard, soft, single, double (ARM, MIPS, RISC-V, LoongArch)
	ISA   string `json:"isa,omitempty"`   // mips32r2, mips64r6, armv7, rv64, …
	Flags string `json:"flags,omitempty"` // e_flags in hex
}
