// Package reporttest fills a state directory with the records of a lease's
// cycles, for the report's tests and benchmark. The records are made the
// way tb-run's post-processing makes them: a capture per cycle (a pcap
// written by pcapgen, stored as a blob with its artifact record) and the
// sample's system-call trace (an strace log, stored as tb-run stores it),
// tb-parse's parse with --merge (observables and the flow log), tb-allow's
// classifier and promote, an operator's approve and the expiry of entries,
// and tb-run's own analysis (cycle.Analyse). The cycle and execution records
// tb-run writes are written here with the fields the report reads.
package reporttest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/gopacket/layers"
	"github.com/klauspost/compress/zstd"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/cycle"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/parsejob"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/sample"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Clock is the state's clock: records carry the times of the lease's story,
// not of the test run.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Open opens (or creates) a state directory whose clock is the returned
// Clock, syncing only on Flush.
func Open(ctx context.Context, dir string) (*state.Store, *Clock, error) {
	clk := &Clock{t: time.Date(2026, 11, 20, 8, 0, 0, 0, time.UTC)}
	st, err := state.Open(ctx, dir, state.WithClock(clk.Now), state.WithDurability(state.SyncOnFlush))
	return st, clk, err
}

// The lab of the story: the guest, the lab's resolver, the C2s and the
// scanned networks, all on documentation addresses.
var (
	Guest    = netip.MustParseAddr("10.13.37.10")
	Resolver = netip.AddrPortFrom(netip.MustParseAddr("10.13.37.1"), 53)
	LabNet   = netip.MustParsePrefix("10.13.37.0/24")
)

// Beacon is a periodic check-in: HTTP, or a TLS handshake when TLS is set.
type Beacon struct {
	// Name is resolved before each check-in ("" for a bare address).
	Name   string
	Addr   netip.AddrPort
	TLS    bool
	Period time.Duration
	// Jitter is the relative spread of the period (0.1: ±10 %).
	Jitter float64
	// From and To are the first and last cycle (1-based) it runs in; 0:
	// from the first, to the last.
	From, To int
}

// Scan is a SYN scan of one port, Rate probes a second for Duration,
// starting Offset into each cycle from From on. Each probe goes to an
// address of the documentation networks (the story's C2s aside) that the
// cycle has not probed yet (there are 759: a cycle probes at most those).
type Scan struct {
	Port     uint16
	Rate     float64
	Offset   time.Duration
	Duration time.Duration
	From     int
}

// Lookup is a name resolved once, Offset into cycle Cycle.
type Lookup struct {
	Name   string
	Cycle  int
	Offset time.Duration
}

// Spec is a lease's story.
type Spec struct {
	Start time.Time
	// Cycles run back to back: each observes the (detached) sample for
	// Window, then post-processing and a Gap follow.
	Cycles      int
	Window, Gap time.Duration
	Beacons     []Beacon
	Scans       []Scan
	Lookups     []Lookup
	// Args are the sample's arguments (sample-controlled text in the
	// report).
	Args []string
	// TTL is the allow-list policy's entry lifetime.
	TTL time.Duration
	// ApproveAfter is the cycle after which the operator approves the
	// pending entries, with Note; 0: never.
	ApproveAfter int
	Note         string
	// ExpireAfter runs tb-allow expire this long after the last cycle
	// (0: never).
	ExpireAfter time.Duration
	// Failed are the cycles that fail while preparing, TimedOut those the
	// runner kills at their timeout, Crashed those whose sample dies of a
	// segmentation fault at the end of the window.
	Failed   map[int]bool
	TimedOut map[int]bool
	Crashed  map[int]bool
	// Trace is the system-call trace of each cycle from BehaviourFrom on
	// (nil: none), from which tb-parse makes the behaviour observables
	// and the analysis its behaviour summary.
	Trace         []Call
	BehaviourFrom int
	// Seed makes the jitter and the scanned addresses repeatable.
	Seed uint64
}

// Call is one line of an strace log (strace -f -ttt -T): what process PID
// did At into the sample's run.
type Call struct {
	PID  int
	At   time.Duration
	Line string
}

