package flowlog

import (
	"net/netip"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// scanTest is one cycle's destinations, fed the connections of one guest
// to a scan of 100 addresses of 203.0.113.0/24.
type scanTest struct {
	d       *Dests
	emitted []*records.Observable
	dests   []netip.Addr
}

func newScanTest() *scanTest {
	s := &scanTest{dests: make([]netip.Addr, 100)}
	s.d = NewDests("cycle_01JD0000000000000000000001", func(netip.Addr) bool { return false }, func(o *records.Observable) { s.emitted = append(s.emitted, o) })
	for i := range s.dests {
		s.dests[i] = netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)})
	}
	return s
}

// conn folds c, a TCP connection of the guest's from port to dest (port 23
// unless c says another), starting at and lasting dur.
func (s *scanTest) conn(dest netip.Addr, port uint16, at, dur time.Duration, c Conn) {
	c.UID, c.Start, c.End, c.Proto = "C"+dest.String(), int64(at), int64(at+dur), "tcp"
	c.OrigH, c.OrigP, c.RespH = netip.MustParseAddr("10.213.1.10"), port, dest
	if c.RespP == 0 {
		c.RespP = 23
	}
	s.d.Conn(&c, &observe.Origin{Input: "cap.pcap", Source: "pcap"})
}

// wantScanAlone flushes the destinations and fails unless they make one
// scan observable and nothing that stands out of it.
func (s *scanTest) wantScanAlone(t *testing.T) {
	t.Helper()
	s.d.Flush()
	for _, o := range s.emitted {
		if o.Type == records.ObsEndpoint || o.Type == records.ObsIP {
			t.Errorf("%s %s stands out of the scan (%d contacts)", o.Type, o.Value, o.Count)
		}
	}
	if len(s.emitted) != 1 || s.emitted[0].Type != records.ObsScan {
		t.Fatalf("emitted %d observables, want the scan alone", len(s.emitted))
	}
}

// A probe's connection states, as the flow log has them.
var (
	probeClosed = Conn{ConnState: "S2", History: "ShAFa", OrigPkts: 3, RespPkts: 2}
	probeReset  = Conn{ConnState: "RSTOS0", History: "SaR", OrigPkts: 3, RespPkts: 2}
)

// TestRetriedSYNIsNoNewContact: a probe whose SYN a loaded sinkhole
// answered with a stale ACK, which the guest reset and sent again at once
// on the same ports (two connections in a flow table: "SaR", then "S..."),
// is one contact: with the second round's probe, whose responder took 32 s
// to close, it would otherwise make three contacts over more than a
// minute, and every such destination would stand out of the scan (seen in
// TestSoakScanningLease beside other guests' demos).
func TestRetriedSYNIsNoNewContact(t *testing.T) {
	s := newScanTest()
	for i, a := range s.dests { // round 1: every SYN met by a stale ACK, reset, sent again
		at := time.Duration(i) * 100 * time.Millisecond
		s.conn(a, uint16(40000+i), at, 2*time.Millisecond, probeReset)
		s.conn(a, uint16(40000+i), at+20*time.Millisecond, 2*time.Second, probeClosed)
	}
	for i, a := range s.dests { // round 2, 41 s later; the responder closes 32 s late
		s.conn(a, uint16(50000+i), 41*time.Second+time.Duration(i)*100*time.Millisecond, 32*time.Second,
			Conn{ConnState: "S2", History: "ShAF", OrigPkts: 3, RespPkts: 2})
	}
	s.wantScanAlone(t)
}

// TestRetriedSYNLoggedOutOfOrderIsNoNewContact: the flow log is in the
// order connections end, not start. A probe met by a stale ACK is logged
// ("SaR") when its retry's SYN ends it, before an earlier probe of the same
// address whose close the capture had not yet seen; the retry, whose
// responder took 28 s to close, comes after both. The retry must still be
// the reset probe's, not a third contact: counted as one, the three spread
// over more than a minute and the address stood out of its scan (seen in
// TestSoakScanningLease in a fresh-clone make test, cycle 6, 2026-12-02).
func TestRetriedSYNLoggedOutOfOrderIsNoNewContact(t *testing.T) {
	s := newScanTest()
	for i, a := range s.dests {
		round2 := 32*time.Second + time.Duration(i)*100*time.Millisecond
		s.conn(a, uint16(50000+i), round2, 2*time.Millisecond, probeReset)                          // round 2's probe, reset
		s.conn(a, uint16(40000+i), time.Duration(i)*100*time.Millisecond, time.Second, probeClosed) // round 1's, logged late
		s.conn(a, uint16(50000+i), round2+14*time.Millisecond, 28*time.Second, probeClosed)         // round 2's retry
	}
	s.wantScanAlone(t)
}

