package capture_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// clockStore is a real state directory whose clock the test moves.
type clockStore struct {
	*state.Store
	now time.Time
}

func newClockStore(t testing.TB, opts ...state.Option) *clockStore {
	t.Helper()
	cs := &clockStore{now: time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC)}
	st, err := state.Open(context.Background(), t.TempDir(), append(opts, state.WithClock(func() time.Time { return cs.now }))...)
	if err != nil {
		t.Fatal(err)
	}
	cs.Store = st
	return cs
}

// add registers content as an artifact, as the capture daemon (pcap, with
// its last packet's time) or tb-parse (flow-log, dated by its source) do.
func (cs *clockStore) add(t testing.TB, lease, typ string, content []byte, last time.Time, source string) records.Artifact {
	t.Helper()
	ctx := context.Background()
	blob, err := cs.PutBlob(ctx, bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	a := &records.Artifact{Lease: lease, Type: typ, URI: blob.URI(), SHA256: blob.SHA256, Size: blob.Size, Source: source}
	if typ == capture.TypePcap {
		first := last.Add(-time.Hour)
		a.FirstTS, a.LastTS = &first, &last
	}
	records.Init(a, records.KindArtifact, cs.Now())
	if err := cs.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	return *a
}

func (cs *clockStore) get(t testing.TB, id string) records.Artifact {
	t.Helper()
	var a records.Artifact
	if err := cs.Get(id, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

func content(tag string, n int) []byte {
	return append([]byte(tag), bytes.Repeat([]byte{'.'}, n-len(tag))...)
}

func ids(as []records.Artifact) string {
	var s []string
	for _, a := range as {
		s = append(s, a.ID)
	}
	return strings.Join(s, " ")
}

// TestPrune: six daily pcaps with their flow logs on lease L; keep-days
// and then keep-bytes prune the oldest; records stay with pruned_at, blobs
// go, except one another lease shares.
func TestPrune(t *testing.T) {
	ctx := context.Background()
	cs := newClockStore(t)
	var pcaps, flows []records.Artifact
	for day := 6; day >= 1; day-- {
		last := cs.now.Add(-time.Duration(day) * 24 * time.Hour)
		p := cs.add(t, "L", capture.TypePcap, content(fmt.Sprintf("pcap-%d", day), 1000), last, "")
		pcaps = append(pcaps, p)
		flows = append(flows, cs.add(t, "L", capture.TypeFlowLog, content(fmt.Sprintf("flow-%d", day), 100), time.Time{}, p.ID))
	}
	// Another lease holds the same content as L's second pcap, and an old
	// pcap of its own.
	shared := cs.add(t, "M", capture.TypePcap, content("pcap-5", 1000), cs.now.Add(-30*24*time.Hour), "")
	otherOld := cs.add(t, "M", capture.TypePcap, content("m-old", 500), cs.now.Add(-30*24*time.Hour), "")

	// Dry: the artifacts older than 3.5 days, oldest first, and no change.
	res, err := capture.Prune(ctx, cs.Store, quiet, capture.PruneRequest{Lease: "L", Retention: capture.Retention{KeepDays: 3.5}, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []records.Artifact{pcaps[0], flows[0], pcaps[1], flows[1], pcaps[2], flows[2]}
	if ids(res.Pruned) != ids(want) || res.Kept != 6 || res.KeptBytes != 3300 || res.Deleted != 0 {
		t.Fatalf("dry run: %s kept %d (%d bytes), deleted %d\nwant %s", ids(res.Pruned), res.Kept, res.KeptBytes, res.Deleted, ids(want))
	}
	for _, a := range want {
		if got := cs.get(t, a.ID); got.PrunedAt != nil || !cs.HasBlob(a.SHA256) {
			t.Fatalf("dry run changed %s", a.ID)
		}
	}

	// keep-days 3.5: the same six go; L's pcap-5 content stays for M.
	res, err = capture.Prune(ctx, cs.Store, quiet, capture.PruneRequest{Lease: "L", Retention: capture.Retention{KeepDays: 3.5}})
	if err != nil {
		t.Fatal(err)
	}
	if ids(res.Pruned) != ids(want) || res.Deleted != 5 || res.Freed != 2*1000+3*100 {
		t.Fatalf("keep-days: pruned %s, deleted %d (%d bytes)", ids(res.Pruned), res.Deleted, res.Freed)
	}
	for _, a := range want {
		got := cs.get(t, a.ID)
		if got.PrunedAt == nil || !got.PrunedAt.Equal(cs.Now()) || got.URI != a.URI || got.Rev != a.Rev+1 {
			t.Fatalf("%s after pruning: %+v", a.ID, got)
		}
		if a.SHA256 == shared.SHA256 {
			if !cs.HasBlob(a.SHA256) {
				t.Fatalf("%s: the blob lease M still uses was deleted", a.ID)
			}
		} else if cs.HasBlob(a.SHA256) {
			t.Fatalf("%s: blob kept", a.ID)
		}
	}
	if got := cs.get(t, otherOld.ID); got.PrunedAt != nil || !cs.HasBlob(otherOld.SHA256) {
		t.Fatal("another lease's artifact was pruned")
	}

	// keep-bytes 2200 keeps the two newest pcaps with their flow logs
	// (1100 bytes each); day 3's go, the pcap first.
	res, err = capture.Prune(ctx, cs.Store, quiet, capture.PruneRequest{Lease: "L", Retention: capture.Retention{KeepBytes: 2200}})
	if err != nil {
		t.Fatal(err)
	}
	if ids(res.Pruned) != ids([]records.Artifact{pcaps[3], flows[3]}) || res.KeptBytes != 2200 || res.Kept != 4 {
		t.Fatalf("keep-bytes: pruned %s, kept %d bytes", ids(res.Pruned), res.KeptBytes)
	}
	// Again: nothing left to do.
	if res, err = capture.Prune(ctx, cs.Store, quiet, capture.PruneRequest{Lease: "L", Retention: capture.Retention{KeepBytes: 2200}}); err != nil || len(res.Pruned)+res.Deleted != 0 {
		t.Fatalf("second run: %+v %v", res, err)
	}

	// A run that died between a record's update and its blob's deletion
	// left a pruned record with its blob: the next run deletes the blob.
	var u records.Artifact
	if err := cs.Update(ctx, pcaps[4].ID, &u, func(bool) error { now := cs.Now(); u.PrunedAt = &now; return nil }); err != nil {
		t.Fatal(err)
	}
	res, err = capture.Prune(ctx, cs.Store, quiet, capture.PruneRequest{Lease: "L", Retention: capture.Retention{KeepBytes: 2200}})
	if err != nil || len(res.Pruned) != 0 || res.Deleted != 1 || cs.HasBlob(pcaps[4].SHA256) {
		t.Fatalf("finishing a deletion: %+v %v", res, err)
	}

	// The store is consistent: pruned records, their blobs gone.
	rep, err := cs.Check(ctx, state.CheckOptions{Blobs: true})
	if err != nil || !rep.OK() {
		t.Fatalf("state check: %+v %v", rep, err)
	}
	if _, err := capture.Prune(ctx, cs.Store, quiet, capture.PruneRequest{Lease: "L"}); err == nil {
		t.Fatal("a prune without retention was accepted")
	}
}

// TestPruneWaitsForARegisteringWriter: a writer that stores content a
// prune is about to delete holds the blob's lock until its record exists;
// the prune, waiting on that lock, then sees the record and keeps the blob.
func TestPruneWaitsForARegisteringWriter(t *testing.T) {
	ctx := context.Background()
	cs := newClockStore(t)
	old := cs.add(t, "L", capture.TypePcap, content("same", 100), cs.now.Add(-10*24*time.Hour), "")
	unlock, err := cs.LockBlob(ctx, old.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *capture.PruneResult, 1)
	go func() {
		res, err := capture.Prune(ctx, cs.Store, quiet, capture.PruneRequest{Lease: "L", Retention: capture.Retention{KeepDays: 1}})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	var lockFile unix.Stat_t
	if err := unix.Stat(cs.Path("locks", "blobs"), &lockFile); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the prune waiting for the blob's lock", func() bool { return lockWaiter(t, lockFile.Ino) })
	// The writer's record, created while it holds the lock.
	cs.add(t, "M", capture.TypePcap, content("same", 100), cs.now, "")
	unlock()
	res := <-done
	if len(res.Pruned) != 1 || res.Deleted != 0 || !cs.HasBlob(old.SHA256) {
		t.Fatalf("pruned %d, deleted %d, blob there: %v", len(res.Pruned), res.Deleted, cs.HasBlob(old.SHA256))
	}
}

// lockWaiter reports whether /proc/locks shows a blocked lock request on
// the inode.
func lockWaiter(t *testing.T, ino uint64) bool {
	f, err := os.Open("/proc/locks")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 6 && fs[1] == "->" && strings.HasSuffix(fs[6], fmt.Sprintf(":%d", ino)) {
			return true
		}
	}
	return false
}

// TestDaemonRetention: a running capture with --keep-bytes prunes its
// oldest files after rotations.
func TestDaemonRetention(t *testing.T) {
	l := newLink(t)
	st, err := state.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Each window: 100 datagrams of 1000 bytes, a 105,824-byte pcap; two
	// fit in 250,000 bytes, three do not.
	r := startDaemonIn(t, st, l, t.TempDir(), "udp dst port 9", func(c *records.Capture) {
		c.Lease = "lease_01JDTESTRETENTION0000000"
		c.KeepBytes = 250000
	})
	ctx := context.Background()
	var arts []records.Artifact
	for i := 0; i < 4; i++ {
		l.send(t, 100, fmt.Sprintf("w%d%s", i, strings.Repeat("x", 1000-9)))
		waitFor(t, "the window's packets", func() bool {
			rep, err := capture.Call(ctx, st, r.rec.ID, "status", "")
			return err == nil && rep.Packets >= uint64(100*(i+1))
		})
		a, err := capture.Rotate(ctx, st, r.rec, "")
		if err != nil || len(a) != 1 || a[0].Size != 105824 {
			t.Fatalf("rotate %d: %+v %v", i, a, err)
		}
		arts = append(arts, a...)
	}
	waitFor(t, "the two oldest pruned", func() bool {
		var a records.Artifact
		return st.Get(arts[1].ID, &a) == nil && a.PrunedAt != nil && !st.HasBlob(arts[1].SHA256) && !st.HasBlob(arts[0].SHA256)
	})
	if _, err := capture.Call(ctx, st, r.rec.ID, "stop", ""); err != nil {
		t.Fatal(err)
	}
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	for i, a := range arts {
		got := records.Artifact{}
		if err := st.Get(a.ID, &got); err != nil {
			t.Fatal(err)
		}
		if pruned := got.PrunedAt != nil; pruned != (i < 2) || st.HasBlob(a.SHA256) == pruned {
			t.Fatalf("file %d: pruned_at %v, blob there %v", i, got.PrunedAt, st.HasBlob(a.SHA256))
		}
	}
}

// week simulates a lease captured for a week: 168 hourly rotations of
// 0.25-1 MiB pcaps, each followed by its flow log (1/20 of it) and a prune
// with the given retention. It returns the most the lease held in blobs
// at once and the last prune's duration.
func week(t testing.TB, ret capture.Retention) (maxHeld, written int64, lastPrune time.Duration) {
	ctx := context.Background()
	cs := newClockStore(t, state.WithDurability(state.SyncOnFlush))
	rng := rand.New(rand.NewPCG(1, 2))
	for h := 0; h < 168; h++ {
		cs.now = cs.now.Add(time.Hour)
		size := 256<<10 + rng.IntN(768<<10)
		p := cs.add(t, "L", capture.TypePcap, content(fmt.Sprintf("pcap-%d", h), size), cs.now, "")
		cs.add(t, "L", capture.TypeFlowLog, content(fmt.Sprintf("flow-%d", h), size/20), time.Time{}, p.ID)
		written += int64(size + size/20)
		start := time.Now()
		if _, err := capture.Prune(ctx, cs.Store, quiet, capture.PruneRequest{Lease: "L", Retention: ret}); err != nil {
			t.Fatal(err)
		}
		lastPrune = time.Since(start)
		held := blobBytes(t, cs.Store)
		maxHeld = max(maxHeld, held)
		if ret.KeepBytes > 0 && held > ret.KeepBytes {
			t.Fatalf("hour %d: %d bytes of blobs, retention %d", h, held, ret.KeepBytes)
		}
		if ret.KeepDays > 0 && (h%24 == 23) {
			ids, _ := cs.List(records.KindArtifact)
			for _, id := range ids {
				a := cs.get(t, id)
				if a.Type == capture.TypePcap && a.PrunedAt == nil && cs.now.Sub(*a.LastTS) > time.Duration(ret.KeepDays*24)*time.Hour {
					t.Fatalf("hour %d: %s is %v old", h, a.ID, cs.now.Sub(*a.LastTS))
				}
			}
		}
	}
	return maxHeld, written, lastPrune
}

func blobBytes(t testing.TB, st *state.Store) int64 {
	var n int64
	err := filepath.WalkDir(st.Path("blobs"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if fi != nil {
			n += fi.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRetentionWeek: over a simulated week the lease's blobs stay within
// --keep-bytes, and nothing older than --keep-days survives (checked daily).
func TestRetentionWeek(t *testing.T) {
	held, written, _ := week(t, capture.Retention{KeepBytes: 16 << 20})
	if held > 16<<20 || written < 4*held {
		t.Fatalf("held at most %d of %d written", held, written)
	}
	// Half a day is about 8 MiB: here the age binds.
	if held, _, _ := week(t, capture.Retention{KeepDays: 0.5, KeepBytes: 16 << 20}); held > 12<<20 {
		t.Fatalf("half a day held %d bytes", held)
	}
}

// BenchmarkRetentionWeek reports the bound held and the cost of the last
// hour's prune (336 artifacts in the lease by then).
func BenchmarkRetentionWeek(b *testing.B) {
	for _, ret := range []capture.Retention{{KeepBytes: 16 << 20}, {KeepDays: 1}, {KeepDays: 0.5, KeepBytes: 16 << 20}} {
		b.Run(fmt.Sprintf("days=%g,bytes=%d", ret.KeepDays, ret.KeepBytes), func(b *testing.B) {
			var held, written int64
			var last time.Duration
			for b.Loop() {
				held, written, last = week(b, ret)
			}
			b.ReportMetric(float64(held), "max-held-B")
			b.ReportMetric(float64(written), "written-B")
			b.ReportMetric(float64(last.Microseconds()), "last-prune-µs")
		})
	}
}

// BenchmarkPrunePass is one prune of a lease with nothing to prune, in a
// state holding n artifacts of other leases besides the lease's 336 (a
// week of hourly pcaps and flow logs): a pass reads every artifact, since
// any of them may share content.
func BenchmarkPrunePass(b *testing.B) {
	for _, n := range []int{0, 1000, 10000} {
		b.Run(fmt.Sprintf("others=%d", n), func(b *testing.B) {
			cs := newClockStore(b, state.WithDurability(state.SyncOnFlush))
			for i := 0; i < n; i++ {
				cs.add(b, fmt.Sprintf("other-%d", i%50), capture.TypePcap, content(fmt.Sprintf("o-%d", i), 64), cs.now, "")
			}
			for h := 0; h < 168; h++ {
				p := cs.add(b, "L", capture.TypePcap, content(fmt.Sprintf("pcap-%d", h), 64), cs.now, "")
				cs.add(b, "L", capture.TypeFlowLog, content(fmt.Sprintf("flow-%d", h), 64), time.Time{}, p.ID)
			}
			req := capture.PruneRequest{Lease: "L", Retention: capture.Retention{KeepDays: 7}}
			for b.Loop() {
				if res, err := capture.Prune(context.Background(), cs.Store, quiet, req); err != nil || len(res.Pruned) != 0 {
					b.Fatal(res, err)
				}
			}
		})
	}
}