// C2 is the main C2 of the stories, and Hostile a DNS name made to break
// an HTML page that does not escape it.
const (
	C2Name   = "c2.example"
	DropName = "drop.pastebin.com"
	Hostile  = "<script>alert(1)</script>"
)

// C2 and the others are the story's endpoints.
var (
	C2       = netip.MustParseAddrPort("198.51.100.18:80")
	Fallback = netip.MustParseAddrPort("198.51.100.77:8080")
	Drop     = netip.MustParseAddrPort("203.0.113.50:443")
)

// TwoCycles is the demo's lease as an analyst sees it on a long-lived
// bot: two 80-minute windows of a detached sample. In the first,
// everything is sinkholed: the bot checks in with its C2 every minute,
// falls back to a second C2 by address every two minutes, fetches from a
// paste site every five, scans telnet and resolves a name that is HTML. The
// promote after it puts both C2s on probation, leaves the paste site
// pending approval and refuses the scan and DNS; the operator approves the
// paste site; the second cycle reaches the C2 (the fallback and the paste
// site are not used anymore), scans tcp/23 and tcp/2323; the promote after
// it makes the C2 active (while let through, it answered and the bot
// reported back) and revokes the fallback (it was not heard from); then the paste site's entry expires.
func TwoCycles() Spec {
	return Spec{
		Start:  time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC),
		Cycles: 2, Window: 80 * time.Minute, Gap: 15 * time.Minute,
		Beacons: []Beacon{
			{Name: C2Name, Addr: C2, Period: time.Minute, Jitter: 0.1},
			{Addr: Fallback, Period: 2 * time.Minute, Jitter: 0.05, From: 1, To: 1},
			{Name: DropName, Addr: Drop, TLS: true, Period: 5 * time.Minute, Jitter: 0.2, From: 1, To: 1},
		},
		Scans: []Scan{
			{Port: 23, Rate: 1, Offset: 20 * time.Minute, Duration: 8 * time.Minute},
			{Port: 2323, Rate: 0.5, Offset: 35 * time.Minute, Duration: 6 * time.Minute, From: 2},
		},
		Lookups:      []Lookup{{Name: "update.example.net", Cycle: 1, Offset: 3 * time.Minute}, {Name: Hostile, Cycle: 2, Offset: 50 * time.Minute}},
		Args:         []string{"-c2", C2Name, "-interval", "60s", `--tag=<img src=x onerror=alert(2)>`},
		TTL:          2 * time.Hour,
		ApproveAfter: 1, Note: `ticket 4711: the paste is the bot's "config" <b>drop</b>`,
		ExpireAfter:   40 * time.Minute,
		Trace:         botTrace,
		BehaviourFrom: 2,
		Seed:          17,
	}
}

