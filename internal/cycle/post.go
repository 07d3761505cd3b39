package cycle

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/behave"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/mitre"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/yarascan"
)

// post runs the cycle's post-processing steps that have not run yet (a
// resumed cycle skips those it finished), then writes the analysis.
func (r *Runner) post(ctx context.Context, c *records.Cycle) (*records.Cycle, error) {
	var err error
	done := func(step string) bool { _, ok := c.Timings[step]; return ok }
	if slices.Contains(c.Post, StepDump) && !done(StepDump) {
		start := time.Now()
		id, err := r.Post.Dump(ctx, c.Lease, c.ID)
		if err != nil {
			return c, fmt.Errorf("dumping the guest's memory: %w", err)
		}
		if c, err = r.timed(ctx, c, StepDump, start, func(n *records.Cycle) error {
			n.Artifacts = append(n.Artifacts, id)
			return nil
		}); err != nil {
			return c, err
		}
	}
	if slices.Contains(c.Post, StepRotate) && !done(StepRotate) {
		start := time.Now()
		arts, err := r.Post.Rotate(ctx, c.Lease, c.ID)
		if err != nil {
			return c, fmt.Errorf("rotating the capture: %w", err)
		}
		if c, err = r.timed(ctx, c, StepRotate, start, func(n *records.Cycle) error {
			n.Artifacts = append(n.Artifacts, arts...)
			return nil
		}); err != nil {
			return c, err
		}
	}
	if slices.Contains(c.Post, StepParse) && !done(StepParse) {
		var pcaps []string
		for _, id := range c.Artifacts {
			var a records.Artifact
			if r.St.Get(id, &a) == nil && a.Type != ArtifactStdout && a.Type != ArtifactStderr && a.Type != ArtifactMemoryDump {
				pcaps = append(pcaps, id)
			}
		}
		start := time.Now()
		if len(pcaps) > 0 {
			n, err := r.Post.Parse(ctx, pcaps)
			if err != nil {
				return c, fmt.Errorf("parsing: %w", err)
			}
			r.Log.Info("parsed", "cycle", c.ID, "artifacts", len(pcaps), "observables", n, "took", time.Since(start))
		}
		if c, err = r.timed(ctx, c, StepParse, start, nil); err != nil {
			return c, err
		}
	}
	if slices.Contains(c.Post, StepDrops) && !done(StepDrops) {
		start := time.Now()
		ids, skipped, err := r.drops(ctx, c)
		if err != nil {
			return c, fmt.Errorf("planning dropped files: %w", err)
		}
		if c, err = r.timed(ctx, c, StepDrops, start, func(n *records.Cycle) error {
			n.DroppedSamples = ids
			if skipped != "" {
				n.Artifacts = append(n.Artifacts, skipped)
			}
			return nil
		}); err != nil {
			return c, err
		}
	}
	if slices.Contains(c.Post, StepPromote) && !done(StepPromote) {
		start := time.Now()
		rev, err := r.Post.Promote(ctx, c.Lease, c.ID)
		if err != nil {
			return c, fmt.Errorf("promoting: %w", err)
		}
		if c, err = r.timed(ctx, c, StepPromote, start, func(n *records.Cycle) error { n.Promoted = rev; return nil }); err != nil {
			return c, err
		}
	}
	start := time.Now()
	a, err := Analyse(ctx, r.St, c)
	if err != nil {
		return c, err
	}
	if c.Analysis == "" {
		now := r.St.Now()
		records.Init(a, records.KindAnalysis, now)
		if err := r.St.Create(ctx, a); err != nil {
			return c, err
		}
		if c, err = r.timed(ctx, c, "analyse", start, func(n *records.Cycle) error { n.Analysis = a.ID; return nil }); err != nil {
			return c, err
		}
	}
	to := records.CycleCompleted
	if c.TimedOut {
		to = records.CycleTimedOut
	}
	return r.transition(ctx, c, to, a.Recommendation+": "+strings.Join(a.Reasons, "; "), nil)
}

// maxCarried bounds the floods an analysis names as carrying out an order.
const maxCarried = 4

