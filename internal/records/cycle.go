package records

import "time"

// Kinds written by tb-run.
const (
	KindCycle     = "cycle"
	KindExecution = "execution"
	KindAnalysis  = "analysis"
	KindEvent     = "event"
)

// Cycle states. pending → leasing → preparing → executing →
// post_processing → completed; a run killed at its timeout is still
// post-processed and ends timed_out; failed and cancelled end a cycle early.
const (
	CyclePending        = "pending"
	CycleLeasing        = "leasing"
	CyclePreparing      = "preparing"
	CycleExecuting      = "executing"
	CyclePostProcessing = "post_processing"
	CycleCompleted      = "completed"
	CycleFailed         = "failed"
	CycleTimedOut       = "timed_out"
	CycleCancelled      = "cancelled"
)

// CycleTerminal reports whether a cycle state is final.
func CycleTerminal(state string) bool {
	switch state {
	case CycleCompleted, CycleFailed, CycleTimedOut, CycleCancelled:
		return true
	}
	return false
}

// Recommendations of a RunAnalysis.
const (
	RecommendRerun    = "rerun"    // run again: the allow-list changed
	RecommendReplan   = "re-plan"  // the plan is wrong (architecture, image)
	RecommendEscalate = "escalate" // a person should look
	RecommendDone     = "done"     // nothing more to learn from another cycle
)

// Cycle (SandboxCycle) is one observation window of a sample on a lease.
type Cycle struct {
	Meta
	State  string `json:"state"`
	Plan   string `json:"plan"`
	Sample string `json:"sample"` // sha256
	Lease  string `json:"lease,omitempty"`
	// FreshLease: leasing boots a new lease instead of reusing an idle one.
	FreshLease bool `json:"fresh_lease,omitempty"`
	// Previous is the cycle this one follows on the same lease and sample
	// (lineage); Revision the lease chain's allow-list revision in force
	// when it started and Forwarding the digest of that chain's enforced
	// set with its element count; Enforced the revisions of the sample's
	// and the global chains in force then (enforced too).
	Previous   string   `json:"previous,omitempty"`
	Revision   string   `json:"revision,omitempty"`
	Forwarding string   `json:"forwarding,omitempty"`
	Allowed    int      `json:"allowed"`
	Enforced   []string `json:"enforced,omitempty"`
	// What runs: the sample's path in the guest, its arguments, environment
	// and working directory, and the bounds.
	GuestPath string `json:"guest_path,omitempty"`
	// GuestOut is the path prefix of the sample's files in the guest
	// (.pid, .stdout, .stderr, .trace).
	GuestOut string            `json:"guest_out,omitempty"`
	Args     []string          `json:"args,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
	Timeout  Duration          `json:"timeout"`
	Detach   bool              `json:"detach"`
	Window   Duration          `json:"window,omitempty"`
	// Post is what post-processing does: rotate, parse, promote.
	Post []string `json:"post,omitempty"`
	// Launch is set before the sample is started and GuestPID once it is,
	// so that a resumed cycle never starts it twice; Attached is set when a
	// detached sample of an earlier cycle is observed instead.
	Launch     bool       `json:"launch,omitempty"`
	LaunchedAt *time.Time `json:"launched_at,omitempty"`
	GuestPID   int        `json:"guest_pid,omitempty"`
	Attached   string     `json:"attached,omitempty"`
	// StdoutFrom/To and StderrFrom/To are the byte ranges of the guest's
	// output files this cycle read (a detached sample's output spans
	// cycles: the next one starts where this one stopped).
	StdoutFrom int64 `json:"stdout_from,omitempty"`
	StdoutTo   int64 `json:"stdout_to,omitempty"`
	StderrFrom int64 `json:"stderr_from,omitempty"`
	StderrTo   int64 `json:"stderr_to,omitempty"`
	// Tracer says the sample's system calls are traced in the guest (plan
	// instrumentation "trace"): by strace, natively or, for a sample under
	// user-mode emulation (the plan's emulation), around the emulator.
	// "strace" (an emulated cycle recorded by an older tb-run may say
	// "qemu": QEMU's own log, which lost lines at each exec). TraceFrom/To
	// is the byte range of the trace this cycle read.
	Tracer    string `json:"tracer,omitempty"`
	TraceFrom int64  `json:"trace_from,omitempty"`
	TraceTo   int64  `json:"trace_to,omitempty"`
	// DroppedSamples are the samples planned from files the sample dropped
	// in the guest (post-processing step drops).
	DroppedSamples []string `json:"dropped_samples,omitempty"`
	// Cancel is set by "tb-run cancel" for the runner to act on.
	Cancel      bool       `json:"cancel,omitempty"`
	RequestedAt time.Time  `json:"requested_at"`
	StartedAt   *time.Time `json:"started_at,omitempty"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	ExitCode    *int       `json:"exit_code,omitempty"`
	TimedOut    bool       `json:"timed_out"`
	Execution   string     `json:"execution,omitempty"`
	Analysis    string     `json:"analysis,omitempty"`
	// Promoted is the allow-list revision post-processing left in force.
	Promoted  string   `json:"promoted,omitempty"`
	Capture   string   `json:"capture,omitempty"`
	Artifacts []string `json:"artifacts,omitempty"`
	// Timings are the durations of each step ("lease", "ready", "clock",
	// "push", "verify", "run", "rotate", "parse", "promote", …).
	Timings map[string]Duration `json:"timings,omitempty"`
	// GuestClock is the guest's clock against the host's when the cycle
	// prepared it, before the sample ran.
	GuestClock *GuestClock `json:"guest_clock,omitempty"`
	// Seq counts transitions; the event of transition n carries Seq n.
	Seq int `json:"seq"`
	// Replaces is the cycle of a host that died which this one does again
	// on a fresh lease; ReplacedBy, on that cycle, names this one.
	Replaces   string `json:"replaces,omitempty"`
	ReplacedBy string `json:"replaced_by,omitempty"`
	// PinnedTo is the fleet host (a worker's --host) that alone may take
	// the cycle (tb-run submit --host): no other host's worker leases for
	// it, and a replacement made when that host died keeps the pin and
	// waits for the host to come back.
	PinnedTo string `json:"pinned_to,omitempty"`
	Host     string `json:"host,omitempty"`
	PID      int    `json:"pid,omitempty"` // the tb-run process driving it
	Error    string `json:"error,omitempty"`
}

