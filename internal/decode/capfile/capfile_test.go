package capfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

// pcapFile writes a pcap by hand in either byte order.
func pcapFile(order binary.ByteOrder, nano bool, link uint32, pkts ...[]byte) []byte {
	var b bytes.Buffer
	magic := uint32(0xa1b2c3d4)
	if nano {
		magic = 0xa1b23c4d
	}
	for _, v := range []any{magic, uint16(2), uint16(4), int32(0), uint32(0), uint32(65535), link} {
		binary.Write(&b, order, v)
	}
	for i, p := range pkts {
		frac := uint32(500000 + i)
		if nano {
			frac = 500000000 + uint32(i)
		}
		for _, v := range []uint32{1700000000, frac, uint32(len(p)), uint32(len(p) + 4)} {
			binary.Write(&b, order, v)
		}
		b.Write(p)
	}
	return b.Bytes()
}

// readAll reads data's packets through a Reader of a stream and through
// one of the bytes (NewBytesReader), and fails the test unless both give
// the same packets and the same error.
func readAll(t *testing.T, data []byte) ([]Packet, error) {
	t.Helper()
	pkts, err := readFrom(NewReader(bytes.NewReader(data)))
	bpkts, berr := readFrom(NewBytesReader(data))
	if fmt.Sprint(err) != fmt.Sprint(berr) || !slices.EqualFunc(pkts, bpkts, func(a, b Packet) bool {
		return a.N == b.N && a.TS == b.TS && a.LinkType == b.LinkType && a.OrigLen == b.OrigLen && bytes.Equal(a.Data, b.Data)
	}) {
		t.Fatalf("read as a stream: %d packets, %v; from its bytes: %d packets, %v", len(pkts), err, len(bpkts), berr)
	}
	return pkts, err
}

func readFrom(rd *Reader, err error) ([]Packet, error) {
	if err != nil {
		return nil, err
	}
	var out []Packet
	for {
		var p Packet
		err := rd.Next(&p)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		p.Data = append([]byte(nil), p.Data...)
		out = append(out, p)
	}
}

func TestByteOrdersAndResolutions(t *testing.T) {
	for _, tc := range []struct {
		order binary.ByteOrder
		nano  bool
		ts    int64
	}{
		{binary.LittleEndian, false, 1700000000*1e9 + 500001*1e3},
		{binary.BigEndian, false, 1700000000*1e9 + 500001*1e3},
		{binary.LittleEndian, true, 1700000000*1e9 + 500000001},
		{binary.BigEndian, true, 1700000000*1e9 + 500000001},
	} {
		pkts, err := readAll(t, pcapFile(tc.order, tc.nano, 101, []byte("first"), []byte("second")))
		if err != nil {
			t.Fatal(err)
		}
		if len(pkts) != 2 || string(pkts[1].Data) != "second" || pkts[1].TS != tc.ts || pkts[1].N != 2 ||
			pkts[1].LinkType != 101 || pkts[1].OrigLen != 10 {
			t.Errorf("%v nano=%v: %+v", tc.order, tc.nano, pkts)
		}
	}
}

