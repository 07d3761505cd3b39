package capture_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// link is a veth between two test namespaces: "guest" sends, "host" holds
// the tap-like end that is captured.
type link struct {
	guest, host string
	tap         string
	dst         netip.Addr
	guestIP     netip.Addr
	guestMAC    net.HardwareAddr
}

func newLink(t *testing.T) *link {
	l := labtest.New(t) // unique names, cleaned up
	g := l.AddGuest("c", netip.MustParseAddr("10.13.37.2"))
	h := l.Handle(l.Config.HostNS)
	port, err := h.LinkByName(g.Port)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr("10.13.37.1/24")
	if err := h.AddrAdd(port, a); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(port); err != nil {
		t.Fatal(err)
	}
	return &link{guest: g.NS, host: l.Config.HostNS, tap: g.Port, dst: netip.MustParseAddr("10.13.37.1"), guestIP: g.IP, guestMAC: g.MAC}
}

// send sends n UDP datagrams with numbered payloads from the guest to port 9.
func (l *link) send(t *testing.T, n int, tag string) {
	t.Helper()
	l.sendTo(t, n, tag, 9)
}

// sendTo sends n UDP datagrams with numbered payloads from the guest to port.
func (l *link) sendTo(t *testing.T, n int, tag string, port int) {
	t.Helper()
	sendUDP(t, l.guest, netip.AddrPortFrom(l.dst, uint16(port)), n, tag)
}

// sendUDP sends n UDP datagrams with numbered payloads from namespace ns to to.
func sendUDP(t *testing.T, ns string, to netip.AddrPort, n int, tag string) {
	t.Helper()
	labtest.In(t, ns, func() error {
		// Unconnected, so that the host's port-unreachable answers do
		// not fail the next write.
		c, err := net.ListenPacket("udp", ":0")
		if err != nil {
			return err
		}
		defer c.Close()
		dst := net.UDPAddrFromAddrPort(to)
		for i := 0; i < n; i++ {
			if _, err := c.WriteTo([]byte(fmt.Sprintf("%s-%06d", tag, i)), dst); err != nil {
				return err
			}
		}
		return nil
	})
}

type running struct {
	st   *state.Store
	rec  *records.Capture
	done chan error
}

func startDaemon(t *testing.T, l *link, spool, filter string, sensors ...capture.Sensor) *running {
	t.Helper()
	st, err := state.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return startDaemonIn(t, st, l, spool, filter, nil, sensors...)
}

// startDaemonIn starts a capture daemon in st; set, if not nil, completes
// the capture record (retention, free-space threshold).
func startDaemonIn(t *testing.T, st *state.Store, l *link, spool, filter string, set func(*records.Capture), sensors ...capture.Sensor) *running {
	t.Helper()
	ctx := context.Background()
	var err error
	rec := &records.Capture{Iface: l.tap, NetNS: netns.Path(l.host), Snaplen: 65535, Spool: spool, State: capture.StateStarting,
		Cycle: records.NewID("cycle", time.Now()), Clock: capture.ClockNow(), Filter: filter}
	if set != nil {
		set(rec)
	}
	var prog []unix.SockFilter
	if filter != "" {
		if prog, err = capture.CompileFilter(ctx, filter, rec.Snaplen); err != nil {
			t.Fatal(err)
		}
	}
	records.Init(rec, records.KindCapture, st.Now())
	if err := st.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	src, err := capture.OpenAFPacket(rec.NetNS, rec.Iface, rec.Snaplen, prog, capture.DefaultRing)
	if err != nil {
		t.Fatal(err)
	}
	d := &capture.Daemon{St: st, ID: rec.ID, Source: src, Sensors: sensors, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r := &running{st: st, rec: rec, done: make(chan error, 1)}
	go func() {
		err := d.Serve(ctx)
		src.Close()
		r.done <- err
	}()
	waitFor(t, "daemon up", func() bool {
		_, err := capture.Call(ctx, st, rec.ID, "status", "")
		return err == nil
	})
	return r
}

// waitFor polls cond for up to 10 s; a say function, if given, tells
// what was seen instead.
func waitFor(t *testing.T, what string, cond func() bool, say ...func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			for _, f := range say {
				what += ": " + f()
			}
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with no event
	}
}

