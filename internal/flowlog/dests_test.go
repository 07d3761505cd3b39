package flowlog

import (
	"net/netip"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// A scan's late piece (the sinkhole's FIN to a probe, arriving after the
// probe's flow expired: a loaded sinkhole forks its responder late) is not
// a third contact of the destination: it must not make a destination the
// scan probed twice, a minute apart, stand out as a beacon would.
// TestRetriedSYNIsNoNewContact: a probe whose SYN a loaded sinkhole
// answered with a stale ACK, which the guest reset and sent again at once
// on the same ports (two connections in a flow table: "SaR", then "S..."),
// is one contact: with the second round's probe, whose responder took 32 s
// to close, it would otherwise make three contacts over more than a
// minute, and every such destination would stand out of the scan (seen in
// TestSoakScanningLease beside other guests' demos).
func TestRetriedSYNIsNoNewContact(t *testing.T) {
	var emitted []*records.Observable
	d := NewDests("cycle_01JD0000000000000000000001", func(netip.Addr) bool { return false }, func(o *records.Observable) { emitted = append(emitted, o) })
	guest := netip.MustParseAddr("10.213.1.10")
	conn := func(dest netip.Addr, port uint16, at, dur time.Duration, state, history string) {
		start := int64(at)
		d.Conn(&Conn{UID: "C" + dest.String(), Start: start, End: start + int64(dur), Proto: "tcp",
			OrigH: guest, OrigP: port, RespH: dest, RespP: 23, ConnState: state, History: history, OrigPkts: 3, RespPkts: 2}, &observe.Origin{Input: "cap.pcap", Source: "pcap"})
	}
	dests := make([]netip.Addr, 100)
	for i := range dests {
		dests[i] = netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)})
	}
	for i, a := range dests { // round 1: every SYN met by a stale ACK, reset, sent again
		at := time.Duration(i) * 100 * time.Millisecond
		conn(a, uint16(40000+i), at, 2*time.Millisecond, "RSTOS0", "SaR")
		conn(a, uint16(40000+i), at+20*time.Millisecond, 2*time.Second, "S2", "ShAFa")
	}
	for i, a := range dests { // round 2, 41 s later; the responder closes 32 s late
		conn(a, uint16(50000+i), 41*time.Second+time.Duration(i)*100*time.Millisecond, 32*time.Second, "S2", "ShAF")
	}
	d.Flush()
	wantScanAlone(t, emitted)
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
	var emitted []*records.Observable
	d := NewDests("cycle_01JD0000000000000000000001", func(netip.Addr) bool { return false }, func(o *records.Observable) { emitted = append(emitted, o) })
	guest := netip.MustParseAddr("10.213.1.10")
	conn := func(dest netip.Addr, port uint16, at, dur time.Duration, state, history string) {
		start := int64(at)
		d.Conn(&Conn{UID: "C" + dest.String(), Start: start, End: start + int64(dur), Proto: "tcp",
			OrigH: guest, OrigP: port, RespH: dest, RespP: 23, ConnState: state, History: history, OrigPkts: 3, RespPkts: 2}, &observe.Origin{Input: "cap.pcap", Source: "pcap"})
	}
	dests := make([]netip.Addr, 100)
	for i := range dests {
		dests[i] = netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)})
	}
	for i, a := range dests {
		round2 := 32*time.Second + time.Duration(i)*100*time.Millisecond
		conn(a, uint16(50000+i), round2, 2*time.Millisecond, "RSTOS0", "SaR") // round 2's probe, reset
		round1 := time.Duration(i) * 100 * time.Millisecond
		conn(a, uint16(40000+i), round1, time.Second, "S2", "ShAFa")                        // round 1's, logged late
		conn(a, uint16(50000+i), round2+14*time.Millisecond, 28*time.Second, "S2", "ShAFa") // round 2's retry
	}
	d.Flush()
	wantScanAlone(t, emitted)
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
	var emitted []*records.Observable
	d := NewDests("cycle_01JD0000000000000000000001", func(netip.Addr) bool { return false }, func(o *records.Observable) { emitted = append(emitted, o) })
	guest := netip.MustParseAddr("10.213.1.10")
	attempt := func(dest netip.Addr, port uint16, at, dur time.Duration, syns int64) {
		start := int64(at)
		d.Conn(&Conn{UID: "C" + dest.String(), Start: start, End: start + int64(dur), Proto: "tcp",
			OrigH: guest, OrigP: port, RespH: dest, RespP: 23, ConnState: "S0", History: "S", OrigPkts: syns}, &observe.Origin{Input: "cap.pcap", Source: "pcap"})
	}
	dests := make([]netip.Addr, 100)
	for i := range dests {
		dests[i] = netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)})
	}
	for i, a := range dests {
		at := time.Duration(i) * 100 * time.Millisecond
		port := uint16(40000 + i)
		attempt(a, port, at, 3*time.Second, 3)               // SYNs at 0, 1 and 3 s
		attempt(a, port, at+7*time.Second, 0, 1)             // 7 s
		attempt(a, port, at+15*time.Second, 0, 1)            // 15 s
		attempt(a, port, at+31*time.Second, 0, 1)            // 31 s
		attempt(a, port, at+63*time.Second, 0, 1)            // 63 s
		attempt(a, uint16(50000+i), at+90*time.Second, 0, 1) // a second probe, other ports
	}
	d.Flush()
	wantScanAlone(t, emitted)

	// Answered, then the same ports again: three contacts over a minute.
	emitted = nil
	d = NewDests("cycle_01JD0000000000000000000001", func(netip.Addr) bool { return false }, func(o *records.Observable) { emitted = append(emitted, o) })
	c2 := netip.MustParseAddr("198.51.100.7")
	for i := range 3 {
		start := int64(time.Duration(i) * 40 * time.Second)
		d.Conn(&Conn{UID: "Cc2", Start: start, End: start + int64(time.Second), Proto: "tcp", OrigH: guest, OrigP: 41000, RespH: c2, RespP: 80,
			ConnState: "SF", History: "ShADadFf", OrigPkts: 5, RespPkts: 4}, &observe.Origin{Input: "cap.pcap", Source: "pcap"})
	}
	d.Flush()
	if len(emitted) != 2 || emitted[0].Count != 3 {
		t.Errorf("a beacon answered on the same ports three times: %d observables, the first counting %d contacts; want the endpoint and its address, 3", len(emitted), emitted[0].Count)
	}
}

