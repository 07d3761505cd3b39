package records

import (
	"slices"
	"strings"
)

// Plan is the lease-agnostic blueprint for running one sample: what image it
// needs, what lease to ask for, the network policy and the instrumentation.
type Plan struct {
	Meta
	Sample       string     `json:"sample"`
	SampleSHA256 string     `json:"sample_sha256"`
	Profile      ProfileRef `json:"profile"`
	Runnable     bool       `json:"runnable"`
	Reason       string     `json:"reason,omitempty"`
	Image        ImageNeeds `json:"image"`
	Lease        LeaseNeeds `json:"lease"`
	Network      NetPolicy  `json:"network"`
	Execution    Execution  `json:"execution"`
	// Emulation is set when no guest runs the sample natively: it runs
	// inside a guest of Image.Platform under a user-mode emulator.
	Emulation *Emulation `json:"emulation,omitempty"`
	Timeouts  Timeouts   `json:"timeouts"`
	// Instrument is the instrumentation: Instruments joined with "+".
	Instrument string `json:"instrumentation"`
	// Yara are the directories of the analyst's YARA rules, besides the
	// host's own (/etc/talkbox/yara): run over the sample at tb-plan, and
	// over its dropped files and memory dumps at each cycle's
	// post-processing, on the host that runs it.
	Yara      []string `json:"yara,omitempty"`
	Overrides []string `json:"overrides,omitempty"`
}

// Emulation is how a sample with no native guest runs inside one.
type Emulation struct {
	Mode string `json:"mode"` // user: qemu-user through binfmt_misc in the guest
	// Target is the qemu-user target (mips, ppc, sh4, m68k, sparc, …) and
	// Emulator its binary in the guest (qemu-mips-static, …).
	Target   string `json:"target"`
	Emulator string `json:"emulator"`
	// Platform is the sample's own architecture, as Debian or the
	// toolchain names it (mips, powerpc, sh4, m68k, sparc, …).
	Platform string `json:"platform"`
}

// ProfileRef names the profile version a plan was made from.
type ProfileRef struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// ImageNeeds is what an image must offer to run the sample.
type ImageNeeds struct {
	// Platform is the Debian architecture of a guest that runs the sample
	// natively (amd64, i386, arm64, armhf, armel, mipsel, mips64el, ppc64el,
	// s390x, …).
	Platform   string   `json:"platform,omitempty"`
	Arch       string   `json:"arch,omitempty"`
	OS         string   `json:"os,omitempty"`
	Endianness string   `json:"endianness,omitempty"`
	Bits       int      `json:"bits,omitempty"`
	ABI        string   `json:"abi,omitempty"`
	Features   []string `json:"features,omitempty"`
	Preferred  []string `json:"preferred,omitempty"`
}

// LeaseNeeds is the minimum lease to request.
type LeaseNeeds struct {
	VCPUs     int      `json:"vcpus"`
	MemoryMiB int      `json:"memory_mib"`
	DiskGiB   int      `json:"disk_gib"`
	TTL       Duration `json:"ttl"`
}

// NetPolicy is the containment a lease starts with.
type NetPolicy struct {
	// Mode is sinkhole (nothing leaves the lab) or allowlist (promoted
	// destinations are forwarded).
	Mode string `json:"mode"`
	// RateLimit caps forwarded traffic per destination, e.g. "64kbytes/second".
	RateLimit string `json:"rate_limit,omitempty"`
	// AllowSMTP forwards SMTP ports if promoted; off unless forced.
	AllowSMTP bool `json:"allow_smtp"`
	// Promote lets tb-allow promote C2 candidates between cycles.
	Promote bool `json:"promote"`
}

// Execution is how the sample is started in the guest.
type Execution struct {
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	// Detach leaves the sample running across cycles.
	Detach bool `json:"detach"`
	// Cycles is how many observation cycles the plan asks for.
	Cycles int `json:"cycles"`
}

// Timeouts bound each phase.
type Timeouts struct {
	Boot      Duration `json:"boot"`
	Execution Duration `json:"execution"`
	Window    Duration `json:"window"`
}

// Instruments are the instrumentation a plan may ask for: the lease's
// packet capture (always on: containment and the flow log rest on it), the
// sample's system-call trace and a dump of the guest's memory at the end of
// each cycle.
var Instruments = []string{"pcap", "trace", "memory"}

// Instruments reports whether the plan asks for the instrument.
func (p *Plan) Instruments(instrument string) bool {
	return slices.Contains(strings.Split(p.Instrument, "+"), instrument)
}
