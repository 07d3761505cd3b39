// Package capfile reads packet captures: pcap (either byte order, micro- or
// nanosecond timestamps) and pcapng, bounds-checked and without allocating
// per packet.
package capfile

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// Limits that keep a hostile file from costing unbounded memory.
const (
	// MaxCaplen is the largest captured packet accepted (pcap's usual
	// snaplen is 262144).
	MaxCaplen = 262144
	// maxBlock bounds a pcapng packet or interface block held in memory.
	maxBlock = 1 << 20
	// maxSkip bounds any other pcapng block, which is skipped unread.
	maxSkip = 1 << 30
	// maxIfaces bounds the interfaces of a pcapng section.
	maxIfaces = 4096
	// BufferSize is the read buffer; packets are returned as slices of it.
	// It holds the largest block read whole and a little more: a larger
	// one only costs fresh pages and falls out of the CPU's caches before
	// its packets are decoded.
	BufferSize = maxBlock + 64<<10
)

// ErrBadData marks every error about the content of a capture.
var ErrBadData = errors.New("bad capture")

// ErrCutShort is a capture that ends inside a packet's record: what a
// crash or a full disk leaves behind its writer. Every packet before the
// cut is whole and was returned; it is not an ErrBadData error.
var ErrCutShort = errors.New("capture cut short")

// Link types the decoder (package packet) reads; packets of any other link
// type are still returned, counted, and reported at the end of the capture.
const (
	LinkNull     = 0
	LinkEthernet = 1
	LinkPPP      = 9
	LinkRawBSD   = 12 // raw IP on some BSDs
	LinkRawOpen  = 14 // raw IP on OpenBSD
	LinkPPPHDLC  = 50 // PPP in HDLC-like framing, or Cisco PPP
	LinkPPPoE    = 51 // PPPoE session header, then PPP (LINKTYPE_PPP_ETHER)
	LinkRaw      = 101
	LinkCHDLC    = 104 // Cisco HDLC
	LinkLoop     = 108
	LinkSLL      = 113
	LinkPPPDir   = 204 // PPP after a direction byte
	LinkIPv4     = 228
	LinkIPv6     = 229
	LinkNFLOG    = 239
	LinkSLL2     = 276
)

// Decodable reports whether the decoder reads frames of a link type.
func Decodable(link uint32) bool {
	switch link {
	case LinkNull, LinkEthernet, LinkPPP, LinkRawBSD, LinkRawOpen, LinkPPPHDLC, LinkPPPoE, LinkRaw, LinkCHDLC,
		LinkLoop, LinkSLL, LinkPPPDir, LinkIPv4, LinkIPv6, LinkNFLOG, LinkSLL2:
		return true
	}
	return false
}

// linkNames name the link types a capture point is likely to produce and
// the decoder does not read.
var linkNames = map[uint32]string{
	6: "IEEE 802.5 Token Ring", 10: "FDDI", 105: "IEEE 802.11", 107: "Frame Relay", 119: "IEEE 802.11 Prism",
	127: "IEEE 802.11 radiotap", 163: "IEEE 802.11 AVS", 187: "Bluetooth HCI H4", 189: "Linux USB", 192: "PPI",
	195: "IEEE 802.15.4", 201: "Bluetooth HCI H4 with direction", 215: "IEEE 802.15.4 without FCS", 220: "Linux USB mmapped",
	249: "USBPcap",
}

// LinkError reports, at the end of a capture, the packets of link types the
// decoder does not read. It is an ErrBadData error.
type LinkError struct {
	Link    uint32 // the first such link type seen
	Packets int64  // packets of every such link type
	Others  bool   // other such link types were seen too
}

func (e *LinkError) Error() string {
	s := "s"
	if e.Packets == 1 {
		s = ""
	}
	name := ""
	if n, ok := linkNames[e.Link]; ok {
		name = " (" + n + ")"
	}
	others := ""
	if e.Others {
		others = " and other link types"
	}
	return fmt.Sprintf("%d packet%s of link type %d%s%s not decoded", e.Packets, s, e.Link, name, others)
}

