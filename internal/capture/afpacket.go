// Package capture records a lease's traffic: a pure-Go AF_PACKET
// (TPACKET_V3) capture writing pcap files with rotation, the capture
// daemon that registers each file as an artifact, and the instrumentation
// interface external sensors (tcpdump, dumpcap, an analyst's own) plug into.
package capture

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// Source is a packet source: the driver boundary that tests may fake.
type Source interface {
	// Run delivers packets to fn until ctx ends or fn returns an error.
	// data is only valid during the call. outgoing says the host sent the
	// packet out of the interface: on a guest's tap, towards the guest;
	// the others came from the guest.
	Run(ctx context.Context, fn func(ts time.Time, data []byte, origLen int, outgoing bool) error) error
	// Stats are the kernel's counts since the last call.
	Stats() (packets, drops uint64, err error)
	Close() error
}

// RingConfig sizes the TPACKET_V3 ring.
type RingConfig struct {
	BlockSize int           // bytes per block, a multiple of the page size
	Blocks    int           // number of blocks
	Timeout   time.Duration // a block is handed over at least this often
}

// DefaultRing holds 64 MiB: about half a second at 100k full-size packets
// per second, or several seconds of small ones. The kernel hands a block
// over at each timeout however little it holds, so sparse traffic (a
// packet every 50 ms or more) takes a block a packet: 256 blocks hold
// 12.8 s of it while the reader is held up, where 64 of 1 MiB held 3.2 s
// (TestDefaultRingHoldsSparseTrafficThroughAStall). A frame longer than a
// block would be cut to it; a tap's largest (a 64 KiB GSO frame) is not.
var DefaultRing = RingConfig{BlockSize: 256 << 10, Blocks: 256, Timeout: 50 * time.Millisecond}

// AFPacket is a TPACKET_V3 memory-mapped capture socket.
type AFPacket struct {
	fd      int
	ring    []byte
	cfg     RingConfig
	snaplen int
	iface   string
	closed  atomic.Bool
}

// OpenAFPacket opens a capture on iface in the network namespace at nsPath
// ("" for the caller's). filter, if not nil, is a classic BPF program
// (tcpdump -ddd); snaplen caps the bytes kept per packet.
func OpenAFPacket(nsPath, iface string, snaplen int, filter []unix.SockFilter, ring RingConfig) (*AFPacket, error) {
	if snaplen <= 0 || snaplen > 262144 {
		snaplen = 262144
	}
	if ring.Blocks == 0 {
		ring = DefaultRing
	}
	s := &AFPacket{fd: -1, cfg: ring, snaplen: snaplen, iface: iface}
	err := netns.Do(nsPath, func() error {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return fmt.Errorf("AF_PACKET socket: %w", err)
		}
		s.fd = fd
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VERSION, unix.TPACKET_V3); err != nil {
			return fmt.Errorf("TPACKET_V3: %w", err)
		}
		// The filter goes on before bind so that no unfiltered packet
		// slips in between; it also enforces the snaplen in the kernel.
		prog := snapFilter(filter, snaplen)
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
			&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
			return fmt.Errorf("attaching the filter: %w", err)
		}
		req := unix.TpacketReq3{
			Block_size: uint32(ring.BlockSize), Block_nr: uint32(ring.Blocks),
			Frame_size: 2048, Frame_nr: uint32(ring.BlockSize / 2048 * ring.Blocks),
			Retire_blk_tov: uint32(ring.Timeout / time.Millisecond),
		}
		if err := unix.SetsockoptTpacketReq3(fd, unix.SOL_PACKET, unix.PACKET_RX_RING, &req); err != nil {
			return fmt.Errorf("PACKET_RX_RING: %w", err)
		}
		s.ring, err = unix.Mmap(fd, 0, ring.BlockSize*ring.Blocks, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_LOCKED)
		if err != nil {
			s.ring, err = unix.Mmap(fd, 0, ring.BlockSize*ring.Blocks, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				return fmt.Errorf("mmap ring: %w", err)
			}
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}); err != nil {
			return fmt.Errorf("bind %s: %w", iface, err)
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("capture on %s: %w", iface, err)
	}
	// Reset the statistics so that they start with this capture.
	s.Stats()
	return s, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// snapFilter appends the snaplen to a filter: every "accept N bytes"
