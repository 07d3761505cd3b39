package main

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The ring's geometry. A slot holds the largest frame the benchmark sends
// (1,514 bytes) after its header; the ring holds several batches, so that
// filling one never waits on the kernel.
const (
	txSlotSize  = 1 << 11
	txBlockSize = 1 << 16
	txBlocks    = 128
	txSlots     = txBlockSize / txSlotSize * txBlocks
	// On transmit the kernel reads a frame at TPACKET2_HDRLEN less the
	// sockaddr_ll, which is only filled in on receive: the header rounded
	// up to TPACKET_ALIGNMENT.
	txDataOff = (unix.SizeofTpacket2Hdr + unix.TPACKET_ALIGNMENT - 1) &^ (unix.TPACKET_ALIGNMENT - 1)
)

// txRing sends frames through an AF_PACKET TPACKET_V2 transmit ring that
// bypasses the qdisc: a batch is copied into the mapped ring and handed to
// the kernel with one send, where netlab.SendFrames makes a syscall (and
// the qdisc path) for every frame, which held the generator near 63k
// frames a second on 2 cores.
type txRing struct {
	fd   int
	ring []byte
	next int // the slot the next frame is written into
}

// openTxRing opens the ring on iface in the current network namespace.
func openTxRing(iface string) (*txRing, error) {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, err
	}
	// Protocol 0: the socket only sends, so the kernel delivers it nothing.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	t := &txRing{fd: fd}
	if err := t.setup(ifc.Index); err != nil {
		t.Close()
		return nil, fmt.Errorf("transmit ring on %s: %w", iface, err)
	}
	return t, nil
}

func (t *txRing) setup(ifindex int) error {
	if err := unix.SetsockoptInt(t.fd, unix.SOL_PACKET, unix.PACKET_VERSION, unix.TPACKET_V2); err != nil {
		return fmt.Errorf("PACKET_VERSION: %w", err)
	}
	if err := unix.SetsockoptInt(t.fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
		return fmt.Errorf("PACKET_QDISC_BYPASS: %w", err)
	}
	req := unix.TpacketReq{Block_size: txBlockSize, Block_nr: txBlocks, Frame_size: txSlotSize, Frame_nr: txSlots}
	if err := unix.SetsockoptTpacketReq(t.fd, unix.SOL_PACKET, unix.PACKET_TX_RING, &req); err != nil {
		return fmt.Errorf("PACKET_TX_RING: %w", err)
	}
	ring, err := unix.Mmap(t.fd, 0, txBlockSize*txBlocks, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	t.ring = ring
	// Bound, a send without an address goes out on this interface.
	return unix.Bind(t.fd, &unix.SockaddrLinklayer{Ifindex: ifindex})
}

// status is the slot's tp_status, the word the kernel and this process hand
// the slot back and forth with, so it is read and written atomically.
func (t *txRing) status(slot int) *uint32 {
	return (*uint32)(unsafe.Pointer(&t.ring[slot*txSlotSize]))
}

// Send queues frames into the ring and has the kernel send them, returning
// once it has: each send waits for the frames it took, so every slot of the
// batch is free again for the next one.
func (t *txRing) Send(frames [][]byte) error {
	var want int
	for _, f := range frames {
		if len(f) > txSlotSize-txDataOff {
			return fmt.Errorf("a frame of %d bytes does not fit a %d-byte slot", len(f), txSlotSize)
		}
		st := t.status(t.next)
		switch s := atomic.LoadUint32(st); s {
		case unix.TP_STATUS_AVAILABLE:
		case unix.TP_STATUS_WRONG_FORMAT:
			return errors.New("the kernel refused a frame (TP_STATUS_WRONG_FORMAT)")
		default:
			return fmt.Errorf("slot %d still held by the kernel (status %#x)", t.next, s)
		}
		slot := t.ring[t.next*txSlotSize : (t.next+1)*txSlotSize]
		copy(slot[txDataOff:], f)
		hdr := (*unix.Tpacket2Hdr)(unsafe.Pointer(&slot[0]))
		hdr.Len = uint32(len(f))
		atomic.StoreUint32(st, unix.TP_STATUS_SEND_REQUEST)
		want += len(f)
		t.next = (t.next + 1) % txSlots
	}
	// Blocking (no MSG_DONTWAIT): the kernel returns once the skbs it made
	// from the slots are released, which a veth does as it forwards them.
	n, _, errno := unix.Syscall6(unix.SYS_SENDTO, uintptr(t.fd), 0, 0, 0, 0, 0)
	if errno != 0 {
		return fmt.Errorf("sending the ring: %w", errno)
	}
	if int(n) != want {
		return fmt.Errorf("the kernel sent %d bytes of %d", n, want)
	}
	return nil
}

func (t *txRing) Close() error {
	var err error
	if t.ring != nil {
		err = unix.Munmap(t.ring)
	}
	return errors.Join(err, unix.Close(t.fd))
}