// Is makes a LinkError an ErrBadData error.
func (e *LinkError) Is(target error) bool { return target == ErrBadData }

// Packet is one captured frame. Data is valid until the next call to Next.
type Packet struct {
	N        int64  // 1-based packet number in the file
	TS       int64  // Unix nanoseconds
	LinkType uint32 // pcap LINKTYPE_ value
	OrigLen  int
	Data     []byte
}

type iface struct {
	link   uint32
	resol  uint8 // if_tsresol
	offset int64 // if_tsoffset, seconds
}

// source is what a Reader reads through: a *bufio.Reader, or a file's
// bytes mapped whole (bytesSource).
type source interface {
	Peek(n int) ([]byte, error)
	Discard(n int) (int, error)
	Buffered() int
}

// bytesSource reads from b, a file mapped in memory, a window at a time:
// the pages behind a window are released (MADV_DONTNEED) when the next is
// read, so that a large capture's pages do not all count as the process's
// resident memory. Released pages of a file stay in the page cache, and
// read the file's bytes again if touched.
type bytesSource struct {
	b   []byte
	off int
	// release: b is a mapping whose pages may be released; released is
	// where the pages not yet released start.
	release  bool
	released int
}

// bytesWindow is how much of a mapped capture is read between releases.
const bytesWindow = 4 << 20

func (s *bytesSource) Peek(n int) ([]byte, error) {
	if rest := s.b[s.off:]; n > len(rest) {
		return rest, io.EOF
	}
	return s.b[s.off : s.off+n], nil
}

func (s *bytesSource) Discard(n int) (int, error) {
	var err error
	if rest := len(s.b) - s.off; n > rest {
		n, err = rest, io.EOF
	}
	s.off += n
	if end := s.off &^ (pageSize - 1); s.release && end-s.released >= bytesWindow {
		unix.Madvise(s.b[s.released:end], unix.MADV_DONTNEED)
		s.released = end
	}
	return n, err
}

// pageSize rounds what is released: the smallest page size, which every
// larger one is a multiple of.
const pageSize = 4096

func (s *bytesSource) Buffered() int { return min(len(s.b)-s.off, bytesWindow) }

// Reader reads packets from a pcap or pcapng stream.
type Reader struct {
	br     source
	ng     bool
	big    bool
	nano   bool
	link   uint32
	ifaces []iface
	n      int64
	off    int64
	// win is what of br's buffer a pcap's records are read from without
	// a call into br for each: the bytes br had buffered after the last
	// record read through it, of which used are consumed (and not yet
	// discarded from br).
	win  []byte
	used int
	// undecoded counts the packets of link types the decoder does not read.
	undecoded *LinkError
}

// Magic numbers as they appear in the first four bytes.
var (
	magicMicroLE = []byte{0xd4, 0xc3, 0xb2, 0xa1}
	magicMicroBE = []byte{0xa1, 0xb2, 0xc3, 0xd4}
	magicNanoLE  = []byte{0x4d, 0x3c, 0xb2, 0xa1}
	magicNanoBE  = []byte{0xa1, 0xb2, 0x3c, 0x4d}
	magicNG      = []byte{0x0a, 0x0d, 0x0d, 0x0a}
)

// IsCapture reports whether b starts like a pcap or pcapng file.
func IsCapture(b []byte) bool {
	if len(b) < 4 {
		return false
	}
	for _, m := range [][]byte{magicMicroLE, magicMicroBE, magicNanoLE, magicNanoBE, magicNG} {
		if string(b[:4]) == string(m) {
			return true
		}
	}
	return false
}

// NewReader reads the file header from r. A *bufio.Reader of at least
// BufferSize bytes is used as is.
func NewReader(r io.Reader) (*Reader, error) {
	br, ok := r.(*bufio.Reader)
	if !ok || br.Size() < BufferSize {
		br = bufio.NewReaderSize(r, BufferSize)
	}
	return newReader(br)
}

