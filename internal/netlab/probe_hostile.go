package netlab

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// The hostile battery: what a guest with root sends to pass as its
// neighbour or the gateway. Each frame must be dropped at the bridge.
const (
	probeSpoofIP      = "spoofed-address-dropped"
	probeSpoofMAC     = "spoofed-mac-dropped"
	probeARPGateway   = "arp-gateway-claim-dropped"
	probeARPNeighbour = "arp-neighbour-claim-dropped"
)

// hostile has guest a send, three times each, an IPv4 datagram with b's
// address, one with b's MAC, and gratuitous ARP claiming the gateway and
// b; then a datagram of its own as a marker. Once the marker has passed
// the bridge, none of the others may have reached the host by the bridge
// or reached b.
func (p *prober) hostile(ctx context.Context) []ProbeResult {
	names := []string{probeSpoofIP, probeSpoofMAC, probeARPGateway, probeARPNeighbour}
	out := make([]ProbeResult, len(names))
	failAll := func(format string, a ...any) []ProbeResult {
		for i, n := range names {
			out[i] = fail(n, format, a...)
		}
		return out
	}
	h, err := handleAt(p.cfg.HostNSPath())
	if err != nil {
		return failAll("%v", err)
	}
	br, err := h.LinkByName(p.cfg.Bridge)
	h.Close()
	if err != nil {
		return failAll("bridge %s: %v", p.cfg.Bridge, err)
	}
	brMAC := br.Attrs().HardwareAddr
	gw := p.cfg.Gateway()
	var nonces [][]byte
	for range names {
		nonces = append(nonces, []byte("tb-hostile-"+nonce()))
	}
	marker := []byte("tb-hostile-marker-" + nonce())
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	frames := [][]byte{
		udpFrame(p.a.MAC, brMAC, p.b.IP, probeTCPDst, nonces[0]),
		udpFrame(p.b.MAC, brMAC, p.a.IP, probeTCPDst, nonces[1]),
		arpFrame(1, bcast, p.a.MAC, gw, gw, nonces[2]),
		arpFrame(2, bcast, p.a.MAC, p.b.IP, p.b.IP, nonces[3]),
	}
	atBridge, err := openSniffer(p.cfg.HostNSPath(), p.cfg.Bridge)
	if err != nil {
		return failAll("sniffing on %s: %v", p.cfg.Bridge, err)
	}
	defer unix.Close(atBridge)
	atB, err := openSniffer(p.b.path(), "eth0")
	if err != nil {
		return failAll("sniffing in %s: %v", p.b.NS, err)
	}
	defer unix.Close(atB)
	err = netns.Do(p.a.path(), func() error {
		for range 3 {
			if err := SendFrames("eth0", frames...); err != nil {
				return err
			}
		}
		return SendFrames("eth0", udpFrame(p.a.MAC, brMAC, p.a.IP, gw, marker))
	})
	if err != nil {
		return failAll("sending from %s: %v", p.a.NS, err)
	}
	passed, err := readFrames(ctx, atBridge, time.Now().Add(answerWait), marker)
	if err != nil {
		return failAll("%v", err)
	}
	if !containsFrame(passed, marker) {
		return failAll("the guest's own datagram did not pass the bridge within %s", answerWait)
	}
	// What the bridge forwarded to b before the marker is queued by now.
	reachedB, err := readFrames(ctx, atB, time.Now(), nil)
	if err != nil {
		return failAll("%v", err)
	}
	what := []string{"a datagram with the other guest's address", "a datagram with the other guest's MAC",
		"ARP claiming the gateway " + gw.String(), "ARP claiming the other guest's address " + p.b.IP.String()}
	for i, n := range names {
		switch {
		case containsFrame(passed, nonces[i]):
			out[i] = fail(n, "%s passed the bridge to the host", what[i])
		case containsFrame(reachedB, nonces[i]):
			out[i] = fail(n, "%s reached the other guest", what[i])
		default:
			out[i] = pass(n, "%s was dropped at the bridge", what[i])
		}
	}
	return out
}

func containsFrame(frames [][]byte, nonce []byte) bool {
	for _, f := range frames {
		if bytes.Contains(f, nonce) {
			return true
		}
	}
	return false
}

// udpFrame is an Ethernet frame with an IPv4/UDP datagram to port 9
// (discard) from any addresses; UDP's checksum is optional over IPv4.
func udpFrame(src, dst net.HardwareAddr, from, to netip.Addr, payload []byte) []byte {
	f := append(append(append([]byte{}, dst...), src...), 0x08, 0x00)
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	fa, ta := from.As4(), to.As4()
	copy(ip[12:], fa[:])
	copy(ip[16:], ta[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], 9)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	return append(append(append(f, ip...), udp...), payload...)
}

// arpFrame is an Ethernet/IPv4 ARP frame (op 1 request, 2 reply) from
// sha claiming spa, asking for or answering tpa; pad follows it.
func arpFrame(op uint16, dst, sha net.HardwareAddr, spa, tpa netip.Addr, pad []byte) []byte {
	f := append(append(append([]byte{}, dst...), sha...), 0x08, 0x06)
	f = append(f, 0, 1, 8, 0, 6, 4)
	f = binary.BigEndian.AppendUint16(f, op)
	sa, ta := spa.As4(), tpa.As4()
	f = append(append(f, sha...), sa[:]...)
	f = append(append(f, dst...), ta[:]...)
	return append(f, pad...)
}

// SendFrames writes whole Ethernet frames, unchecked, out of iface in the
// calling thread's namespace: what a guest with root can put on its link
// (the hostile probes, and the tests' hostile guests).
func SendFrames(iface string, frames ...[]byte) error {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	to := &unix.SockaddrLinklayer{Ifindex: ifc.Index, Halen: 6}
	for _, f := range frames {
		if err := unix.Sendto(fd, f, 0, to); err != nil {
			return fmt.Errorf("sending a frame on %s: %w", iface, err)
		}
	}
	return nil
}

// openSniffer opens a socket that receives every frame arriving on iface
// in the namespace at nsPath.
func openSniffer(nsPath, iface string) (int, error) {
	fd := -1
	err := netns.Do(nsPath, func() error {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL))); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index})
	})
	if err != nil && fd >= 0 {
		unix.Close(fd)
	}
	return fd, err
}

// readFrames returns the inbound frames on fd until one contains until
// (nil: until none is queued) or the deadline passes.
func readFrames(ctx context.Context, fd int, deadline time.Time, until []byte) ([][]byte, error) {
	var out [][]byte
	buf := make([]byte, 65536)
	for ctx.Err() == nil {
		flags := 0
		if until == nil {
			flags = unix.MSG_DONTWAIT
		} else {
			left := time.Until(deadline)
			if left <= 0 {
				return out, nil
			}
			tv := unix.NsecToTimeval(min(left, dropWindow).Nanoseconds())
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
				return nil, err
			}
		}
		n, from, err := unix.Recvfrom(fd, buf, flags)
		if errors.Is(err, unix.EAGAIN) {
			if until == nil {
				return out, nil
			}
			continue
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		f := bytes.Clone(buf[:n])
		out = append(out, f)
		if until != nil && bytes.Contains(f, until) {
			return out, nil
		}
	}
	return nil, ctx.Err()
}