// Analyse sums a cycle up from its execution, its observables and the
// allow-list revision post-processing wrote, and recommends what to do
// next; ctx bounds reading the allow lists in force (a fleet fetches their
// content from the host that wrote it).
func Analyse(ctx context.Context, st *state.Store, c *records.Cycle) (*records.RunAnalysis, error) {
	a := &records.RunAnalysis{Cycle: c.ID, Lease: c.Lease, Sample: c.Sample, Plan: c.Plan, Previous: c.Previous,
		Observables: map[string]int{}, Revision: c.Promoted}
	seen, err := state.FindBy[records.Observable](st, records.KindObservable, records.KeyCycle, c.ID, nil)
	if err != nil {
		return nil, err
	}
	var tampered, carried []string
	var attacks []*records.Observable
	droppedMatch := false
	for _, o := range seen {
		a.Observables[o.Type]++
		if o.Attack != nil {
			attacks = append(attacks, o)
		}
		if k := o.Attack; k != nil && k.Order != "" {
			carried = append(carried, fmt.Sprintf("%s after %q (%g s)", o.Value, k.Order, k.OrderDelay))
		}
		if o.Evasion != nil && o.Evasion.Technique == behave.TechTraceTampered {
			tampered = append(tampered, o.Evasion.Paths...)
		}
		switch o.Type {
		case records.ObsDomain:
			a.Domains = append(a.Domains, o.Value)
		case records.ObsEndpoint:
			a.Destinations = append(a.Destinations, o.Value)
		case records.ObsYara:
			if o.Yara != nil {
				a.Yara = append(a.Yara, o.Value+" in "+o.Yara.Target)
				droppedMatch = droppedMatch || o.Yara.Target == yarascan.TargetDropped
			}
		}
		behaviourOf(a, o)
	}
	if a.Attacks, err = attackOutcomes(ctx, st, c, attacks); err != nil {
		return nil, err
	}
	sort.Strings(a.Domains)
	sort.Strings(a.Destinations)
	sort.Strings(a.Yara)
	a.Techniques = mitre.IDs(seen)
	if b := a.Behaviour; b != nil {
		for _, l := range [][]string{b.Dropped, b.Persistence, b.Evasion, b.Tried, b.Listening} {
			sort.Strings(l)
		}
		slices.SortFunc(b.Processes, func(x, y records.ProcessNode) int { return cmp.Compare(x.PID, y.PID) })
		b.DroppedSamples = c.DroppedSamples
	}
	arts, err := state.FindBy(st, records.KindArtifact, records.KeyCycle, c.ID, func(art *records.Artifact) bool {
		return art.Type == flowlog.ArtifactType || art.Type == ArtifactDropsSkipped || art.KeptOut > 0 || art.Forged > 0
	})
	if err != nil {
		return nil, err
	}
	var warnings []string
	// Frames the bridge dropped, kept out of the captures; forged, those
	// that claimed another identity. (An artifact from before kept_out
	// counted them all as forged.)
	var keptOut, forged uint64
	for _, art := range arts {
		if art.Type != flowlog.ArtifactType && art.Type != ArtifactDropsSkipped {
			keptOut += max(art.KeptOut, art.Forged)
			forged += art.Forged
			continue
		}
		if art.Type == ArtifactDropsSkipped {
			// []any once read back as JSON.
			skipped, _ := art.Metadata["skipped"].([]any)
			for _, s := range skipped {
				warnings = append(warnings, fmt.Sprint("dropped file not copied out: ", s))
			}
			continue
		}
		a.Connections += art.Conns
		a.FlowLogs = append(a.FlowLogs, art.ID)
	}
	var ex records.ExecutionSnapshot
	if c.Execution != "" {
		if err := st.Get(c.Execution, &ex); err != nil {
			return nil, err
		}
	}
	var pending, confirmed []string
	if c.Promoted != "" {
		var rv records.AllowRevision
		if err := st.Get(c.Promoted, &rv); err != nil {
			return nil, err
		}
		a.Refused = rv.Refusals
		if rv.Cycle == c.ID && rv.ID != c.Revision {
			// Changed entries include refreshed ones (last seen, expiry)
			// whose status stayed: only a status reached now counts.
			for _, ch := range append(rv.Changes.Added, rv.Changes.Changed...) {
				switch {
				case ch.To == ch.From:
				case ch.To == records.StatusActive && ch.From == records.StatusProbation:
					// Let through already, now past probation.
					confirmed = append(confirmed, ch.Key)
				case ch.To == records.StatusProbation, ch.To == records.StatusActive:
					a.Promoted = append(a.Promoted, ch.Key)
				case ch.To == records.StatusPending:
					pending = append(pending, ch.Key)
				}
			}
		}
	}
	total := 0
	for _, n := range a.Observables {
		total += n
	}
	classes := map[string]bool{}
	for _, f := range a.Refused {
		classes[f.Class] = true
	}
	// The sample writes its stderr and chooses its exit status: bash's
	// "Exec format error" in them says the guest could not run the sample
	// only if nothing shows that it ran. Else a sample that printed the
	// line would be filed as a wrong architecture guess, "replan", its
	// traffic, tampering and persistence unremarked.
	wrongArch := !sampleRan(a, tampered) &&
		(strings.Contains(ex.StderrTail, "Exec format error") || (ex.ExitCode != nil && *ex.ExitCode == 126 && strings.Contains(ex.StderrTail, "cannot execute binary file")))
	crashed := ex.ExitCode != nil && *ex.ExitCode > 128 && !ex.Killed
	switch {
	case wrongArch:
		a.Classification = append(a.Classification, "wrong-architecture")
	case crashed:
		a.Classification = append(a.Classification, "crashed")
	case ex.TimedOut:
		a.Classification = append(a.Classification, "timed-out")
	case ex.Running:
		a.Classification = append(a.Classification, "running")
	}
	survived := ex.Killed && ex.Running
	if survived {
		a.Classification = append(a.Classification, "survived-kill")
	}
	if a.Observables[records.ObsDomain] > 0 || a.Observables[records.ObsHTTP] > 0 {
		a.Classification = append(a.Classification, "network-active")
	}
	if len(a.Promoted) > 0 {
		a.Classification = append(a.Classification, "c2-candidate")
	}
	if classes["scan"] {
		a.Classification = append(a.Classification, "scanning")
	}
	if len(a.Yara) > 0 {
		a.Classification = append(a.Classification, "yara-match")
	}
	if a.Observables[records.ObsC2Command] > 0 {
		a.Classification = append(a.Classification, "ordered")
	}
	if a.Observables[records.ObsAttack] > 0 {
		a.Classification = append(a.Classification, "attacking")
	}
	if total == 0 && !wrongArch {
		a.Classification = append(a.Classification, "silent")
	}
	if forged > 0 {
		a.Classification = append(a.Classification, "spoofing")
	}
	if b := a.Behaviour; b != nil {
		for _, l := range []struct {
			label string
			has   bool
		}{{"persistence", len(b.Persistence) > 0}, {"evasion", len(b.Evasion) > 0},
			{"dropper", len(b.Dropped) > 0}, {"backdoor", len(b.Listening) > 0}} {
			if l.has {
				a.Classification = append(a.Classification, l.label)
			}
		}
	}
	switch {
	case wrongArch:
		a.Recommendation = records.RecommendReplan
		a.Reasons = append(a.Reasons, "the guest could not execute the sample (Exec format error): the architecture guess is wrong; plan again with another --platform")
	case len(tampered) > 0:
		// What the trace shows may be the sample's forgery: a person looks.
		a.Recommendation = records.RecommendEscalate
		a.Reasons = append(a.Reasons, "the behaviour trace was tampered with: "+strings.Join(tampered, "; "))
	case survived:
		// Something in the guest outlasted every kill: a person looks
		// before the lease's guest is trusted with the next cycle.
		a.Recommendation = records.RecommendEscalate
		a.Reasons = append(a.Reasons, "the sample did not end after its kill at the timeout, nor after the kills that followed: "+
			"it still runs in the guest (children forked past each kill, or a guest agent that is the sample's)")
	case a.Observables[records.ObsC2Command] > 0:
		// What the C2 orders is what the analysts are after.
		a.Recommendation = records.RecommendEscalate
		a.Reasons = append(a.Reasons, fmt.Sprintf("the C2 sent %d attack orders (c2-command); %d floods seen (attack)",
			a.Observables[records.ObsC2Command], a.Observables[records.ObsAttack]))
	case droppedMatch:
		// The analyst's own rules recognise what the sample left behind.
		a.Recommendation = records.RecommendEscalate
		a.Reasons = append(a.Reasons, "YARA rules match a dropped file: "+strings.Join(a.Yara, ", "))
	case crashed:
		a.Recommendation = records.RecommendEscalate
		a.Reasons = append(a.Reasons, fmt.Sprintf("the sample died with status %d", *ex.ExitCode))
	case len(pending) > 0:
		a.Recommendation = records.RecommendEscalate
		a.Reasons = append(a.Reasons, "allow-list entries wait for approval: "+strings.Join(pending, ", "))
	case a.Behaviour != nil && len(a.Behaviour.Persistence) > 0:
		a.Recommendation = records.RecommendEscalate
		a.Reasons = append(a.Reasons, "persistence or tampering in the guest: "+strings.Join(a.Behaviour.Persistence, ", "))
	case classes["abuse"] || classes["smtp"]:
		a.Recommendation = records.RecommendEscalate
		a.Reasons = append(a.Reasons, "the sample tried abuse destinations (refused)")
	case len(a.Promoted) > 0:
		a.Recommendation = records.RecommendRerun
		a.Reasons = append(a.Reasons, "promoted "+strings.Join(a.Promoted, ", ")+"; rerun so the sample can reach it")
	default:
		a.Recommendation = records.RecommendDone
		switch {
		case total == 0:
			a.Reasons = append(a.Reasons, "no network activity observed")
		case len(confirmed) > 0:
			a.Reasons = append(a.Reasons, "nothing new to allow")
		default:
			a.Reasons = append(a.Reasons, "nothing new to allow; the allow-list in force is unchanged")
		}
	}
	if forged > 0 {
		a.Reasons = append(a.Reasons, fmt.Sprintf("the guest sent %d frames claiming a sender it is not (another MAC, IPv4 address or ARP sender, 0.0.0.0 outside DHCP and ARP probes, or a routable IPv6 source), which the lab's bridge dropped: kept out of the capture, they are evidence of nothing", forged))
	}
	if other := keptOut - forged; other > 0 {
		a.Reasons = append(a.Reasons, fmt.Sprintf("the guest sent %d frames the lab does not carry (its own IPv6, another protocol than IPv4 and ARP, or cut short), which its bridge dropped: kept out of the capture", other))
	}
	if len(carried) > 0 {
		// What the bot did with what it was told; tb-parse's
		// attribution, which the sample could have staged, is told and
		// decides nothing.
		sort.Strings(carried)
		more := ""
		if len(carried) > maxCarried {
			more = fmt.Sprintf(" and %d more", len(carried)-maxCarried)
			carried = carried[:maxCarried]
		}
		a.Reasons = append(a.Reasons, "floods carrying out an order: "+strings.Join(carried, ", ")+more)
	}
	if len(a.Attacks) > 0 {
		// Where the floods went: the lab's rules in force, not a
		// measurement (the capture is on the tap, before them).
		var where []string
		for _, o := range a.Attacks[:min(len(a.Attacks), maxCarried)] {
			where = append(where, fmt.Sprintf("%s (%d packets) %s", o.Value, o.Packets, o.Contained))
		}
		if len(a.Attacks) > maxCarried {
			where = append(where, fmt.Sprintf("and %d more", len(a.Attacks)-maxCarried))
		}
		a.Reasons = append(a.Reasons, "floods under the rules in force: "+strings.Join(where, ", "))
	}
	if len(confirmed) > 0 {
		a.Reasons = append(a.Reasons, "confirmed "+strings.Join(confirmed, ", ")+": its far side answered as a C2 while let through on probation")
	}
	if classes["scan"] {
		a.Reasons = append(a.Reasons, "scan traffic refused")
	}
	a.Reasons = append(a.Reasons, warnings...)
	if a.Classification == nil {
		a.Classification = []string{}
	}
	return a, nil
}