func TestPcapng(t *testing.T) {
	var buf bytes.Buffer
	g, err := pcapgen.New(&buf, pcapgen.Options{NG: true, Link: layers.LinkTypeRaw})
	if err != nil {
		t.Fatal(err)
	}
	g.Frame([]byte{0x45, 1, 2, 3})
	g.Frame([]byte{0x45, 4})
	g.Flush()
	pkts, err := readAll(t, buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(pkts) != 2 || pkts[1].TS != pcapgen.Start.Add(time.Millisecond).UnixNano() || pkts[0].LinkType != 101 || len(pkts[1].Data) != 2 {
		t.Fatalf("%+v", pkts)
	}
}

func TestBadFiles(t *testing.T) {
	good := pcapFile(binary.LittleEndian, false, 1, []byte("0123456789"))
	huge := pcapFile(binary.LittleEndian, false, 1, []byte("x"))
	binary.LittleEndian.PutUint32(huge[24+8:], 1<<30)
	var ng bytes.Buffer
	g, _ := pcapgen.New(&ng, pcapgen.Options{NG: true})
	g.Frame(make([]byte, 60))
	g.Flush()
	ngb := ng.Bytes()
	badBlock := append([]byte(nil), ngb...)
	binary.LittleEndian.PutUint32(badBlock[len(badBlock)-92+4:], 7) // the enhanced packet block (92 bytes) length
	for name, data := range map[string][]byte{
		"absurd caplen":      huge,
		"pcapng block len":   badBlock,
		"pcapng short start": ngb[:6],
	} {
		_, err := readAll(t, data)
		if !errors.Is(err, ErrBadData) || errors.Is(err, ErrCutShort) {
			t.Errorf("%s: %v, want a bad-data error", name, err)
		}
	}
	// A file that ends inside a record is cut short, not bad: what came
	// before the cut is returned whole.
	// The offset named is the cut record's.
	two := pcapFile(binary.LittleEndian, false, 1, []byte("0123456789"), []byte("abcdefghij"))
	stats := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 5), 32) // an interface statistics block, skipped unread
	for name, c := range map[string]struct {
		data []byte
		want int
		at   int
	}{
		"inside a packet":                {two[:len(two)-3], 1, 24 + 16 + 10},
		"inside a record header":         {good[:30], 0, 24},
		"pcapng inside a block":          {ngb[:len(ngb)-10], 0, len(ngb) - 92},
		"pcapng inside a skipped block":  {append(slices.Clone(ngb), append(stats, 0, 0, 0, 0)...), 1, len(ngb)},
		"pcapng inside a second section": {append(slices.Clone(ngb), ngb[:20]...), 1, len(ngb)},
	} {
		pkts, err := readAll(t, c.data)
		if !errors.Is(err, ErrCutShort) || errors.Is(err, ErrBadData) || len(pkts) != c.want ||
			!strings.Contains(err.Error(), fmt.Sprintf(" at offset %d:", c.at)) {
			t.Errorf("%s: %d packets, %v; want %d and a cut-short error at offset %d", name, len(pkts), err, c.want, c.at)
		}
	}
	if _, err := NewReader(bytes.NewReader([]byte("hello world, not a capture"))); !errors.Is(err, ErrBadData) {
		t.Errorf("not a capture: %v", err)
	}
}

func TestScaleTS(t *testing.T) {
	for _, tc := range []struct {
		ts    uint64
		resol uint8
		want  int64
	}{
		{1500, 6, 1500000}, {1500, 9, 1500}, {1500, 3, 1500000000}, {1500000, 12, 1500},
		{1 << 20, 0x80 | 20, 1e9}, {3, 0x80, 3e9},
	} {
		if got := scaleTS(tc.ts, tc.resol); got != tc.want {
			t.Errorf("scaleTS(%d, %#x) = %d, want %d", tc.ts, tc.resol, got, tc.want)
		}
	}
}

// Packets of link types the decoder does not read are returned, and the
// capture ends with a LinkError naming them instead of io.EOF.
func TestUndecodedLinkTypes(t *testing.T) {
	pkts, err := readAll(t, pcapFile(binary.LittleEndian, false, 127, []byte("radiotap"), []byte("frames")))
	var le *LinkError
	if len(pkts) != 2 || pkts[1].LinkType != 127 || !errors.As(err, &le) || !errors.Is(err, ErrBadData) ||
		err.Error() != "2 packets of link type 127 (IEEE 802.11 radiotap) not decoded" {
		t.Errorf("radiotap: %d packets, %v", len(pkts), err)
	}
	if _, err := readAll(t, pcapFile(binary.BigEndian, false, 147, []byte("x"))); err == nil ||
		err.Error() != "1 packet of link type 147 not decoded" {
		t.Errorf("user link type: %v", err)
	}

	// pcapng: the packets of the decoded interface count for nothing.
	var buf bytes.Buffer
	w, err := pcapgo.NewNgWriterInterface(&buf, pcapgo.NgInterface{LinkType: layers.LinkTypeEthernet, SnapLength: 65535}, pcapgo.DefaultNgWriterOptions)
	if err != nil {
		t.Fatal(err)
	}
	wifi, _ := w.AddInterface(pcapgo.NgInterface{LinkType: layers.LinkTypeIEEE802_11, SnapLength: 65535})
	usb, _ := w.AddInterface(pcapgo.NgInterface{LinkType: 220, SnapLength: 65535})
	for _, ifc := range []int{0, wifi, 0, usb, wifi} {
		w.WritePacket(gopacket.CaptureInfo{Timestamp: pcapgen.Start, CaptureLength: 1, Length: 1, InterfaceIndex: ifc}, []byte{0})
	}
	w.Flush()
	pkts, err = readAll(t, buf.Bytes())
	if len(pkts) != 5 || err == nil || err.Error() != "3 packets of link type 105 (IEEE 802.11) and other link types not decoded" {
		t.Errorf("pcapng: %d packets, %v", len(pkts), err)
	}

	// Every link type the decoder reads ends with io.EOF.
	for _, link := range []uint32{LinkNull, LinkEthernet, LinkPPP, LinkRawBSD, LinkRawOpen, LinkPPPHDLC, LinkPPPoE, LinkRaw,
		LinkCHDLC, LinkLoop, LinkSLL, LinkPPPDir, LinkIPv4, LinkIPv6, LinkNFLOG, LinkSLL2} {
		if _, err := readAll(t, pcapFile(binary.LittleEndian, false, link, []byte("x"))); err != nil {
			t.Errorf("link type %d: %v", link, err)
		}
	}
}

