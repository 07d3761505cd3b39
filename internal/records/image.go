package records

import "time"

// Kind names of tb-build's records.
const (
	KindImage = "image"
	KindBuild = "build"
)

// Image statuses. One image per spec is active at a time; stable images are
// earlier good builds that rollback may make active again; superseded ones
// are retired and gc removes their files unless pinned.
const (
	ImageActive     = "active"
	ImageStable     = "stable"
	ImageSuperseded = "superseded"
)

// Build statuses.
const (
	BuildRunning     = "running"
	BuildOK          = "ok"
	BuildFailed      = "failed"
	BuildSmokeFailed = "smoke_failed"
	// BuildInterrupted is set by the next build (or gc) on a build whose
	// process died while it was running.
	BuildInterrupted = "interrupted"
)

// SandboxImage is a published, smoke-tested, signed image.
type SandboxImage struct {
	Meta
	Spec        string `json:"spec"`
	SpecVersion string `json:"spec_version"`
	// Version is the spec version plus the build number: "1.0.0+build.3".
	Version     string `json:"version"`
	BuildNumber int    `json:"build_number"`
	// Platform is the Debian architecture (amd64, mipsel, …).
	Platform string `json:"platform"`
	// ABI is the userland ABI a dynamic sample must match (ARM float ABI
	// eabi5-hf or eabi5-sf, MIPS o32 or n64, PowerPC64 elfv2, …); empty
	// where the platform has only one.
	ABI string `json:"abi,omitempty"`
	// UserEmulators are the qemu-user targets (qemu-<name>-static, e.g.
	// mips, ppc, sh4, m68k, sparc) registered with binfmt_misc in the
	// guest: foreign binaries of those architectures run inside it.
	UserEmulators []string `json:"user_emulators,omitempty"`
	OS            string   `json:"os"`
	Release       string   `json:"release"`
	Status        string   `json:"status"`
	Pinned        bool     `json:"pinned,omitempty"`
	// Dir holds the files; their names are relative to it.
	Dir      string      `json:"dir"`
	Files    []ImageFile `json:"files"`
	Manifest string      `json:"manifest"`
	// ManifestSHA256 and KeyID tie the record to the signed manifest.
	ManifestSHA256 string    `json:"manifest_sha256"`
	KeyID          string    `json:"key_id"`
	Boot           ImageBoot `json:"boot"`
	Build          string    `json:"build"`
	SizeBytes      int64     `json:"size_bytes"`
	PublishedAt    time.Time `json:"published_at"`
	// BootToAgent is how long the smoke test took from start to a guest
	// agent answering.
	BootToAgent Duration `json:"boot_to_agent"`
}

// ImageFile is one file of an image.
type ImageFile struct {
	Name   string `json:"name"`
	Role   string `json:"role,omitempty"` // disk, kernel, initrd, manifest, signature
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// ImageBoot is what a hypervisor needs to boot the image directly.
type ImageBoot struct {
	Kernel     string `json:"kernel"`
	Initrd     string `json:"initrd"`
	Disk       string `json:"disk"`
	Cmdline    string `json:"cmdline"`
	Mode       string `json:"mode"` // talkbox-init or systemd
	Emulator   string `json:"emulator"`
	Arch       string `json:"arch"` // libvirt/QEMU architecture name
	Machine    string `json:"machine"`
	CPU        string `json:"cpu,omitempty"`
	Console    string `json:"console"`
	DiskBus    string `json:"disk_bus"`
	MemoryMiB  int    `json:"memory_mib"`
	VCPUs      int    `json:"vcpus"`
	NetModel   string `json:"net_model"`
	Interface  string `json:"interface"`
	NetworkSet string `json:"network"` // static, none
}

// ImageBuildRun is one run of tb-build build.
type ImageBuildRun struct {
	Meta
	Spec        string      `json:"spec"`
	SpecVersion string      `json:"spec_version"`
	SpecSHA256  string      `json:"spec_sha256"`
	Version     string      `json:"version"`
	BuildNumber int         `json:"build_number"`
	Platform    string      `json:"platform"`
	Status      string      `json:"status"`
	Error       string      `json:"error,omitempty"`
	Inputs      BuildInputs `json:"inputs"`
	// Log is the blob URI of the full build log.
	Log        string              `json:"log,omitempty"`
	PID        int                 `json:"pid,omitempty"`
	Host       string              `json:"host"`
	StartedAt  time.Time           `json:"started_at"`
	FinishedAt *time.Time          `json:"finished_at,omitempty"`
	Duration   Duration            `json:"duration,omitempty"`
	Phases     map[string]Duration `json:"phases,omitempty"`
	Files      []ImageFile         `json:"files,omitempty"`
	Smoke      *SmokeResult        `json:"smoke,omitempty"`
	Image      string              `json:"image,omitempty"`
}

// BuildInputs are what a build was made from.
type BuildInputs struct {
	Mirror   string   `json:"mirror"`
	Suite    string   `json:"suite"`
	Packages []string `json:"packages"`
	Builder  string   `json:"builder"` // e.g. "mmdebstrap 1.3.5"
	Tool     string   `json:"tool"`    // tb-build version
	// CachedDebs is how many .deb files the package cache held at the start.
	CachedDebs int `json:"cached_debs"`
}

// SmokeResult is what the smoke test saw.
type SmokeResult struct {
	Passed      bool     `json:"passed"`
	Accel       string   `json:"accel"` // kvm or tcg
	BootToAgent Duration `json:"boot_to_agent,omitempty"`
	Checks      []string `json:"checks,omitempty"`
	Error       string   `json:"error,omitempty"`
	// ConsoleTail is the end of the serial console when the test failed.
	ConsoleTail string `json:"console_tail,omitempty"`
}