// TestResumedConnectionIsNoNewContact: a probe's connection still open when
// the previous cycle's capture ended comes back resumed at the start of the
// next (its last packets), before that cycle's scan has begun; with the
// cycle's two rounds of probes over more than a minute after it, it would
// be a third contact, and every such destination would stand out of the
// scan (seen in TestSoakScanningLease, in a fresh-clone make test).
func TestResumedConnectionIsNoNewContact(t *testing.T) {
	var emitted []*records.Observable
	d := NewDests("cycle_01JD0000000000000000000001", func(netip.Addr) bool { return false }, func(o *records.Observable) { emitted = append(emitted, o) })
	guest := netip.MustParseAddr("10.213.1.10")
	conn := func(dest netip.Addr, port uint16, at time.Duration, history string, resumed bool) {
		start := int64(at)
		d.Conn(&Conn{UID: "C" + dest.String(), Start: start, End: start + int64(time.Second), Proto: "tcp",
			OrigH: guest, OrigP: port, RespH: dest, RespP: 23, ConnState: "S2", History: history, OrigPkts: 3, RespPkts: 2,
			Resumed: resumed}, &observe.Origin{Input: "cap.pcap", Source: "pcap"})
	}
	dests := make([]netip.Addr, 100)
	for i := range dests {
		dests[i] = netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)})
	}
	for i, a := range dests { // the previous cycle's last probes, resumed
		conn(a, uint16(30000+i), time.Duration(i)*10*time.Millisecond, "ShAFa", true)
	}
	for i, a := range dests { // round 1, 20 s later
		conn(a, uint16(40000+i), 20*time.Second+time.Duration(i)*100*time.Millisecond, "ShAFa", false)
	}
	for i, a := range dests { // round 2, a minute after the resumed ones
		conn(a, uint16(50000+i), 61*time.Second+time.Duration(i)*100*time.Millisecond, "ShAFa", false)
	}
	d.Flush()
	wantScanAlone(t, emitted)
}

// wantScanAlone fails unless emitted is one scan observable and nothing
// that stands out of it.
func wantScanAlone(t *testing.T, emitted []*records.Observable) {
	t.Helper()
	for _, o := range emitted {
		if o.Type == records.ObsEndpoint || o.Type == records.ObsIP {
			t.Errorf("%s %s stands out of the scan (%d contacts)", o.Type, o.Value, o.Count)
		}
	}
	if len(emitted) != 1 || emitted[0].Type != records.ObsScan {
		t.Fatalf("emitted %d observables, want the scan alone", len(emitted))
	}
}

func TestLatePieceOfAProbeIsNoNewContact(t *testing.T) {
	var emitted []*records.Observable
	d := NewDests("cycle_01JD0000000000000000000001", func(netip.Addr) bool { return false }, func(o *records.Observable) { emitted = append(emitted, o) })
	guest := netip.MustParseAddr("10.213.1.10")
	probe := func(dest netip.Addr, port uint16, at time.Duration, history string) {
		start := int64(at)
		d.Conn(&Conn{UID: "C" + dest.String(), Start: start, End: start + int64(500*time.Millisecond), Proto: "tcp",
			OrigH: guest, OrigP: port, RespH: dest, RespP: 23, ConnState: "SF", History: history, OrigPkts: 4, RespPkts: 3}, &observe.Origin{Input: "cap.pcap", Source: "pcap"})
	}
	dests := make([]netip.Addr, 100)
	for i := range dests {
		dests[i] = netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)})
	}
	for i, a := range dests { // round 1
		probe(a, uint16(40000+i), time.Duration(i)*100*time.Millisecond, "ShAFf")
	}
	for i, a := range dests { // round 2, a minute later
		probe(a, uint16(50000+i), time.Minute+time.Duration(i)*100*time.Millisecond, "ShAFf")
	}
	// Round 2's probe of the first address, its responder's FIN 20 s late.
	probe(dests[0], 50000, time.Minute+20*time.Second, "^f")
	d.Flush()
	wantScanAlone(t, emitted)
}
