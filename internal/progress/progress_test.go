package progress

import (
	"bytes"
	"context"
	"github.com/talkbox-sandbox/talkbox/internal/progress/ptytest"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTerminalOnly: a file or pipe gets no Meter, and a nil Meter's bars
// are harmless; a terminal (a pseudo-terminal here) gets one.
func TestTerminalOnly(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := ForTerminal(context.Background(), f)
	if m != nil {
		t.Fatal("a meter for a regular file")
	}
	b := m.Bar("nothing", 10, Items)
	b.Add(3)
	b.SetTotal(4)
	if got := readAll(t, b.Reader(strings.NewReader("abc"))); got != "abc" {
		t.Errorf("nil bar's reader gave %q", got)
	}
	b.Done()
	m.Wait()

	ptm, pts := ptytest.Open(t)
	defer ptm.Close()
	defer pts.Close()
	if !IsTerminal(pts) || ForTerminal(context.Background(), pts) == nil {
		t.Fatal("no meter for a pseudo-terminal")
	}
}

// TestBarDraws: a bar shows its phase, its counts and its percentage.
func TestBarDraws(t *testing.T) {
	var out bytes.Buffer
	m := New(context.Background(), &out)
	b := m.Bar("pcap day-1", 2048, Bytes)
	if got := readAll(t, b.Reader(bytes.NewReader(make([]byte, 2048)))); len(got) != 2048 {
		t.Fatalf("read %d bytes", len(got))
	}
	b.Done()
	m.Wait()
	for _, want := range []string{"pcap day-1", "2.0 KiB / 2.0 KiB", "100 %"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in %q", want, out.String())
		}
	}
}

func readAll(t *testing.T, r interface{ Read([]byte) (int, error) }) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := b.ReadFrom(r); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestStatusFollowsLog: while a meter draws, log lines go above its bars
// and their messages become the status line's phase; after it, straight
// to the log's writer.
func TestStatusFollowsLog(t *testing.T) {
	var out, direct bytes.Buffer
	m := New(context.Background(), &out)
	st := m.Status("build")
	lw := &LogWriter{W: &direct}
	lw.Route(m)
	log := slog.New(slog.NewTextHandler(lw, nil))
	log.Info("phase done", "spec", "amd64", "phase", "bootstrap")
	if got := st.phase.Load().(string); got != "phase done bootstrap" {
		t.Errorf("phase %q", got)
	}
	st.Done()
	m.Wait()
	log.Info("after")
	if !strings.Contains(out.String(), `msg="phase done"`) || !strings.Contains(out.String(), "build") {
		t.Errorf("terminal: %q", out.String())
	}
	if !strings.Contains(direct.String(), "msg=after") || strings.Contains(direct.String(), "phase done") {
		t.Errorf("direct: %q", direct.String())
	}
	if got := message([]byte(`{"time":"x","level":"INFO","msg":"booting","phase":"agent"}`)); got != "booting agent" {
		t.Errorf("json message %q", got)
	}
}