// readPcap returns the UDP payloads of a stored pcap blob.
func readPcap(t *testing.T, st *state.Store, a records.Artifact) (payloads []string, n int) {
	t.Helper()
	f, err := st.OpenBlob(a.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	payloads, n, err = pcapPayloads(f)
	if err != nil {
		t.Fatalf("pcap %s: %v", a.ID, err)
	}
	return payloads, n
}

// pcapPayloads reads a pcap as readPcap does; on an error (a sensor's file
// cut short in the packet it is writing, say) it returns what it read
// before it as well.
func pcapPayloads(f io.Reader) (payloads []string, n int, err error) {
	r, err := pcapgo.NewReader(f)
	if err != nil {
		return nil, 0, err
	}
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return payloads, n, err
		}
		n++
		p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.NoCopy)
		if u, ok := p.TransportLayer().(*layers.UDP); ok && u.DstPort == 9 {
			payloads = append(payloads, string(u.Payload))
		}
	}
	return payloads, n, nil
}

// TestCaptureKnownTraffic sends known packets through a tap and checks
// that every one is in the artifacts, whose counts match their files.
func TestCaptureKnownTraffic(t *testing.T) {
	l := newLink(t)
	// Only the test's datagrams: no neighbour discovery, no ICMP errors.
	r := startDaemon(t, l, t.TempDir(), "udp dst port 9")
	ctx := context.Background()

	l.send(t, 500, "one")
	waitFor(t, "500 packets captured", func() bool {
		rep, err := capture.Call(ctx, r.st, r.rec.ID, "status", "")
		return err == nil && rep.Packets >= 500
	})
	arts, err := capture.Rotate(ctx, r.st, r.rec, "")
	if err != nil || len(arts) != 1 {
		t.Fatalf("rotate: %v %v", arts, err)
	}
	l.send(t, 300, "two")
	waitFor(t, "800 packets captured", func() bool {
		rep, err := capture.Call(ctx, r.st, r.rec.ID, "status", "")
		return err == nil && rep.Packets >= 800
	})
	// The second window belongs to the next cycle, named at its rotate.
	cycle2 := records.NewID("cycle", time.Now())
	arts2, err := capture.Rotate(ctx, r.st, r.rec, cycle2)
	if err != nil || len(arts2) != 1 {
		t.Fatalf("rotate: %v %v", arts2, err)
	}
	arts = append(arts, arts2...)
	// Nothing since: stop registers no empty file.
	rep2, err := capture.Call(ctx, r.st, r.rec.ID, "stop", "")
	if err != nil || len(rep2.Artifacts) != 0 {
		t.Fatalf("stop: %+v %v", rep2, err)
	}
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}

	for i, a := range arts {
		payloads, n := readPcap(t, r.st, a)
		want := map[int]string{0: "one", 1: "two"}[i]
		wantN := map[int]int{0: 500, 1: 300}[i]
		got := 0
		for j, p := range payloads {
			if p != fmt.Sprintf("%s-%06d", want, j) {
				t.Fatalf("%s: payload %d is %q", a.ID, j, p)
			}
			got++
		}
		if got != wantN {
			t.Fatalf("%s: %d of %d datagrams captured", a.ID, got, wantN)
		}
		if uint64(n) != a.Packets || n != wantN || a.Drops != 0 || a.Type != "pcap" || a.Iface != l.tap || a.FirstTS == nil || a.LastTS.Before(*a.FirstTS) {
			t.Fatalf("%s: artifact says %d packets (file has %d), drops %d: %+v", a.ID, a.Packets, n, a.Drops, a)
		}
		if a.Lease != r.rec.Lease || a.Capture != r.rec.ID || a.Filter != "udp dst port 9" {
			t.Fatalf("artifact not linked: %+v", a)
		}
	}
	if arts[0].Cycle != r.rec.Cycle || arts[1].Cycle != cycle2 {
		t.Fatalf("cycles: %s %s, want %s %s", arts[0].Cycle, arts[1].Cycle, r.rec.Cycle, cycle2)
	}
	var c records.Capture
	if err := r.st.Get(r.rec.ID, &c); err != nil {
		t.Fatal(err)
	}
	if c.State != capture.StateStopped || c.Files != 2 || c.Packets != arts[0].Packets+arts[1].Packets || len(c.Artifacts) != 2 {
		t.Fatalf("capture record: %+v", c)
	}
}

