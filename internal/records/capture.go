package records

import "time"

// Kinds written by tb-capture.
const (
	KindCapture  = "capture"
	KindArtifact = "artifact"
)

// Capture is one packet capture on a lease's tap, with the containment
// rules applied for the lease while it runs.
type Capture struct {
	Meta
	Lease string `json:"lease,omitempty"`
	Plan  string `json:"plan,omitempty"`
	// Cycle is the cycle rotated files are registered for (changed by
	// "rotate --cycle").
	Cycle string `json:"cycle,omitempty"`
	Lab   string `json:"lab,omitempty"`
	// Iface is the capture interface (the lease's tap) in NetNS.
	Iface   string `json:"iface"`
	NetNS   string `json:"netns,omitempty"`
	IP      string `json:"ip,omitempty"`
	Snaplen int    `json:"snaplen"`
	// Filter is the capture filter as given (an expression or "bpf").
	Filter      string   `json:"filter,omitempty"`
	RotateSize  int64    `json:"rotate_size,omitempty"`
	RotateEvery Duration `json:"rotate_every,omitempty"`
	Spool       string   `json:"spool"`
	// KeepDays and KeepBytes bound what the lease keeps of its pcaps and
	// flow logs, oldest pruned first (0: no bound); the daemon prunes after
	// each rotation.
	KeepDays  float64 `json:"keep_days,omitempty"`
	KeepBytes int64   `json:"keep_bytes,omitempty"`
	// MinFree and MinFreePercent are what must stay free on the state's and
	// the spool's file systems, the larger bound winning: below it the
	// capture stops (both 0: never).
	MinFree        int64   `json:"min_free,omitempty"`
	MinFreePercent float64 `json:"min_free_percent,omitempty"`
	// State is starting, running, stopped or failed.
	State string `json:"state"`
	PID   int    `json:"pid,omitempty"`
	// Clock is the marker written at start: host wall and monotonic time
	// at the same instant, to line packets up with guest and host logs.
	Clock     ClockMarker `json:"clock"`
	StoppedAt *time.Time  `json:"stopped_at,omitempty"`
	Packets   uint64      `json:"packets"`
	Drops     uint64      `json:"drops"`
	// Bound is the lab's binding of the lease's port, when the capture is
	// on it: the frames from the guest that the bridge drops for it are
	// counted in KeptOut and not written, so that the capture holds only
	// what reached the lab (a sample cannot forge its C2's answers into it);
	// Forged counts those of them that claimed another identity (another
	// MAC, IPv4 source or ARP sender, 0.0.0.0 outside DHCP and ARP probes,
	// a routable IPv6 source: firewall.PortBinding.Forged).
	Bound     *PortBound `json:"bound,omitempty"`
	KeptOut   uint64     `json:"kept_out,omitempty"`
	Forged    uint64     `json:"forged,omitempty"`
	Files     int        `json:"files"`
	Artifacts []string   `json:"artifacts,omitempty"`
	// Rules summarises the lease's containment rules while applied.
	Rules   *RuleSummary   `json:"rules,omitempty"`
	Sensors []SensorStatus `json:"sensors,omitempty"`
	Error   string         `json:"error,omitempty"`
}

// PortBound is a guest port's binding on the lab's bridge: its MAC and
// IPv4, and whether the lab serves DHCP (a request from 0.0.0.0 passes).
type PortBound struct {
	MAC  string `json:"mac"`
	IP   string `json:"ip"`
	DHCP bool   `json:"dhcp,omitempty"`
}

// ClockMarker pairs wall-clock and monotonic time.
type ClockMarker struct {
	Wall time.Time `json:"wall"`
	// MonotonicNS is CLOCK_MONOTONIC, BoottimeNS CLOCK_BOOTTIME, in ns.
	MonotonicNS int64 `json:"monotonic_ns"`
	BoottimeNS  int64 `json:"boottime_ns"`
}

// RuleSummary is what tb-capture applied for a lease.
type RuleSummary struct {
	Table     string         `json:"table"`
	Mode      string         `json:"mode"`
	RateLimit string         `json:"rate_limit,omitempty"`
	AllowSMTP bool           `json:"allow_smtp"`
	Elements  map[string]int `json:"elements,omitempty"`
	Applied   bool           `json:"applied"`
}

// SensorStatus is one external sensor of a capture.
type SensorStatus struct {
	Name     string `json:"name"`
	State    string `json:"state"` // running, stopped, failed
	PID      int    `json:"pid,omitempty"`
	Restarts int    `json:"restarts"`
	Error    string `json:"error,omitempty"`
}

// Artifact is a file registered for a cycle: a pcap, a sensor's log.
type Artifact struct {
	Meta
	Cycle   string `json:"cycle,omitempty"`
	Lease   string `json:"lease,omitempty"`
	Capture string `json:"capture,omitempty"`
	// Type is pcap, sensor-log, guest-log, …
	Type         string `json:"type"`
	Sensor       string `json:"sensor,omitempty"`
	URI          string `json:"uri"`
	SHA256       string `json:"sha256"`
	Size         int64  `json:"size"`
	ContentType  string `json:"content_type"`
	ParserStatus string `json:"parser_status"`
	// Pcap details.
	Packets uint64     `json:"packets,omitempty"`
	FirstTS *time.Time `json:"first_ts,omitempty"`
	LastTS  *time.Time `json:"last_ts,omitempty"`
	Iface   string     `json:"iface,omitempty"`
	Filter  string     `json:"filter,omitempty"`
	Snaplen int        `json:"snaplen,omitempty"`
	// Drops are the kernel's drops while this file was written.
	Drops uint64 `json:"drops"`
	// KeptOut counts the frames from the guest kept out of this file: the
	// lab's bridge dropped them (Capture.Bound). Forged counts those of
	// them that claimed another identity; the rest (the guest's own IPv6,
	// other ethertypes, frames cut short) claimed nobody's.
	KeptOut uint64 `json:"kept_out,omitempty"`
	Forged  uint64 `json:"forged,omitempty"`
	// Reason is why the file was closed: rotate, size, time, stop, disk-full.
	Reason string `json:"reason,omitempty"`
	// Source is the artifact this one was derived from (a flow log's
	// capture), Conns the connections a flow log holds.
	Source string `json:"source,omitempty"`
	Conns  int64  `json:"conns,omitempty"`
	// PrunedAt is when retention deleted the artifact's content; the
	// record stays, its URI no longer resolves.
	PrunedAt *time.Time     `json:"pruned_at,omitempty"`
	Metadata map[string]any `json:"metadata,omitempty"`
}
