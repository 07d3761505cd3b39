package leasereport

import (
	"cmp"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// scanKey is one scan of a cycle: a port across addresses, or the ports
// of one address.
type scanKey struct {
	target string // the scan observable's value: "tcp/23", "203.0.113.9/tcp"
	proto  string
	port   uint16
	addr   string
	obs    *records.Observable
}

// loadObservables reads the observables the report may draw from: the
// DNS names, the endpoints (the C2s' connection starts) and the scans of
// the leases, or of the cycle.
func (c *collector) loadObservables() error {
	keep := func(o *records.Observable) bool {
		switch o.Type {
		case records.ObsDomain, records.ObsScan, records.ObsEndpoint, records.ObsC2Command, records.ObsAttack:
			return true
		}
		return false
	}
	if c.r.Target == TargetCycle {
		obs, err := state.FindBy(c.st, records.KindObservable, records.KeyCycle, c.r.ID, keep)
		c.loaded = obs
		return err
	}
	for _, l := range c.leases {
		obs, err := state.FindBy(c.st, records.KindObservable, records.KeyLease, l, keep)
		if err != nil {
			return err
		}
		c.loaded = append(c.loaded, obs...)
	}
	return nil
}

// observables picks the observables the report uses: the DNS names first
// seen in the span, the C2s' endpoints, each cycle's scans.
func (c *collector) observables() {
	c.eps = map[string][]*records.Observable{}
	c.scans = map[string][]scanKey{}
	c.isC2 = map[string]bool{}
	for _, v := range c.r.C2s {
		c.isC2[v.Value] = true
	}
	all := c.loaded
	names := map[string]*Name{}
	orderOf := map[string][]*records.Observable{} // c2-commands by value
	for _, o := range all {
		switch {
		case o.Type == records.ObsEndpoint && c.isC2[o.Value]:
			c.eps[o.Value] = append(c.eps[o.Value], o)
		case o.Type == records.ObsC2Command && o.C2Command != nil && c.in(o.FirstSeen):
			orderOf[o.Value] = append(orderOf[o.Value], o)
			k := o.C2Command
			c.r.Orders = append(c.r.Orders, Order{At: o.FirstSeen, Cycle: o.Cycle, Family: k.Family, Vector: k.Vector, Targets: k.Targets,
				Ports: k.Ports, Duration: k.Duration, Servers: k.Servers, Observable: o.ID, UIDs: provUIDs(o)})
		case o.Type == records.ObsAttack && o.Attack != nil && c.in(o.FirstSeen):
			a := o.Attack
			c.r.Attacks = append(c.r.Attacks, Attack{Start: o.FirstSeen, End: o.LastSeen, Cycle: o.Cycle, Vector: a.Vector, Target: a.Target,
				Packets: a.Packets, PPS: a.PPS, Spoofed: a.Spoofed, Observable: o.ID, Order: a.Order, OrderDelay: a.OrderDelay,
				UIDs: provUIDs(o)})
		case o.Type == records.ObsScan && o.Scan != nil:
			if _, ok := c.cycleIdx[o.Cycle]; ok {
				c.scans[o.Cycle] = append(c.scans[o.Cycle], scanKey{target: o.Value, proto: o.Scan.Proto, port: o.Scan.Port, addr: o.Scan.Addr, obs: o})
			}
		case o.Type == records.ObsDomain && c.in(o.FirstSeen):
			q := o.Count
			if o.Domain != nil {
				q = o.Domain.Queries
			}
			n := names[o.Value]
			switch {
			case n == nil:
				names[o.Value] = &Name{Name: o.Value, FirstSeen: o.FirstSeen, Queries: q, Observable: o.ID, UIDs: provUIDs(o)}
			case o.FirstSeen.Before(n.FirstSeen):
				n.FirstSeen, n.Observable, n.Queries, n.UIDs = o.FirstSeen, o.ID, n.Queries+q, provUIDs(o)
			default:
				n.Queries += q
			}
		}
	}
	for _, n := range names {
		c.r.Names = append(c.r.Names, *n)
	}
	slices.SortFunc(c.r.Names, func(a, b Name) int { return cmp.Or(a.FirstSeen.Compare(b.FirstSeen), strings.Compare(a.Name, b.Name)) })
	slices.SortFunc(c.r.Orders, func(a, b Order) int { return cmp.Or(a.At.Compare(b.At), strings.Compare(a.Observable, b.Observable)) })
	slices.SortFunc(c.r.Attacks, func(a, b Attack) int {
		return cmp.Or(a.Start.Compare(b.Start), strings.Compare(a.Observable, b.Observable))
	})
	for i := range c.r.Attacks {
		c.r.Attacks[i].OrderObservable = orderRecord(orderOf[c.r.Attacks[i].Order], &c.r.Attacks[i])
	}
}

// provUIDs are the connections an observable's provenance names, at most
// maxUIDs: the uids of their lines in the lease's flow logs.
func provUIDs(o *records.Observable) []string {
	var out []string
	for _, p := range o.Provenance {
		if p.UID != "" && len(out) < maxUIDs && !slices.Contains(out, p.UID) {
			out = append(out, p.UID)
		}
	}
	return out
}

// orderRecord is the record of the order an attack carried out, among the
// c2-commands of its value: the one of the attack's cycle first sighted
// last before the attack, none if there is none.
func orderRecord(orders []*records.Observable, a *Attack) string {
	best := ""
	var bestAt time.Time
	for _, o := range orders {
		if o.Cycle != a.Cycle || o.FirstSeen.After(a.Start) {
			continue
		}
		if best == "" || o.FirstSeen.After(bestAt) || o.FirstSeen.Equal(bestAt) && o.ID < best {
			best, bestAt = o.ID, o.FirstSeen
		}
	}
	return best
}

// tally is what some connections add up to, by hour (Unix hours).
type tally struct {
	hours map[int64]*hourTally
	c2    map[string]*c2Tally
}

type hourTally struct {
	conns, est int64
	checkins   map[string]*[2]int64 // C2 -> answered, sinkholed
	scans      map[string]*scanTally
	estimated  bool
}

type scanTally struct {
	conns       int64
	first, last int64 // Unix ns
	rate        float64
}

type c2Tally struct {
	answered, sinkholed int64
	first, last         int64
	firstConns          []connAt // the earliest, at most maxUIDs
}

// connAt is a connection by its uid, and its start (Unix ns).
type connAt struct {
	ts  int64
	uid string
}

// maxUIDs bounds the connections the report names for one thing it shows.
const maxUIDs = 8

// keepFirst adds c to the earliest connections of ct, in start order, if
// it is one of the first maxUIDs.
func (ct *c2Tally) keepFirst(ts int64, uid []byte) {
	n := len(ct.firstConns)
	if n == maxUIDs && ts >= ct.firstConns[n-1].ts || len(uid) == 0 {
		return
	}
	i, _ := slices.BinarySearchFunc(ct.firstConns, ts, func(c connAt, ts int64) int { return cmp.Compare(c.ts, ts) })
	ct.firstConns = slices.Insert(ct.firstConns, i, connAt{ts: ts, uid: string(uid)})
	if len(ct.firstConns) > maxUIDs {
		ct.firstConns = ct.firstConns[:maxUIDs]
	}
}

func newTally() *tally { return &tally{hours: map[int64]*hourTally{}, c2: map[string]*c2Tally{}} }

func (t *tally) hour(ns int64) *hourTally {
	k := ns / int64(time.Hour)
	if ns < 0 {
		k--
	}
	h := t.hours[k]
	if h == nil {
		h = &hourTally{checkins: map[string]*[2]int64{}, scans: map[string]*scanTally{}}
		t.hours[k] = h
	}
	return h
}

func (t *tally) checkIn(value string, ns int64, answered bool) {
	ci := t.hour(ns).checkins[value]
	if ci == nil {
		ci = &[2]int64{}
		t.hour(ns).checkins[value] = ci
	}
	ct := t.c2[value]
	if ct == nil {
		ct = &c2Tally{first: ns, last: ns}
		t.c2[value] = ct
	}
	if answered {
		ci[0]++
		ct.answered++
	} else {
		ci[1]++
		ct.sinkholed++
	}
	ct.first, ct.last = min(ct.first, ns), max(ct.last, ns)
}

func (t *tally) scan(target string, ns int64, n int64) {
	h := t.hour(ns)
	s := h.scans[target]
	if s == nil {
		s = &scanTally{first: ns, last: ns}
		h.scans[target] = s
	}
	s.conns += n
	s.first, s.last = min(s.first, ns), max(s.last, ns)
}

func (t *tally) merge(o *tally) {
	for k, oh := range o.hours {
		h := t.hours[k]
		if h == nil {
			t.hours[k] = oh
			continue
		}
		h.conns += oh.conns
		h.est += oh.est
		h.estimated = h.estimated || oh.estimated
		for v, ci := range oh.checkins {
			if cur := h.checkins[v]; cur != nil {
				cur[0] += ci[0]
				cur[1] += ci[1]
			} else {
				h.checkins[v] = ci
			}
		}
		for v, s := range oh.scans {
			if cur := h.scans[v]; cur != nil {
				cur.conns += s.conns
				cur.first, cur.last = min(cur.first, s.first), max(cur.last, s.last)
				cur.rate = max(cur.rate, s.rate)
			} else {
				h.scans[v] = s
			}
		}
	}
	for v, oc := range o.c2 {
		if cur := t.c2[v]; cur != nil {
			cur.answered += oc.answered
			cur.sinkholed += oc.sinkholed
			cur.first, cur.last = min(cur.first, oc.first), max(cur.last, oc.last)
			for _, c := range oc.firstConns {
				cur.keepFirst(c.ts, []byte(c.uid))
			}
		} else {
			t.c2[v] = oc
		}
	}
}

// flowJob is one flow log to read, with what its connections are matched
// against.
type flowJob struct {
	art   *records.Artifact
	lease string
	scans []scanKey
}

// traffic adds up the connections of the flow logs by hour: all of them,
// the check-ins to each C2 (answered or sinkholed), the scans' rates; the
// cycles without a flow log are estimated from their observables.
func (c *collector) traffic() error {
	var jobs []flowJob
	for _, cy := range c.cycles {
		for _, a := range c.flowLogs[cy.ID] {
			jobs = append(jobs, flowJob{art: a, lease: cy.Lease, scans: c.scans[cy.ID]})
		}
	}
	total, err := c.readLogs(jobs)
	if err != nil {
		return err
	}
	var estimated []string
	for _, cy := range c.cycles {
		if len(c.flowLogs[cy.ID]) > 0 || c.analyses[cy.ID] == nil {
			continue
		}
		estimated = append(estimated, cy.ID)
		total.merge(c.estimate(cy))
	}
	if len(estimated) > 0 {
		c.note("%d cycle(s) have no flow log (pruned by retention, or parsed before flow logs existed; the first is %s): "+
			"their hours come from the observables: check-ins from the connection starts "+
			"each C2's observable keeps (the latest 256) and scans spread evenly between their first and last sighting, without "+
			"connection counts", len(estimated), estimated[0])
	}
	c.hours(total)
	return nil
}

// readLogs reads the flow logs on every CPU and adds their connections up.
func (c *collector) readLogs(jobs []flowJob) (*tally, error) {
	total := newTally()
	if len(jobs) == 0 {
		return total, nil
	}
	var mu sync.Mutex
	var firstErr error
	next := make(chan flowJob)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := newTally()
			fr, err := flowlog.NewReader()
			if err != nil {
				mu.Lock()
				firstErr = cmp.Or(firstErr, err)
				mu.Unlock()
			}
			for j := range next {
				if fr == nil {
					continue
				}
				if err := c.readLog(fr, j, t); err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
				}
			}
			if fr != nil {
				fr.Close()
			}
			mu.Lock()
			total.merge(t)
			mu.Unlock()
		}()
	}
	for _, j := range jobs {
		if c.ctx.Err() != nil {
			break
		}
		next <- j
	}
	close(next)
	wg.Wait()
	if err := c.ctx.Err(); err != nil {
		return nil, err
	}
	return total, firstErr
}