// udpFrame is an Ethernet/IPv4/UDP frame to port 9 with payload.
func udpFrame(t *testing.T, src, dst net.HardwareAddr, from, to netip.Addr, payload string) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: from.AsSlice(), DstIP: to.AsSlice()}
	return udpOver(t, src, dst, layers.EthernetTypeIPv4, ip, payload)
}

// udp6Frame is an IPv6 datagram from the address from to port 9 of every
// node on the link (ff02::1): what stays on the test's own veth.
func udp6Frame(t *testing.T, src, dst net.HardwareAddr, from, payload string) []byte {
	ip := &layers.IPv6{Version: 6, HopLimit: 1, NextHeader: layers.IPProtocolUDP,
		SrcIP: netip.MustParseAddr(from).AsSlice(), DstIP: netip.MustParseAddr("ff02::1").AsSlice()}
	return udpOver(t, src, dst, layers.EthernetTypeIPv6, ip, payload)
}

// udpOver is an Ethernet frame of type typ carrying ip, then UDP to port 9
// with payload.
func udpOver(t *testing.T, src, dst net.HardwareAddr, typ layers.EthernetType, ip gopacket.NetworkLayer, payload string) []byte {
	t.Helper()
	udp := &layers.UDP{SrcPort: 40000, DstPort: 9}
	udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		&layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: typ}, ip.(gopacket.SerializableLayer), udp, gopacket.Payload(payload))
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestCaptureKeepsOutForgedFrames: on a lease's tap, bound on the lab's
// bridge to the guest's MAC and address, the frames from the guest that
// the bridge drops (another source address, another source MAC, or an
// "answer" the guest forges to itself as if from the lab; and IPv6, which
// the lab does not carry) never reached anything: they are counted in the
// artifact and the capture record and kept out of the file, so that a
// sample cannot forge what it sent, nor its C2's answers, into the capture
// tb-parse reads. Only those that claimed another identity count as
// forged: the guest's own IPv6 (from its link-local address) is not
// spoofing, IPv6 from a routable address the lab never gave it is. The
// guest's own datagrams and the host's to the guest are written.
func TestCaptureKeepsOutForgedFrames(t *testing.T) {
	l := newLink(t)
	st, err := state.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The tcpdump sensor beside it must keep them out as well.
	sensor, err := capture.LoadSensor("", "tcpdump")
	if err != nil {
		t.Fatal(err)
	}
	r := startDaemonIn(t, st, l, t.TempDir(), "udp dst port 9", func(c *records.Capture) {
		c.Bound = &records.PortBound{MAC: l.guestMAC.String(), IP: l.guestIP.String()}
	}, sensor)
	sensorOut := filepath.Join(r.rec.Spool, "sensors", "tcpdump", "tcpdump.pcap")
	waitFor(t, "tcpdump capturing", func() bool { _, err := os.Stat(sensorOut); return err == nil })
	ctx := context.Background()
	var hostMAC net.HardwareAddr
	labtest.In(t, l.host, func() error {
		ifc, err := net.InterfaceByName(l.tap)
		hostMAC = ifc.HardwareAddr
		return err
	})
	forged := [][]byte{
		udpFrame(t, l.guestMAC, hostMAC, netip.MustParseAddr("10.13.37.99"), l.dst, "forged-address"),
		udpFrame(t, net.HardwareAddr{2, 0, 0, 0, 0, 0x99}, hostMAC, l.guestIP, l.dst, "forged-mac"),
		udpFrame(t, hostMAC, l.guestMAC, l.dst, l.guestIP, "forged-answer"),
	}
	forged = append(forged, udp6Frame(t, l.guestMAC, hostMAC, "2001:db8::66", "forged-ipv6"))
	ownIPv6 := udp6Frame(t, l.guestMAC, hostMAC, "fe80::1", "own-ipv6")
	for range 10 {
		labtest.SendFrames(t, l.guest, "eth0", append(forged, ownIPv6)...)
	}
	// After the forged frames, in the order the ring keeps: the guest's
	// own datagrams, and the host's to the guest. (The guest's first: the
	// first frame after tcpdump sets its filter, libpcap tests again in
	// userland, where it cannot read the direction; tcpdump(1) drops it if
	// the host sent it; see tb-capture(1), Sensors.)
	l.send(t, 20, "own")
	sendUDP(t, l.host, netip.AddrPortFrom(l.guestIP, 9), 20, "host")
	waitFor(t, "40 packets captured", func() bool {
		rep, err := capture.Call(ctx, r.st, r.rec.ID, "status", "")
		return err == nil && rep.Packets >= 40
	})
	arts, err := capture.Rotate(ctx, r.st, r.rec, "")
	if err != nil || len(arts) != 1 {
		t.Fatalf("rotate: %v %v", arts, err)
	}
	payloads, n := readPcap(t, r.st, arts[0])
	got := map[string]int{}
	for _, p := range payloads {
		got[strings.TrimRight(p, "-0123456789")]++
	}
	if n != 40 || got["own"] != 20 || got["host"] != 20 || len(got) != 2 {
		t.Errorf("the file holds %d frames: %v; want the guest's 20 and the host's 20, nothing forged", n, got)
	}
	if arts[0].Forged != 40 || arts[0].KeptOut != 50 {
		t.Errorf("the artifact counts %d frames kept out, %d forged; want 50 and 40 (the guest's own IPv6 not forged)", arts[0].KeptOut, arts[0].Forged)
	}
	// The sensor's file, once it holds the 40 frames sent after the
	// forged ones (one socket: what it caught is in the order it came).
	var sensorGot map[string]int
	waitFor(t, "tcpdump's file holding the guest's and the host's 40 datagrams", func() bool {
		f, err := os.Open(sensorOut)
		if err != nil {
			return false
		}
		defer f.Close()
		payloads, _, _ := pcapPayloads(f)
		sensorGot = map[string]int{}
		for _, p := range payloads {
			sensorGot[strings.TrimRight(p, "-0123456789")]++
		}
		return sensorGot["own"]+sensorGot["host"] >= 40
	}, func() string {
		// Stopped, tcpdump says what it caught and what the kernel dropped.
		capture.Call(ctx, r.st, r.rec.ID, "stop", "")
		<-r.done
		stderr, _ := os.ReadFile(filepath.Join(r.rec.Spool, "sensors", "tcpdump", "tcpdump.stderr"))
		return fmt.Sprintf("it holds %v; its stderr: %s", sensorGot, stderr)
	})
	if sensorGot["own"] != 20 || sensorGot["host"] != 20 || len(sensorGot) != 2 {
		t.Errorf("the tcpdump sensor's file holds %v; want the guest's 20 and the host's 20, nothing forged", sensorGot)
	}
	// What was kept out was handled: the rotate's drain did not wait for
	// it to be written, nor count it as given up on.
	if rep, err := capture.Call(ctx, r.st, r.rec.ID, "status", ""); err != nil || rep.Unwritten != 0 {
		t.Errorf("status after the rotate: %d packets given up on (%v), want 0", rep.Unwritten, err)
	}
	if _, err := capture.Call(ctx, r.st, r.rec.ID, "stop", ""); err != nil {
		t.Fatal(err)
	}
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	var c records.Capture
	if err := r.st.Get(r.rec.ID, &c); err != nil || c.Forged != 40 || c.KeptOut != 50 {
		t.Errorf("the capture record counts %d frames kept out, %d forged (%v); want 50 and 40", c.KeptOut, c.Forged, err)
	}
}

