// Command day writes one day of a Mirai-rate bot as the lab would capture
// it, one pcap per hour (each hour is one cycle): a telnet SYN scan of
// distinct public addresses at a steady rate, each SYN with its answer
// (mostly RST-ACK, some SYN-ACK that the guest's kernel resets, a few
// none), over a TLS C2 contacted every minute, an HTTP check every ten
// minutes, the hourly lookups of both names and a little DNS noise. The
// guest is 10.13.37.5, its gateway and DNS sinkhole 10.13.37.1.
//
//	go run ./bench/tb-parse/day -o bench/out/day-8000000 -conns 8000000 -hours 24
//
// DIR gets hour-00.pcap … and, written last, day.json with the counts.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

var (
	guest   = netip.MustParseAddr("10.13.37.5")
	gateway = netip.MustParseAddr("10.13.37.1")
	c2      = netip.AddrPortFrom(netip.MustParseAddr("203.0.113.66"), 443)
	update  = netip.AddrPortFrom(netip.MustParseAddr("198.51.100.20"), 80)
)

const (
	c2Name     = "c2.example.net"
	updateName = "update.example.org"
)

type config struct {
	dir   string
	conns int
	hours int
	seed  uint64
}

// summary is day.json: what was written, for the bench script and the
// smoke test to compare with what they decode.
type summary struct {
	Conns      int      `json:"conns"`
	Hours      int      `json:"hours"`
	Seed       uint64   `json:"seed"`
	Files      []string `json:"files"`
	Packets    int64    `json:"packets"`
	Bytes      int64    `json:"bytes"`
	Port2323   int      `json:"port_2323"`
	RSTACK     int      `json:"rst_ack"`
	SYNACK     int      `json:"syn_ack"`
	Unanswered int      `json:"unanswered"`
	C2Sessions int      `json:"c2_sessions"`
	HTTPGets   int      `json:"http_gets"`
	DNSQueries int      `json:"dns_queries"`
}

func main() {
	var cfg config
	flag.StringVar(&cfg.dir, "o", "", "output directory (created)")
	flag.IntVar(&cfg.conns, "conns", 8000000, "scan connections (SYNs to distinct addresses) over the day")
	flag.IntVar(&cfg.hours, "hours", 24, "hours, one capture file each")
	flag.Uint64Var(&cfg.seed, "seed", 1, "random seed")
	flag.Parse()
	if cfg.dir == "" || cfg.conns < 1 || cfg.hours < 1 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: day -o DIR [-conns N] [-hours H] [-seed S]")
		os.Exit(2)
	}
	start := time.Now()
	s, err := generate(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "day:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "day: %s: %d files, %d packets, %d bytes, %d scan SYNs, in %s\n",
		cfg.dir, len(s.Files), s.Packets, s.Bytes, s.Conns, time.Since(start).Round(time.Millisecond))
}

// generate writes the day. Each source of traffic is an event stream;
// events are generated in start order, their frames held by a Sched until
// no later event can precede them, so each file comes out in time order.
func generate(cfg config) (*summary, error) {
	if err := os.MkdirAll(cfg.dir, 0o755); err != nil {
		return nil, err
	}
	marker := filepath.Join(cfg.dir, "day.json")
	if err := os.Remove(marker); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	out := &hourly{dir: cfg.dir, start: pcapgen.Start, hours: cfg.hours, cur: -1}
	sched := &pcapgen.Sched{Out: out}
	d := &day{
		cfg: cfg, g: pcapgen.To(sched, pcapgen.Options{}), rng: rand.New(rand.NewPCG(cfg.seed, 0x6d69726169)),
		targets: pcapgen.NewTargets(cfg.seed), sum: &summary{Conns: cfg.conns, Hours: cfg.hours, Seed: cfg.seed},
		span: time.Duration(cfg.hours) * time.Hour,
	}
	d.bulk = make([]byte, 16<<10)
	for i := range d.bulk {
		d.bulk[i] = byte(d.rng.Uint32())
	}
	d.hello = pcapgen.ClientHelloRecord(pcapgen.Hello{
		Version: 0x0303, Ciphers: []uint16{0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8},
		Order: []uint16{0, 5, 10, 11, 13, 65281, 18, 43, 51}, SNI: c2Name,
		Groups: []uint16{29, 23, 24}, PointFormats: []uint8{0}, SigAlgs: []uint16{0x0804, 0x0403, 0x0805, 0x0503, 0x0806, 0x0401},
		SupportedVersions: []uint16{0x0304, 0x0303}})
	end := pcapgen.Start.Add(d.span)
	srcs := []*source{
		{next: pcapgen.Start, run: d.scan},
		{next: pcapgen.Start.Add(2 * time.Second), run: d.lookups},
		{next: pcapgen.Start.Add(3 * time.Second), run: d.beacon},
		{next: pcapgen.Start.Add(17 * time.Second), run: d.http},
		{next: pcapgen.Start.Add(41 * time.Second), run: d.noise},
	}
	last := pcapgen.Start
	for {
		var s *source
		for _, c := range srcs {
			if c.next.Before(end) && (s == nil || c.next.Before(s.next)) {
				s = c
			}
		}
		if s == nil {
			break
		}
		if s.next.Before(last) {
			return nil, fmt.Errorf("event at %s after one at %s", s.next, last)
		}
		last = s.next
		if err := sched.Release(s.next); err != nil {
			return nil, err
		}
		s.next = s.run(s.next)
		if err := errors.Join(d.err, d.g.Err()); err != nil {
			return nil, err
		}
	}
	if err := sched.Drain(); err != nil {
		return nil, err
	}
	if err := out.finish(); err != nil {
		return nil, err
	}
	d.sum.Files, d.sum.Packets, d.sum.Bytes = out.files, out.packets, out.bytes
	b, err := json.MarshalIndent(d.sum, "", "  ")
	if err != nil {
		return nil, err
	}
	tmp := marker + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	return d.sum, os.Rename(tmp, marker)
}

