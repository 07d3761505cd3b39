package cycle

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/behave"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

type env struct {
	st     *state.Store
	r      *Runner
	g      *fakeGuest
	post   *fakePost
	plan   string
	lease  string
	sample string
}

// instrument sets the plan's instrumentation.
func (e *env) instrument(t *testing.T, how string) {
	t.Helper()
	var p records.Plan
	if err := e.st.Update(context.Background(), e.plan, &p, func(bool) error { p.Instrument = how; return nil }); err != nil {
		t.Fatal(err)
	}
}

// appendTrace has strace write s to the fake guest's trace.
func (e *env) appendTrace(s string) {
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	for name := range e.g.files {
		if strings.HasSuffix(name, "/t") { // the trace (tracePath)
			e.g.files[name] = append(e.g.files[name], s...)
		}
	}
}

// trace is the trace cycle c stored.
func (e *env) trace(t *testing.T, c *records.Cycle) string {
	t.Helper()
	for _, id := range c.Artifacts {
		a := get(t, e.st, id, &records.Artifact{})
		if a.Type == ArtifactTrace {
			return zstdBlob(t, e.st, a.SHA256)
		}
	}
	t.Fatalf("cycle %s has no trace", c.ID)
	return ""
}

// setup stores a sample whose program is prog, a plan for it and a live
// lease, and a Runner over the fake guest.
func setup(t *testing.T, prog string) *env {
	t.Helper()
	ctx := context.Background()
	st, err := state.Open(ctx, t.TempDir(), state.WithDurability(state.SyncOnFlush))
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.PutBlob(ctx, strings.NewReader(prog))
	if err != nil {
		t.Fatal(err)
	}
	p := &records.Plan{SampleSHA256: b.SHA256, Runnable: true, Network: records.NetPolicy{Mode: "allowlist", Promote: true},
		Timeouts: records.Timeouts{Execution: records.Duration(time.Minute), Window: records.Duration(20 * time.Millisecond)}}
	records.Init(p, records.KindPlan, st.Now())
	p.Sample = "sample_01JD0000000000000000000000"
	l := &records.SandboxLease{State: records.LeaseBusy, Health: records.HealthHealthy, IP: "10.13.37.10", VMName: "tb-test"}
	records.Init(l, records.KindLease, st.Now())
	for _, rec := range []records.Record{p, l} {
		if err := st.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{st: st, g: newFakeGuest(), plan: p.ID, lease: l.ID, sample: b.SHA256}
	e.post = &fakePost{st: st}
	e.r = &Runner{St: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Post: e.post, Leaser: &fakeLeaser{st: st, lease: l.ID},
		Connect: func(ctx context.Context, l *records.SandboxLease) (Guest, error) { return e.g, nil },
		Poll:    time.Millisecond, Stream: time.Millisecond}
	return e
}

// observe stores obs as observables of cycle c, as tb-parse would.
func (e *env) observe(t *testing.T, c *records.Cycle, obs ...*records.Observable) {
	t.Helper()
	for _, o := range obs {
		o.Lease, o.Cycle, o.Count = c.Lease, c.ID, 1
		records.Init(o, records.KindObservable, e.st.Now())
		if err := e.st.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *env) run(t *testing.T, req Request) *records.Cycle {
	t.Helper()
	if req.Plan == "" {
		req.Plan = e.plan
	}
	if req.Lease == "" {
		req.Lease = e.lease
	}
	c, err := e.r.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	c, err = e.r.Drive(context.Background(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// events are a cycle's event records in journal order.
func events(t *testing.T, st *state.Store, cycle string) []records.Event {
	t.Helper()
	var buf bytes.Buffer
	if err := Watch(context.Background(), st, &buf, []string{cycle}, false); err != nil {
		t.Fatal(err)
	}
	var out []records.Event
	rd := records.NewReader(&buf, "watch")
	for {
		l, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		var ev records.Event
		if err := records.Unmarshal(l.Data, &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
}

func states(evs []records.Event) string {
	var s []string
	for _, e := range evs {
		s = append(s, e.To)
	}
	return strings.Join(s, " ")
}

func get[T records.Record](t testing.TB, st *state.Store, id string, r T) T {
	t.Helper()
	if err := st.Get(id, r); err != nil {
		t.Fatal(err)
	}
	return r
}

func blob(t *testing.T, st *state.Store, artifact string) string {
	t.Helper()
	a := get(t, st, artifact, &records.Artifact{})
	b, err := os.ReadFile(st.BlobPath(a.SHA256))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCycleRunsThroughEveryStateAndRecommendsARerun(t *testing.T) {
	e := setup(t, "out hello\nargs\nerr warn\nexit 0")
	c := e.run(t, Request{Args: []string{"-c2", "c2.example"}, Env: map[string]string{"A": "1"}})
	if c.State != records.CycleCompleted || c.Seq != 6 {
		t.Fatalf("cycle = %s (seq %d): %s", c.State, c.Seq, c.Error)
	}
	evs := events(t, e.st, c.ID)
	if got := states(evs); got != "pending leasing preparing executing post_processing completed" {
		t.Fatalf("events = %s", got)
	}
	for i, ev := range evs {
		if ev.Seq != i+1 || ev.Cycle != c.ID || ev.Type != "cycle.state" {
			t.Fatalf("event %d = %+v", i, ev)
		}
	}
	ex := get(t, e.st, c.Execution, &records.ExecutionSnapshot{})
	if ex.ExitCode == nil || *ex.ExitCode != 0 || ex.TimedOut || ex.Killed || ex.StdoutBytes != int64(len("hello\n-c2 c2.example\n")) {
		t.Fatalf("execution = %+v", ex)
	}
	if got := blob(t, e.st, ex.Stdout); got != "hello\n-c2 c2.example\n" {
		t.Fatalf("stdout artifact = %q", got)
	}
	if got := blob(t, e.st, ex.Stderr); got != "warn\n" {
		t.Fatalf("stderr artifact = %q", got)
	}
	// The sample was pushed where it ran, and verified there.
	if p := e.g.proc(ex.GuestPID); p.argv[0] != c.GuestPath || c.GuestPath != GuestRoot+"/samples/"+e.sample || c.GuestOut != GuestRoot+"/"+c.ID {
		t.Fatalf("ran %q, guest path %s", p.argv, c.GuestPath)
	}
	for _, step := range []string{"ready", "capture", "push", "verify", "run", "rotate", "parse", "promote"} {
		if _, ok := c.Timings[step]; !ok {
			t.Errorf("no timing for %s: %v", step, c.Timings)
		}
	}
	a := get(t, e.st, c.Analysis, &records.RunAnalysis{})
	if a.Recommendation != records.RecommendRerun || !slices.Equal(a.Promoted, []string{"endpoint 203.0.113.5:80/tcp"}) ||
		a.Observables["domain"] != 1 || !slices.Equal(a.Domains, []string{"c2.example"}) || len(a.Refused) != 1 ||
		!slices.Contains(a.Classification, "scanning") {
		t.Fatalf("analysis = %+v", a)
	}
	// The second cycle follows the first, under the revision it left; the
	// sample is already on the lease: it is staged and verified, not pushed.
	c2 := e.run(t, Request{})
	if _, pushed := c2.Timings["push"]; pushed || e.g.stages != 2 {
		t.Fatalf("second cycle pushed again (%v), %d stages", c2.Timings, e.g.stages)
	}
	if c2.Previous != c.ID || c2.Revision != c.Promoted || c2.Allowed != 1 || c2.State != records.CycleCompleted || c2.Promoted == c.Promoted {
		t.Fatalf("second cycle = %+v", c2)
	}
	a2 := get(t, e.st, c2.Analysis, &records.RunAnalysis{})
	if a2.Recommendation != records.RecommendDone || len(a2.Promoted) != 0 || a2.Previous != c.ID {
		t.Fatalf("second analysis = %+v", a2)
	}
}

// A cycle after the lease's guest was reverted (tb-lease gave it to
// another sample, then back) follows no cycle from before the revert: its
// detached sample and its files are gone.
func TestNoPreviousAcrossARevert(t *testing.T) {
	e := setup(t, "hello")
	c := e.run(t, Request{})
	var l records.SandboxLease
	err := e.st.Update(context.Background(), c.Lease, &l, func(bool) error {
		l.Reverts = append(l.Reverts, records.LeaseRevert{At: c.CreatedAt})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if c2 := e.run(t, Request{}); c2.Previous != "" {
		t.Fatalf("the cycle after a revert follows %s", c2.Previous)
	}
}

func TestTimeoutKillsTheSampleInTheGuest(t *testing.T) {
	e := setup(t, "out started\nhang")
	d := 30 * time.Millisecond
	c := e.run(t, Request{Timeout: &d})
	if c.State != records.CycleTimedOut || !c.TimedOut {
		t.Fatalf("cycle = %s: %s", c.State, c.Error)
	}
	ex := get(t, e.st, c.Execution, &records.ExecutionSnapshot{})
	if !ex.TimedOut || !ex.Killed || ex.ExitCode == nil || *ex.ExitCode != 137 || ex.Duration.D() < d {
		t.Fatalf("execution = %+v", ex)
	}
	if p := e.g.proc(ex.GuestPID); !p.killed {
		t.Fatal("the sample was not killed in the guest")
	}
	if blob(t, e.st, ex.Stdout) != "started\n" {
		t.Fatal("output before the kill lost")
	}
	if a := get(t, e.st, c.Analysis, &records.RunAnalysis{}); !slices.Contains(a.Classification, "timed-out") {
		t.Fatalf("analysis = %+v", a)
	}
}

// TestASampleThatOutlivesItsKill: a sample still running after its kill
// at the timeout is killed again; one that dies of the second kill ends
// as killed; one that survives every kill (children forked past each
// kill's walk of its tree, an agent that is the sample's) does not hold
// its cycle for more than KillWait: the execution records it as still
// running, and the analysis escalates, also when the kills after the
// first fail (the agent's hiccup). Before, the cycle waited an hour and
// killed again, without end.
func TestASampleThatOutlivesItsKill(t *testing.T) {
	for _, tc := range []struct {
		name             string
		survive, failing int
		prog             string
	}{{"dies at the second kill", 1, 0, "out started\nhang"}, {"survives every kill", -1, 0, "out started\nhang"},
		{"the kills after the first fail", -1, 1, "out started\nhang"},
		// Its launcher exits 0 at once; its cgroup's events file (which
		// root in the guest can mount over) says populated whatever the
		// kills do.
		{"a cgroup that stays populated", -1, 0, "out started\ndaemon\nexit 0"}} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, tc.prog)
			e.g.survivesKills, e.g.failKillsAfter = tc.survive, tc.failing
			e.r.KillWait = 400 * time.Millisecond
			d := 30 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := e.r.Create(ctx, Request{Plan: e.plan, Lease: e.lease, Timeout: &d})
			if err != nil {
				t.Fatal(err)
			}
			if c, err = e.r.Drive(ctx, c.ID); err != nil {
				t.Fatalf("the cycle did not end: %v", err)
			}
			ex := get(t, e.st, c.Execution, &records.ExecutionSnapshot{})
			a := get(t, e.st, c.Analysis, &records.RunAnalysis{})
			if tc.survive > 0 {
				if e.g.kills != 2 || ex.Running || ex.ExitCode == nil || *ex.ExitCode != 137 || slices.Contains(a.Classification, "survived-kill") {
					t.Fatalf("%d kills, execution %+v, analysis %v", e.g.kills, ex, a.Classification)
				}
				return
			}
			// The launcher's exit code is the daemon's execution's.
			if c.State != records.CycleTimedOut || !ex.TimedOut || !ex.Killed || !ex.Running ||
				(ex.ExitCode != nil) != strings.Contains(tc.prog, "daemon") || e.g.kills < 2 {
				t.Fatalf("cycle %s, %d kills, execution %+v", c.State, e.g.kills, ex)
			}
			if a.Recommendation != records.RecommendEscalate || !slices.Contains(a.Classification, "survived-kill") ||
				!strings.Contains(strings.Join(a.Reasons, ";"), "did not end after its kill") {
				t.Fatalf("analysis %s %v %q", a.Recommendation, a.Classification, a.Reasons)
			}
		})
	}
}

func TestASilentAgentWhileTheSampleRunsIsWaitedFor(t *testing.T) {
	e := setup(t, "out started")
	// Status, then the alive check (Status and a guest command): all unanswered.
	e.g.onSpawn = func(int) { e.g.mu.Lock(); e.g.silent = 3; e.g.mu.Unlock() }
	c := e.run(t, Request{})
	if c.State != records.CycleCompleted {
		t.Fatalf("cycle = %s: %s", c.State, c.Error)
	}
}

// TestExecFormatErrorRecommendsReplanning: a sample the guest could not
// execute (bash's "Exec format error", status 126, and nothing else: no
// traffic, no trace) is a wrong architecture guess, to plan again.
func TestExecFormatErrorRecommendsReplanning(t *testing.T) {
	e := setup(t, "noexec")
	c := e.run(t, Request{Post: []string{}})
	a := get(t, e.st, c.Analysis, &records.RunAnalysis{})
	if c.State != records.CycleCompleted || *c.ExitCode != 126 || a.Recommendation != records.RecommendReplan || a.Classification[0] != "wrong-architecture" {
		t.Fatalf("cycle %s exit %v, analysis %+v", c.State, c.ExitCode, a)
	}
}

// TestExecFormatErrorFromASampleThatRan: a sample that prints bash's
// "Exec format error" line and exits 126 itself, after it talked to the
// network (the fake capture's domain and endpoints) or with a trace it
// forged, is not filed as a wrong architecture guess: its traffic and its
// tampering still decide the recommendation.
func TestExecFormatErrorFromASampleThatRan(t *testing.T) {
	for _, tc := range []struct {
		name, tamper string
		want         string
	}{
		{"traffic", "", ""},
		{"forged trace", "forge", records.RecommendEscalate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, "err tb-run: line 17: /var/tmp/sample: cannot execute binary file: Exec format error\nexit 126")
			if tc.tamper != "" {
				var p records.Plan
				if err := e.st.Update(context.Background(), e.plan, &p, func(bool) error { p.Instrument = "pcap+trace"; p.Network.Promote = false; return nil }); err != nil {
					t.Fatal(err)
				}
				e.g.tamper = tc.tamper
				e.post.traceDropped = []string{}
			}
			c := e.run(t, Request{})
			a := get(t, e.st, c.Analysis, &records.RunAnalysis{})
			if c.State != records.CycleCompleted || *c.ExitCode != 126 || a.Recommendation == records.RecommendReplan ||
				tc.want != "" && a.Recommendation != tc.want || slices.Contains(a.Classification, "wrong-architecture") {
				t.Fatalf("cycle %s exit %v, analysis %s %v %q", c.State, c.ExitCode, a.Recommendation, a.Classification, a.Reasons)
			}
		})
	}
}

func TestPushIsVerifiedInTheGuest(t *testing.T) {
	e := setup(t, "exit 0")
	e.g.corrupt = true
	c := e.run(t, Request{})
	if c.State != records.CycleFailed || !strings.Contains(c.Error, "does not verify in the guest") || e.g.spawns != 0 {
		t.Fatalf("cycle = %s %q, spawns %d", c.State, c.Error, e.g.spawns)
	}
	if got := states(events(t, e.st, c.ID)); got != "pending leasing preparing failed" {
		t.Fatalf("events = %s", got)
	}
}

func TestGuestMustBeReadyBeforeAnyTransfer(t *testing.T) {
	e := setup(t, "exit 0")
	e.g.addrs = []string{"127.0.0.1/8"}
	c := e.run(t, Request{})
	if c.State != records.CycleFailed || !strings.Contains(c.Error, "network not up") || len(e.g.files) != 0 || e.g.stages != 0 {
		t.Fatalf("cycle = %s %q, files %v", c.State, c.Error, e.g.files)
	}
}

func TestResumeAfterACrashNeverStartsTheSampleTwice(t *testing.T) {
	e := setup(t, "out once\nexit 0")
	c, err := e.r.Create(context.Background(), Request{Plan: e.plan, Lease: e.lease})
	if err != nil {
		t.Fatal(err)
	}
	// The process dies right after the agent started the sample, before
	// its PID was recorded.
	ctx, cancel := context.WithCancel(context.Background())
	e.g.onSpawn = func(int) { cancel() }
	if _, err := e.r.Drive(ctx, c.ID); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drive = %v, want the interruption", err)
	}
	mid := get(t, e.st, c.ID, &records.Cycle{})
	if mid.State != records.CycleExecuting || !mid.Launch || mid.GuestPID != 0 {
		t.Fatalf("after the crash: %+v", mid)
	}
	e.g.onSpawn = nil
	done, err := e.r.Drive(context.Background(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.State != records.CycleCompleted || e.g.spawns != 1 || done.GuestPID != 101 {
		t.Fatalf("after resume: %s %q, %d spawns, pid %d", done.State, done.Error, e.g.spawns, done.GuestPID)
	}
	if got := states(events(t, e.st, c.ID)); got != "pending leasing preparing executing post_processing completed" {
		t.Fatalf("events = %s", got)
	}
}

func TestResumeWithoutProofOfLaunchDoesNotStartTheSample(t *testing.T) {
	e := setup(t, "exit 0")
	c, err := e.r.Create(context.Background(), Request{Plan: e.plan, Lease: e.lease})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.g.onSpawn = func(pid int) {
		// The launcher never got to write its pidfile.
		delete(e.g.files, GuestRoot+"/"+c.ID+".pid")
		cancel()
	}
	e.r.Drive(ctx, c.ID)
	e.g.onSpawn = nil
	done, err := e.r.Drive(context.Background(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.State != records.CycleFailed || !strings.Contains(done.Error, "no launcher is found in the guest") || e.g.spawns != 1 {
		t.Fatalf("%s %q, %d spawns", done.State, done.Error, e.g.spawns)
	}
}

func TestResumedPostProcessingSkipsFinishedSteps(t *testing.T) {
	e := setup(t, "exit 0")
	c, err := e.r.Create(context.Background(), Request{Plan: e.plan, Lease: e.lease})
	if err != nil {
		t.Fatal(err)
	}
	e.post.failParse = context.Canceled
	ctx, cancel := context.WithCancel(context.Background())
	e.g.onStatus = func(int) {}
	e.post.failParse = errInterrupt{cancel}
	if _, err := e.r.Drive(ctx, c.ID); err == nil {
		t.Fatal("want the interruption")
	}
	if mid := get(t, e.st, c.ID, &records.Cycle{}); mid.State != records.CyclePostProcessing {
		t.Fatalf("state after the crash: %s", mid.State)
	}
	done, err := e.r.Drive(context.Background(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.State != records.CycleCompleted || e.post.rotates != 1 || e.post.parses != 2 || e.g.spawns != 1 {
		t.Fatalf("%s: rotates %d parses %d spawns %d", done.State, e.post.rotates, e.post.parses, e.g.spawns)
	}
}

// errInterrupt cancels the driving context when returned, as a SIGTERM
// arriving during the step would.
type errInterrupt struct{ cancel func() }

func (e errInterrupt) Error() string { e.cancel(); return "interrupted" }

func TestCancelWhileExecutingKillsTheSample(t *testing.T) {
	e := setup(t, "hang")
	c, err := e.r.Create(context.Background(), Request{Plan: e.plan, Lease: e.lease})
	if err != nil {
		t.Fatal(err)
	}
	var waitFor []string
	e.g.onSpawn = func(int) {
		if err := e.r.cancel(context.Background(), c.ID, &waitFor); err != nil {
			t.Error(err)
		}
	}
	done, err := e.r.Drive(context.Background(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.State != records.CycleCancelled || len(waitFor) != 1 || !e.g.proc(done.GuestPID).killed {
		t.Fatalf("%s, waitFor %v", done.State, waitFor)
	}
	if got := states(events(t, e.st, c.ID)); got != "pending leasing preparing executing cancelled" {
		t.Fatalf("events = %s", got)
	}
	if err := e.r.cancel(context.Background(), c.ID, &waitFor); err == nil {
		t.Fatal("cancelling an ended cycle succeeded")
	}
}

func TestCancelPendingCycleNobodyDrives(t *testing.T) {
	e := setup(t, "exit 0")
	c, err := e.r.Create(context.Background(), Request{Plan: e.plan, Lease: e.lease})
	if err != nil {
		t.Fatal(err)
	}
	var waitFor []string
	if err := e.r.cancel(context.Background(), c.ID, &waitFor); err != nil || len(waitFor) != 0 {
		t.Fatal(err, waitFor)
	}
	done, err := e.r.Drive(context.Background(), c.ID)
	if err != nil || done.State != records.CycleCancelled || e.g.spawns != 0 {
		t.Fatalf("%v %s %d", err, done.State, e.g.spawns)
	}
}

func TestDetachedSampleIsObservedAcrossCycles(t *testing.T) {
	e := setup(t, "out first\nhang")
	yes, w := true, 10*time.Millisecond
	c1 := e.run(t, Request{Detach: &yes, Window: &w})
	ex1 := get(t, e.st, c1.Execution, &records.ExecutionSnapshot{})
	if c1.State != records.CycleCompleted || !ex1.Running || !ex1.Detached || ex1.ExitCode != nil || ex1.Duration.D() < w {
		t.Fatalf("first cycle %s, execution %+v", c1.State, ex1)
	}
	e.g.appendOut(c1.GuestPID, "second\n")
	c2 := e.run(t, Request{Detach: &yes, Window: &w})
	ex2 := get(t, e.st, c2.Execution, &records.ExecutionSnapshot{})
	if c2.Attached != c1.ID || c2.GuestPID != c1.GuestPID || e.g.spawns != 1 || !ex2.Running {
		t.Fatalf("second cycle = %+v", c2)
	}
	if got := blob(t, e.st, ex2.Stdout); got != "second\n" || c2.StdoutFrom != int64(len("first\n")) {
		t.Fatalf("second window's output = %q (from %d)", got, c2.StdoutFrom)
	}
	// Once the sample is gone, the next detached cycle starts it again.
	e.g.Run(context.Background(), killArgv(c1.GuestPID, 0, sampleCgroup(c1))...)
	c3 := e.run(t, Request{Detach: &yes, Window: &w})
	if c3.Attached != "" || e.g.spawns != 2 {
		t.Fatalf("third cycle = %+v", c3)
	}
}

func TestOneCycleAtATimePerLease(t *testing.T) {
	e := setup(t, "exit 0")
	unlock, err := e.st.Lock(context.Background(), leaseLock(e.lease))
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.r.Create(context.Background(), Request{Plan: e.plan, Lease: e.lease})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.r.Drive(context.Background(), c.ID)
	if !errors.Is(err, ErrBusy) || fault.Code(err) != fault.ExitTempFail {
		t.Fatalf("Drive = %v", err)
	}
	unlock()
	if done, err := e.r.Drive(context.Background(), c.ID); err != nil || done.State != records.CycleCompleted {
		t.Fatalf("after the lease is free: %v", err)
	}
}

func TestLeasingAcquiresALeaseWhenNoneIsGiven(t *testing.T) {
	e := setup(t, "exit 0")
	c, err := e.r.Create(context.Background(), Request{Plan: e.plan})
	if err != nil {
		t.Fatal(err)
	}
	done, err := e.r.Drive(context.Background(), c.ID)
	if err != nil || done.Lease != e.lease || done.State != records.CycleCompleted {
		t.Fatalf("%v %+v", err, done)
	}
	if _, ok := done.Timings["lease"]; !ok {
		t.Fatal("no lease timing")
	}
}

// TestLeasingAdoptsTheLeaseAcquiredForIt is a tb-run killed after its
// tb-lease acquire ended but before it recorded the lease in the cycle: the
// lease is busy under the cycle's name, and the resumed cycle takes it
// instead of acquiring (and leaking) another.
func TestLeasingAdoptsTheLeaseAcquiredForIt(t *testing.T) {
	e := setup(t, "exit 0")
	ctx := context.Background()
	c, err := e.r.Create(ctx, Request{Plan: e.plan})
	if err != nil {
		t.Fatal(err)
	}
	var l records.SandboxLease
	if err := e.st.Update(ctx, e.lease, &l, func(bool) error { l.Holder = c.ID; return nil }); err != nil {
		t.Fatal(err)
	}
	leaser := e.r.Leaser.(*fakeLeaser)
	done, err := e.r.Drive(ctx, c.ID)
	if err != nil || done.Lease != e.lease || done.State != records.CycleCompleted {
		t.Fatalf("%v %+v", err, done)
	}
	if leaser.acquired != 0 {
		t.Fatalf("acquired %d more leases", leaser.acquired)
	}
	// Another cycle's lease, or a released one, is not taken.
	c2, err := e.r.Create(ctx, Request{Plan: e.plan})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.Drive(ctx, c2.ID); err != nil || leaser.acquired != 1 {
		t.Fatalf("second cycle: %v, acquired %d", err, leaser.acquired)
	}
}

func TestCreateRejectsBadRequests(t *testing.T) {
	e := setup(t, "exit 0")
	zero := time.Duration(0)
	yes := true
	for _, req := range []Request{
		{},
		{Plan: "plan_01JD0000000000000000000000", Lease: e.lease},
		{Plan: e.plan, Lease: "lease_01JD0000000000000000000000"},
		{Plan: e.plan, Lease: e.lease, Timeout: &zero},
		{Plan: e.plan, Lease: e.lease, Detach: &yes, Window: &zero},
		{Plan: e.plan, Lease: e.lease, Workdir: "relative"},
		{Plan: e.plan, Lease: e.lease, Post: []string{"nonsense"}},
	} {
		if _, err := e.r.Create(context.Background(), req); fault.Code(err) != fault.ExitUsage {
			t.Errorf("Create(%+v) = %v, want a usage error", req, err)
		}
	}
}

func TestMetrics(t *testing.T) {
	e := setup(t, "exit 0")
	e.run(t, Request{})
	p := filepath.Join(t.TempDir(), "tb-run.prom")
	if err := WriteMetrics(e.st, p); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	for _, want := range []string{
		`talkbox_cycles{state="completed"} 1`, `talkbox_cycles{state="failed"} 0`,
		`talkbox_cycle_duration_seconds_count 1`, `talkbox_cycle_step_seconds_count{step="push"} 1`,
		`talkbox_lease_healthy{lease="` + e.lease + `",state="busy",health="healthy"} 1`,
		`talkbox_allowlist_entries{chain="lease:` + e.lease + `",status="active"} 1`,
		`talkbox_capture_packets_total 10`, `talkbox_observables 3`,
		`talkbox_low_space_stops_total{type="parse.low-space"} 0`, `talkbox_state_low_space{path="` + e.st.Root() + `"} 0`,
	} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, b)
		}
	}
}

func TestWatchFollowsARunningCycleUntilItEnds(t *testing.T) {
	e := setup(t, "out x\nexit 0")
	c, err := e.r.Create(context.Background(), Request{Plan: e.plan, Lease: e.lease})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	done := make(chan error)
	go func() { done <- Watch(context.Background(), e.st, &buf, []string{c.ID}, false) }()
	if _, err := e.r.Drive(context.Background(), c.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), `"kind":"event"`); n != 6 || !strings.Contains(buf.String(), `"to":"completed"`) {
		t.Fatalf("watch printed %d events:\n%s", n, buf.String())
	}
}

// TestTracedCycleStoresItsTrace: a plan with the trace instrument runs the
// sample under strace (or, emulated, with QEMU's syscall log, one file per
// process gathered into one) and stores the trace as a compressed artifact
// of the cycle.
func TestTracedCycleStoresItsTrace(t *testing.T) {
	for _, tc := range []struct {
		tracer string
		want   []string
	}{
		{TracerStrace, []string{"execve("}},
		{"emulated", []string{"execve("}},
	} {
		t.Run(tc.tracer, func(t *testing.T) {
			e := setup(t, "out hello")
			ctx := context.Background()
			var p records.Plan
			if err := e.st.Update(ctx, e.plan, &p, func(bool) error {
				p.Instrument = "pcap+trace"
				if tc.tracer == "emulated" {
					p.Emulation = &records.Emulation{Mode: "user", Target: "mips", Emulator: "qemu-mips-static", Platform: "mips"}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			c := e.run(t, Request{})
			if c.Tracer != TracerStrace || c.TraceTo == 0 {
				t.Fatalf("cycle tracer %q, trace to %d", c.Tracer, c.TraceTo)
			}
			var trace *records.Artifact
			for _, id := range c.Artifacts {
				var a records.Artifact
				if err := e.st.Get(id, &a); err != nil {
					t.Fatal(err)
				}
				if a.Type == ArtifactTrace {
					trace = &a
				}
			}
			if trace == nil || trace.ContentType != "text/plain+zstd" || trace.Metadata["tracer"] != TracerStrace {
				t.Fatalf("trace artifact %+v", trace)
			}
			text := zstdBlob(t, e.st, trace.SHA256)
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("trace %q lacks %q", text, w)
				}
			}
		})
	}
}

// TestMemoryInstrumentDumpsTheGuestFirst: a plan whose instrumentation has
// "memory" dumps the guest's memory before anything else in
// post-processing, as an artifact of the cycle that tb-parse is not given.
func TestMemoryInstrumentDumpsTheGuestFirst(t *testing.T) {
	e := setup(t, "out hello")
	e.instrument(t, "pcap+memory")
	c := e.run(t, Request{})
	if len(c.Post) == 0 || c.Post[0] != StepDump {
		t.Fatalf("post-processing %v", c.Post)
	}
	if _, ok := c.Timings[StepDump]; !ok {
		t.Fatalf("no dump timing: %v", c.Timings)
	}
	dumps := 0
	for _, id := range c.Artifacts {
		var a records.Artifact
		if err := e.st.Get(id, &a); err != nil {
			t.Fatal(err)
		}
		if a.Type == ArtifactMemoryDump {
			dumps++
			if slices.Contains(e.post.parsed, id) {
				t.Errorf("memory dump %s given to tb-parse", id)
			}
		}
	}
	if dumps != 1 {
		t.Fatalf("%d memory dumps", dumps)
	}
}

// TestTraceReachesTheAnalysis: a traced cycle's behaviour observables give
// the analysis its process tree, dropped files, persistence and listeners;
// the dropped file is copied out of the guest and planned (a file gone from
// the guest is skipped); persistence escalates.
func TestTraceReachesTheAnalysis(t *testing.T) {
	e := setup(t, "out hello")
	e.instrument(t, "pcap+trace")
	c := e.run(t, Request{})
	if !slices.Equal(c.Post, []string{StepRotate, StepParse, StepDrops, StepPromote}) {
		t.Fatalf("post-processing %v", c.Post)
	}
	if len(c.DroppedSamples) != 1 || !slices.Equal(e.post.dropped, []string{fakeDropped + "=#!/bin/sh\nexit 0\n"}) {
		t.Fatalf("dropped samples %v, planned %q", c.DroppedSamples, e.post.dropped)
	}
	var a records.RunAnalysis
	if err := e.st.Get(c.Analysis, &a); err != nil {
		t.Fatal(err)
	}
	b := a.Behaviour
	if b == nil || len(b.Processes) != 2 || b.Processes[1].PPID != 101 || !slices.Equal(b.Processes[0].Names, []string{"kworker/u:tb"}) ||
		!slices.Equal(b.Dropped, []string{fakeDropped}) || !slices.Equal(b.Persistence, []string{"cron /etc/crontab"}) ||
		!slices.Equal(b.Listening, []string{"listen 0.0.0.0:2323/tcp"}) || !slices.Equal(b.DroppedSamples, c.DroppedSamples) {
		t.Fatalf("behaviour %+v", b)
	}
	for _, l := range []string{"persistence", "dropper", "backdoor"} {
		if !slices.Contains(a.Classification, l) {
			t.Errorf("classification %v lacks %s", a.Classification, l)
		}
	}
	if a.Recommendation != records.RecommendEscalate {
		t.Errorf("recommendation %s: %v", a.Recommendation, a.Reasons)
	}
	s, err := Summarise(t.Context(), e.st, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	s.Text(&text)
	for _, want := range []string{"process 101 /var/tmp/sample (kworker/u:tb) exit 0", "  process 102 /var/tmp/sample", "dropped: " + fakeDropped, "planned from them: sample_", "persistence: cron /etc/crontab"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, text.String())
		}
	}
}

// TestHostileDropNamesDoNotFailTheCycle: the trace names the files the
// cycle copies out, and the sample writes the trace. Paths of 300 bytes,
// with a newline and control bytes, gone, or larger than the cycle's drop
// budget do not fail the cycle: the copyable ones are planned
// (named on the host by index only), the others are reasons in the
// analysis.
func TestHostileDropNamesDoNotFailTheCycle(t *testing.T) {
	e := setup(t, "out hello")
	e.instrument(t, "pcap+trace")
	long := "/var/tmp/" + strings.Repeat("f", 291) // one name longer than a host's file name may be
	odd := "/var/tmp/a\nb\x01c\x7f"
	big := "/var/tmp/big"
	e.g.files[long] = []byte("long\n")
	e.g.files[odd] = []byte("odd\n")
	e.g.files[big] = make([]byte, maxDroppedSize+1)
	e.post.traceDropped = []string{long, odd, "/var/tmp/gone", big}
	c := e.run(t, Request{})
	if c.State != records.CycleCompleted {
		t.Fatalf("cycle %s", c.State)
	}
	if len(long) != 300 || !slices.Equal(e.post.dropped, []string{long + "=long\n", odd + "=odd\n"}) {
		t.Fatalf("planned %q", e.post.dropped)
	}
	var a records.RunAnalysis
	if err := e.st.Get(c.Analysis, &a); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"/var/tmp/gone": gone`, `"/var/tmp/big": larger than`} {
		if !slices.ContainsFunc(a.Reasons, func(r string) bool { return strings.HasPrefix(r, "dropped file not copied out: "+want) }) {
			t.Errorf("reasons %q lack %s", a.Reasons, want)
		}
	}
}

// TestTamperedTraceIsEvidence: a sample that kills its tracer (the trace
// stops, the launcher writes no end record) or forges a trace line (of a
// process no traced one started) leaves a "trace tampered" evasion
// observable that escalates the analysis; a clean trace, or the note of a
// guest without strace, leaves none.
func TestTamperedTraceIsEvidence(t *testing.T) {
	for _, tc := range []struct {
		tamper string
		seen   string
	}{
		{"", ""},
		{"nostrace", ""},
		{"kill", "the launcher wrote no end record"},
		{"forge", "lines of processes no traced process started: 4242"},
	} {
		t.Run(cmp.Or(tc.tamper, "clean"), func(t *testing.T) {
			e := setup(t, "out hello")
			ctx := context.Background()
			var p records.Plan
			if err := e.st.Update(ctx, e.plan, &p, func(bool) error { p.Instrument = "pcap+trace"; p.Network.Promote = false; return nil }); err != nil {
				t.Fatal(err)
			}
			e.g.tamper, e.g.noStrace = tc.tamper, tc.tamper == "nostrace"
			e.post.traceDropped = []string{}
			c := e.run(t, Request{})
			if c.State != records.CycleCompleted {
				t.Fatalf("cycle %s %s", c.State, c.Error)
			}
			obs, err := state.FindBy(e.st, records.KindObservable, records.KeyCycle, c.ID, func(o *records.Observable) bool {
				return o.Evasion != nil && o.Evasion.Technique == behave.TechTraceTampered
			})
			if err != nil {
				t.Fatal(err)
			}
			var a records.RunAnalysis
			if err := e.st.Get(c.Analysis, &a); err != nil {
				t.Fatal(err)
			}
			if tc.seen == "" {
				if len(obs) != 0 {
					t.Fatalf("a clean trace seen as tampered: %q", obs[0].Evasion.Paths)
				}
				return
			}
			if len(obs) != 1 || obs[0].Value != "trace tampered" || !slices.ContainsFunc(obs[0].Evasion.Paths, func(s string) bool { return strings.HasPrefix(s, tc.seen) }) {
				t.Fatalf("tamper observables %+v", obs)
			}
			if a.Recommendation != records.RecommendEscalate || !strings.Contains(strings.Join(a.Reasons, ";"), "the behaviour trace was tampered with: ") ||
				!slices.Contains(a.Behaviour.Evasion, "trace tampered") {
				t.Fatalf("analysis %s %q, behaviour %+v", a.Recommendation, a.Reasons, a.Behaviour)
			}
		})
	}
}

// TestGuestClockSetToTheHosts: a guest clock years off (a restored clean
// state, or a sample's earlier cycle set it) is set to the host's before
// the sample runs, and the cycle records both; one within the tolerance is
// left alone; one the agent cannot set is said in the record and the
// cycle goes on.
func TestGuestClockSetToTheHosts(t *testing.T) {
	far := -time.Since(time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC))
	for _, tc := range []struct {
		name  string
		skew  time.Duration
		stuck bool
		sets  int
	}{{"years behind", far, false, 1}, {"within the tolerance", 200 * time.Millisecond, false, 0}, {"cannot be set", far, true, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, "out started")
			e.g.clock, e.g.clockStuck = tc.skew, tc.stuck
			c := e.run(t, Request{})
			if c.State != records.CycleCompleted {
				t.Fatalf("cycle = %s: %s", c.State, c.Error)
			}
			gc := c.GuestClock
			if gc == nil || e.g.clockSets != tc.sets || (gc.Found.D()-tc.skew).Abs() > 100*time.Millisecond {
				t.Fatalf("guest clock %+v, %d sets, want found %s and %d sets", gc, e.g.clockSets, tc.skew, tc.sets)
			}
			switch {
			case tc.stuck && ((gc.Left-gc.Found).D().Abs() > 100*time.Millisecond || !strings.Contains(gc.Error, "hwclock")):
				t.Errorf("a clock that could not be set: %+v", gc)
			case !tc.stuck && gc.Left.D().Abs() > records.ClockTolerance:
				t.Errorf("the sample starts with a clock %s off the host's: %+v", gc.Left, gc)
			case !tc.stuck && gc.Error != "":
				t.Errorf("a clock that was set has an error: %+v", gc)
			}
			if _, ok := c.Timings["clock"]; !ok {
				t.Errorf("no clock timing: %v", c.Timings)
			}
			// The report says so when it was off.
			sum, err := Summarise(context.Background(), e.st, c.ID)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			if err := sum.Text(&b); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"years behind": "s behind the host's at the start, set to within ",
				"cannot be set": "s behind the host's at the start, not set (guest-set-time: GenericError: hwclock"}[tc.name]
			if got := b.String(); want == "" && strings.Contains(got, "guest clock") || want != "" && !strings.Contains(got, want) {
				t.Errorf("report, want %q:\n%q", want, got)
			}
		})
	}
}

// TestADaemonIsWatchedUntilTheTimeout: a sample that forks a daemon and
// exits (as Mirai does) ended its cycle at its exit, its daemon unwatched
// and never killed. Its cgroup says the daemon runs: the cycle watches it
// until the timeout, then kills it through the cgroup.
func TestADaemonIsWatchedUntilTheTimeout(t *testing.T) {
	e := setup(t, "out started\ndaemon\nexit 0")
	e.r.Stream = 20 * time.Millisecond
	d := 300 * time.Millisecond
	c := e.run(t, Request{Timeout: &d})
	ex := get(t, e.st, c.Execution, &records.ExecutionSnapshot{})
	if c.State != records.CycleTimedOut || !ex.TimedOut || !ex.Killed || ex.Running || ex.ExitCode == nil || *ex.ExitCode != 0 ||
		e.g.kills != 1 || ex.Duration.D() < d {
		t.Fatalf("cycle %s (%s), %d kills, execution %+v", c.State, c.Error, e.g.kills, ex)
	}
}

// TestADetachedDaemonIsObservedAcrossCycles: a detached sample that forked
// a daemon and exited is still the sample the next window observes (its
// cgroup says the daemon runs), not one to start again beside it.
func TestADetachedDaemonIsObservedAcrossCycles(t *testing.T) {
	e := setup(t, "out first\ndaemon\nexit 0")
	e.r.Stream = 20 * time.Millisecond
	yes, w := true, 100*time.Millisecond
	c1 := e.run(t, Request{Detach: &yes, Window: &w})
	ex1 := get(t, e.st, c1.Execution, &records.ExecutionSnapshot{})
	if c1.State != records.CycleCompleted || !ex1.Running || ex1.ExitCode == nil {
		t.Fatalf("first cycle %s (%s), execution %+v", c1.State, c1.Error, ex1)
	}
	c2 := e.run(t, Request{Detach: &yes, Window: &w})
	if c2.Attached != c1.ID || e.g.spawns != 1 {
		t.Fatalf("second cycle attached to %q, %d spawns", c2.Attached, e.g.spawns)
	}
}
