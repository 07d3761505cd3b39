package records

import "time"

// Kind names of tb-lease's records.
const (
	KindLease    = "lease"
	KindSnapshot = "snapshot"
)

// Lease states. A lease is written "creating" before its domain exists, so
// a crash at any later point leaves a record that reap can find; "busy" is
// held by a caller, "idle" is running and free for the next acquire of a
// matching plan. failed, released and expired are final: the domain and the
// overlay are gone (tb-capture treats them as gone).
const (
	LeaseCreating = "creating"
	LeaseBusy     = "busy"
	LeaseIdle     = "idle"
	LeaseFailed   = "failed"
	LeaseReleased = "released"
	LeaseExpired  = "expired"
)

// Lease health as last seen by tb-lease.
const (
	HealthHealthy   = "healthy"
	HealthUnhealthy = "unhealthy"
	HealthUnknown   = "unknown"
)

// LeaseGone reports whether a lease state is final.
func LeaseGone(state string) bool {
	switch state {
	case LeaseFailed, LeaseReleased, LeaseExpired, "deleted":
		return true
	}
	return false
}

// SandboxLease is a running VM owned by tb-lease.
type SandboxLease struct {
	Meta
	State  string `json:"state"`
	Health string `json:"health"`
	Plan   string `json:"plan,omitempty"`
	// Samples are the samples (sha256) whose code the guest has run since
	// it was last clean: the one it was handed to first and those of its
	// dropped descendants (files it dropped on this lease) it ran after.
	// An acquire for any other sample reverts the guest first; an empty
	// list (a lease from before it was kept) is clean for no one.
	Samples []string `json:"samples,omitempty"`
	// Reverts are the times the guest was taken back to a clean state to
	// serve another sample, oldest first (at most MaxReverts kept).
	Reverts []LeaseRevert `json:"reverts,omitempty"`
	// Holder is what the lease was acquired for (tb-run: the cycle), until
	// it is released: whoever acquired it and died before recording it can
	// find it again (tb-run resume adopts it).
	Holder string `json:"holder,omitempty"`
	Pool   string `json:"pool"`
	// Host is the name of the libvirt host in tb-lease's configuration,
	// ConnectURI how it is reached.
	Host       string `json:"host"`
	ConnectURI string `json:"connect_uri"`
	VMName     string `json:"vm_name"`
	Image      string `json:"image"`
	ImageSpec  string `json:"image_spec"`
	// ImageVersion is the image's version ("1.0.0+build.3").
	ImageVersion string   `json:"image_version"`
	Platform     string   `json:"platform"`
	Features     []string `json:"features,omitempty"`
	Accel        string   `json:"accel"`
	// Network: the lab bridge the tap is enslaved to, the guest's address
	// (without prefix), its prefix length and gateway.
	Bridge  string `json:"bridge"`
	Tap     string `json:"tap"`
	MAC     string `json:"mac"`
	IP      string `json:"ip"`
	Prefix  int    `json:"prefix"`
	Gateway string `json:"gateway,omitempty"`
	Limits  Limits `json:"limits"`
	// Dir holds the overlay and the console log while the lease lives.
	Dir        string `json:"dir"`
	Overlay    string `json:"overlay"`
	ConsoleLog string `json:"console_log"`
	// Console is the blob of the serial console, stored at release.
	Console     string     `json:"console,omitempty"`
	ConsoleTail string     `json:"console_tail,omitempty"`
	TTL         Duration   `json:"ttl"`
	AcquiredAt  *time.Time `json:"acquired_at,omitempty"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	StartedAt   *time.Time `json:"started_at,omitempty"`
	ReleasedAt  *time.Time `json:"released_at,omitempty"`
	// BootToAgent is how long the last start took until the guest agent
	// answered (a boot, or a restore).
	BootToAgent  Duration `json:"boot_to_agent,omitempty"`
	RestoredFrom string   `json:"restored_from,omitempty"`
	Acquisitions int      `json:"acquisitions"`
	Restarts     int      `json:"restarts,omitempty"`
	// PID is the tb-lease process that is creating the lease; it holds the
	// lease's acquire lock until the lease is ready.
	PID   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
	Usage *Usage `json:"usage,omitempty"`
}

// MaxReverts bounds the reverts a lease record keeps.
const MaxReverts = 32

// LeaseRevert is one revert of a lease's guest: what it served, what it
// was handed to, how it was made clean and what of the lease was reset.
type LeaseRevert struct {
	At time.Time `json:"at"`
	// From are the samples the guest had run; To the sample it serves now,
	// for Plan and Holder.
	From   []string `json:"from,omitempty"`
	To     string   `json:"to,omitempty"`
	Plan   string   `json:"plan,omitempty"`
	Holder string   `json:"holder,omitempty"`
	// How is "snapshot": restored from the lease's clean state (its guest
	// saved right after a fresh boot, before any sample ran), or "boot":
	// booted again on a fresh overlay of its image (the first revert,
	// which then saves that clean state, or a machine that cannot be
	// saved).
	How string `json:"how"`
	// Revision is the lease chain's revision that revoked the entries the
	// guest was allowed; Captures are the captures of the lease stopped
	// (the next cycle starts one with its own plan's rules).
	Revision string   `json:"revision,omitempty"`
	Captures []string `json:"captures,omitempty"`
	Took     Duration `json:"took"`
}

// Limits are a lease's resources.
type Limits struct {
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memory_mib"`
	DiskGiB   int `json:"disk_gib"`
	// CPUQuota is the share of one host CPU each vCPU may use, in percent
	// (0: unlimited).
	CPUQuota int `json:"cpu_quota,omitempty"`
}

// Usage is what a lease consumed from its start to its end.
type Usage struct {
	Seconds     float64 `json:"seconds"`
	VCPUSeconds float64 `json:"vcpu_seconds"`
	MiBSeconds  float64 `json:"mib_seconds"`
	// CPUSeconds is the CPU time the guest really used, from libvirt.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
}

// LeaseSnapshot is a saved lease: disk and memory.
type LeaseSnapshot struct {
	Meta
	Lease        string `json:"lease"`
	Host         string `json:"host"`
	Image        string `json:"image"`
	ImageSpec    string `json:"image_spec"`
	ImageVersion string `json:"image_version"`
	Platform     string `json:"platform"`
	Accel        string `json:"accel"`
	Limits       Limits `json:"limits"`
	Dir          string `json:"dir"`
	// Samples are the source lease's Samples when it was saved: the saved
	// guest has run them, and a lease restored from it serves only them.
	Samples   []string        `json:"samples,omitempty"`
	Files     []SnapshotFile  `json:"files"`
	SizeBytes int64           `json:"size_bytes"`
	Took      Duration        `json:"took"`
	Source    SnapshotNetwork `json:"source"`
}

// SnapshotFile is one file of a snapshot.
type SnapshotFile struct {
	Name   string `json:"name"`
	Role   string `json:"role"` // memory, disk
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// SnapshotNetwork is the identity the saved guest had, which a restore
// rewrites.
type SnapshotNetwork struct {
	VMName  string `json:"vm_name"`
	MAC     string `json:"mac"`
	IP      string `json:"ip"`
	Tap     string `json:"tap"`
	Overlay string `json:"overlay"`
	Console string `json:"console_log"`
}