// Records are read from what the buffer holds without a call into it for
// each (the window) and through it when one is not wholly buffered: every
// packet of a file many buffers long comes back whole and in order, from a
// reader that returns little at a time too, and a cut or an absurd record
// length deep in the file is reported at its record's offset.
func TestPcapAcrossBuffers(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	var pkts [][]byte
	var offsets []int // each record's offset
	size := 24
	for size < 3*BufferSize {
		n := rng.Intn(1600)
		if rng.Intn(50) == 0 {
			n = MaxCaplen - rng.Intn(3) // as large as a record may be
		}
		p := make([]byte, n)
		rng.Read(p)
		pkts = append(pkts, p)
		offsets = append(offsets, size)
		size += 16 + n
	}
	data := pcapFile(binary.BigEndian, true, 1, pkts...)
	check := func(name string, r io.Reader, want int, wantErr error, at int) {
		t.Helper()
		rd, err := NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		var p Packet
		i := 0
		for ; ; i++ {
			if err = rd.Next(&p); err != nil {
				break
			}
			if i >= len(pkts) || p.N != int64(i+1) || !bytes.Equal(p.Data, pkts[i]) || p.OrigLen != len(pkts[i])+4 ||
				p.TS != 1700000000*1e9+500000000+int64(i) {
				t.Fatalf("%s: packet %d: N %d, %d bytes, orig %d, ts %d", name, i+1, p.N, len(p.Data), p.OrigLen, p.TS)
			}
		}
		if i != want || !errors.Is(err, wantErr) || at >= 0 && !strings.Contains(err.Error(), fmt.Sprintf("offset %d:", at)) {
			t.Fatalf("%s: %d packets, %v; want %d, %v at offset %d", name, i, err, want, wantErr, at)
		}
	}
	for _, k := range []int{len(pkts) / 2, len(pkts) - 1} {
		if _, err := readAll(t, data[:offsets[k]+16+len(pkts[k])/2]); !errors.Is(err, ErrCutShort) {
			t.Fatalf("cut in packet %d: %v", k+1, err)
		}
	}
	check("whole", bytes.NewReader(data), len(pkts), io.EOF, -1)
	check("a little at a time", iotest.HalfReader(bytes.NewReader(data)), len(pkts), io.EOF, -1)
	for _, k := range []int{1, len(pkts) / 3, len(pkts) / 2, len(pkts) - 1} {
		// Cut inside record k's data, and inside its header.
		check(fmt.Sprintf("cut in packet %d", k+1), bytes.NewReader(data[:offsets[k]+16+len(pkts[k])/2]), k, ErrCutShort, offsets[k])
		check(fmt.Sprintf("cut in header %d", k+1), bytes.NewReader(data[:offsets[k]+7]), k, ErrCutShort, offsets[k])
		bad := slices.Clone(data)
		binary.BigEndian.PutUint32(bad[offsets[k]+8:], MaxCaplen+1)
		check(fmt.Sprintf("absurd length of packet %d", k+1), bytes.NewReader(bad), k, ErrBadData, offsets[k])
	}
}

// FuzzReadersAgree: whatever a file holds, a Reader of its bytes (how
// tb-parse reads a capture file, mapped) returns the packets and the error
// a Reader of it as a stream returns (how it reads a compressed one).
func FuzzReadersAgree(f *testing.F) {
	f.Add(pcapFile(binary.LittleEndian, false, 1, []byte("first"), []byte("second")))
	f.Add(pcapFile(binary.BigEndian, true, 101, bytes.Repeat([]byte{0x45}, 300)))
	var ng bytes.Buffer
	if g, err := pcapgen.New(&ng, pcapgen.Options{NG: true, Link: layers.LinkTypeRaw}); err == nil {
		g.Frame([]byte{0x45, 1, 2, 3})
		g.Flush()
		f.Add(ng.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		readAll(t, data) // fails the test when the two differ
	})
}
