package leasereport

import (
	"math"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// histBins is the number of bins of an inter-arrival histogram's range.
const histBins = 24

// beacons makes each C2's inter-arrival histogram from the connection
// starts its endpoint observables keep: what the classifier estimated the
// period from (the latest starts of each observable; starts less than a
// second apart are one connection a sensor split, as for the classifier).
func (c *collector) beacons() {
	for i := range c.r.C2s {
		v := &c.r.C2s[i]
		var seqs [][]time.Time
		for _, o := range c.eps[v.Value] {
			if o.Endpoint != nil {
				v.Observables = append(v.Observables, o.ID)
				seqs = append(seqs, o.Endpoint.Starts)
			}
		}
		var iv []float64
		for _, seq := range seqs {
			var prev time.Time
			for _, s := range slices.SortedFunc(slices.Values(seq), time.Time.Compare) {
				if !c.in(s) {
					continue
				}
				if !prev.IsZero() {
					d := s.Sub(prev)
					if d < time.Second {
						continue
					}
					iv = append(iv, d.Seconds())
				}
				prev = s
			}
		}
		slices.Sort(v.Observables)
		v.Intervals = len(iv)
		if len(iv) == 0 {
			continue
		}
		med := median(iv)
		dev := make([]float64, len(iv))
		for j, x := range iv {
			dev[j] = math.Abs(x - med)
		}
		mad := median(dev)
		v.Median = round(med, 3)
		if med > 0 {
			v.Jitter = round(mad/med, 3)
		}
		v.Histogram = histogram(iv, med, mad)
	}
}

// histogram bins intervals over the median ± the larger of four median
// absolute deviations and a quarter of the median; the intervals outside
// (a gap between cycles, a missed check-in) are two more bins, left out
// when empty.
func histogram(iv []float64, med, mad float64) []Bin {
	half := max(4*mad, med/4, 0.5)
	lo, hi := max(med-half, 0), med+half
	w := (hi - lo) / histBins
	bins := make([]Bin, histBins)
	for k := range bins {
		bins[k] = Bin{From: round(lo+float64(k)*w, 3), To: round(lo+float64(k+1)*w, 3)}
	}
	below, above := Bin{From: 0, To: round(lo, 3), Outside: true}, Bin{From: round(hi, 3), Outside: true}
	for _, x := range iv {
		switch {
		case x < lo:
			below.Count++
		case x >= hi:
			above.Count++
		default:
			bins[min(int((x-lo)/w), histBins-1)].Count++
		}
	}
	var out []Bin
	if below.Count > 0 {
		out = append(out, below)
	}
	out = append(out, bins...)
	if above.Count > 0 {
		out = append(out, above)
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// behaviour sums up the behaviour summaries of the cycles' analyses: the
// latest process tree, and every dropped file, technique, tried
// destination and listener with how many cycles saw it.
func (c *collector) behaviour() {
	var b *Behaviour
	index := map[[2]string]int{}
	for _, cy := range c.cycles {
		a := c.analyses[cy.ID]
		if a == nil || a.Behaviour == nil {
			continue
		}
		if b == nil {
			b = &Behaviour{}
		}
		s := a.Behaviour
		b.Cycle, b.Analysis, b.Cycles = cy.ID, a.ID, append(b.Cycles, cy.ID)
		b.Processes = b.Processes[:0]
		s.Tree(func(depth int, n records.ProcessNode) {
			b.Processes = append(b.Processes, Process{Depth: depth, PID: n.PID, PPID: n.PPID, Exe: n.Exe, Argv: n.Argv, Names: n.Names, Exit: n.Exit})
		})
		for _, l := range []struct {
			what string
			vs   []string
		}{{"dropped", s.Dropped}, {"persistence", s.Persistence}, {"evasion", s.Evasion}, {"tried", s.Tried}, {"listening", s.Listening}} {
			for _, v := range l.vs {
				k := [2]string{l.what, v}
				if i, ok := index[k]; ok {
					b.Items[i].Cycles++
					continue
				}
				index[k] = len(b.Items)
				b.Items = append(b.Items, BehaviourItem{What: l.what, Value: v, Cycles: 1, First: cy.ID})
			}
		}
		for _, d := range s.DroppedSamples {
			if !slices.Contains(b.DroppedSamples, d) {
				b.DroppedSamples = append(b.DroppedSamples, d)
			}
		}
	}
	c.r.Behaviour = b
}
