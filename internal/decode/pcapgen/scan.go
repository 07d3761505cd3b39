package pcapgen

import (
	"cmp"
	"net/netip"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// PacketWriter takes frames as a capture file would: pcapgo's writers are
// one, Sched is another.
type PacketWriter interface {
	WritePacket(ci gopacket.CaptureInfo, data []byte) error
}

// To returns a generator writing frames to w instead of a capture file
// (no header is written; pcapng is not available this way).
func To(w PacketWriter, opt Options) *Gen {
	opt.Link = cmp.Or(opt.Link, layers.LinkTypeEthernet)
	opt.NG = false
	return &Gen{opt: opt, out: w, T: Start, Step: time.Millisecond, buf: gopacket.NewSerializeBuffer()}
}

// Sched holds frames and writes them to Out in timestamp order. A
// scenario generates its conversations one after the other, each with its
// own timestamps; a capture has them interleaved (a scan's answers arrive
// while the next SYNs go out), and so does Out, as long as every
// conversation starting at t is generated before Release(t) is called.
type Sched struct {
	Out  PacketWriter
	h    []held
	seq  uint64
	free [][]byte
}

type held struct {
	ts   time.Time
	seq  uint64 // ties keep the order frames were given in
	data []byte
}

func (a held) before(b held) bool {
	if !a.ts.Equal(b.ts) {
		return a.ts.Before(b.ts)
	}
	return a.seq < b.seq
}

// WritePacket holds a copy of data until its time is released.
func (s *Sched) WritePacket(ci gopacket.CaptureInfo, data []byte) error {
	var b []byte
	if n := len(s.free); n > 0 {
		b, s.free = s.free[n-1][:0], s.free[:n-1]
	}
	s.seq++
	s.push(held{ts: ci.Timestamp, seq: s.seq, data: append(b, data...)})
	return nil
}

// Release writes every held frame stamped before t, oldest first.
func (s *Sched) Release(t time.Time) error {
	for len(s.h) > 0 && s.h[0].ts.Before(t) {
		if err := s.writeNext(); err != nil {
			return err
		}
	}
	return nil
}

// Drain writes every held frame.
func (s *Sched) Drain() error {
	for len(s.h) > 0 {
		if err := s.writeNext(); err != nil {
			return err
		}
	}
	return nil
}

func (s *Sched) writeNext() error {
	f := s.pop()
	err := s.Out.WritePacket(gopacket.CaptureInfo{Timestamp: f.ts, CaptureLength: len(f.data), Length: len(f.data)}, f.data)
	s.free = append(s.free, f.data)
	return err
}

// Held is the number of frames not yet written.
func (s *Sched) Held() int { return len(s.h) }

func (s *Sched) push(f held) {
	s.h = append(s.h, f)
	for i := len(s.h) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.h[i].before(s.h[p]) {
			break
		}
		s.h[i], s.h[p] = s.h[p], s.h[i]
		i = p
	}
}

func (s *Sched) pop() held {
	top := s.h[0]
	n := len(s.h) - 1
	s.h[0] = s.h[n]
	s.h = s.h[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && s.h[l].before(s.h[m]) {
			m = l
		}
		if r := l + 1; r < n && s.h[r].before(s.h[m]) {
			m = r
		}
		if m == i {
			break
		}
		s.h[i], s.h[m] = s.h[m], s.h[i]
		i = m
	}
	return top
}

// Scannable reports whether an Internet-wide scanner would send to a:
// public unicast IPv4, i.e. not 0/8, 10/8, 100.64/10, 127/8, 169.254/16,
// 172.16/12, 192.168/16, 198.18/15, 224/4 and above — nor the three
// documentation networks, which stand in for the Internet's benign and C2
// hosts in the lab's tests and must not be confused with scan targets.
func Scannable(a netip.Addr) bool {
	if !a.Is4() {
		return false
	}
	b := a.As4()
	switch {
	case b[0] == 0, b[0] == 10, b[0] == 127, b[0] >= 224,
		b[0] == 100 && b[1]&0xc0 == 64,
		b[0] == 169 && b[1] == 254,
		b[0] == 172 && b[1]&0xf0 == 16,
		b[0] == 192 && b[1] == 168,
		b[0] == 198 && b[1]&0xfe == 18,
		b[0] == 192 && b[1] == 0 && b[2] == 2,
		b[0] == 198 && b[1] == 51 && b[2] == 100,
		b[0] == 203 && b[1] == 0 && b[2] == 113:
		return false
	}
	return true
}

// Targets yields distinct pseudo-random scannable addresses, as a scanner
// walking the Internet does: a keyed permutation of the 32-bit space is
// walked in order, so no address comes twice, without a set of those
// already drawn (8 million of them would cost 100+ MB).
type Targets struct {
	keys [4]uint32
	i    uint64
}

// NewTargets starts the permutation chosen by seed.
func NewTargets(seed uint64) *Targets {
	t := &Targets{}
	for i := range t.keys {
		seed += 0x9e3779b97f4a7c15 // splitmix64
		z := seed
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		t.keys[i] = uint32(z ^ z>>31)
	}
	return t
}

// Next is the next address; false once all 2^32 have been walked.
func (t *Targets) Next() (netip.Addr, bool) {
	for t.i < 1<<32 {
		v := t.permute(uint32(t.i))
		t.i++
		a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		if Scannable(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// permute is a four-round Feistel network on 16-bit halves: a bijection
// whatever the round function.
func (t *Targets) permute(v uint32) uint32 {
	l, r := uint16(v>>16), uint16(v)
	for _, k := range t.keys {
		f := (uint32(r) ^ k) * 0x45d9f3b
		l, r = r, l^uint16(f>>16^f)
	}
	return uint32(l)<<16 | uint32(r)
}
