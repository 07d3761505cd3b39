package allowlist

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/observe/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

const probed = "198.51.100.7"

// c2Flows are six connections a minute apart to probed:443 in a cycle
// (none: an offline capture), the responder sending respBytes each.
func c2Flows(cycle string, respBytes int64) []*records.Observable {
	var obs []*records.Observable
	for i := 0; i < 6; i++ {
		o := obsFlow(probed, 443, "tcp", "established", pcapgen.Start.Add(time.Duration(i)*time.Minute), 1)
		o.Cycle, o.Flow.RespBytes = cycle, respBytes
		obs = append(obs, o)
	}
	return obs
}

// jsonl is observables as tb-parse prints them, of a lease ("" for an
// offline capture).
func jsonl(lease string, obs []*records.Observable) io.Reader {
	var b bytes.Buffer
	for i, o := range obs {
		records.Init(o, records.KindObservable, pcapgen.Start.Add(time.Duration(i)*time.Millisecond))
		o.Lease = lease
		data, _ := records.Marshal(o)
		b.Write(append(data, '\n'))
	}
	return &b
}

// TestProbation: an endpoint whose evidence is only what the sample sent
// in a sinkholed cycle (the sinkhole answered) is let through on
// probation, rate-limited, for one cycle. If its far side answers in the
// cycle that let it through it becomes active with the policy's verdict;
// if not (silent, or never contacted) it is revoked for the lease, and
// the same evidence does not promote it again. An answer in an observable
// that also spans a sinkholed cycle confirms nothing; one in an offline
// capture of a live run does.
func TestProbation(t *testing.T) {
	ctx := context.Background()
	now := pcapgen.Start.Add(time.Hour)
	b := testBook(t, &now)
	pol := DefaultPolicy()
	pol.Documentation, pol.Verdict = true, string(firewall.Forward)
	if err := pol.compile(); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	sink := cmdout.New("tb-allow", io.Discard, &stderr, nil)
	cycle := func(lease, revision string) string {
		c := &records.Cycle{Lease: lease, Revision: revision}
		records.Init(c, records.KindCycle, now)
		if err := b.St.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Minute)
		return c.ID
	}
	promote := func(lease, cycle string, obs []*records.Observable) (*records.AllowRevision, *records.AllowEntry) {
		t.Helper()
		// Without a cycle, an offline capture: its observables have no lease.
		obsLease := lease
		if cycle == "" {
			obsLease = ""
		}
		err := Promote(ctx, b, PromoteRequest{Input: Input{Stdin: jsonl(obsLease, obs), Lease: lease, Cycle: cycle},
			Scope: records.ScopeLease, Policy: pol, NoApply: true}, sink)
		if err != nil {
			t.Fatalf("promote: %v\n%s", err, stderr.String())
		}
		rev, entries, err := b.Head(Chain{Scope: records.ScopeLease, Lease: lease})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Value == probed+":443/tcp" {
				return rev, e
			}
		}
		return rev, nil
	}
	verdictNow := func(lease string) firewall.Verdict {
		l, err := b.Desired(lease, now)
		if err != nil || len(l.Elements) > 1 {
			t.Fatalf("live set of %s: %+v %v", lease, l, err)
		}
		if len(l.Elements) == 0 {
			return ""
		}
		return l.Elements[0].Verdict
	}
	// sinkholed promotes a sinkholed cycle's beacon (the sinkhole
	// answered every connection) for a new lease: probation.
	sinkholed := func() (string, *records.AllowRevision) {
		t.Helper()
		lease := records.NewID("lease", now)
		c1 := cycle(lease, "")
		r1, e := promote(lease, c1, c2Flows(c1, 500))
		if e == nil || e.Status != records.StatusProbation || e.Verdict != string(firewall.RateLimit) || r1.Active != 1 {
			t.Fatalf("after a sinkholed cycle: %+v (revision active %d)", e, r1.Active)
		}
		if v := verdictNow(lease); v != firewall.RateLimit {
			t.Fatalf("on probation the live set has %q, want rate-limit", v)
		}
		return lease, r1
	}

	// The far side answers in the cycle that let it through: active.
	lease, r1 := sinkholed()
	c2 := cycle(lease, r1.ID)
	if _, e := promote(lease, c2, c2Flows(c2, 800)); e.Status != records.StatusActive || !strings.HasPrefix(e.Reason, "confirmed") {
		t.Errorf("answered while let through: %+v", e)
	}
	if v := verdictNow(lease); v != firewall.Forward {
		t.Errorf("confirmed: the live set has %q, want the policy's forward", v)
	}

	// Silent while let through: revoked, and the same evidence again
	// does not bring it back.
	lease, r1 = sinkholed()
	c2 = cycle(lease, r1.ID)
	_, e := promote(lease, c2, c2Flows(c2, 0))
	if e.Status != records.StatusRevoked || !strings.Contains(e.Reason, "probation failed") {
		t.Errorf("silent while let through: %+v", e)
	}
	if _, e := promote(lease, c2, c2Flows(c2, 0)); e.Status != records.StatusRevoked || verdictNow(lease) != "" {
		t.Errorf("promoted again on the same evidence: %+v", e)
	}

	// Not contacted at all while let through: revoked too.
	lease, r1 = sinkholed()
	c2 = cycle(lease, r1.ID)
	other := obsFlow("198.51.100.99", 80, "tcp", "established", pcapgen.Start, 1)
	other.Cycle = c2
	if _, e := promote(lease, c2, []*records.Observable{other}); e.Status != records.StatusRevoked {
		t.Errorf("not contacted while let through: %+v", e)
	}

	// One observable over a sinkholed cycle and the one that let it
	// through: its payload may be the sinkhole's, so it confirms nothing.
	lease, r1 = sinkholed()
	c1 := r1.Cycle
	c2 = cycle(lease, r1.ID)
	merged := c2Flows(c2, 800)
	for _, o := range merged {
		o.Cycles = []string{c1, c2}
	}
	if _, e := promote(lease, c2, merged); e.Status == records.StatusActive {
		t.Errorf("a merged observable confirmed the endpoint: %+v", e)
	}

	// What tb-parse --merge writes: one endpoint observable over both
	// cycles, saying in which of them the responder sent payload. An
	// answer in the cycle that let it through confirms; one only in the
	// sinkholed cycle does not.
	for _, answeredIn := range []int{2, 1} {
		lease, r1 = sinkholed()
		c1, c2 = r1.Cycle, cycle(lease, r1.ID)
		ep := obsEndpoint(probed, 443, 12, pcapgen.Start, pcapgen.Start.Add(11*time.Minute))
		ep.Cycle, ep.Cycles = c2, []string{c1, c2}
		ep.Endpoint.RespBytes, ep.Endpoint.AnsweredIn = 800, []string{[]string{c1, c2}[answeredIn-1]}
		_, e := promote(lease, c2, []*records.Observable{ep})
		if confirmed := e.Status == records.StatusActive; confirmed != (answeredIn == 2) {
			t.Errorf("merged endpoint answered in cycle %d of 2: %+v", answeredIn, e)
		}
	}

	// An offline capture of a live run (no lease, no cycle) in which the
	// far side answered: active at once.
	lease = records.NewID("lease", now)
	if _, e := promote(lease, "", c2Flows("", 800)); e == nil || e.Status != records.StatusActive {
		t.Errorf("offline capture with answers: %+v", e)
	}
	if _, err := b.Verify(Chain{Scope: records.ScopeLease, Lease: lease}); err != nil {
		t.Fatal(err)
	}
	// The operator may vouch for an endpoint on probation.
	lease, _ = sinkholed()
	if err := ChangeEntries(ctx, b, "approve", ChangeRequest{Selector: Selector{Lease: lease, Scope: records.ScopeLease},
		Targets: []string{probed + ":443/tcp"}, Policy: pol, NoApply: true}, sink); err != nil {
		t.Fatalf("approve: %v", err)
	}
	if v := verdictNow(lease); v != firewall.Forward {
		t.Errorf("approved off probation: the live set has %q, want the policy's forward", v)
	}
	if stderr.Len() > 0 {
		os.Stderr.Write(stderr.Bytes())
	}
}