// NewBytesReader reads a capture held whole in b: packets are slices of b.
func NewBytesReader(b []byte) (*Reader, error) {
	return newReader(&bytesSource{b: b})
}

func newReader(br source) (*Reader, error) {
	rd := &Reader{br: br}
	m, err := br.Peek(4)
	if err != nil {
		return nil, rd.errf("file too short for a capture header")
	}
	switch string(m) {
	case string(magicNG):
		rd.ng = true
		return rd, nil
	case string(magicMicroLE):
	case string(magicMicroBE):
		rd.big = true
	case string(magicNanoLE):
		rd.nano = true
	case string(magicNanoBE):
		rd.big, rd.nano = true, true
	default:
		return nil, rd.errf("not a pcap or pcapng file")
	}
	h, err := br.Peek(24)
	if err != nil {
		return nil, rd.errf("truncated pcap file header")
	}
	rd.link = rd.u32(h[20:24]) & 0x0fffffff // upper bits carry FCS information
	br.Discard(24)
	rd.off = 24
	return rd, nil
}

// Offset is how many bytes of the capture have been read: the end of the
// last packet returned.
func (r *Reader) Offset() int64 { return r.off }

func (r *Reader) u32(b []byte) uint32 {
	if r.big {
		return binary.BigEndian.Uint32(b)
	}
	return binary.LittleEndian.Uint32(b)
}

func (r *Reader) u16(b []byte) uint16 {
	if r.big {
		return binary.BigEndian.Uint16(b)
	}
	return binary.LittleEndian.Uint16(b)
}

func (r *Reader) errf(format string, a ...any) error {
	return fmt.Errorf("%w: offset %d: %s", ErrBadData, r.off, fmt.Sprintf(format, a...))
}

// cutf is the end of a capture inside a record, at the record's offset.
func (r *Reader) cutf(format string, a ...any) error {
	return fmt.Errorf("%w at offset %d: %s", ErrCutShort, r.off, fmt.Sprintf(format, a...))
}

// Next fills p with the next packet. It returns io.EOF at a clean end of
// file, an ErrCutShort error when the file ends inside a record (after the
// file's header), and an ErrBadData error for anything malformed. Packets
// of link types the decoder does not read are returned too; at the end of a
// capture that held any, Next returns a *LinkError instead of io.EOF.
func (r *Reader) Next(p *Packet) error {
	var err error
	if r.ng {
		err = r.nextNG(p)
	} else {
		err = r.nextPcap(p)
	}
	switch {
	case err == nil:
		if !Decodable(p.LinkType) {
			r.count(p.LinkType)
		}
	case err == io.EOF && r.undecoded != nil:
		return r.undecoded
	}
	return err
}

func (r *Reader) count(link uint32) {
	if r.undecoded == nil {
		r.undecoded = &LinkError{Link: link}
	}
	r.undecoded.Packets++
	if link != r.undecoded.Link {
		r.undecoded.Others = true
	}
}

func (r *Reader) nextPcap(p *Packet) error {
	if w := r.win[r.used:]; len(w) >= 16 {
		if caplen := r.u32(w[8:12]); caplen <= MaxCaplen && 16+int(caplen) <= len(w) {
			b := w[:16+caplen]
			r.used += len(b)
			r.record(p, b)
			return nil
		}
	}
	// The record is not wholly in the window (or is bad): through br,
	// which reads more.
	r.br.Discard(r.used)
	r.win, r.used = nil, 0
	h, err := r.br.Peek(16)
	if err != nil {
		if len(h) == 0 && err == io.EOF {
			return io.EOF
		}
		if err == io.EOF {
			return r.cutf("record header after packet %d", r.n)
		}
		return err
	}
	caplen := r.u32(h[8:12])
	if caplen > MaxCaplen {
		return r.errf("packet %d: record length %d exceeds %d", r.n+1, caplen, MaxCaplen)
	}
	b, err := r.br.Peek(16 + int(caplen))
	if err != nil {
		if err == io.EOF {
			return r.cutf("packet %d: %d of %d bytes", r.n+1, len(b)-16, caplen)
		}
		return err
	}
	r.br.Discard(len(b))
	r.record(p, b)
	// Peeking at what is buffered reads nothing: b stays valid.
	r.win, _ = r.br.Peek(r.br.Buffered())
	return nil
}

