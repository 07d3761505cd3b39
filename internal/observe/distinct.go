package observe

import (
	"encoding/base64"
	"errors"
	"math"
	"math/bits"
	"net/netip"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// Distinct counting of a scan's destinations: exact up to ExactDistinct,
// then HyperLogLog with 2^sketchBits registers (standard error 1.04/√4096,
// about 1.6%). The sketch starts once a group is large enough to be a scan,
// so that the many small groups of a capture cost a few bytes each.
const (
	ExactDistinct = 4096
	sketchBits    = 12
	sketchSize    = 1 << sketchBits
)

// distinct counts distinct 64-bit keys.
type distinct struct {
	exact  map[uint64]struct{}
	n      int64 // exact count while exact is not nil or no sketch
	sketch sketch
}

// add counts k and reports whether it was new (always true, and unknown,
// once the count is estimated; then it returns false).
func (d *distinct) add(k uint64) bool {
	if d.sketch != nil {
		d.sketch.add(k)
	}
	if d.exact == nil {
		if d.n >= ExactDistinct {
			return false
		}
		d.exact = make(map[uint64]struct{}, 8)
	}
	if _, ok := d.exact[k]; ok {
		return false
	}
	d.exact[k] = struct{}{}
	d.n++
	if d.n >= ExactDistinct {
		d.startSketch()
		d.exact = nil // from here on, the sketch counts
	}
	return true
}

// startSketch begins the sketch with the keys counted so far.
func (d *distinct) startSketch() {
	if d.sketch != nil {
		return
	}
	d.sketch = make(sketch, sketchSize)
	for k := range d.exact {
		d.sketch.add(k)
	}
}

// count is the exact count, or the estimate once beyond ExactDistinct.
func (d *distinct) count() (n int64, estimated bool) {
	if d.exact == nil && d.n >= ExactDistinct {
		return d.sketch.estimate(), true
	}
	return d.n, false
}

// sketch is a HyperLogLog's registers.
type sketch []uint8

func (s sketch) add(k uint64) {
	h := mix64(k)
	i := h >> (64 - sketchBits)
	rank := uint8(bits.LeadingZeros64(h<<sketchBits|1<<(sketchBits-1)) + 1)
	s[i] = max(s[i], rank)
}

// estimate is HyperLogLog's estimate with linear counting for small sets.
func (s sketch) estimate() int64 {
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

// union folds o into s, register by register.
func (s sketch) union(o sketch) {
	for i, r := range o {
		s[i] = max(s[i], r)
	}
}

func (s sketch) String() string { return base64.StdEncoding.EncodeToString(s) }

func parseSketch(text string) (sketch, error) {
	b, err := base64.StdEncoding.DecodeString(text)
	if err != nil || len(b) != sketchSize {
		return nil, errors.New("malformed scan sketch")
	}
	return b, nil
}

// mix64 is SplitMix64's finaliser: a fixed hash, so that sketches written
// by different runs can be united.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// addrKey is a 64-bit key of an address.
func addrKey(a netip.Addr) uint64 {
	b := a.As16()
	var hi, lo uint64
	for i := 0; i < 8; i++ {
		hi = hi<<8 | uint64(b[i])
		lo = lo<<8 | uint64(b[8+i])
	}
	return mix64(hi) ^ lo
}

// ScanDests is the distinct destinations of several sightings of a scan
// (the cycles of a lease): the estimate of their united sketches, or the
// largest count when one has no sketch.
func ScanDests(scans []*records.ScanInfo) int64 {
	union := make(sketch, sketchSize)
	var most int64
	united := true
	for _, s := range scans {
		most = max(most, s.Dests)
		sk, err := parseSketch(s.Sketch)
		if err != nil {
			united = false
			continue
		}
		union.union(sk)
	}
	if !united || len(scans) == 0 {
		return most
	}
	if len(scans) == 1 {
		return scans[0].Dests // exact up to ExactDistinct
	}
	return max(union.estimate(), most)
}