// botTrace is the bot's run as strace logs it: it renames itself, runs a
// shell line that writes a script, drops and starts a second binary that
// listens on tcp/2323 until the bot kills it, appends to the crontab,
// connects to its C2 and deletes itself. The command line and the dropped
// path are markup.
var botTrace = []Call{
	{412, 0, `execve("/tmp/talkbox/beacon", ["/tmp/talkbox/beacon", "-c2", "` + C2Name + `"], 0x7ffd4e0c7f30 /* 10 vars */) = 0 <0.000200>`},
	{412, 100 * time.Microsecond, `prctl(PR_SET_NAME, "[kworker/0:2]") = 0 <0.000020>`},
	{412, 200 * time.Microsecond, `clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f0000000a10) = 418 <0.000100>`},
	{418, 300 * time.Microsecond, `execve("/bin/busybox", ["sh", "-c", "echo '<svg onload=alert(3)>' > /tmp/.x/run"], 0x7ffd4e0c7f30 /* 10 vars */) = 0 <0.000200>`},
	{418, 400 * time.Microsecond, `openat(AT_FDCWD, "/tmp/.x/run", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3 <0.000020>`},
	{418, 500 * time.Microsecond, `exit_group(0)     = ?`},
	{418, 600 * time.Microsecond, `+++ exited with 0 +++`},
	{412, 700 * time.Microsecond, `openat(AT_FDCWD, "/tmp/.x/<b>bot</b>", O_WRONLY|O_CREAT|O_TRUNC, 0755) = 3 <0.000020>`},
	{412, 800 * time.Microsecond, `clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f0000000a10) = 420 <0.000100>`},
	{420, 900 * time.Microsecond, `execve("/tmp/.x/<b>bot</b>", ["/tmp/.x/<b>bot</b>"], 0x7ffd4e0c7f30 /* 10 vars */) = 0 <0.000200>`},
	{420, time.Millisecond, `socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 3 <0.000021>`},
	{420, 1100 * time.Microsecond, `bind(3, {sa_family=AF_INET, sin_port=htons(2323), sin_addr=inet_addr("0.0.0.0")}, 16) = 0 <0.000018>`},
	{420, 1200 * time.Microsecond, `listen(3, 16)    = 0 <0.000014>`},
	{412, 1300 * time.Microsecond, `openat(AT_FDCWD, "/etc/crontab", O_WRONLY|O_APPEND) = 4 <0.000020>`},
	{412, 1400 * time.Microsecond, `socket(AF_INET, SOCK_STREAM, IPPROTO_IP) = 5 <0.000021>`},
	{412, 1500 * time.Microsecond, `connect(5, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("198.51.100.18")}, 16) = -1 EINPROGRESS (Operation now in progress) <0.000075>`},
	{412, 1600 * time.Microsecond, `unlink("/tmp/talkbox/beacon") = 0 <0.000020>`},
	{412, 1700 * time.Microsecond, `kill(420, SIGKILL) = 0 <0.000020>`},
	{420, 1800 * time.Microsecond, `+++ killed by SIGKILL +++`},
}

// Hourly is a week-and-more lease: n cycles, one an hour (50-minute
// windows), the C2 checking in every minute, the paste site every five, a
// telnet scan of scanRate probes a second for five minutes of each, every
// 97th cycle failing and every 89th timing out; the operator approves
// after the first.
func Hourly(n int, scanRate float64) Spec {
	s := TwoCycles()
	s.Cycles, s.Window, s.Gap = n, 50*time.Minute, 10*time.Minute
	s.Beacons = []Beacon{
		{Name: C2Name, Addr: C2, Period: time.Minute, Jitter: 0.1},
		{Addr: Fallback, Period: 2 * time.Minute, Jitter: 0.05, From: 1, To: 1},
		{Name: DropName, Addr: Drop, TLS: true, Period: 5 * time.Minute, Jitter: 0.2},
	}
	s.Scans = []Scan{{Port: 23, Rate: scanRate, Offset: 10 * time.Minute, Duration: 5 * time.Minute}}
	s.Lookups = []Lookup{{Name: "update.example.net", Cycle: 1, Offset: 3 * time.Minute}, {Name: Hostile, Cycle: 2, Offset: 20 * time.Minute}}
	s.TTL = 24 * time.Hour
	s.ExpireAfter = 0
	s.Failed, s.TimedOut = map[int]bool{}, map[int]bool{}
	for i := 97; i <= n; i += 97 {
		s.Failed[i] = true
	}
	for i := 89; i <= n; i += 89 {
		s.TimedOut[i] = true
	}
	return s
}

// Built names what Build made.
type Built struct {
	Sample, SampleSHA256, Plan, Lease, Capture string
	Cycles                                     []string
	Revisions                                  []string
}