// record fills p from b, a pcap record (its 16-byte header and data).
func (r *Reader) record(p *Packet, b []byte) {
	sec, frac := int64(r.u32(b[0:4])), int64(r.u32(b[4:8]))
	r.n++
	p.N = r.n
	if r.nano {
		p.TS = sec*1e9 + frac
	} else {
		p.TS = sec*1e9 + frac*1000
	}
	p.LinkType = r.link
	p.OrigLen = int(r.u32(b[12:16]))
	p.Data = b[16:]
	r.off += int64(len(b))
}

func pad4(n uint32) uint32 { return (n + 3) &^ 3 }

func (r *Reader) nextNG(p *Packet) error {
	for {
		h, err := r.br.Peek(12)
		if err != nil {
			if len(h) == 0 && err == io.EOF {
				return io.EOF
			}
			if err == io.EOF && r.off == 0 {
				return r.errf("truncated section header") // the file's own header, as for pcap
			}
			if err == io.EOF {
				return r.cutf("block header after packet %d", r.n)
			}
			return err
		}
		typ := r.u32(h[0:4])
		if typ == 0x0A0D0D0A {
			if err := r.sectionHeader(); err != nil {
				return err
			}
			continue
		}
		blen := r.u32(h[4:8])
		if blen < 12 || blen%4 != 0 {
			return r.errf("block type %#x: bad block length %d", typ, blen)
		}
		switch typ {
		case 1, 2, 3, 6: // interface description, obsolete packet, simple packet, enhanced packet
		default:
			if blen > maxSkip {
				return r.errf("block type %#x: absurd block length %d", typ, blen)
			}
			n, err := r.br.Discard(int(blen))
			if err != nil {
				// Named at the block's start, as every other cut is.
				return r.cutf("block of type %#x: %d of %d bytes", typ, n, blen)
			}
			r.off += int64(n)
			continue
		}
		if blen > maxBlock {
			return r.errf("block type %#x: block length %d exceeds %d", typ, blen, maxBlock)
		}
		b, err := r.br.Peek(int(blen))
		if err != nil {
			if err == io.EOF {
				return r.cutf("block of type %#x: %d of %d bytes", typ, len(b), blen)
			}
			return err
		}
		if r.u32(b[blen-4:]) != blen {
			return r.errf("block type %#x: trailing length does not match %d", typ, blen)
		}
		body := b[8 : blen-4]
		if typ == 1 {
			if err := r.interfaceBlock(body); err != nil {
				return err
			}
			r.br.Discard(int(blen))
			r.off += int64(blen)
			continue
		}
		if err := r.packetBlock(typ, body, p); err != nil {
			return err
		}
		r.br.Discard(int(blen))
		r.off += int64(blen)
		return nil
	}
}

func (r *Reader) sectionHeader() error {
	h, err := r.br.Peek(12)
	if err != nil {
		return r.errf("truncated section header")
	}
	switch binary.LittleEndian.Uint32(h[8:12]) {
	case 0x1A2B3C4D:
		r.big = false
	case 0x4D3C2B1A:
		r.big = true
	default:
		return r.errf("section header: bad byte-order magic")
	}
	blen := r.u32(h[4:8])
	if blen < 28 || blen%4 != 0 || blen > maxSkip {
		return r.errf("section header: bad block length %d", blen)
	}
	n, err := r.br.Discard(int(blen))
	if err != nil {
		if r.off > 0 {
			// A later section (captures appended to one file) whose
			// header the writer did not finish.
			return r.cutf("section header: %d of %d bytes", n, blen)
		}
		return r.errf("truncated section header")
	}
	r.off += int64(n)
	r.ifaces = r.ifaces[:0]
	return nil
}

