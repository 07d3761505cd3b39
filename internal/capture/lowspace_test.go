package capture_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// lowFS is a state directory on a tmpfs the test mounts, with a capture
// record whose daemon must keep minFree free.
type lowFS struct {
	root string
	st   *state.Store
	rec  *records.Capture
	done chan error
}

const minFree = 4 << 20

func newLowFS(t *testing.T, l *link, size string) *lowFS {
	t.Helper()
	return newLowFSOn(t, l.tap, netns.Path(l.host), size)
}

// newLowFSOn is newLowFS capturing iface in the namespace at nsPath.
func newLowFSOn(t *testing.T, iface, nsPath, size string) *lowFS {
	t.Helper()
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size="+size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	ctx := context.Background()
	st, err := state.Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	rec := &records.Capture{Iface: iface, NetNS: nsPath, Snaplen: 65535, State: capture.StateStarting,
		Cycle: records.NewID("cycle", time.Now()), Clock: capture.ClockNow(), Filter: "udp dst port 9", MinFree: minFree}
	records.Init(rec, records.KindCapture, st.Now())
	rec.Spool = filepath.Join(root, "capture", "spool", rec.ID)
	if err := st.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// The daemon reads its compiled filter from the spool, as "start"
	// leaves it (tcpdump -ddd's format).
	prog, err := capture.CompileFilter(ctx, rec.Filter, rec.Snaplen)
	if err != nil {
		t.Fatal(err)
	}
	bpf := fmt.Sprintf("%d\n", len(prog))
	for _, in := range prog {
		bpf += fmt.Sprintf("%d %d %d %d\n", in.Code, in.Jt, in.Jf, in.K)
	}
	if err := os.MkdirAll(rec.Spool, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rec.Spool, "filter.bpf"), []byte(bpf), 0o640); err != nil {
		t.Fatal(err)
	}
	return &lowFS{root: root, st: st, rec: rec, done: make(chan error, 1)}
}

// fillTo writes a filler file so that avail bytes stay free.
func (f *lowFS) fillTo(t *testing.T, name string, avail int64) {
	t.Helper()
	fr, err := diskspace.Check(f.root)
	if err != nil {
		t.Fatal(err)
	}
	if fr.Avail < avail {
		t.Fatalf("only %d free, want %d", fr.Avail, avail)
	}
	if err := os.WriteFile(filepath.Join(f.root, name), make([]byte, fr.Avail-avail), 0o600); err != nil {
		t.Fatal(err)
	}
}

// run starts "tb-capture daemon ID" in this process, as the command does.
func (f *lowFS) run(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	st, err := state.Open(ctx, f.root)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() { f.done <- capture.Fault(capture.RunDaemon(ctx, st, log, f.rec.ID)) }()
	waitFor(t, "daemon up", func() bool {
		_, err := capture.Call(ctx, f.st, f.rec.ID, "status", "")
		return err == nil
	})
}

// stopped waits for the daemon to end by itself and checks that it
// reported low space, exit 75, with the capture record and the event; with
// full, that the capture itself kept the threshold free.
func (f *lowFS) stopped(t *testing.T, full bool) records.Capture {
	t.Helper()
	var err error
	select {
	case err = <-f.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the capture did not stop on low space")
	}
	if code := fault.Code(err); code != fault.ExitTempFail || !errors.Is(err, diskspace.ErrLow) {
		t.Fatalf("daemon: exit %d, %v; want 75 and low space", code, err)
	}
	var c records.Capture
	if err := f.st.Get(f.rec.ID, &c); err != nil {
		t.Fatal(err)
	}
	if c.State != capture.StateStopped || !strings.Contains(c.Error, "stopped before the disk is full") || c.StoppedAt == nil {
		t.Fatalf("capture after low space: %+v", c)
	}
	ids, err := f.st.List(records.KindEvent)
	if err != nil || len(ids) != 1 {
		t.Fatalf("events: %v %v", ids, err)
	}
	var e records.Event
	if err := f.st.Get(ids[0], &e); err != nil {
		t.Fatal(err)
	}
	if e.Type != "capture.low-space" || e.Subject != f.rec.ID || e.Cycle != f.rec.Cycle || !strings.Contains(e.Detail, f.root) {
		t.Fatalf("event: %+v", e)
	}
	if !full {
		return c
	}
	// Before full: the threshold held (the records and the event aside).
	fr, err := diskspace.Check(f.root)
	if err != nil {
		t.Fatal(err)
	}
	if fr.Avail < minFree-64<<10 {
		t.Fatalf("%d bytes free after the stop: the capture ran past its %d-byte threshold", fr.Avail, minFree)
	}
	return c
}