// estimate is what a cycle without a flow log adds up to, from its
// observables: the C2s' connection starts within the cycle and its scans
// spread over their span.
func (c *collector) estimate(cy *records.Cycle) *tally {
	t := newTally()
	from := cy.RequestedAt
	if cy.StartedAt != nil {
		from = *cy.StartedAt
	}
	to := c.r.To
	if cy.CompletedAt != nil {
		to = *cy.CompletedAt
	}
	in := func(s time.Time) bool { return !s.Before(from) && !s.After(to) }
	for value, obs := range c.eps {
		for _, o := range obs {
			if o.Lease != cy.Lease || o.Endpoint == nil {
				continue
			}
			for _, s := range o.Endpoint.Starts {
				if in(s) {
					t.checkIn(value, s.UnixNano(), c.forwarded(cy.Lease, value, s))
				}
			}
		}
	}
	for _, k := range c.scans[cy.ID] {
		spreadScan(t, k.obs)
	}
	for _, h := range t.hours {
		h.estimated = true
	}
	return t
}

// spreadScan spreads a scan observable's connections evenly over the
// hours between its first and last sighting, at its rate.
func spreadScan(t *tally, o *records.Observable) {
	first, last := o.FirstSeen.UnixNano(), max(o.LastSeen.UnixNano(), o.FirstSeen.UnixNano())
	span := float64(last - first + 1)
	var done int64
	for at := first; at <= last; {
		end := min((at/int64(time.Hour)+1)*int64(time.Hour), last+1)
		upto := int64(math.Round(float64(o.Scan.Conns) * float64(end-first) / span))
		t.scan(o.Value, at, upto-done)
		t.hour(at).scans[o.Value].rate = o.Scan.Rate
		done, at = upto, end
	}
}