// Build writes the story's records into st, moving clk along.
func Build(ctx context.Context, st *state.Store, clk *Clock, s Spec) (*Built, error) {
	b := &builder{ctx: ctx, st: st, clk: clk, s: s, book: &allowlist.Book{St: st}, rng: rand.New(rand.NewPCG(s.Seed, s.Seed+1)),
		sport: 32768, out: &Built{}}
	pol, err := allowlist.LoadPolicy("")
	if err != nil {
		return nil, err
	}
	pol.Documentation, pol.TTL = true, records.Duration(s.TTL)
	b.pol = pol
	b.validator = firewall.Policy{Documentation: true, SMTPPorts: pol.SMTPPorts, Lab: []netip.Prefix{LabNet}}
	if err := b.subjects(); err != nil {
		return nil, err
	}
	b.chain = allowlist.Chain{Scope: records.ScopeLease, Lease: b.out.Lease}
	prev := ""
	for i := 1; i <= s.Cycles; i++ {
		id, err := b.cycle(i, prev)
		if err != nil {
			return nil, fmt.Errorf("cycle %d: %w", i, err)
		}
		b.out.Cycles = append(b.out.Cycles, id)
		prev = id
		if i == s.ApproveAfter {
			if err := b.approve(b.cycleEnd(i).Add(9 * time.Minute)); err != nil {
				return nil, err
			}
		}
	}
	if s.ExpireAfter > 0 {
		clk.Set(b.cycleEnd(s.Cycles).Add(s.ExpireAfter))
		rev, created, err := b.book.Change(ctx, b.chain, "expire", allowlist.Expired(clk.Now()))
		if err != nil {
			return nil, err
		}
		if created {
			b.out.Revisions = append(b.out.Revisions, rev.ID)
		}
	}
	if err := b.leaseDone(); err != nil {
		return nil, err
	}
	return b.out, st.Flush()
}

type builder struct {
	ctx       context.Context
	st        *state.Store
	clk       *Clock
	s         Spec
	book      *allowlist.Book
	pol       allowlist.Policy
	validator firewall.Policy
	chain     allowlist.Chain
	rng       *rand.Rand
	sport     uint16
	out       *Built
}

func (b *builder) cycleStart(i int) time.Time {
	return b.s.Start.Add(time.Duration(i-1) * (b.s.Window + b.s.Gap))
}

func (b *builder) cycleEnd(i int) time.Time { return b.cycleStart(i).Add(b.s.Window + 30*time.Second) }

// subjects writes the sample, its plan, the lease and its capture.
func (b *builder) subjects() error {
	b.clk.Set(b.s.Start.Add(-10 * time.Minute))
	content := []byte(fmt.Sprintf("\x7fELF talkbox report fixture %d", b.s.Seed))
	blob, err := b.st.PutBlob(b.ctx, bytes.NewReader(content))
	if err != nil {
		return err
	}
	sum := sha256.Sum256(content)
	sha := hex.EncodeToString(sum[:])
	smp := &records.Sample{SHA256: sha, Size: int64(len(content)), Blob: blob.URI(), Names: []string{"beacon"}, Source: "beacon",
		SubmittedAt: b.clk.Now(), Triage: records.Triage{Format: "elf", Arch: "x86_64", Bits: 64, OS: "linux", Type: "exec"}}
	records.Init(smp, records.KindSample, b.clk.Now())
	if err := b.st.Create(b.ctx, smp); err != nil {
		return err
	}
	if err := b.st.SetIndex(sample.IndexSHA256, sha, smp.ID); err != nil {
		return err
	}
	pl := &records.Plan{Sample: smp.ID, SampleSHA256: sha, Runnable: true, Instrument: "pcap"}
	pl.Network.Mode = "allowlist"
	records.Init(pl, records.KindPlan, b.clk.Now())
	if err := b.st.Create(b.ctx, pl); err != nil {
		return err
	}
	b.clk.Set(b.s.Start.Add(-3 * time.Minute))
	now := b.clk.Now()
	l := &records.SandboxLease{State: records.LeaseBusy, Health: records.HealthHealthy, Plan: pl.ID, Pool: "default", Host: "local",
		ConnectURI: "qemu:///system", ImageSpec: "debian-bookworm-amd64", ImageVersion: "1.0.0+build.3", Platform: "amd64", Accel: "kvm",
		Bridge: "tbr0", Tap: "tbtap0", IP: Guest.String(), Prefix: 24, Gateway: Resolver.Addr().String(),
		Limits: records.Limits{VCPUs: 1, MemoryMiB: 512, DiskGiB: 4}, TTL: records.Duration(30 * 24 * time.Hour),
		AcquiredAt: &now, StartedAt: &now, BootToAgent: records.Duration(12 * time.Second), Acquisitions: 1}
	records.Init(l, records.KindLease, now)
	l.VMName = "tb-" + strings.ToLower(strings.TrimPrefix(l.ID, "lease_"))
	if err := b.st.Create(b.ctx, l); err != nil {
		return err
	}
	c := &records.Capture{Lease: l.ID, Plan: pl.ID, Lab: "default", Iface: l.Tap, IP: l.IP, Snaplen: 262144, State: "running",
		Clock: records.ClockMarker{Wall: now}}
	records.Init(c, records.KindCapture, now)
	if err := b.st.Create(b.ctx, c); err != nil {
		return err
	}
	b.out.Sample, b.out.SampleSHA256, b.out.Plan, b.out.Lease, b.out.Capture = smp.ID, sha, pl.ID, l.ID, c.ID
	return nil
}