// source is an event stream: run generates the event at t and returns the
// time of the next.
type source struct {
	next time.Time
	run  func(t time.Time) time.Time
}

type day struct {
	cfg     config
	g       *pcapgen.Gen
	rng     *rand.Rand
	targets *pcapgen.Targets
	sum     *summary
	span    time.Duration
	syns    int
	bulk    []byte
	hello   []byte
	dnsID   uint16
	err     error
}

func (d *day) ephemeral() uint16 { return uint16(32768 + d.rng.IntN(60999-32768+1)) }

func (d *day) ms(lo, hi int) time.Duration {
	return time.Duration(lo+d.rng.IntN(hi-lo+1)) * time.Millisecond
}

func (d *day) bytes(n int) []byte {
	off := d.rng.IntN(len(d.bulk) - n)
	return d.bulk[off : off+n]
}

// scan sends one SYN and writes its answer; the SYNs are spread evenly
// over the day, each at a random point of its slot.
func (d *day) scan(t time.Time) time.Time {
	dst, ok := d.targets.Next()
	if !ok {
		d.err = fmt.Errorf("%d conns: more than the scannable addresses", d.cfg.conns)
		return t.Add(d.span)
	}
	port := uint16(23)
	if d.rng.IntN(10) == 0 {
		port = 2323
		d.sum.Port2323++
	}
	from, to := netip.AddrPortFrom(guest, d.ephemeral()), netip.AddrPortFrom(dst, port)
	// Mirai's scanner puts the target's address in the sequence number and
	// recognises answers by it.
	a4 := dst.As4()
	isn := binary.BigEndian.Uint32(a4[:])
	d.g.T = t
	d.g.TCP(from, to, isn, 0, pcapgen.SYN, nil)
	rtt := d.ms(20, 300)
	switch k := d.rng.IntN(100); {
	case k < 90:
		d.g.T = t.Add(rtt)
		d.g.TCP(to, from, 0, isn+1, pcapgen.RST|pcapgen.ACK, nil)
		d.sum.RSTACK++
	case k < 98:
		// The SYN left a raw socket, so the guest's kernel knows no such
		// connection and resets it.
		d.g.T = t.Add(rtt)
		d.g.TCP(to, from, d.rng.Uint32(), isn+1, pcapgen.SYN|pcapgen.ACK, nil)
		d.g.T = t.Add(rtt + 40*time.Microsecond)
		d.g.TCP(from, to, isn+1, 0, pcapgen.RST, nil)
		d.sum.SYNACK++
	default:
		d.sum.Unanswered++
	}
	d.syns++
	if d.syns == d.cfg.conns {
		return t.Add(d.span)
	}
	return pcapgen.Start.Add(d.slot(d.syns) + time.Duration(d.rng.Int64N(int64(max(1, d.slot(d.syns+1)-d.slot(d.syns))))))
}

// slot is where the i-th SYN's slot starts: i·span/conns, without the
// product overflowing (8e6 × 86400e9 ns does).
func (d *day) slot(i int) time.Duration {
	n := time.Duration(d.cfg.conns)
	return time.Duration(i)*(d.span/n) + time.Duration(i)*(d.span%n)/n
}

func (d *day) resolve(t time.Time, name string, rcode layers.DNSResponseCode, answers ...layers.DNSResourceRecord) {
	d.dnsID += 1 + uint16(d.rng.IntN(97))
	from, to := netip.AddrPortFrom(guest, d.ephemeral()), netip.AddrPortFrom(gateway, 53)
	d.g.T = t
	d.g.UDP(from, to, pcapgen.DNSQuery(d.dnsID, name, layers.DNSTypeA))
	d.g.T = t.Add(d.ms(1, 30))
	d.g.UDP(to, from, pcapgen.DNSResponse(d.dnsID, name, layers.DNSTypeA, rcode, answers))
	d.sum.DNSQueries++
}

