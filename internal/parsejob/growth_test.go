package parsejob

import (
	"bytes"
	"io/fs"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
)

// scanCapture writes a bot's capture: a C2 contacted every minute and a
// telnet scan of conns random addresses (they only ever appear in this
// file, never on a wire), every tenth answering.
func scanCapture(t *testing.T, path string, conns int) {
	t.Helper()
	err := pcapgen.WriteFile(path, pcapgen.Options{}, func(g *pcapgen.Gen) {
		rng := rand.New(rand.NewPCG(1, uint64(conns)))
		guest, c2 := netip.MustParseAddr("10.13.37.5"), netip.AddrPortFrom(netip.MustParseAddr("203.0.113.66"), 443)
		g.Step = time.Millisecond
		span := time.Duration(conns) * 10 * time.Millisecond
		for i := 0; i < conns; i++ {
			if i%(conns/10) == 0 {
				c := g.Dial(netip.AddrPortFrom(guest, uint16(30000+i%1000)), c2, uint32(i), 7)
				c.Send([]byte("hello"))
				c.Close()
			}
			dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(20 + rng.IntN(180)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(1 + rng.IntN(250))}), 23)
			src := netip.AddrPortFrom(guest, uint16(40000+i%20000))
			if i%10 == 0 {
				g.Dial(src, dst, uint32(i), 9).Reset()
			} else {
				g.Refused(src, dst, uint32(i))
			}
			g.T = pcapgen.Start.Add(span * time.Duration(i) / time.Duration(conns))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// stateSize is the bytes and files of a state directory outside its blobs
// and its lock files.
func stateSize(t *testing.T, root string) (size int64, files int) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// Lock files hold no bytes, and a kind's or an index's are at most
		// 16, which of them a run creates depending on its records'
		// random IDs: counted, they would make the file counts of two
		// runs differ by chance.
		if d.IsDir() && (d.Name() == "blobs" || p == filepath.Join(root, "locks")) {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			size += fi.Size()
			files++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return size, files
}

func parseInto(t *testing.T, root, path string, cycles int) {
	t.Helper()
	for c := range cycles {
		var out, errb bytes.Buffer
		req := Request{Inputs: []string{path}, Lease: "lease_01JD0000000000000000000000", Merge: true,
			Cycle: "cycle_01JD00000000000000000000" + string(rune('A'+c/26)) + string(rune('A'+c%26))}
		if err := tbParse(root, strings.NewReader(""), req, &out, &errb); err != nil {
			t.Fatalf("tb-parse: %v: %s", err, errb.String())
		}
	}
}

// The state outside the blobs grows by O(1) per scanned connection: ten
// times the scan costs the same records, and a few bytes more (the scan's
// sketch fills up); cycles add a bounded amount each.
func TestStateGrowthPerScannedConnectionIsConstant(t *testing.T) {
	dir := t.TempDir()
	small, large := filepath.Join(dir, "small.pcap"), filepath.Join(dir, "large.pcap")
	scanCapture(t, small, 4000)
	scanCapture(t, large, 40000)
	sizes := map[string][2]int64{}
	for _, c := range []struct {
		name, path string
		cycles     int
	}{{"small", small, 1}, {"large", large, 1}, {"small-10", small, 10}} {
		root := filepath.Join(dir, c.name)
		parseInto(t, root, c.path, c.cycles)
		b, n := stateSize(t, root)
		sizes[c.name] = [2]int64{b, int64(n)}
		t.Logf("%s: %d bytes in %d files outside the blobs", c.name, b, n)
	}
	s, l, s10 := sizes["small"], sizes["large"], sizes["small-10"]
	if l[1] != s[1] {
		t.Errorf("10x the scan made %d files, against %d: growth per connection is not O(1)", l[1], s[1])
	}
	if l[0]-s[0] > 16<<10 {
		t.Errorf("10x the scan took %d more bytes (36,000 more connections): growth per connection is not O(1)", l[0]-s[0])
	}
	if per := (s10[0] - s[0]) / 9; per > 64<<10 {
		t.Errorf("a cycle adds %d bytes, want at most 64 KiB", per)
	}
}

// BenchmarkParseScanWithState is tb-parse's default path (the state, the
// flow log) over a capture of a telnet scan.
func BenchmarkParseScanWithState(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "scan.pcap")
	t := &testing.T{}
	scanCapture(t, path, 100000)
	b.ResetTimer()
	for i := range b.N {
		var out, errb bytes.Buffer
		root := filepath.Join(dir, "state", strconv.Itoa(i))
		if err := tbParse(root, strings.NewReader(""), Request{Inputs: []string{path}, Lease: "lease_01JD0000000000000000000000"}, &out, &errb); err != nil {
			b.Fatal(err, errb.String())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100000), "ns/conn")
}