// leaseDone leaves the lease idle, as tb-run does between cycles.
func (b *builder) leaseDone() error {
	var l records.SandboxLease
	return b.st.Update(b.ctx, b.out.Lease, &l, func(bool) error {
		l.State = records.LeaseIdle
		return nil
	})
}

// cycle runs cycle i of the story.
func (b *builder) cycle(i int, prev string) (string, error) {
	start, end := b.cycleStart(i), b.cycleEnd(i)
	b.clk.Set(start)
	head, _, err := b.book.Head(b.ctx, b.chain)
	if err != nil {
		return "", err
	}
	c := &records.Cycle{State: records.CyclePending, Plan: b.out.Plan, Sample: b.out.SampleSHA256, Lease: b.out.Lease, Previous: prev,
		Args: b.s.Args, Timeout: records.Duration(b.s.Window + 10*time.Minute), Detach: true, Window: records.Duration(b.s.Window),
		Post: []string{"rotate", "parse", "promote"}, RequestedAt: start, Host: "local"}
	records.Init(c, records.KindCycle, start)
	if head != nil {
		c.Revision, c.Allowed = head.ID, head.Active
	}
	started := start.Add(2 * time.Second)
	c.StartedAt = &started
	if b.s.Failed[i] {
		b.clk.Set(start.Add(2 * time.Minute))
		done := b.clk.Now()
		c.State, c.CompletedAt, c.Error = records.CycleFailed, &done, "preparing: the guest agent did not answer within 2m0s"
		return c.ID, b.st.Create(b.ctx, c)
	}
	launched := start.Add(20 * time.Second)
	c.Launch, c.LaunchedAt, c.GuestPID = true, &launched, 400+i
	pcapID, err := b.capture(i, c.ID, launched, start.Add(b.s.Window))
	if err != nil {
		return "", err
	}
	inputs := []string{pcapID}
	if b.s.Trace != nil && i >= b.s.BehaviourFrom {
		traceID, err := b.trace(c.ID, launched, start.Add(b.s.Window))
		if err != nil {
			return "", err
		}
		inputs = append(inputs, traceID)
	}
	b.clk.Set(end)
	if err := b.parse(inputs); err != nil {
		return "", err
	}
	obs, err := state.FindBy[records.Observable](b.st, records.KindObservable, records.KeyCycle, c.ID, nil)
	if err != nil {
		return "", err
	}
	b.clk.Set(end.Add(20 * time.Second))
	// The cycle's record is stored below, after the promote; what tb-run
	// would have recorded as in force while it ran is the head it began
	// under, which is what lets a C2 on probation be confirmed.
	inForce := map[string]map[string]bool{c.ID: nil}
	if head != nil {
		_, es, err := b.book.Revision(b.ctx, head.ID)
		if err != nil {
			return "", err
		}
		keys := map[string]bool{}
		for _, e := range es {
			if allowlist.Enforced(e, start) {
				keys[allowlist.EntryKey(e)] = true
			}
		}
		inForce[c.ID] = keys
	}
	rev, created, err := b.book.Promote(b.ctx, allowlist.Promotion{Chain: b.chain, Cycle: c.ID, Dests: allowlist.Classify(obs, &b.pol),
		Policy: &b.pol, Validator: b.validator, InForce: inForce, Now: b.clk.Now()})
	if err != nil {
		return "", err
	}
	if created {
		b.out.Revisions = append(b.out.Revisions, rev.ID)
	}
	c.Promoted = rev.ID
	b.clk.Set(end.Add(25 * time.Second))
	arts, err := state.FindBy[records.Artifact](b.st, records.KindArtifact, records.KeyCycle, c.ID, nil)
	if err != nil {
		return "", err
	}
	for _, a := range arts {
		c.Artifacts = append(c.Artifacts, a.ID)
	}
	c.Capture = b.out.Capture
	ex, err := b.execution(c, launched, start.Add(b.s.Window), b.s.TimedOut[i], b.s.Crashed[i])
	if err != nil {
		return "", err
	}
	c.Execution, c.ExitCode, c.TimedOut = ex.ID, ex.ExitCode, ex.TimedOut
	a, err := cycle.Analyse(b.ctx, b.st, c)
	if err != nil {
		return "", err
	}
	records.Init(a, records.KindAnalysis, b.clk.Now())
	if err := b.st.Create(b.ctx, a); err != nil {
		return "", err
	}
	c.Analysis = a.ID
	done := b.clk.Now()
	c.CompletedAt = &done
	c.State = records.CycleCompleted
	if c.TimedOut {
		c.State = records.CycleTimedOut
	}
	c.Timings = map[string]records.Duration{"ready": records.Duration(2 * time.Second), "push": records.Duration(3 * time.Second),
		"run": records.Duration(b.s.Window), "rotate": records.Duration(40 * time.Millisecond), "parse": records.Duration(300 * time.Millisecond),
		"promote": records.Duration(60 * time.Millisecond)}
	return c.ID, b.st.Create(b.ctx, c)
}

