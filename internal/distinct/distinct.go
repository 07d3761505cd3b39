// Package distinct counts distinct 64-bit keys in bounded memory: exactly
// up to Exact keys, then with a HyperLogLog sketch whose registers can be
// written out and united with those of another count. A scan's
// destinations (flowlog), their union over a lease's cycles (observe) and
// the processes of a trace (behave) are counted with it.
package distinct

import (
	"encoding/base64"
	"errors"
	"math"
	"math/bits"
	"net/netip"
)

// Exact keys are counted exactly; beyond, HyperLogLog with 2^sketchBits
// registers (standard error 1.04/√4096, about 1.6%). The sketch starts once
// a count is large enough to be a scan, so that the many small counts of a
// capture cost a few bytes each.
const (
	Exact      = 4096
	sketchBits = 12
	sketchSize = 1 << sketchBits
)

// Counter counts distinct 64-bit keys; its zero value is an empty count.
type Counter struct {
	exact  map[uint64]struct{}
	n      int64 // exact count while exact is not nil or no sketch
	sketch Sketch
}

// Add counts k and reports whether it was new (unknown once the count is
// estimated: then it returns false).
func (d *Counter) Add(k uint64) bool {
	if d.sketch != nil {
		d.sketch.add(k)
	}
	if d.exact == nil {
		if d.n >= Exact {
			return false
		}
		d.exact = make(map[uint64]struct{}, 8)
	}
	if _, ok := d.exact[k]; ok {
		return false
	}
	d.exact[k] = struct{}{}
	d.n++
	if d.n >= Exact {
		d.StartSketch()
		d.exact = nil // from here on, the sketch counts
	}
	return true
}

// AtLeast reports whether at least n keys were counted (n at most Exact):
// cheaper than Count, which estimates once beyond Exact.
func (d *Counter) AtLeast(n int64) bool { return d.n >= n }

// StartSketch begins the sketch now, with the keys counted so far, so that
// Sketch is not nil however few keys there are: a count that may be united
// with others later (a scan's) starts it when it matters.
func (d *Counter) StartSketch() {
	if d.sketch != nil {
		return
	}
	d.sketch = NewSketch()
	for k := range d.exact {
		d.sketch.add(k)
	}
}

// Count is the number of distinct keys, and whether it is an estimate (once
// beyond Exact).
func (d *Counter) Count() (n int64, estimated bool) {
	if d.exact == nil && d.n >= Exact {
		return d.sketch.Estimate(), true
	}
	return d.n, false
}

// Sketch is the count's registers once it is beyond Exact, nil before.
func (d *Counter) Sketch() Sketch { return d.sketch }

// Sketch is a HyperLogLog's registers.
type Sketch []uint8

// NewSketch is an empty sketch, to unite others into.
func NewSketch() Sketch { return make(Sketch, sketchSize) }

func (s Sketch) add(k uint64) {
	h := Mix64(k)
	i := h >> (64 - sketchBits)
	rank := uint8(bits.LeadingZeros64(h<<sketchBits|1<<(sketchBits-1)) + 1)
	s[i] = max(s[i], rank)
}

// Estimate is HyperLogLog's estimate with linear counting for small sets.
func (s Sketch) Estimate() int64 {
	m := float64(len(s))
	var sum float64
	zeros := 0
	for _, r := range s {
		sum += math.Ldexp(1, -int(r))
		if r == 0 {
			zeros++
		}
	}
	alpha := 0.7213 / (1 + 1.079/m)
	e := alpha * m * m / sum
	if e <= 2.5*m && zeros > 0 {
		e = m * math.Log(m/float64(zeros))
	}
	return int64(math.Round(e))
}

// Union folds o into s, register by register.
func (s Sketch) Union(o Sketch) {
	for i, r := range o {
		s[i] = max(s[i], r)
	}
}

// String is the registers in base64, as a scan observable keeps them.
func (s Sketch) String() string { return base64.StdEncoding.EncodeToString(s) }

// ParseSketch reads what String wrote.
func ParseSketch(text string) (Sketch, error) {
	b, err := base64.StdEncoding.DecodeString(text)
	if err != nil || len(b) != sketchSize {
		return nil, errors.New("malformed sketch")
	}
	return b, nil
}

// Mix64 is SplitMix64's finaliser: a fixed hash, so that sketches written
// by different runs can be united.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// AddrKey is a 64-bit key of an address.
func AddrKey(a netip.Addr) uint64 {
	b := a.As16()
	var hi, lo uint64
	for i := 0; i < 8; i++ {
		hi = hi<<8 | uint64(b[i])
		lo = lo<<8 | uint64(b[8+i])
	}
	return Mix64(hi) ^ lo
}