// lookups resolves the C2's and the update server's names, hourly.
func (d *day) lookups(t time.Time) time.Time {
	d.resolve(t, c2Name, layers.DNSResponseCodeNoErr, pcapgen.A(c2Name, c2.Addr(), 3600))
	d.resolve(t.Add(d.ms(100, 400)), updateName, layers.DNSResponseCodeNoErr, pcapgen.A(updateName, update.Addr(), 3600))
	return t.Add(time.Hour)
}

// beacon is one C2 session: TLS hello exchange, a few KB each way, close.
func (d *day) beacon(t time.Time) time.Time {
	d.g.T, d.g.Step = t, d.ms(20, 40)
	c := d.g.Dial(netip.AddrPortFrom(guest, d.ephemeral()), c2, d.rng.Uint32(), d.rng.Uint32())
	c.Send(d.hello)
	srv := pcapgen.ServerHelloRecord(0x0304, 0x1301)
	srv = append(srv, pcapgen.Record(20, []byte{1})...)
	srv = append(srv, pcapgen.Record(23, d.bytes(2500+d.rng.IntN(1500)))...)
	c.Reply(srv)
	c.Send(append(pcapgen.Record(20, []byte{1}), pcapgen.Record(23, d.bytes(2000+d.rng.IntN(2000)))...))
	c.Reply(pcapgen.Record(23, d.bytes(1000+d.rng.IntN(3000))))
	c.Close()
	d.sum.C2Sessions++
	// Every minute, give or take half a second.
	return t.Add(time.Minute + d.ms(0, 1000) - 500*time.Millisecond)
}

// http is the ten-minute check with the update server.
func (d *day) http(t time.Time) time.Time {
	d.g.T, d.g.Step = t, d.ms(10, 30)
	c := d.g.Dial(netip.AddrPortFrom(guest, d.ephemeral()), update, d.rng.Uint32(), d.rng.Uint32())
	c.Send(pcapgen.HTTPGet(updateName, fmt.Sprintf("/v1/check?id=%08x&arch=arm7", d.cfg.seed), "Wget/1.20.3 (linux-gnu)"))
	c.Reply(pcapgen.HTTPResponse(200, "OK", []byte("ok\n")))
	c.Close()
	d.sum.HTTPGets++
	return t.Add(10 * time.Minute)
}

// noise is a lookup of some other name every few minutes, some of which
// do not exist.
func (d *day) noise(t time.Time) time.Time {
	names := []string{"pool.ntp.org", "connectivity-check.ubuntu.com", "www.example.com", "api.example.net", "cdn.example.org"}
	if d.rng.IntN(4) == 0 {
		d.resolve(t, fmt.Sprintf("%08x.example.com", d.rng.Uint32()), layers.DNSResponseCodeNXDomain)
	} else {
		n := names[d.rng.IntN(len(names))]
		d.resolve(t, n, layers.DNSResponseCodeNoErr, pcapgen.A(n, netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + d.rng.IntN(254))}), 300))
	}
	return t.Add(d.ms(240_000, 360_000))
}

// hourly writes frames to one pcap per hour, as tb-capture's rotation
// does; a frame stamped after the last hour (an answer to one of its last
// SYNs) goes to the last file.
type hourly struct {
	dir     string
	start   time.Time
	hours   int
	cur     int
	f       *os.File
	bw      *bufio.Writer
	pw      *pcapgo.Writer
	files   []string
	packets int64
	bytes   int64
}

func (h *hourly) WritePacket(ci gopacket.CaptureInfo, data []byte) error {
	i := min(int(ci.Timestamp.Sub(h.start)/time.Hour), h.hours-1)
	for h.cur < i {
		if err := h.open(h.cur + 1); err != nil {
			return err
		}
	}
	h.packets++
	h.bytes += 16 + int64(len(data))
	return h.pw.WritePacket(ci, data)
}

func (h *hourly) open(i int) error {
	if err := h.close(); err != nil {
		return err
	}
	name := fmt.Sprintf("hour-%02d.pcap", i)
	f, err := os.Create(filepath.Join(h.dir, name))
	if err != nil {
		return err
	}
	h.f, h.bw, h.cur = f, bufio.NewWriterSize(f, 4<<20), i
	h.pw = pcapgo.NewWriter(h.bw)
	h.files = append(h.files, name)
	h.bytes += 24
	return h.pw.WriteFileHeader(262144, layers.LinkTypeEthernet)
}

func (h *hourly) close() error {
	if h.f == nil {
		return nil
	}
	err := h.bw.Flush()
	if cerr := h.f.Close(); err == nil {
		err = cerr
	}
	h.f = nil
	return err
}

// finish writes the remaining hours' files (empty if nothing happened in
// them) and closes the last.
func (h *hourly) finish() error {
	for h.cur < h.hours-1 {
		if err := h.open(h.cur + 1); err != nil {
			return err
		}
	}
	return h.close()
}