// TestLowSpaceStopsCapture fills a tmpfs state directory to 3 MiB above
// the capture's 4 MiB threshold, then sends far more than fits: the real
// daemon, sniffing a veth, stops before the threshold with its last pcap
// whole and registered as a blob, a capture.low-space event, and exit 75.
func TestLowSpaceStopsCapture(t *testing.T) {
	l := newLink(t)
	f := newLowFS(t, l, "24m")
	f.fillTo(t, "filler", minFree+3<<20)
	f.run(t)
	// About 6 MB of datagrams.
	labtest.In(t, l.guest, func() error {
		c, err := net.ListenPacket("udp", ":0")
		if err != nil {
			return err
		}
		defer c.Close()
		buf := bytes.Repeat([]byte{'p'}, 1400)
		for i := 0; i < 4000; i++ {
			c.WriteTo(buf, &net.UDPAddr{IP: l.dst.AsSlice(), Port: 9})
		}
		return nil
	})
	c := f.stopped(t, true)
	if len(c.Artifacts) == 0 || c.Packets == 0 {
		t.Fatalf("nothing captured before the stop: %+v", c)
	}
	for i, id := range c.Artifacts {
		var a records.Artifact
		if err := f.st.Get(id, &a); err != nil {
			t.Fatal(err)
		}
		if _, ok := state.BlobOf(a.URI); !ok || a.Reason == "disk-full" {
			t.Fatalf("%s: uri %s, reason %s: the disk filled up", a.ID, a.URI, a.Reason)
		}
		if payloads, n := readPcap(t, f.st, a); uint64(n) != a.Packets || len(payloads) != n {
			t.Fatalf("%s: %d packets in the file (%d datagrams), artifact says %d", a.ID, n, len(payloads), a.Packets)
		}
		if i == len(c.Artifacts)-1 && a.Reason != "low-space" {
			t.Fatalf("last file's reason %q", a.Reason)
		}
	}
	// While the last file was copied into the blob store, it was on the
	// disk twice: even then the threshold held.
	var last records.Artifact
	if err := f.st.Get(c.Artifacts[len(c.Artifacts)-1], &last); err != nil {
		t.Fatal(err)
	}
	if fr, _ := diskspace.Check(f.root); fr.Avail-last.Size < minFree-64<<10 {
		t.Fatalf("%d bytes free at the copy of the last file: below the %d-byte threshold", fr.Avail-last.Size, minFree)
	}
	if left, _ := filepath.Glob(filepath.Join(f.rec.Spool, "capture-*.pcap")); len(left) != 0 {
		t.Fatalf("files left in the spool: %v", left)
	}
}

// TestLowSpaceFromAnotherWriter: an idle capture stops within its
// one-second check when another process takes the space.
func TestLowSpaceFromAnotherWriter(t *testing.T) {
	l := newLink(t)
	f := newLowFS(t, l, "16m")
	f.run(t)
	f.fillTo(t, "filler", minFree-1<<20)
	rec := f.stopped(t, false)
	if len(rec.Artifacts) != 0 {
		var a records.Artifact
		f.st.Get(rec.Artifacts[0], &a)
		t.Fatalf("an idle capture registered %+v", a)
	}
}

