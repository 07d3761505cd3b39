package records

import "time"

// Kinds written by tb-allow.
const (
	KindAllow    = "allow"
	KindRevision = "revision"
)

// Allow-list entry types: an endpoint is one element of a lease's live
// allow set, a domain a name the DNS sinkhole forwards upstream.
const (
	AllowEndpoint = "endpoint" // "45.13.7.9:443/tcp"
	AllowDomain   = "domain"   // "c2.example.com"
)

// Allow-list scopes: the live set of a lease is the union of its own
// entries, those of its sample and the global ones.
const (
	ScopeLease  = "lease"
	ScopeSample = "sample"
	ScopeGlobal = "global"
)

// Allow-list entry statuses. Active entries and those on probation are
// enforced: an endpoint whose evidence is only what the sample sent (in a
// sinkholed cycle the sinkhole answers) is let through rate-limited for
// one cycle on probation, and becomes active only if its far side then
// answered as a C2 would (a conversation).
const (
	StatusCandidate = "candidate"
	StatusPending   = "pending-approval"
	StatusProbation = "probation"
	StatusActive    = "active"
	StatusRevoked   = "revoked"
	StatusRejected  = "rejected"
	StatusExpired   = "expired"
)

// AllowEntry (AllowListEntry) is one destination of an allow list, as of
// the revision that last changed it.
type AllowEntry struct {
	Meta
	Type  string `json:"type"`
	Value string `json:"value"`
	// Observable is the observable the entry was promoted from.
	Observable string `json:"observable,omitempty"`
	Scope      string `json:"scope"`
	Lease      string `json:"lease,omitempty"`
	Sample     string `json:"sample,omitempty"`
	Status     string `json:"status"`
	// Class is what the classifier made of the destination (c2, …);
	// Score its confidence (0–1) and Reason the evidence, in words.
	Class  string  `json:"class"`
	Score  float64 `json:"score"`
	Reason string  `json:"reason"`
	// Verdict is the firewall verdict of an active endpoint.
	Verdict string `json:"verdict,omitempty"`
	// Beacon is the estimated contact interval and its jitter (relative
	// median absolute deviation), when the contact was periodic.
	Beacon *Beacon `json:"beacon,omitempty"`
	// Names are the DNS names that resolved to an endpoint.
	Names []string `json:"names,omitempty"`
	// UIDs name the connections the evidence rests on (some of them), by
	// their uid in the lease's flow logs (tb-parse flows --uid).
	UIDs []string `json:"uids,omitempty"`
	// LastSeen is the latest sighting in the evidence.
	LastSeen  time.Time  `json:"last_seen"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Revision is the revision that last changed the entry, Cycle the
	// cycle whose observables it came from.
	Revision string `json:"revision"`
	Cycle    string `json:"cycle,omitempty"`
	// Note is the operator's comment on approve, reject or revoke.
	Note string `json:"note,omitempty"`
}

// Beacon is a periodic contact.
type Beacon struct {
	Interval Duration `json:"interval"`
	Jitter   float64  `json:"jitter"`
	Samples  int      `json:"samples"`
}

// AllowRevision (AllowListRevision) is one version of one allow list (a
// chain: a lease's, a sample's or the global one). Its content, every
// entry in key order, is a blob; its PrevHash is the sha256 of the
// previous revision's canonical encoding, so that editing any revision of
// the chain breaks the next one.
type AllowRevision struct {
	Meta
	Chain    string `json:"chain"` // "lease:<id>", "sample:<sha256>", "global"
	Scope    string `json:"scope"`
	Lease    string `json:"lease,omitempty"`
	Sample   string `json:"sample,omitempty"`
	Seq      int64  `json:"seq"`
	Previous string `json:"previous,omitempty"`
	PrevHash string `json:"prev_hash,omitempty"`
	Cycle    string `json:"cycle,omitempty"`
	// Cause is what made it: promote, approve, reject, revoke, expire,
	// rollback, revert (tb-lease gave the lease's guest to another sample).
	Cause string `json:"cause"`
	// RollbackOf is the revision whose content a rollback restored.
	RollbackOf string `json:"rollback_of,omitempty"`
	// Content is the blob URI of the entries, ContentSHA256 its digest.
	Content       string `json:"content"`
	ContentSHA256 string `json:"content_sha256"`
	// Enforce is the blob of the active entries in the compact form apply
	// reads ("endpoint 45.13.7.9:443/tcp rate-limit 1763856000" per line,
	// with the expiry in Unix seconds, 0 for none); EnforceSHA256 its digest.
	Enforce       string `json:"enforce"`
	EnforceSHA256 string `json:"enforce_sha256"`
	// EnforceDelta is the blob of the change from the previous revision's
	// enforced list to this one's: the lines that went, each prefixed
	// "-", and those that came, prefixed "+", in key order (a changed
	// line is both). The promote path sends it to the firewall without
	// reading either list. EnforceDeltaSHA256 is its digest; revisions
	// written before it existed have neither.
	EnforceDelta       string `json:"enforce_delta,omitempty"`
	EnforceDeltaSHA256 string `json:"enforce_delta_sha256,omitempty"`
	Entries            int    `json:"entries"`
	// Active counts the enforced entries: active and on probation.
	Active   int       `json:"active"`
	Changes  Changeset `json:"changeset"`
	Refusals []Refusal `json:"refusals,omitempty"`
	// Hash is the sha256 of this revision's own canonical encoding.
	Hash string `json:"hash"`
}

// Changeset is what a revision changed from its predecessor.
type Changeset struct {
	Added   []Change `json:"added,omitempty"`
	Removed []Change `json:"removed,omitempty"`
	Changed []Change `json:"changed,omitempty"`
}

// Change is one entry's change: its key ("endpoint 45.13.7.9:443/tcp"),
// entry ID and status before and after.
type Change struct {
	Key   string `json:"key"`
	Entry string `json:"entry"`
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
}

// Refusal is a destination the revision did not allow, and why: a class
// that is never promoted (scan, abuse, infrastructure), the safety
// validator, a never-allow list or a cap. Refusals of one group (a scanned
// port) are one refusal with a count and examples.
type Refusal struct {
	Target   string   `json:"target"`
	Class    string   `json:"class"`
	Reason   string   `json:"reason"`
	Count    int      `json:"count,omitempty"`
	Examples []string `json:"examples,omitempty"`
	// UIDs name connections of the refused destinations (some of them),
	// by their uid in the lease's flow logs.
	UIDs []string `json:"uids,omitempty"`
}