// ExecutionSnapshot is what one run of the sample did in a cycle.
type ExecutionSnapshot struct {
	Meta
	Cycle    string   `json:"cycle"`
	Lease    string   `json:"lease"`
	Sample   string   `json:"sample"`
	Argv     []string `json:"argv"`
	GuestPID int      `json:"guest_pid,omitempty"`
	// Detached: the sample was left running (Running: it still was at the
	// end of the window).
	Detached  bool       `json:"detached"`
	Running   bool       `json:"running"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	Duration  Duration   `json:"duration"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	TimedOut  bool       `json:"timed_out"`
	Killed    bool       `json:"killed"`
	// Stdout and Stderr are the artifact IDs of this cycle's output, with
	// their sizes and last lines.
	Stdout      string `json:"stdout,omitempty"`
	Stderr      string `json:"stderr,omitempty"`
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
	StdoutTail  string `json:"stdout_tail,omitempty"`
	StderrTail  string `json:"stderr_tail,omitempty"`
	// NotStored are the outputs (artifact types) the blob store refused
	// for low space: their sizes and tails above are all that is kept.
	NotStored []string `json:"not_stored,omitempty"`
}

// RunAnalysis is what a cycle's post-processing concluded.
type RunAnalysis struct {
	Meta
	Cycle    string `json:"cycle"`
	Lease    string `json:"lease"`
	Sample   string `json:"sample"`
	Plan     string `json:"plan"`
	Previous string `json:"previous,omitempty"`
	// Observables counts this cycle's observables by type; Domains and
	// Destinations list the names and endpoints seen.
	Observables  map[string]int `json:"observables"`
	Domains      []string       `json:"domains,omitempty"`
	Destinations []string       `json:"destinations,omitempty"`
	// Connections are the connections of the cycle's flow logs, FlowLogs
	// those artifacts.
	Connections int64    `json:"connections"`
	FlowLogs    []string `json:"flow_logs,omitempty"`
	// Revision is the allow-list revision post-processing wrote (if any),
	// Promoted what it added and Refused what it would not allow.
	Revision string    `json:"revision,omitempty"`
	Promoted []string  `json:"promoted,omitempty"`
	Refused  []Refusal `json:"refused,omitempty"`
	// Behaviour sums up the cycle's behaviour trace, when it had one.
	Behaviour *BehaviourSummary `json:"behaviour,omitempty"`
	// Yara are the YARA rules that matched what the cycle left ("RULE in
	// TARGET", target dropped or memory).
	Yara []string `json:"yara,omitempty"`
	// Techniques are the MITRE ATT&CK technique IDs the cycle's
	// observables show (internal/mitre's table).
	Techniques []string `json:"techniques,omitempty"`
	// Attacks are the cycle's floods (attack observables) and where each
	// went under the allow lists in force when the cycle started.
	Attacks []AttackOutcome `json:"attacks,omitempty"`
	// Classification sums the run up (beaconing, scanning, silent,
	// crashed, wrong-architecture, persistence, evasion, dropper, …).
	Classification []string `json:"classification"`
	Recommendation string   `json:"recommendation"`
	Reasons        []string `json:"reasons"`
}

// AttackOutcome is one flood of a cycle and where the lab sent it.
type AttackOutcome struct {
	Attack  string `json:"attack"` // the attack observable
	Value   string `json:"value"`
	Packets int64  `json:"packets"`
	Order   string `json:"order,omitempty"` // the order it carried out (tb-parse's attribution)
	// Contained is what the rules in force did with its packets:
	// sinkholed (no entry let it out), dropped, reflected, rate-limited,
	// forwarded, or partly let out (some of its ports or reflectors let
	// out, or ports beyond those tb-parse listed).
	Contained string `json:"contained"`
}

// Event is one transition of a cycle (or another notable step), in the
// order the journal committed it.
type Event struct {
	Meta
	Type    string    `json:"type"` // cycle.state, cycle.note
	Subject string    `json:"subject"`
	Cycle   string    `json:"cycle"`
	Seq     int       `json:"seq"`
	From    string    `json:"from,omitempty"`
	To      string    `json:"to,omitempty"`
	Detail  string    `json:"detail,omitempty"`
	At      time.Time `json:"at"`
}

// GuestClock is a guest's wall clock against the host's at the start of a
// cycle, guest minus host: Found, before tb-run set the guest's clock to the
// host's (a revert's restored clock, drift under TCG, or what a sample set
// it to); Left, what the sample starts with (Found when that was within
// ClockTolerance and left alone, or when setting the clock failed).
type GuestClock struct {
	Found Duration `json:"found"`
	Left  Duration `json:"left"`
	// Error is why the clock could not be set, when Left is not within
	// ClockTolerance.
	Error string `json:"error,omitempty"`
}

// ClockTolerance is the difference between a guest's clock and the host's
// that tb-run leaves alone: below what an agent's round trip under TCG
// lets it measure.
const ClockTolerance = time.Second