// hours turns the tally into the report's hours, and the C2s' totals.
func (c *collector) hours(t *tally) {
	firstScan := map[string]int64{}
	for _, h := range t.hours {
		for v, s := range h.scans {
			if f, ok := firstScan[v]; !ok || s.first < f {
				firstScan[v] = s.first
			}
		}
	}
	for v := range firstScan {
		c.r.ScanTargets = append(c.r.ScanTargets, v)
	}
	slices.SortFunc(c.r.ScanTargets, func(a, b string) int { return cmp.Or(cmp.Compare(firstScan[a], firstScan[b]), strings.Compare(a, b)) })
	newNames := map[int64][]string{}
	for _, n := range c.r.Names {
		k := n.FirstSeen.Truncate(time.Hour).Unix() / 3600
		newNames[k] = append(newNames[k], n.Name)
	}
	keys := make([]int64, 0, len(t.hours)+len(newNames))
	for k := range t.hours {
		keys = append(keys, k)
	}
	for k := range newNames {
		if t.hours[k] == nil {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		out := Hour{Hour: time.Unix(k*3600, 0).UTC(), NewNames: newNames[k]}
		if h := t.hours[k]; h != nil {
			out.Connections, out.Established, out.Estimated = h.conns, h.est, h.estimated
			for _, v := range c.r.C2s {
				if ci := h.checkins[v.Value]; ci != nil {
					out.CheckIns = append(out.CheckIns, HourCheckIns{C2: v.Value, Answered: ci[0], Sinkholed: ci[1]})
				}
			}
			for _, v := range c.r.ScanTargets {
				if s := h.scans[v]; s != nil {
					rate := s.rate
					if rate == 0 {
						rate = float64(s.conns) / max(time.Duration(s.last-s.first).Seconds(), 1)
					}
					out.Scans = append(out.Scans, HourScan{Target: v, Conns: s.conns, Rate: round(rate, 3)})
				}
			}
		}
		c.r.Hours = append(c.r.Hours, out)
	}
	for i := range c.r.C2s {
		v := &c.r.C2s[i]
		if ct := t.c2[v.Value]; ct != nil {
			v.Answered, v.Sinkholed, v.CheckIns = ct.answered, ct.sinkholed, ct.answered+ct.sinkholed
			v.First, v.Last = time.Unix(0, ct.first).UTC(), time.Unix(0, ct.last).UTC()
			for _, c := range ct.firstConns {
				v.UIDs = append(v.UIDs, c.uid)
			}
		}
	}
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}
