// Package leasereport is a lease's life at a glance: it collects what the
// state holds about a lease (all its cycles), a sample (across its leases)
// or one cycle — the cycles and their outcomes, the allow-list's history,
// the traffic hour by hour from the flow logs, the beacon estimates, the
// behaviour summary — into a Report, and renders it as one self-contained
// HTML page (inline CSS and SVG, no script, nothing loaded from anywhere)
// or as JSON lines.
//
// Everything a sample controls (DNS names, argv, paths, process names) is
// text to the renderers: the HTML is made with html/template, which escapes
// it in every context, and a Content-Security-Policy forbids the page any
// script and any load.
package leasereport

import (
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/mitre"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Target names what a report covers: exactly one of a lease, a sample (its
// record ID or sha256) or a cycle.
type Target struct {
	Lease  string
	Sample string
	Cycle  string
}

// What a report is about (Report.Target).
const (
	TargetLease  = "lease"
	TargetSample = "sample"
	TargetCycle  = "cycle"
)

// Report is the data of a report: what the renderers draw, nothing they
// compute. Times are UTC.
type Report struct {
	// Target is lease, sample or cycle and ID that record's ID; Sample is
	// the sha256 of the sample the cycles ran.
	Target string `json:"target"`
	ID     string `json:"id"`
	Sample string `json:"sample,omitempty"`
	// From and To are the span the report covers: the lease's start (the
	// cycle's, for a cycle) to the last thing it shows.
	From      time.Time `json:"from"`
	To        time.Time `json:"to"`
	Generated time.Time `json:"generated"`
	Leases    []Lease   `json:"leases"`
	Cycles    []Cycle   `json:"cycles"`
	// Revisions are the allow-list revisions shown (the timeline's markers)
	// and Events what they changed and refused, oldest first.
	Revisions []Revision   `json:"revisions"`
	Events    []AllowEvent `json:"events"`
	C2s       []C2         `json:"c2s"`
	Hours     []Hour       `json:"hours"`
	// ScanTargets are the scanned ports ("tcp/23") or hosts
	// ("203.0.113.9/tcp") the hours count, in order of first scan.
	ScanTargets []string   `json:"scan_targets,omitempty"`
	Names       []Name     `json:"names"`
	Behaviour   *Behaviour `json:"behaviour,omitempty"`
	// Files are the sample's and its dropped files' hashes (the exports
	// name them).
	Files []File `json:"files,omitempty"`
	// Orders are the attack orders the bot's C2 sent (c2-command
	// observables) and Attacks the floods it sent (attack observables),
	// in time order: the timeline's bot row.
	Orders  []Order  `json:"orders,omitempty"`
	Attacks []Attack `json:"attacks,omitempty"`
	// Notes say what the report could not show, and why.
	Notes []string `json:"notes,omitempty"`
}

// Order is an order a C2 sent the bot, as decoded.
type Order struct {
	At         time.Time `json:"at"`
	Cycle      string    `json:"cycle,omitempty"`
	Family     string    `json:"family"`
	Vector     string    `json:"vector"`
	Targets    []string  `json:"targets,omitempty"`
	Ports      []string  `json:"ports,omitempty"`
	Duration   int64     `json:"duration,omitempty"`
	Servers    []string  `json:"servers,omitempty"`
	Observable string    `json:"observable"`
	// UIDs name the connections it came on in the lease's flow logs.
	UIDs []string `json:"uids,omitempty"`
}

// Attack is a flood the bot sent, as classified from its packets.
type Attack struct {
	Start      time.Time `json:"start"`
	End        time.Time `json:"end"`
	Cycle      string    `json:"cycle,omitempty"`
	Vector     string    `json:"vector"`
	Target     string    `json:"target"`
	Packets    int64     `json:"packets"`
	PPS        float64   `json:"pps"`
	Spoofed    bool      `json:"spoofed,omitempty"`
	Observable string    `json:"observable"`
	// UIDs name the flood's first connection(s) in the lease's flow logs.
	UIDs []string `json:"uids,omitempty"`
	// Order is the value of the c2-command the flood carried out and
	// OrderDelay the seconds from it (tb-parse's attribution, which the
	// sample could have staged: it describes, it proves nothing);
	// OrderObservable is that order's record when the report shows it.
	Order           string  `json:"order,omitempty"`
	OrderDelay      float64 `json:"order_delay,omitempty"`
	OrderObservable string  `json:"order_observable,omitempty"`
}

// File is the sample the cycles ran (Role "sample") or a file one of them
// dropped ("dropped"), as its sample record has it.
type File struct {
	Role   string   `json:"role"`
	Sample string   `json:"sample"`
	SHA256 string   `json:"sha256"`
	SHA1   string   `json:"sha1,omitempty"`
	MD5    string   `json:"md5,omitempty"`
	Size   int64    `json:"size"`
	Names  []string `json:"names,omitempty"`
}

// Lease is a lease of the report, with its health as tb-lease last saw it.
type Lease struct {
	ID        string     `json:"id"`
	State     string     `json:"state,omitempty"`
	Health    string     `json:"health,omitempty"`
	Host      string     `json:"host,omitempty"`
	VMName    string     `json:"vm_name,omitempty"`
	Platform  string     `json:"platform,omitempty"`
	Image     string     `json:"image_spec,omitempty"`
	IP        string     `json:"ip,omitempty"`
	Plan      string     `json:"plan,omitempty"`
	StartedAt *time.Time `json:"started_at,omitempty"`
	// ReleasedAt is when it ended (released, failed, expired).
	ReleasedAt *time.Time `json:"released_at,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	Restarts   int        `json:"restarts,omitempty"`
	Error      string     `json:"error,omitempty"`
	// Seen is when the record last changed (its health is as of then).
	Seen time.Time `json:"seen"`
	// Missing: the record is gone; what is known comes from its cycles.
	Missing bool `json:"missing,omitempty"`
}

// Cycle is one cycle: its outcome and what its analysis concluded.
type Cycle struct {
	ID          string     `json:"id"`
	Lease       string     `json:"lease,omitempty"`
	State       string     `json:"state"`
	RequestedAt time.Time  `json:"requested_at"`
	StartedAt   *time.Time `json:"started_at,omitempty"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	// Revision is the lease's allow-list revision in force at the start
	// (Allowed its active entries), Promoted the one post-processing left.
	Revision string   `json:"revision,omitempty"`
	Allowed  int      `json:"allowed"`
	Promoted string   `json:"promoted,omitempty"`
	Args     []string `json:"args,omitempty"`
	ExitCode *int     `json:"exit_code,omitempty"`
	Error    string   `json:"error,omitempty"`
	// Execution and Analysis are the cycle's records; the rest comes from
	// the analysis.
	Execution      string   `json:"execution,omitempty"`
	Analysis       string   `json:"analysis,omitempty"`
	Connections    int64    `json:"connections"`
	FlowLogs       []string `json:"flow_logs,omitempty"`
	Classification []string `json:"classification,omitempty"`
	Recommendation string   `json:"recommendation,omitempty"`
	Reasons        []string `json:"reasons,omitempty"`
	// Yara are the YARA rules that matched what the cycle left, and
	// Techniques the MITRE ATT&CK techniques its observables show.
	Yara       []string          `json:"yara,omitempty"`
	Techniques []mitre.Technique `json:"techniques,omitempty"`
}

// End is when the cycle ended, or until is if it has not.
func (c *Cycle) End(until time.Time) time.Time {
	if c.CompletedAt != nil {
		return *c.CompletedAt
	}
	return until
}

// Start is when the cycle started, or was asked for.
func (c *Cycle) Start() time.Time {
	if c.StartedAt != nil {
		return *c.StartedAt
	}
	return c.RequestedAt
}

// Revision is one allow-list revision of a chain that applies to the
// report's leases.
type Revision struct {
	ID         string    `json:"id"`
	Chain      string    `json:"chain"`
	Seq        int64     `json:"seq"`
	Cause      string    `json:"cause"`
	Cycle      string    `json:"cycle,omitempty"`
	At         time.Time `json:"at"`
	Entries    int       `json:"entries"`
	Active     int       `json:"active"`
	RollbackOf string    `json:"rollback_of,omitempty"`
	// Changes counts the entries whose status it changed (added, removed
	// or moved); 0 for a revision that only refreshed evidence.
	Changes int `json:"changes"`
}

// Actions of an AllowEvent.
const (
	ActionPromoted  = "promoted"
	ActionCandidate = "candidate"
	ActionPending   = "pending-approval"
	ActionApproved  = "approved"
	ActionRejected  = "rejected"
	ActionRevoked   = "revoked"
	ActionExpired   = "expired"
	ActionRemoved   = "removed"
	ActionRefused   = "refused"
)

// AllowEvent is one thing a revision did to one destination: an entry's
// status changed (promoted, pending-approval, approved, expired, …) or a
// destination was refused. A refusal that later revisions of the chain
// repeat is one event: Repeats counts the later ones, Last the latest.
type AllowEvent struct {
	At       time.Time `json:"at"`
	Revision string    `json:"revision"`
	Chain    string    `json:"chain"`
	Seq      int64     `json:"seq"`
	Cause    string    `json:"cause"`
	Cycle    string    `json:"cycle,omitempty"`
	Action   string    `json:"action"`
	// Key is the entry's key ("endpoint 198.51.100.18:80/tcp") or the
	// refused target ("scan of tcp/23").
	Key   string `json:"key"`
	Entry string `json:"entry,omitempty"`
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
	Class string `json:"class,omitempty"`
	// Why is the classifier's reason, the refusal's, or the expiry; Note
	// the operator's comment.
	Why          string    `json:"why,omitempty"`
	Note         string    `json:"note,omitempty"`
	Count        int       `json:"count,omitempty"`
	Examples     []string  `json:"examples,omitempty"`
	Repeats      int       `json:"repeats,omitempty"`
	Last         time.Time `json:"last,omitzero"`
	LastRevision string    `json:"last_revision,omitempty"`
}

// C2 is an endpoint the classifier called a C2 in one of the chains: its
// latest status, the beacon estimate, the inter-arrival histogram of the
// connection starts the estimate is made from, and the check-ins the flow
// logs show.
type C2 struct {
	Entry  string   `json:"entry"`
	Chain  string   `json:"chain"`
	Value  string   `json:"value"`
	Names  []string `json:"names,omitempty"`
	Status string   `json:"status"`
	Score  float64  `json:"score"`
	Reason string   `json:"reason,omitempty"`
	// Beacon is the classifier's estimate (none: not periodic), made in
	// revision EstimatedIn.
	Beacon      *records.Beacon `json:"beacon,omitempty"`
	EstimatedIn string          `json:"estimated_in,omitempty"`
	// Observables are the endpoint observables whose connection starts
	// (the latest each keeps) make the histogram; Intervals how many
	// intervals it counts, Median and Jitter (median absolute deviation
	// over the median) what they say.
	Observables []string `json:"observables,omitempty"`
	Intervals   int      `json:"intervals"`
	Median      float64  `json:"median_s,omitempty"`
	Jitter      float64  `json:"jitter,omitempty"`
	Histogram   []Bin    `json:"histogram,omitempty"`
	// CheckIns are the connections to it in the span, Answered those an
	// allow-list revision in force forwarded, the rest sinkholed.
	CheckIns  int64     `json:"checkins"`
	Answered  int64     `json:"answered"`
	Sinkholed int64     `json:"sinkholed"`
	First     time.Time `json:"first,omitzero"`
	Last      time.Time `json:"last,omitzero"`
	// UIDs are its first check-ins' connections in the flow logs (at most
	// maxUIDs), the uids its endpoint observables' provenance names.
	UIDs []string `json:"uids,omitempty"`
}

// Bin is one bar of a histogram of intervals, in seconds: [From, To).
// Outside bins count the intervals below and above the histogram's range;
// the one above has no To.
type Bin struct {
	From    float64 `json:"from_s"`
	To      float64 `json:"to_s,omitempty"`
	Count   int     `json:"count"`
	Outside bool    `json:"outside,omitempty"`
}

// Hour is one hour of traffic (hours without any are left out).
type Hour struct {
	Hour time.Time `json:"hour"`
	// Connections are the connections the flow logs hold, Established
	// those answered.
	Connections int64 `json:"connections"`
	Established int64 `json:"established"`
	// CheckIns are per C2 (Report.C2s' values), Scans per scanned target.
	CheckIns []HourCheckIns `json:"checkins,omitempty"`
	Scans    []HourScan     `json:"scans,omitempty"`
	// NewNames are the DNS names first seen in the hour.
	NewNames []string `json:"new_names,omitempty"`
	// Estimated: some of the hour comes from observables, not flow logs.
	Estimated bool `json:"estimated,omitempty"`
}

// HourCheckIns counts one C2's check-ins in an hour.
type HourCheckIns struct {
	C2        string `json:"c2"`
	Answered  int64  `json:"answered"`
	Sinkholed int64  `json:"sinkholed"`
}

// HourScan is a scan's connections in an hour, and their rate (per second,
// from the first to the last in the hour).
type HourScan struct {
	Target string  `json:"target"`
	Conns  int64   `json:"conns"`
	Rate   float64 `json:"rate"`
}

// Name is a DNS name the sample looked up.
type Name struct {
	Name       string    `json:"name"`
	FirstSeen  time.Time `json:"first_seen"`
	Queries    int64     `json:"queries"`
	Observable string    `json:"observable"`
	// UIDs name the connections of its first lookups in the flow logs.
	UIDs []string `json:"uids,omitempty"`
}

// Behaviour is the behaviour summary: the process tree of the latest
// cycle that traced one, and what every traced cycle saw.
type Behaviour struct {
	Cycle     string    `json:"cycle"`
	Analysis  string    `json:"analysis"`
	Cycles    []string  `json:"cycles"`
	Processes []Process `json:"processes,omitempty"`
	// Items are the dropped files, persistence, evasion, tried
	// destinations and listeners, each with the number of cycles that saw
	// it and the first.
	Items          []BehaviourItem `json:"items,omitempty"`
	DroppedSamples []string        `json:"dropped_samples,omitempty"`
}

// Process is one process of the tree, Depth deep.
type Process struct {
	Depth int      `json:"depth"`
	PID   int64    `json:"pid"`
	PPID  int64    `json:"ppid"`
	Exe   string   `json:"exe,omitempty"`
	Argv  []string `json:"argv,omitempty"`
	Names []string `json:"names,omitempty"`
	Exit  string   `json:"exit,omitempty"`
}

// BehaviourItem is one dropped file, persistence or evasion technique,
// tried destination or listener.
type BehaviourItem struct {
	What   string `json:"what"`
	Value  string `json:"value"`
	Cycles int    `json:"cycles"`
	First  string `json:"first"`
}
