package diskspace_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
)

// tmpfs mounts a tmpfs of size bytes for the test (as root).
func tmpfs(t testing.TB, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("mounting a tmpfs (the test runs as root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func fill(t testing.TB, path string, n int) {
	t.Helper()
	if err := os.WriteFile(path, bytes.Repeat([]byte{'x'}, n), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCheckReadsTheFileSystem(t *testing.T) {
	dir := tmpfs(t, "8m")
	f, err := diskspace.Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	if f.Total != 8<<20 || f.Avail != f.Total || f.Percent() != 100 || f.Path != dir {
		t.Fatalf("empty 8 MiB tmpfs: %+v", f)
	}
	fill(t, filepath.Join(dir, "a"), 3<<20)
	g, err := diskspace.Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	if g.Avail != 5<<20 {
		t.Fatalf("after 3 MiB: %d free, want %d", g.Avail, 5<<20)
	}
	if _, err := diskspace.Check(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing path: %v", err)
	}
}

func TestThreshold(t *testing.T) {
	gib := int64(1 << 30)
	for _, c := range []struct {
		min           diskspace.Threshold
		avail, total  int64
		reserve       int64
		low           bool
		floor         int64
		name          string
		wantInMessage string
	}{
		{diskspace.DefaultThreshold(), 2 * gib, 10 * gib, 0, false, gib, "bytes win on a small disk", ""},
		{diskspace.DefaultThreshold(), gib - 1, 10 * gib, 0, true, gib, "below 1 GiB", "1024 MiB"},
		{diskspace.DefaultThreshold(), 3 * gib, 200 * gib, 0, true, 4 * gib, "2 % of 200 GiB is 4 GiB", "4 GiB that must stay free"},
		{diskspace.DefaultThreshold(), 2 * gib, 10 * gib, gib + 1, true, gib, "the reserve counts", "once the 1 GiB still to write"},
		{diskspace.Threshold{}, 0, 10 * gib, 0, false, 0, "zero never low", ""},
		{diskspace.Threshold{Percent: 50}, 5 * gib, 10 * gib, 0, false, 5 * gib, "exactly at the floor is not low", ""},
	} {
		f := diskspace.Free{Path: "/x", Avail: c.avail, Total: c.total}
		err := c.min.Low(f, c.reserve)
		if (err != nil) != c.low || c.min.Floor(c.total) != c.floor {
			t.Errorf("%s: low %v (floor %d), want %v (floor %d)", c.name, err, c.min.Floor(c.total), c.low, c.floor)
			continue
		}
		if err == nil {
			continue
		}
		var le *diskspace.LowError
		if !errors.Is(err, diskspace.ErrLow) || !errors.As(err, &le) || le.Free != f || le.Reserve != c.reserve {
			t.Errorf("%s: %#v", c.name, err)
		}
		if !strings.HasPrefix(err.Error(), "/x: ") || !strings.Contains(err.Error(), c.wantInMessage) {
			t.Errorf("%s: message %q lacks %q", c.name, err, c.wantInMessage)
		}
	}
}

// TestGuard: Wrote re-reads the file system only once the bytes written
// could have used half the margin; Check always reads it.
func TestGuard(t *testing.T) {
	dir := tmpfs(t, "8m")
	g := &diskspace.Guard{Path: dir, Min: diskspace.Threshold{Bytes: 2 << 20}}
	// The first Wrote reads: 8 MiB free, 6 MiB margin, 3 MiB budget.
	if err := g.Wrote(0, 0); err != nil || g.Last().Avail != 8<<20 {
		t.Fatalf("first Wrote: %v %+v", err, g.Last())
	}
	// Another writer takes 6.5 MiB: the cached reading does not know yet.
	fill(t, filepath.Join(dir, "other"), 6<<20+1<<19)
	if err := g.Wrote(1<<20, 0); err != nil || g.Last().Avail != 8<<20 {
		t.Fatalf("Wrote within the budget read the file system: %v %+v", err, g.Last())
	}
	// The reserve grows with the open file: 1 MiB written and 2 MiB more
	// reserved reach the 3 MiB budget, so this one reads, and finds it low.
	err := g.Wrote(0, 2<<20)
	var le *diskspace.LowError
	if !errors.As(err, &le) || le.Free.Avail != 1<<20+1<<19 || le.Reserve != 2<<20 {
		t.Fatalf("Wrote past the budget: %v", err)
	}
	// Low stays low: every Wrote reads again.
	os.Remove(filepath.Join(dir, "other"))
	if err := g.Wrote(1, 0); err != nil {
		t.Fatalf("after the space came back: %v", err)
	}
	if _, err := g.Check(7 << 20); !errors.Is(err, diskspace.ErrLow) {
		t.Fatalf("Check with a 7 MiB reserve on 8 MiB free and a 2 MiB floor: %v", err)
	}
	// The zero threshold never reads nor reports.
	z := &diskspace.Guard{Path: filepath.Join(dir, "missing")}
	if err := z.Wrote(1<<40, 0); err != nil {
		t.Fatal(err)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "123": 123, "10K": 10 << 10, "10k": 10 << 10, "1.5G": 3 << 29,
		"2TiB": 2 << 40, "512MB": 512e6, "1GB": 1e9, "7 M": 7 << 20, "100B": 100} {
		got, err := diskspace.ParseSize(in)
		if err != nil || int64(got) != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "G", "-1G", "10X", "1e3", "99999999T"} {
		if _, err := diskspace.ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
	if s := diskspace.Size(3 << 29).String(); s != "1.5 GiB" {
		t.Errorf("String: %q", s)
	}
}

func TestWriteMetrics(t *testing.T) {
	var b strings.Builder
	f := diskspace.Free{Path: "/var/lib/talkbox", Avail: 512 << 20, Total: 10 << 30}
	if err := diskspace.WriteMetrics(&b, f, diskspace.DefaultThreshold()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"talkbox_state_free_bytes{path=\"/var/lib/talkbox\"} 536870912\n",
		"talkbox_state_size_bytes{path=\"/var/lib/talkbox\"} 10737418240\n",
		"talkbox_state_min_free_bytes{path=\"/var/lib/talkbox\"} 1073741824\n",
		"talkbox_state_low_space{path=\"/var/lib/talkbox\"} 1\n",
		"# TYPE talkbox_state_low_space gauge\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, b.String())
		}
	}
}

// BenchmarkCheck is one statfs(2): what the capture daemon pays per
// second, and per Guard reading.
func BenchmarkCheck(b *testing.B) {
	dir := b.TempDir()
	for b.Loop() {
		if _, err := diskspace.Check(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuardWrote is the per-packet cost: an addition while the bytes
// written are within the budget, a statfs each time they reach half the
// margin (1500-byte packets, on the test machine's disk).
func BenchmarkGuardWrote(b *testing.B) {
	g := &diskspace.Guard{Path: b.TempDir(), Min: diskspace.DefaultThreshold()}
	if _, err := g.Check(0); err != nil {
		b.Fatal(err)
	}
	i := int64(0)
	for b.Loop() {
		// The open file (the reserve) rotates at about 100 MB.
		i = (i + 1) % 65536
		if err := g.Wrote(1516, i*1516); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDF is the peer: asking df(1) once.
func BenchmarkDF(b *testing.B) {
	dir := b.TempDir()
	df, err := exec.LookPath("df")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if out, err := exec.Command(df, "--output=avail", "-B1", dir).Output(); err != nil || len(out) == 0 {
			b.Fatal(err)
		}
	}
}
