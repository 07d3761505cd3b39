package parsejob

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/decode/capfile"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// BenchmarkParseNoStore is tb-parse --no-store on a capture of many small
// conversations, one observable or two each (bench/tb-parse/gen's bulk
// capture in small): DNS lookups, HTTP requests, TLS handshakes, refused
// and unanswered connections, from 250 lab hosts to 4,000 servers. It
// reports the time per capture and per packet; bench/tb-parse/run.sh
// measures the tool itself against tshark.
func BenchmarkParseNoStore(b *testing.B) {
	path := bulkCapture(b)
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	rd, err := capfile.NewReader(f)
	if err != nil {
		b.Fatal(err)
	}
	packets := 0
	var p capfile.Packet
	for rd.Next(&p) == nil {
		packets++
	}
	b.SetBytes(fi.Size())
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := tbParse("", nil, Request{Inputs: []string{path}, NoStore: true}, io.Discard, io.Discard); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(packets), "ns/packet")
}

// BenchmarkRemerge is tb-parse --merge of BenchmarkParseNoStore's capture
// into a state that holds it already, as every cycle of a long-running
// lease merges its capture into the lease's observables: each round
// merges it once more into the same state. On the state directory and on
// PostgreSQL (a cluster the benchmark starts, without fsync). It reports
// the time per merged observable; bench/tb-parse/shapes.sh's remerge
// measures the tool itself on the directory beside tshark.
func BenchmarkRemerge(b *testing.B) {
	path := bulkCapture(b)
	b.Run("dir", func(b *testing.B) { benchRemerge(b, path, "") })
	b.Run("postgres", func(b *testing.B) {
		c := pgtest.Start(b, pgtest.WithoutFsync())
		benchRemerge(b, path, c.NewDatabase(b))
	})
}

func benchRemerge(b *testing.B, path, url string) {
	ctx := context.Background()
	opts := []state.Option{state.WithDurability(state.SyncOnFlush)}
	if url != "" {
		opts = append(opts, state.WithShared(url))
	}
	st, err := state.Open(ctx, b.TempDir(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	merge := func() error {
		sink := cmdout.New("tb-parse", io.Discard, io.Discard, nil)
		job, err := Prepare(Request{Inputs: []string{path}, Lease: storeLease, Merge: true}, nil, sink.Warnf)
		if err != nil {
			return err
		}
		return job.Run(ctx, st, sink)
	}
	if err := merge(); err != nil {
		b.Fatal(err)
	}
	ids, err := st.List(records.KindObservable)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := merge(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(ids)), "ns/observable")
}

// bulkCapture writes BenchmarkParseNoStore's capture.
func bulkCapture(b *testing.B) string {
	path := filepath.Join(b.TempDir(), "bulk.pcap")
	err := pcapgen.WriteFile(path, pcapgen.Options{}, func(g *pcapgen.Gen) {
		for i := 0; i < 4000; i++ {
			client := netip.AddrFrom4([4]byte{10, 13, byte(i % 250 / 100), byte(i%100 + 1)})
			server := netip.AddrFrom4([4]byte{198, 51, 100, byte(i%250 + 1)})
			if i%2 == 1 {
				server = netip.AddrFrom4([4]byte{203, 0, 113, byte(i%250 + 1)})
			}
			sp := uint16(20000 + i)
			name := fmt.Sprintf("host%d.domain%d.example", i, i%97)
			g.DNSOverUDP(netip.AddrPortFrom(client, sp), netip.AddrPortFrom(netip.MustParseAddr("10.13.37.1"), 53),
				pcapgen.DNSQuery(uint16(i), name, layers.DNSTypeA),
				pcapgen.DNSResponse(uint16(i), name, layers.DNSTypeA, 0, []layers.DNSResourceRecord{pcapgen.A(name, server, 60)}))
			switch i % 4 {
			case 0:
				c := g.Dial(netip.AddrPortFrom(client, sp+1), netip.AddrPortFrom(server, 80), 1, 1)
				c.Send(pcapgen.HTTPGet(name, fmt.Sprintf("/gate.php?id=%d", i), "bench/1.0"))
				c.Reply(pcapgen.HTTPResponse(200, "OK", make([]byte, 900)))
				c.Close()
			case 1:
				c := g.Dial(netip.AddrPortFrom(client, sp+1), netip.AddrPortFrom(server, 443), 1, 1)
				c.Send(pcapgen.ClientHelloRecord(pcapgen.Hello{Version: 0x0303, Ciphers: []uint16{0x1301, 0xc02f}, Order: []uint16{0}, SNI: name}))
				c.Reply(pcapgen.ServerHelloRecord(0x0303, 0x1301))
				c.Close()
			case 2:
				g.Refused(netip.AddrPortFrom(client, sp+1), netip.AddrPortFrom(server, 8080), 1)
			default:
				g.Unanswered(netip.AddrPortFrom(client, sp+1), netip.AddrPortFrom(server, 23), 1, 2)
			}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	return path
}