// sampleRan reports whether the cycle shows its sample ran: traffic, a
// trace it tampered with, or what its trace shows it did (files dropped,
// persistence, evasion, connections tried, listeners). A sample the guest
// could not execute leaves none of these; the process nodes alone do not
// count (a traced failed exec has them).
func sampleRan(a *records.RunAnalysis, tampered []string) bool {
	for _, t := range []string{records.ObsDomain, records.ObsIP, records.ObsEndpoint, records.ObsScan, records.ObsHTTP, records.ObsTLS,
		records.ObsICMP, records.ObsC2Channel, records.ObsC2Command, records.ObsAttack} {
		if a.Observables[t] > 0 {
			return true
		}
	}
	b := a.Behaviour
	return len(tampered) > 0 || b != nil && len(b.Dropped)+len(b.Persistence)+len(b.Evasion)+len(b.Tried)+len(b.Listening) > 0
}

// behaviourOf adds a behaviour observable to the analysis's summary.
func behaviourOf(a *records.RunAnalysis, o *records.Observable) {
	if o.Process == nil && o.Path == nil && o.Netcall == nil && o.Persistence == nil && o.Evasion == nil {
		return
	}
	if a.Behaviour == nil {
		a.Behaviour = &records.BehaviourSummary{}
	}
	b := a.Behaviour
	switch {
	case o.Process != nil:
		p := o.Process
		n := records.ProcessNode{PID: p.PID, PPID: p.PPID, Exe: p.Exe, Names: p.Names}
		if len(p.Execs) > 0 {
			n.Argv = p.Execs[len(p.Execs)-1].Argv
		}
		if x := p.Exit; x != nil {
			n.Exit = cmp.Or(x.Signal, strconv.FormatInt(x.Code, 10))
		}
		if len(b.Processes) < maxTreeNodes {
			b.Processes = append(b.Processes, n)
		}
	case o.Path != nil:
		if o.Path.Dropped {
			b.Dropped = append(b.Dropped, o.Value)
		}
	case o.Netcall != nil:
		switch o.Netcall.Call {
		case "connect", "sendto":
			b.Tried = append(b.Tried, o.Value)
		case "listen":
			b.Listening = append(b.Listening, o.Value)
		}
	case o.Persistence != nil:
		b.Persistence = append(b.Persistence, o.Value)
	case o.Evasion != nil:
		b.Evasion = append(b.Evasion, o.Value)
	}
}

// maxTreeNodes bounds the processes an analysis lists (the trace's process
// observables are bounded too).
const maxTreeNodes = 512