func (r *Reader) interfaceBlock(body []byte) error {
	if len(body) < 8 {
		return r.errf("interface block too short")
	}
	if len(r.ifaces) >= maxIfaces {
		return r.errf("more than %d interfaces", maxIfaces)
	}
	ifc := iface{link: uint32(r.u16(body[0:2])), resol: 6}
	opts := body[8:]
	for len(opts) >= 4 {
		code, l := r.u16(opts[0:2]), uint32(r.u16(opts[2:4]))
		if code == 0 {
			break
		}
		if 4+pad4(l) > uint32(len(opts)) {
			return r.errf("interface block: option %d overruns the block", code)
		}
		v := opts[4 : 4+l]
		switch {
		case code == 9 && l >= 1:
			ifc.resol = v[0]
		case code == 14 && l >= 8:
			if r.big {
				ifc.offset = int64(binary.BigEndian.Uint64(v))
			} else {
				ifc.offset = int64(binary.LittleEndian.Uint64(v))
			}
		}
		opts = opts[4+pad4(l):]
	}
	r.ifaces = append(r.ifaces, ifc)
	return nil
}

func (r *Reader) packetBlock(typ uint32, body []byte, p *Packet) error {
	var ifID, caplen, orig uint32
	var ts uint64
	var data []byte
	switch typ {
	case 6:
		if len(body) < 20 {
			return r.errf("enhanced packet block too short")
		}
		ifID = r.u32(body[0:4])
		ts = uint64(r.u32(body[4:8]))<<32 | uint64(r.u32(body[8:12]))
		caplen, orig = r.u32(body[12:16]), r.u32(body[16:20])
		if caplen > MaxCaplen || pad4(caplen) > uint32(len(body)-20) {
			return r.errf("packet %d: captured length %d does not fit its block", r.n+1, caplen)
		}
		data = body[20 : 20+caplen]
	case 2:
		if len(body) < 20 {
			return r.errf("packet block too short")
		}
		ifID = uint32(r.u16(body[0:2]))
		ts = uint64(r.u32(body[4:8]))<<32 | uint64(r.u32(body[8:12]))
		caplen, orig = r.u32(body[12:16]), r.u32(body[16:20])
		if caplen > MaxCaplen || pad4(caplen) > uint32(len(body)-20) {
			return r.errf("packet %d: captured length %d does not fit its block", r.n+1, caplen)
		}
		data = body[20 : 20+caplen]
	case 3:
		if len(body) < 4 {
			return r.errf("simple packet block too short")
		}
		orig = r.u32(body[0:4])
		caplen = min(orig, uint32(len(body)-4), MaxCaplen)
		data = body[4 : 4+caplen]
	}
	if int(ifID) >= len(r.ifaces) {
		return r.errf("packet %d: interface %d not described", r.n+1, ifID)
	}
	ifc := r.ifaces[ifID]
	r.n++
	p.N = r.n
	p.TS = scaleTS(ts, ifc.resol) + ifc.offset*1e9
	p.LinkType = ifc.link
	p.OrigLen = int(orig)
	p.Data = data
	return nil
}

// scaleTS converts a pcapng timestamp in units of the interface's
// resolution (10^-n, or 2^-n with the high bit set) to nanoseconds.
func scaleTS(ts uint64, resol uint8) int64 {
	if resol&0x80 != 0 {
		k := uint(resol & 0x7f)
		if k == 0 {
			return int64(ts * 1e9)
		}
		if k > 63 {
			return 0
		}
		return int64((ts>>k)*1e9 + ((ts&(1<<k-1))*1e9)>>k)
	}
	k := int(resol)
	switch {
	case k == 9:
		return int64(ts)
	case k < 9:
		mul := uint64(1)
		for i := k; i < 9; i++ {
			mul *= 10
		}
		return int64(ts * mul)
	default:
		div := uint64(1)
		for i := 9; i < k && i < 29; i++ {
			if div > ^uint64(0)/10 {
				return 0
			}
			div *= 10
		}
		return int64(ts / div)
	}
}
