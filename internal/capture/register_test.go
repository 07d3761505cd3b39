package capture_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// TestPacketPathDoesNotWaitForRegistration holds the capture record's lock,
// so that no rotated file can be registered, and sends enough packets for
// ten size rotations: every packet is still taken from the ring and
// written (the daemon answers status with all of them counted), more
// closed files than the queue holds make the open file grow past its
// rotation instead of waiting, and once the lock is released every packet
// is in the registered files, in order, and the spool is empty.
func TestPacketPathDoesNotWaitForRegistration(t *testing.T) {
	l := newLink(t)
	st, err := state.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const rotateSize = 20000 // about 18 of the datagrams below
	spool := t.TempDir()
	r := startDaemonIn(t, st, l, spool, "udp dst port 9", func(c *records.Capture) { c.RotateSize = rotateSize })
	ctx := context.Background()

	locked, release, updated := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		var c records.Capture
		updated <- st.Update(ctx, r.rec.ID, &c, func(bool) error {
			close(locked)
			<-release
			return state.ErrNoChange
		})
	}()
	<-locked
	tag := strings.Repeat("r", 990)
	l.send(t, 200, tag)
	waitFor(t, "200 packets written while no file can be registered", func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		rep, err := capture.Call(cctx, st, r.rec.ID, "status", "")
		return err == nil && rep.Packets >= 200
	})
	close(release)
	if err := <-updated; err != nil {
		t.Fatal(err)
	}
	if _, err := capture.Call(ctx, st, r.rec.ID, "stop", ""); err != nil {
		t.Fatal(err)
	}
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}

	var c records.Capture
	if err := st.Get(r.rec.ID, &c); err != nil {
		t.Fatal(err)
	}
	next, grew := 0, false
	for _, id := range c.Artifacts {
		var a records.Artifact
		if err := st.Get(id, &a); err != nil {
			t.Fatal(err)
		}
		payloads, n := readPcap(t, st, a)
		if uint64(n) != a.Packets {
			t.Fatalf("%s: %d packets in the file, artifact says %d", a.ID, n, a.Packets)
		}
		for _, p := range payloads {
			if want := fmt.Sprintf("%s-%06d", tag, next); p != want {
				t.Fatalf("%s: datagram %d is %.20q…", a.ID, next, p[len(tag):])
			}
			next++
		}
		grew = grew || a.Size > rotateSize
	}
	if next != 200 || c.Packets != 200 || c.Files != len(c.Artifacts) || len(c.Artifacts) < 5 {
		t.Fatalf("%d of 200 datagrams in %d files; capture record: %d packets, %d files", next, len(c.Artifacts), c.Packets, c.Files)
	}
	if !grew {
		t.Fatalf("no file grew past --rotate-size while the queue of closed files was full")
	}
	if left, _ := filepath.Glob(filepath.Join(spool, "capture-*.pcap")); len(left) != 0 {
		t.Fatalf("files left in the spool: %v", left)
	}
}

// TestRegistrationFailureFailsTheCapture: a closed file that cannot be
// registered (here removed from the spool while registration is held up)
// fails the capture with an error naming it, and the files around it are
// still registered.
func TestRegistrationFailureFailsTheCapture(t *testing.T) {
	l := newLink(t)
	st, err := state.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	spool := t.TempDir()
	r := startDaemonIn(t, st, l, spool, "udp dst port 9", func(c *records.Capture) { c.RotateSize = 20000 })
	ctx := context.Background()
	locked, release, updated := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		var c records.Capture
		updated <- st.Update(ctx, r.rec.ID, &c, func(bool) error {
			close(locked)
			<-release
			return state.ErrNoChange
		})
	}()
	<-locked
	l.send(t, 200, strings.Repeat("f", 990))
	second := filepath.Join(spool, "capture-00002.pcap")
	waitFor(t, "the second file closed", func() bool {
		_, err := os.Stat(filepath.Join(spool, "capture-00003.pcap"))
		return err == nil
	})
	if err := os.Remove(second); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-updated; err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the capture went on after a file could not be registered")
	}
	var c records.Capture
	if err := st.Get(r.rec.ID, &c); err != nil {
		t.Fatal(err)
	}
	if c.State != capture.StateFailed || !strings.Contains(c.Error, second) || len(c.Artifacts) < 3 {
		t.Fatalf("capture after a failed registration: state %s, error %q, %d files", c.State, c.Error, len(c.Artifacts))
	}
}
