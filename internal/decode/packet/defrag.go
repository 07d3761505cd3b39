package packet

// IP reassembly bounds: datagrams in flight, their size, and how long an
// incomplete one is kept.
const (
	maxFragDatagrams = 256
	maxDatagram      = 65535
	maxFragPieces    = 64
	fragTimeout      = 30e9
)

type fragKey struct {
	src, dst addr
	id       uint32
	proto    uint8
	v6       bool
}

type span struct{ lo, hi int }

type fragBuf struct {
	data  []byte
	have  []span
	total int // -1 until the last fragment arrives
	first int64
}

type defrag struct {
	m   map[fragKey]*fragBuf
	out []byte
}

// add stores one fragment and returns the reassembled payload once all of
// it has arrived (valid until the next call), or nil.
func (d *defrag) add(k fragKey, off int, more bool, b []byte, ts int64) []byte {
	if off+len(b) > maxDatagram || (more && len(b) == 0) {
		return nil
	}
	fb := d.m[k]
	if fb == nil {
		if len(d.m) >= maxFragDatagrams {
			d.expire(ts)
		}
		fb = &fragBuf{total: -1, first: ts}
		d.m[k] = fb
	}
	if len(fb.have) >= maxFragPieces {
		delete(d.m, k)
		return nil
	}
	if end := off + len(b); end > len(fb.data) {
		fb.data = append(fb.data, make([]byte, end-len(fb.data))...)
	}
	copy(fb.data[off:], b)
	fb.have = append(fb.have, span{off, off + len(b)})
	if !more {
		fb.total = off + len(b)
	}
	if fb.total < 0 || !covered(fb.have, fb.total) {
		return nil
	}
	delete(d.m, k)
	d.out = append(d.out[:0], fb.data[:fb.total]...)
	return d.out
}

// covered reports whether the spans cover [0, total).
func covered(spans []span, total int) bool {
	reach := 0
	for changed := true; changed && reach < total; {
		changed = false
		for _, s := range spans {
			if s.lo <= reach && s.hi > reach {
				reach, changed = s.hi, true
			}
		}
	}
	return reach >= total
}

// expire drops datagrams older than the timeout, or one arbitrary datagram
// when none is that old.
func (d *defrag) expire(now int64) {
	for k, fb := range d.m {
		if now-fb.first > fragTimeout {
			delete(d.m, k)
		}
	}
	if len(d.m) >= maxFragDatagrams {
		for k := range d.m {
			delete(d.m, k)
			break
		}
	}
}