// return is capped at snaplen, and no filter becomes "accept snaplen".
func snapFilter(f []unix.SockFilter, snaplen int) []unix.SockFilter {
	if len(f) == 0 {
		return []unix.SockFilter{{Code: 0x06, K: uint32(snaplen)}} // ret #snaplen
	}
	out := make([]unix.SockFilter, len(f))
	copy(out, f)
	for i := range out {
		if out[i].Code == 0x06 && out[i].K > uint32(snaplen) { // BPF_RET|BPF_K
			out[i].K = uint32(snaplen)
		}
	}
	return out
}

// Block descriptor layout (struct tpacket_block_desc with hdr.bh1).
const (
	bdBlockStatus = 8
	bdNumPkts     = 12
	bdFirstPkt    = 16
)

// sllPkttype is where a TPACKET_V3 frame's packet type is: in the
// sockaddr_ll after its header, aligned (packet_mmap.txt).
const sllPkttype = (unix.SizeofTpacket3Hdr+unix.TPACKET_ALIGNMENT-1)&^(unix.TPACKET_ALIGNMENT-1) + unsafe.Offsetof(unix.RawSockaddrLinklayer{}.Pkttype)

// Run implements Source.
func (s *AFPacket) Run(ctx context.Context, fn func(ts time.Time, data []byte, origLen int, outgoing bool) error) error {
	stop := context.AfterFunc(ctx, func() { s.closed.Store(true) })
	defer stop()
	pfd := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN | unix.POLLERR}}
	block := 0
	for {
		if s.closed.Load() {
			return ctx.Err()
		}
		b := s.ring[block*s.cfg.BlockSize : (block+1)*s.cfg.BlockSize]
		status := atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[bdBlockStatus])))
		if status&unix.TP_STATUS_USER == 0 {
			// Poll with a short timeout so that cancellation is noticed.
			if _, err := unix.Poll(pfd, 100); err != nil && !errors.Is(err, unix.EINTR) {
				return err
			}
			if pfd[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 && atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[bdBlockStatus])))&unix.TP_STATUS_USER == 0 {
				// The interface went away (its guest was destroyed, its
				// namespace deleted): poll would return at once forever.
				if e, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_ERROR); err == nil && e != 0 {
					return fmt.Errorf("capturing on %s: %w", s.iface, unix.Errno(e))
				}
				return fmt.Errorf("capturing on %s: the socket reports an error (poll events %#x)", s.iface, pfd[0].Revents)
			}
			continue
		}
		n := *(*uint32)(unsafe.Pointer(&b[bdNumPkts]))
		off := *(*uint32)(unsafe.Pointer(&b[bdFirstPkt]))
		var err error
		for i := uint32(0); i < n && err == nil; i++ {
			h := (*unix.Tpacket3Hdr)(unsafe.Pointer(&b[off]))
			data := b[off+uint32(h.Mac) : off+uint32(h.Mac)+h.Snaplen]
			outgoing := b[off+uint32(sllPkttype)] == unix.PACKET_OUTGOING
			err = fn(time.Unix(int64(h.Sec), int64(h.Nsec)), data, int(h.Len), outgoing)
			off += h.Next_offset
		}
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[bdBlockStatus])), unix.TP_STATUS_KERNEL)
		block = (block + 1) % s.cfg.Blocks
		if err != nil {
			return err
		}
	}
}

// Stats implements Source.
func (s *AFPacket) Stats() (packets, drops uint64, err error) {
	var st unix.TpacketStatsV3
	l := uint32(unsafe.Sizeof(st))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(s.fd), unix.SOL_PACKET, unix.PACKET_STATISTICS,
		uintptr(unsafe.Pointer(&st)), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return 0, 0, e
	}
	return uint64(st.Packets), uint64(st.Drops), nil
}

// Close implements Source; call it after Run has returned.
func (s *AFPacket) Close() error {
	s.closed.Store(true)
	if s.ring != nil {
		unix.Munmap(s.ring)
		s.ring = nil
	}
	if s.fd >= 0 {
		err := unix.Close(s.fd)
		s.fd = -1
		return err
	}
	return nil
}