// TestLowSpaceRemovesLeaseRules: a lease's capture that stops for low space
// takes the lease's rules (here an allowed C2) with it, so that the guest,
// no longer recorded, keeps only the sinkhole.
func TestLowSpaceRemovesLeaseRules(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	g := l.AddGuest("g", netip.MustParseAddr("10.13.37.10"))
	h := l.Handle(l.Config.HostNS)
	if port, err := h.LinkByName(g.Port); err != nil || h.LinkSetUp(port) != nil {
		t.Fatalf("port %s: %v", g.Port, err)
	}
	f := newLowFSOn(t, g.Port, l.HostNS(), "16m")
	cfg := l.Config
	cfg.Dir = netlab.Dir(f.st, l.ID)
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	fw, err := cfg.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	lease := records.NewID("lease", time.Now())
	allowed := firewall.Element{Dst: labtest.C2, Proto: "tcp", Port: 8080, Verdict: firewall.Forward}
	if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: lease, IP: g.IP, Elements: []firewall.Element{allowed}}); err != nil {
		t.Fatal(err)
	}
	var c records.Capture
	if err := f.st.Update(ctx, f.rec.ID, &c, func(bool) error {
		c.Lease, c.Lab, c.IP = lease, l.ID, g.IP.String()
		c.Rules = &records.RuleSummary{Table: cfg.Table, Mode: "allowlist", Applied: true}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if set, err := fw.AllowSet(ctx, lease); err != nil || len(set) != 1 {
		t.Fatalf("allow set before: %v %v", set, err)
	}

	f.run(t)
	f.fillTo(t, "filler", minFree-1<<20)
	rec := f.stopped(t, false)
	if set, err := fw.AllowSet(ctx, lease); !errors.Is(err, firewall.ErrNoLease) {
		t.Fatalf("the stopped capture's lease keeps its rules: %v %v", set, err)
	}
	if rec.Rules == nil || rec.Rules.Applied {
		t.Fatalf("capture record's rules: %+v", rec.Rules)
	}
}

// TestLowSpaceKeepsRoomForQueuedFiles: while closed files wait for their
// registration (here held up by the capture record's lock), the capture
// keeps room on the state's file system for their copies too, with the
// spool on another file system, where writing them took nothing from the
// state's: it stops on low space early enough that, once they are all
// copied into the blob store, the threshold held.
func TestLowSpaceKeepsRoomForQueuedFiles(t *testing.T) {
	l := newLink(t)
	f := newLowFS(t, l, "32m")
	spool := t.TempDir()
	if err := unix.Mount("tmpfs", spool, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(spool, unix.MNT_DETACH) })
	// The compiled filter goes with the spool, where the daemon reads it.
	bpf, err := os.ReadFile(filepath.Join(f.rec.Spool, "filter.bpf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(spool, "filter.bpf"), bpf, 0o640); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var c records.Capture
	if err := f.st.Update(ctx, f.rec.ID, &c, func(bool) error {
		c.RotateSize, c.Spool = 1<<20, spool
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	f.fillTo(t, "filler", minFree+6<<20)
	f.run(t)
	locked, release, updated := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		var c records.Capture
		updated <- f.st.Update(ctx, f.rec.ID, &c, func(bool) error {
			close(locked)
			<-release
			return state.ErrNoChange
		})
	}()
	<-locked
	// About 8 MB of datagrams: more than the 6 MiB above the threshold.
	labtest.In(t, l.guest, func() error {
		c, err := net.ListenPacket("udp", ":0")
		if err != nil {
			return err
		}
		defer c.Close()
		buf := bytes.Repeat([]byte{'q'}, 1400)
		for i := 0; i < 6000; i++ {
			c.WriteTo(buf, &net.UDPAddr{IP: l.dst.AsSlice(), Port: 9})
		}
		return nil
	})
	// The daemon stops answering once it has left its loop for the stop.
	waitFor(t, "the capture to stop for low space", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := capture.Call(cctx, f.st, f.rec.ID, "status", "")
		return err != nil
	})
	close(release)
	if err := <-updated; err != nil {
		t.Fatal(err)
	}
	rec := f.stopped(t, true)
	if len(rec.Artifacts) < 2 {
		t.Fatalf("%d files registered: no closed file waited", len(rec.Artifacts))
	}
	for _, id := range rec.Artifacts {
		var a records.Artifact
		if err := f.st.Get(id, &a); err != nil {
			t.Fatal(err)
		}
		if _, ok := state.BlobOf(a.URI); !ok {
			t.Fatalf("%s: uri %s: not copied into the blob store", a.ID, a.URI)
		}
	}
}