// TestSYNRetriesAreOneContact: a connect() the lab never answers (its
// SYNs dropped by the guest's connection-rate limit) is retried on the
// same ports at 1, 3, 7, 15, 31 and 63 s (Linux's tcp_syn_retries of 6);
// past the attempt delay (5 s) a flow table starts a new connection for
// each retry, as Zeek does. They are one contact: counted as five over 63 s
// every such destination of a scanner would stand out of its scan as a
// beacon does. A SYN on the same ports after the attempt was answered is a
// new contact.
func TestSYNRetriesAreOneContact(t *testing.T) {
	s := newScanTest()
	unanswered := func(syns int64) Conn { return Conn{ConnState: "S0", History: "S", OrigPkts: syns} }
	for i, a := range s.dests {
		at := time.Duration(i) * 100 * time.Millisecond
		port := uint16(40000 + i)
		s.conn(a, port, at, 3*time.Second, unanswered(3)) // SYNs at 0, 1 and 3 s
		for _, retry := range []time.Duration{7, 15, 31, 63} {
			s.conn(a, port, at+retry*time.Second, 0, unanswered(1))
		}
		s.conn(a, uint16(50000+i), at+90*time.Second, 0, unanswered(1)) // a second probe, other ports
	}
	s.wantScanAlone(t)

	// Answered, then the same ports again: three contacts over a minute.
	s = newScanTest()
	for i := range 3 {
		s.conn(netip.MustParseAddr("198.51.100.7"), 41000, time.Duration(i)*40*time.Second, time.Second,
			Conn{RespP: 80, ConnState: "SF", History: "ShADadFf", OrigPkts: 5, RespPkts: 4})
	}
	s.d.Flush()
	if len(s.emitted) != 2 || s.emitted[0].Count != 3 {
		t.Errorf("a beacon answered on the same ports three times: %d observables, the first counting %d contacts; want the endpoint and its address, 3", len(s.emitted), s.emitted[0].Count)
	}
}

// TestResumedConnectionIsNoNewContact: a probe's connection still open when
// the previous cycle's capture ended comes back resumed at the start of the
// next (its last packets), before that cycle's scan has begun; with the
// cycle's two rounds of probes over more than a minute after it, it would
// be a third contact, and every such destination would stand out of the
// scan (seen in TestSoakScanningLease, in a fresh-clone make test).
func TestResumedConnectionIsNoNewContact(t *testing.T) {
	s := newScanTest()
	resumed := probeClosed
	resumed.Resumed = true
	for i, a := range s.dests { // the previous cycle's last probes, resumed
		s.conn(a, uint16(30000+i), time.Duration(i)*10*time.Millisecond, time.Second, resumed)
	}
	for i, a := range s.dests { // round 1, 20 s later
		s.conn(a, uint16(40000+i), 20*time.Second+time.Duration(i)*100*time.Millisecond, time.Second, probeClosed)
	}
	for i, a := range s.dests { // round 2, a minute after the resumed ones
		s.conn(a, uint16(50000+i), 61*time.Second+time.Duration(i)*100*time.Millisecond, time.Second, probeClosed)
	}
	s.wantScanAlone(t)
}

// TestLatePieceOfAProbeIsNoNewContact: a scan's late piece (the sinkhole's
// FIN to a probe, arriving after the probe's flow expired: a loaded
// sinkhole forks its responder late) is not a third contact of the
// destination: it must not make a destination the scan probed twice, a
// minute apart, stand out as a beacon would.
func TestLatePieceOfAProbeIsNoNewContact(t *testing.T) {
	s := newScanTest()
	probe := func(a netip.Addr, port uint16, at time.Duration, history string) {
		s.conn(a, port, at, 500*time.Millisecond, Conn{ConnState: "SF", History: history, OrigPkts: 4, RespPkts: 3})
	}
	for i, a := range s.dests { // round 1
		probe(a, uint16(40000+i), time.Duration(i)*100*time.Millisecond, "ShAFf")
	}
	for i, a := range s.dests { // round 2, a minute later
		probe(a, uint16(50000+i), time.Minute+time.Duration(i)*100*time.Millisecond, "ShAFf")
	}
	// Round 2's probe of the first address, its responder's FIN 20 s late.
	probe(s.dests[0], 50000, time.Minute+20*time.Second, "^f")
	s.wantScanAlone(t)
}
