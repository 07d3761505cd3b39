package cycle

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// buildParse builds tb-parse into a directory Tools runs it from.
func buildParse(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if out, err := exec.Command(goBin, "build", "-o", filepath.Join(dir, "tb-parse"), "../../cmd/tb-parse").CombinedOutput(); err != nil {
		tb.Fatalf("building tb-parse: %v: %s", err, out)
	}
	return dir
}

// lookupsCapture stores a capture of the cycle in which the guest resolves
// n distinct names (n domain observables), with its artifact record.
func lookupsCapture(tb testing.TB, ctx context.Context, st *state.Store, lease, cycle string, n int) string {
	tb.Helper()
	var buf bytes.Buffer
	g, err := pcapgen.New(&buf, pcapgen.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	guest, resolver := netip.MustParseAddr("10.13.37.10"), netip.MustParseAddrPort("10.13.37.1:53")
	for i := range n {
		name := fmt.Sprintf("h%d.example.net", i)
		src := netip.AddrPortFrom(guest, uint16(32768+i%28000))
		g.DNSOverUDP(src, resolver, pcapgen.DNSQuery(uint16(i), name, layers.DNSTypeA),
			pcapgen.DNSResponse(uint16(i), name, layers.DNSTypeA, layers.DNSResponseCodeNXDomain, nil))
	}
	if err := g.Flush(); err != nil {
		tb.Fatal(err)
	}
	blob, err := st.PutBlob(ctx, &buf)
	if err != nil {
		tb.Fatal(err)
	}
	a := &records.Artifact{Cycle: cycle, Lease: lease, Type: "pcap", URI: blob.URI(), SHA256: blob.SHA256, Size: blob.Size,
		ContentType: "application/vnd.tcpdump.pcap", ParserStatus: "pending"}
	records.Init(a, records.KindArtifact, st.Now())
	if err := st.Create(ctx, a); err != nil {
		tb.Fatal(err)
	}
	if err := st.Flush(); err != nil {
		tb.Fatal(err)
	}
	return a.ID
}

// TestPostParseCountsFromTheState: the parse step runs the real tb-parse
// --merge on a cycle's capture and says how many observables the cycle
// holds, read by its key from the state (tb-parse's output goes unread).
func TestPostParseCountsFromTheState(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const lease, cycle, other = "lease_01JD00000000000000000000K1", "cycle_01JD00000000000000000000C1", "cycle_01JD00000000000000000000C2"
	tools := &Tools{Dir: buildParse(t), St: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	// An earlier cycle of the lease resolved names the next one does
	// again, and more: merged, each is one observable of both cycles.
	if _, err := tools.Parse(ctx, []string{lookupsCapture(t, ctx, st, lease, other, 20)}); err != nil {
		t.Fatal(err)
	}
	n, err := tools.Parse(ctx, []string{lookupsCapture(t, ctx, st, lease, cycle, 50)})
	if err != nil {
		t.Fatal(err)
	}
	obs, err := state.FindBy[records.Observable](st, records.KindObservable, records.KeyCycle, cycle, nil)
	if err != nil {
		t.Fatal(err)
	}
	domains := 0
	for _, o := range obs {
		if o.Type == records.ObsDomain {
			domains++
		}
	}
	if n != len(obs) || domains != 50 {
		t.Fatalf("Parse said %d observables; the cycle holds %d, %d of them names (want 50)", n, len(obs), domains)
	}
}

// BenchmarkPostParse is the parse step on a capture of 20k names: tb-parse
// --merge storing 20k observables, and what tb-run does with its output.
func BenchmarkPostParse(b *testing.B) {
	ctx := context.Background()
	dir := buildParse(b)
	for range b.N {
		b.StopTimer()
		st, err := state.Open(ctx, b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		tools := &Tools{Dir: dir, St: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		art := lookupsCapture(b, ctx, st, "lease_01JD00000000000000000000K1", "cycle_01JD00000000000000000000C1", 20_000)
		b.StartTimer()
		n, err := tools.Parse(ctx, []string{art})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if n < 20_000 {
			b.Fatalf("%d observables", n)
		}
		st.Close()
	}
}