// TestDiskFull fills a small spool: the capture stops cleanly and what was
// written is registered, each file a valid pcap.
func TestDiskFull(t *testing.T) {
	l := newLink(t)
	spool := t.TempDir()
	if err := unix.Mount("tmpfs", spool, "tmpfs", 0, "size=256k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(spool, unix.MNT_DETACH) })
	r := startDaemon(t, l, spool, "")
	// About 3 MB of datagrams: far more than the spool holds.
	labtest.In(t, l.guest, func() error {
		c, err := net.ListenPacket("udp", ":0")
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 1400)
		for i := 0; i < 2000; i++ {
			c.WriteTo(buf, &net.UDPAddr{IP: l.dst.AsSlice(), Port: 9})
		}
		return nil
	})
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("daemon: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("capture did not stop on a full disk")
	}
	var c records.Capture
	if err := r.st.Get(r.rec.ID, &c); err != nil {
		t.Fatal(err)
	}
	if c.State != capture.StateStopped || c.Error == "" || len(c.Artifacts) == 0 || c.Packets == 0 {
		t.Fatalf("after a full disk: %+v", c)
	}
	for _, id := range c.Artifacts {
		var a records.Artifact
		if err := r.st.Get(id, &a); err != nil {
			t.Fatal(err)
		}
		if _, n := readPcap(t, r.st, a); uint64(n) != a.Packets {
			t.Fatalf("%s: %d packets in the file, artifact says %d", a.ID, n, a.Packets)
		}
		if a.Reason != "disk-full" {
			t.Fatalf("reason %q", a.Reason)
		}
	}
}