// event is one piece of the cycle's traffic, written at t.
type event struct {
	t     time.Time
	write func(g *pcapgen.Gen)
}

// capture writes the cycle's pcap into the blob store and registers it.
func (b *builder) capture(i int, cycle string, from, to time.Time) (string, error) {
	var evs []event
	for _, bc := range b.s.Beacons {
		if bc.From > 0 && i < bc.From || bc.To > 0 && i > bc.To {
			continue
		}
		for t := from.Add(b.jitter(bc.Period, bc.Jitter) / 2); t.Before(to); t = t.Add(b.jitter(bc.Period, bc.Jitter)) {
			evs = append(evs, event{t, b.checkIn(bc)})
		}
	}
	targets := scanTargets(b.rng)
	for _, sc := range b.s.Scans {
		if sc.From > 0 && i < sc.From || sc.Rate <= 0 {
			continue
		}
		step := time.Duration(float64(time.Second) / sc.Rate)
		for t := from.Add(sc.Offset); t.Before(from.Add(sc.Offset + sc.Duration)); t = t.Add(step) {
			if len(targets) == 0 {
				break
			}
			evs = append(evs, event{t, b.probe(netip.AddrPortFrom(targets[0], sc.Port))})
			targets = targets[1:]
		}
	}
	for _, l := range b.s.Lookups {
		if l.Cycle == i {
			evs = append(evs, event{from.Add(l.Offset), b.lookup(l.Name, layers.DNSResponseCodeNXDomain)})
		}
	}
	sort.SliceStable(evs, func(x, y int) bool { return evs[x].t.Before(evs[y].t) })
	var buf bytes.Buffer
	g, err := pcapgen.New(&buf, pcapgen.Options{})
	if err != nil {
		return "", err
	}
	g.T = from
	for _, e := range evs {
		if e.t.After(g.T) {
			g.T = e.t
		}
		e.write(g)
	}
	if err := errors.Join(g.Flush(), g.Err()); err != nil {
		return "", err
	}
	last := g.T
	blob, err := b.st.PutBlob(b.ctx, bytes.NewReader(buf.Bytes()))
	if err != nil {
		return "", err
	}
	a := &records.Artifact{Cycle: cycle, Lease: b.out.Lease, Capture: b.out.Capture, Type: "pcap", URI: blob.URI(), SHA256: blob.SHA256,
		Size: int64(buf.Len()), ContentType: "application/vnd.tcpdump.pcap", ParserStatus: "pending", Packets: uint64(g.N),
		FirstTS: &from, LastTS: &last, Iface: "tbtap0", Snaplen: 262144, Reason: "rotate"}
	records.Init(a, records.KindArtifact, to)
	return a.ID, b.st.Create(b.ctx, a)
}

