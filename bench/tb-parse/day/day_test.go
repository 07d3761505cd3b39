package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

// decoded is what the smoke test finds in the files, counted the way a
// reader of the capture would, independently of the generator's tally.
type decoded struct {
	packets, syns, port2323, rstAck, synAck, guestRST int
	dsts                                              map[netip.Addr]bool
	c2SYNs, c2Hellos, c2Fins, httpGets, c2Answers     int
	outOfHour                                         int
}

// TestDay generates a small day (10,000 scan connections over two hours)
// and decodes it: distinct scannable destinations, the answer mix, the
// C2's minute beacon with its TLS name, the hourly lookup, the HTTP check,
// one file per hour in time order, and the same bytes for the same seed.
func TestDay(t *testing.T) {
	const conns, hours = 10000, 2
	dir := t.TempDir()
	sum, err := generate(config{dir: dir, conns: conns, hours: hours, seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	var onDisk int64
	var dec decoded
	dec.dsts = map[netip.Addr]bool{}
	isn := map[netip.AddrPort]uint32{}
	last := int64(0)
	for i, name := range sum.Files {
		if want := []string{"hour-00.pcap", "hour-01.pcap"}[i]; name != want {
			t.Fatalf("file %d is %s, want %s", i, name, want)
		}
		path := filepath.Join(dir, name)
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		onDisk += fi.Size()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		r, err := capfile.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		hourStart := pcapgen.Start.Add(time.Duration(i) * time.Hour).UnixNano()
		var p capfile.Packet
		for {
			err := r.Next(&p)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if p.TS < last {
				t.Fatalf("%s: packet %d is older than the one before", name, p.N)
			}
			last = p.TS
			// The last file also holds the answers to its last SYNs.
			if p.TS < hourStart || (i < hours-1 && p.TS >= hourStart+int64(time.Hour)) {
				dec.outOfHour++
			}
			dec.packets++
			dec.add(t, p.Data, isn)
		}
		f.Close()
	}
	if onDisk != sum.Bytes || int64(dec.packets) != sum.Packets {
		t.Errorf("files hold %d bytes and %d packets; the summary says %d and %d", onDisk, dec.packets, sum.Bytes, sum.Packets)
	}
	if dec.outOfHour != 0 {
		t.Errorf("%d packets in the file of another hour", dec.outOfHour)
	}
	if dec.syns != conns || len(dec.dsts) != conns {
		t.Errorf("%d scan SYNs to %d distinct destinations, want %d to %d", dec.syns, len(dec.dsts), conns, conns)
	}
	unanswered := dec.syns - dec.rstAck - dec.synAck
	got := []int{dec.port2323, dec.rstAck, dec.synAck, unanswered}
	if want := []int{sum.Port2323, sum.RSTACK, sum.SYNACK, sum.Unanswered}; !slices.Equal(got, want) {
		t.Errorf("decoded port 2323, RST-ACK, SYN-ACK, unanswered %v; the summary says %v", got, want)
	}
	for i, r := range []struct {
		what   string
		lo, hi float64
	}{{"to port 2323", 0.08, 0.12}, {"RST-ACK", 0.88, 0.92}, {"SYN-ACK", 0.065, 0.095}, {"unanswered", 0.012, 0.03}} {
		if f := float64(got[i]) / conns; f < r.lo || f > r.hi {
			t.Errorf("%s: %.3f of the SYNs, want %.3f to %.3f", r.what, f, r.lo, r.hi)
		}
	}
	if dec.guestRST != dec.synAck {
		t.Errorf("%d SYN-ACKs, %d reset by the guest", dec.synAck, dec.guestRST)
	}
	// A beacon a minute, each one TLS session to the named C2, closed.
	if dec.c2SYNs < 119 || dec.c2SYNs > 121 || dec.c2Hellos != dec.c2SYNs || dec.c2Fins != 2*dec.c2SYNs {
		t.Errorf("C2: %d SYNs, %d ClientHellos naming %s, %d FINs; want 120, as many and twice as many", dec.c2SYNs, dec.c2Hellos, c2Name, dec.c2Fins)
	}
	if dec.c2Answers != hours || dec.httpGets != 6*hours {
		t.Errorf("%d answers naming the C2, %d GETs of %s; want %d and %d", dec.c2Answers, dec.httpGets, updateName, hours, 6*hours)
	}

	again := t.TempDir()
	if _, err := generate(config{dir: again, conns: conns, hours: hours, seed: 7}); err != nil {
		t.Fatal(err)
	}
	for _, name := range append(sum.Files, "day.json") {
		a, _ := os.ReadFile(filepath.Join(dir, name))
		b, err := os.ReadFile(filepath.Join(again, name))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs between two runs with the same seed (%v)", name, err)
		}
	}
	var back summary
	if b, err := os.ReadFile(filepath.Join(dir, "day.json")); err != nil || json.Unmarshal(b, &back) != nil || back.Conns != conns {
		t.Errorf("day.json: %v %+v", err, back)
	}
}

// add decodes one Ethernet/IPv4 frame.
func (d *decoded) add(t *testing.T, b []byte, isn map[netip.AddrPort]uint32) {
	t.Helper()
	if len(b) < 34 || binary.BigEndian.Uint16(b[12:]) != 0x0800 {
		t.Fatalf("not Ethernet/IPv4: % x", b)
	}
	ip := b[14:]
	ihl := int(ip[0]&0x0f) * 4
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	l4 := ip[ihl:binary.BigEndian.Uint16(ip[2:])]
	sport, dport := binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
	switch ip[9] {
	case 17:
		if sport == 53 && bytes.Contains(l4[8:], []byte("\x02c2\x07example\x03net\x00")) && bytes.Contains(l4[8:], c2.Addr().AsSlice()) {
			d.c2Answers++
		}
	case 6:
		seq, ack := binary.BigEndian.Uint32(l4[4:]), binary.BigEndian.Uint32(l4[8:])
		flags := l4[13] & 0x3f
		payload := l4[int(l4[12]>>4)*4:]
		const fin, syn, rst, psh, ackf = 1, 2, 4, 8, 16
		switch {
		case netip.AddrPortFrom(dst, dport) == c2:
			if flags == syn {
				d.c2SYNs++
			}
			if flags&fin != 0 {
				d.c2Fins++
			}
			if len(payload) > 5 && payload[0] == 22 && payload[5] == 1 && bytes.Contains(payload, []byte(c2Name)) {
				d.c2Hellos++
			}
		case netip.AddrPortFrom(src, sport) == c2:
			if flags&fin != 0 {
				d.c2Fins++
			}
		case netip.AddrPortFrom(dst, dport) == update:
			if bytes.HasPrefix(payload, []byte("GET ")) && bytes.Contains(payload, []byte("\r\nHost: "+updateName+"\r\n")) {
				d.httpGets++
			}
		case netip.AddrPortFrom(src, sport) == update:
		case src == guest && flags == syn:
			if dport != 23 && dport != 2323 || !pcapgen.Scannable(dst) || dst.Is4() && dst.As4()[0] == 0 {
				t.Fatalf("scan SYN to %s:%d", dst, dport)
			}
			d.syns++
			if dport == 2323 {
				d.port2323++
			}
			d.dsts[dst] = true
			isn[netip.AddrPortFrom(dst, dport)] = seq
		case dst == guest && flags == rst|ackf:
			if s, ok := isn[netip.AddrPortFrom(src, sport)]; !ok || ack != s+1 {
				t.Fatalf("RST-ACK from %s:%d answers no SYN", src, sport)
			}
			d.rstAck++
		case dst == guest && flags == syn|ackf:
			if s, ok := isn[netip.AddrPortFrom(src, sport)]; !ok || ack != s+1 {
				t.Fatalf("SYN-ACK from %s:%d answers no SYN", src, sport)
			}
			d.synAck++
		case src == guest && flags == rst:
			d.guestRST++
		}
	}
}