// TestRotateBySize closes files at the size limit.
func TestRotateBySize(t *testing.T) {
	dir := t.TempDir()
	w, err := capture.NewWriter(dir, "t", 65535, 10000, 0)
	if err != nil {
		t.Fatal(err)
	}
	var files []capture.File
	done := func(f capture.File) error { files = append(files, f); return nil }
	pkt := make([]byte, 1000)
	for i := 0; i < 50; i++ {
		if w.Full(len(pkt)) {
			if err := w.Rotate("size", done); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Write(time.Unix(int64(i), 0), pkt, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Rotate("stop", done); err != nil {
		t.Fatal(err)
	}
	total := uint64(0)
	for _, f := range files {
		st, err := os.Stat(f.Path)
		if err != nil || st.Size() != f.Size || f.Size > 10000 {
			t.Fatalf("%+v: %v", f, err)
		}
		total += f.Packets
	}
	if total != 50 || len(files) < 5 {
		t.Fatalf("%d files, %d packets", len(files), total)
	}
}

// TestRotateByTime: a file older than the period is due.
func TestRotateByTime(t *testing.T) {
	w, err := capture.NewWriter(t.TempDir(), "t", 65535, 0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if w.Due(time.Now()) {
		t.Fatal("due before a file is open")
	}
	if err := w.Open(); err != nil {
		t.Fatal(err)
	}
	if w.Due(time.Now()) || !w.Due(time.Now().Add(61*time.Minute)) {
		t.Fatal("age rotation")
	}
	var got []capture.File
	if err := w.Rotate("time", func(f capture.File) error { got = append(got, f); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Reason != "time" || got[0].Packets != 0 || got[0].Size != 24 {
		t.Fatalf("%+v", got)
	}
}

// TestSensorRestart kills the tcpdump sensor: it is restarted and the
// death is on the capture record; its pcap is collected at stop, with the
// datagrams sent just before the stop in it (without --immediate-mode,
// tcpdump stopped within its 1 s block timeout of them writes none).
func TestSensorRestart(t *testing.T) {
	l := newLink(t)
	s, err := capture.LoadSensor("", "tcpdump")
	if err != nil {
		t.Fatal(err)
	}
	r := startDaemon(t, l, t.TempDir(), "", s)
	ctx := context.Background()
	sensor := func() records.SensorStatus {
		var c records.Capture
		r.st.Get(r.rec.ID, &c)
		if len(c.Sensors) == 0 {
			return records.SensorStatus{}
		}
		return c.Sensors[0]
	}
	waitFor(t, "sensor running", func() bool { return sensor().PID > 0 })
	first := sensor().PID
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sensor restarted", func() bool { s := sensor(); return s.Restarts == 1 && s.PID != first && s.PID > 0 })
	if s := sensor(); s.Error == "" || s.State != capture.StateRunning {
		t.Fatalf("sensor after restart: %+v", s)
	}
	// The restarted tcpdump captures once a probe sent after the restart
	// is in its file (the file may be the killed one's until it is
	// opened again); then the datagrams go in, and the stop at once.
	spool := r.rec.Spool
	pcap := filepath.Join(spool, "sensors", "tcpdump", "tcpdump.pcap")
	waitFor(t, "the restarted tcpdump capturing", func() bool {
		l.sendTo(t, 1, "probe", 9)
		b, _ := os.ReadFile(pcap)
		return bytes.Contains(b, []byte("probe-000000"))
	})
	l.send(t, 20, "sensor")
	rep, err := capture.Call(ctx, r.st, r.rec.ID, "stop", "")
	if err != nil {
		t.Fatal(err)
	}
	<-r.done
	found := false
	for _, id := range rep.Artifacts {
		var a records.Artifact
		if r.st.Get(id, &a) == nil && a.Sensor == "tcpdump" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no tcpdump artifact among %v", rep.Artifacts)
	}
	b, err := os.ReadFile(pcap)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("sensor-0000")); n < 20 {
		t.Errorf("tcpdump wrote %d of the 20 datagrams sent before the stop", n)
	}
}

// TestSensorsHonourFilterAndSnaplen runs dumpcap (tshark's capture
// program) as a sensor with the capture's filter and snaplen: what it
// writes holds the filtered traffic, as pcapng, and becomes an artifact.
func TestSensorsHonourFilterAndSnaplen(t *testing.T) {
	l := newLink(t)
	s, err := capture.LoadSensor("", "dumpcap")
	if err != nil {
		t.Fatal(err)
	}
	r := startDaemon(t, l, t.TempDir(), "udp port 9", s)
	out := filepath.Join(r.rec.Spool, "sensors", "dumpcap", "dumpcap.pcapng")
	waitFor(t, "dumpcap capturing", func() bool { _, err := os.Stat(out); return err == nil })
	l.sendTo(t, 20, "filtered", 10) // outside the capture's filter
	l.send(t, 20, "dumpcap")
	// dumpcap writes what it caught every 100 ms (-U is tcpdump's, not
	// its): wait until it did, before stopping it.
	waitFor(t, "dumpcap writing", func() bool { st, err := os.Stat(out); return err == nil && st.Size() > 364 })
	if _, err := capture.Call(context.Background(), r.st, r.rec.ID, "stop", ""); err != nil {
		t.Fatal(err)
	}
	<-r.done
	argv, _ := os.ReadFile(filepath.Join(r.rec.Spool, "sensors", "dumpcap", "dumpcap.stderr"))
	b, err := os.ReadFile(out)
	if err != nil || len(b) < 4 || string(b[:4]) != "\x0a\x0d\x0d\x0a" {
		t.Fatalf("dumpcap output %d bytes, %v (stderr %s)", len(b), err, argv)
	}
	if n := bytes.Count(b, []byte("dumpcap-0000")); n < 20 {
		t.Fatalf("dumpcap caught %d of the 20 datagrams (%d bytes; stderr %s)", n, len(b), argv)
	}
	if n := bytes.Count(b, []byte("filtered-0000")); n != 0 {
		t.Errorf("dumpcap caught %d datagrams outside the filter", n)
	}
	// The interface description block after the section header holds the
	// snaplen dumpcap captured with (its own default is 262144).
	shb := int(binary.LittleEndian.Uint32(b[4:8]))
	if len(b) < shb+16 || binary.LittleEndian.Uint32(b[shb:]) != 1 {
		t.Fatalf("no interface description block after the section header")
	}
	if snap := binary.LittleEndian.Uint32(b[shb+12:]); snap != uint32(r.rec.Snaplen) {
		t.Errorf("dumpcap's snaplen %d, the capture's %d", snap, r.rec.Snaplen)
	}
}

// TestAnalystSensor runs examples/sensors/zeek.json and suricata.json, an
// analyst's own sensors, with stand-ins for zeek and suricata (Debian 12
// packages neither): the template's fields and quoted filter arrive as the
// arguments a shell would give, the command runs in the sensor's
// directory, and the files its output glob names become artifacts.
func TestAnalystSensor(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		argv       func(l *link, dir string) string
	}{
		{"zeek", "conn.log", func(l *link, dir string) string {
			return "-C\n-i\n" + l.tap + "\n-f\nudp port 9\nPcap::snaplen=65535\nLogAscii::use_json=T\n"
		}},
		{"suricata", "eve.json", func(l *link, dir string) string {
			return "-i\n" + l.tap + "\n-l\n" + dir + "\n-k\nnone\nudp port 9\n"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := t.TempDir()
			standIn := "#!/bin/sh\nprintf '%s\\n' \"$@\" > argv.tmp && mv argv.tmp argv.txt\necho '{}' > " + tc.file + "\nexec sleep 3600\n"
			if err := os.WriteFile(filepath.Join(bin, tc.name), []byte(standIn), 0o755); err != nil {
				t.Fatal(err)
			}
			t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
			st, err := state.Open(context.Background(), t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			example, err := os.ReadFile("../../examples/sensors/" + tc.name + ".json")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(capture.SensorsDir(st), 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(capture.SensorsDir(st), tc.name+".json"), example, 0o640); err != nil {
				t.Fatal(err)
			}
			s, err := capture.LoadSensor(capture.SensorsDir(st), tc.name)
			if err != nil {
				t.Fatal(err)
			}
			l := newLink(t)
			r := startDaemonIn(t, st, l, t.TempDir(), "udp port 9", nil, s)
			dir := filepath.Join(r.rec.Spool, "sensors", tc.name)
			waitFor(t, "the sensor started", func() bool {
				_, err := os.Stat(filepath.Join(dir, "argv.txt"))
				return err == nil
			})
			argv, _ := os.ReadFile(filepath.Join(dir, "argv.txt"))
			if want := tc.argv(l, dir); string(argv) != want {
				t.Fatalf("%s argv:\n%s\nwant:\n%s", tc.name, argv, want)
			}
			rep, err := capture.Call(context.Background(), r.st, r.rec.ID, "stop", "")
			if err != nil {
				t.Fatal(err)
			}
			<-r.done
			found := false
			for _, id := range rep.Artifacts {
				var a records.Artifact
				if r.st.Get(id, &a) == nil && a.Sensor == tc.name && a.Metadata["file"] == tc.file {
					found = true
				}
			}
			if !found {
				t.Fatalf("no %s %s artifact among %v", tc.name, tc.file, rep.Artifacts)
			}
		})
	}
}

func TestSensorNames(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"../x", "Zeek", "", "a/b"} {
		if _, err := capture.LoadSensor(dir, name); err == nil || !strings.Contains(err.Error(), "unknown sensor") {
			t.Errorf("LoadSensor(%q) = %v", name, err)
		}
	}
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte(`{"program":"x","template":"x {{.Nope","output":"*"}`), 0o640)
	if _, err := capture.LoadSensor(dir, "bad"); err == nil || !strings.Contains(err.Error(), "template") {
		t.Errorf("a broken template: %v", err)
	}
}

func TestParseBPF(t *testing.T) {
	p, err := capture.ParseBPF("4\n40 0 0 12\n21 0 1 2048\n6 0 0 262144\n6 0 0 0\n")
	if err != nil || len(p) != 4 || p[1].K != 2048 || p[1].Jf != 1 {
		t.Fatalf("%v %v", p, err)
	}
	if _, err := capture.ParseBPF("4,40 0 0 12,21 0 1 2048,6 0 0 262144,6 0 0 0"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "2\n40 0 0 12\n", "1\n40 0 12\n", "1\n40 0 999 12\n", "x"} {
		if _, err := capture.ParseBPF(bad); err == nil {
			t.Errorf("ParseBPF(%q) accepted", bad)
		}
	}
}

// TestCaptureEndsWhenItsInterfaceGoes: a capture whose interface is
// deleted (its guest destroyed, its namespace gone) returns an error
// instead of polling a dead socket in a busy loop.
func TestCaptureEndsWhenItsInterfaceGoes(t *testing.T) {
	name := fmt.Sprintf("tbgone%d", os.Getpid()%100000)
	if out, err := exec.Command("ip", "link", "add", name, "type", "veth", "peer", "name", name+"p").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", name).Run() })
	if out, err := exec.Command("ip", "link", "set", name, "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set: %v: %s", err, out)
	}
	src, err := capture.OpenAFPacket("", name, 0, nil, capture.RingConfig{BlockSize: 1 << 12, Blocks: 2, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ended := make(chan error, 1)
	go func() {
		ended <- src.Run(context.Background(), func(time.Time, []byte, int, bool) error { return nil })
	}()
	if out, err := exec.Command("ip", "link", "del", name).CombinedOutput(); err != nil {
		t.Fatalf("ip link del: %v: %s", err, out)
	}
	select {
	case err := <-ended:
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("the capture ended with %v, want an error naming %s", err, name)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the capture of a deleted interface never ended")
	}
}