func (b *builder) jitter(d time.Duration, j float64) time.Duration {
	return time.Duration(float64(d) * (1 + j*(2*b.rng.Float64()-1)))
}

func (b *builder) next() netip.AddrPort {
	if b.sport++; b.sport < 32768 {
		b.sport = 32768
	}
	return netip.AddrPortFrom(Guest, b.sport)
}

func (b *builder) lookup(name string, rcode layers.DNSResponseCode, answers ...netip.Addr) func(g *pcapgen.Gen) {
	id := uint16(b.rng.Uint32())
	src := b.next()
	return func(g *pcapgen.Gen) {
		var ans []layers.DNSResourceRecord
		for _, a := range answers {
			ans = append(ans, pcapgen.A(name, a, 60))
		}
		g.DNSOverUDP(src, Resolver, pcapgen.DNSQuery(id, name, layers.DNSTypeA), pcapgen.DNSResponse(id, name, layers.DNSTypeA, rcode, ans))
	}
}

func (b *builder) checkIn(bc Beacon) func(g *pcapgen.Gen) {
	var resolve func(g *pcapgen.Gen)
	if bc.Name != "" {
		resolve = b.lookup(bc.Name, layers.DNSResponseCodeNoErr, bc.Addr.Addr())
	}
	src, isn := b.next(), b.rng.Uint32()
	return func(g *pcapgen.Gen) {
		if resolve != nil {
			resolve(g)
		}
		c := g.Dial(src, bc.Addr, isn, isn^0x5a5a5a5a)
		if bc.TLS {
			c.Send(pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x1301, 0xc02f}, Order: []uint16{0, 10, 43},
				SNI: bc.Name, Groups: []uint16{29}, SupportedVersions: []uint16{0x0304}}))
			c.Reply(pcapgen.ServerHelloRecord(0x0304, 0x1301))
		} else {
			// The C2's task, and the bot's report of it on the same
			// connection: a conversation, which is what confirms a C2 on
			// probation.
			host := cmpStr(bc.Name, bc.Addr.Addr().String())
			c.Send(pcapgen.HTTPGet(host, "/gate.php?id=7f3a", "Mozilla/4.0 (compatible)"))
			c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("sleep 60")))
			c.Send(pcapgen.HTTPGet(host, "/gate.php?id=7f3a&done=sleep", "Mozilla/4.0 (compatible)"))
			c.Reply(pcapgen.HTTPResponse(200, "OK", nil))
		}
		c.Close()
	}
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// scanTargets are the documentation networks' addresses but the C2s', in
// random order.
func scanTargets(rng *rand.Rand) []netip.Addr {
	var out []netip.Addr
	for _, n := range []string{"192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"} {
		for a := netip.MustParsePrefix(n).Addr().Next(); netip.MustParsePrefix(n).Contains(a.Next()); a = a.Next() {
			if a != C2.Addr() && a != Fallback.Addr() && a != Drop.Addr() {
				out = append(out, a)
			}
		}
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func (b *builder) probe(dst netip.AddrPort) func(g *pcapgen.Gen) {
	src, isn, refused := b.next(), b.rng.Uint32(), b.rng.IntN(10) == 0
	return func(g *pcapgen.Gen) {
		if refused {
			g.Refused(src, dst, isn)
			return
		}
		g.Unanswered(src, dst, isn, 2)
	}
}

// trace stores the story's trace as the cycle's behaviour-trace artifact,
// the sample's run starting at from, as tb-run stores what it copied out
// of the guest (zstd-compressed).
func (b *builder) trace(cycleID string, from, to time.Time) (string, error) {
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf)
	if err != nil {
		return "", err
	}
	for _, l := range b.s.Trace {
		t := from.Add(l.At)
		fmt.Fprintf(enc, "%d %d.%06d %s\n", l.PID, t.Unix(), t.Nanosecond()/1000, l.Line)
	}
	if err := enc.Close(); err != nil {
		return "", err
	}
	blob, err := b.st.PutBlob(b.ctx, bytes.NewReader(buf.Bytes()))
	if err != nil {
		return "", err
	}
	a := &records.Artifact{Cycle: cycleID, Lease: b.out.Lease, Type: cycle.ArtifactTrace, URI: blob.URI(), SHA256: blob.SHA256,
		Size: blob.Size, ContentType: "text/plain+zstd", ParserStatus: "pending", Metadata: map[string]any{"offset": 0}}
	records.Init(a, records.KindArtifact, to)
	return a.ID, b.st.Create(b.ctx, a)
}

// parse runs tb-parse --merge on the cycle's artifacts, as the
// post-processing step does.
func (b *builder) parse(artifacts []string) error {
	var in bytes.Buffer
	for _, id := range artifacts {
		raw, err := b.st.ReadRaw(id)
		if err != nil {
			return err
		}
		in.Write(bytes.TrimSpace(raw))
		in.WriteByte('\n')
	}
	var warns []string
	job, err := parsejob.Prepare(parsejob.Request{FromStdin: true, Merge: true}, &in, func(f string, a ...any) {
		warns = append(warns, fmt.Sprintf(f, a...))
	})
	if err != nil {
		return err
	}
	if err := job.Run(b.ctx, b.st, cmdout.New("tb-parse", io.Discard, io.Discard, nil)); err != nil {
		return err
	}
	if len(warns) > 0 {
		return errors.New(strings.Join(warns, "; "))
	}
	return nil
}

// approve is the operator approving every pending entry of the lease.
func (b *builder) approve(at time.Time) error {
	b.clk.Set(at)
	_, cur, err := b.book.Head(b.ctx, b.chain)
	if err != nil {
		return err
	}
	var targets []string
	for _, e := range cur {
		if e.Status == records.StatusPending {
			targets = append(targets, e.ID)
		}
	}
	if len(targets) == 0 {
		return nil
	}
	var out bytes.Buffer
	err = allowlist.ChangeEntries(b.ctx, b.book, "approve", allowlist.ChangeRequest{Targets: targets, Note: b.s.Note, Policy: b.pol, NoApply: true},
		cmdout.New("tb-allow", &out, io.Discard, nil))
	if err != nil {
		return err
	}
	head, _, err := b.book.Head(b.ctx, b.chain)
	if err != nil {
		return err
	}
	b.out.Revisions = append(b.out.Revisions, head.ID)
	return nil
}

// execution is the sample's run as tb-run records it: detached, still
// running at the end of the window, killed at its timeout, or dead of a
// segmentation fault (exit status 139, as the shell reports a signal).
func (b *builder) execution(c *records.Cycle, from, to time.Time, timedOut, crashed bool) (*records.ExecutionSnapshot, error) {
	ex := &records.ExecutionSnapshot{Cycle: c.ID, Lease: c.Lease, Sample: c.Sample, Argv: append([]string{"/var/tmp/talkbox/samples/" + c.Sample}, c.Args...),
		GuestPID: c.GuestPID, Detached: true, Running: !timedOut && !crashed, StartedAt: from, Duration: records.Duration(to.Sub(from)), TimedOut: timedOut,
		Killed: timedOut, StdoutBytes: 1700, StdoutTail: "checkin ok\nsleep 60\n"}
	switch {
	case timedOut:
		code := 137
		ex.ExitCode, ex.EndedAt = &code, &to
	case crashed:
		code := 139
		ex.ExitCode, ex.EndedAt, ex.StderrBytes, ex.StderrTail = &code, &to, 19, "Segmentation fault\n"
	}
	records.Init(ex, records.KindExecution, b.clk.Now())
	return ex, b.st.Create(b.ctx, ex)
}
