package state

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// workerEnv, when set, makes the test binary run as a worker process of the
// multi-process tests instead of running tests.
const workerEnv = "TB_STATE_TEST_WORKER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(workerEnv); mode != "" {
		switch mode {
		case "incr":
			workerIncr()
		case "claim":
			workerClaim()
		case "chaos":
			workerChaos()
		case "crashat":
			workerCrashAt()
		case "lockhold":
			workerLockHold()
		default:
			fail("unknown worker mode %q", mode)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func envInt(name string) int {
	n, err := strconv.Atoi(mustEnv(name))
	if err != nil {
		fail("%s: %v", name, err)
	}
	return n
}

// waitForGo blocks until the parent closes stdin, so that all workers start
// their loops together.
func waitForGo() {
	if _, err := io.Copy(io.Discard, os.Stdin); err != nil {
		fail("stdin: %v", err)
	}
}

// pick spreads worker w's i-th increment over k records.
func pick(w, i, k int) int { return (w*7 + i*3 + i/5) % k }

// noop marks the increments that are ErrNoChange instead.
func noop(w, i int) bool { return (w+i)%10 == 9 }

func workerIncr() {
	ctx := context.Background()
	s, err := Open(ctx, mustEnv("TB_DIR"), WithDurability(durabilityFromEnv()), sharedFromEnv())
	if err != nil {
		fail("open: %v", err)
	}
	ids := strings.Split(mustEnv("TB_IDS"), ",")
	n, w := envInt("TB_N"), envInt("TB_W")
	key := fmt.Sprintf("w%02d", w)
	waitForGo()
	var c counterRec // reused on purpose: Update must reset it
	for i := 0; i < n; i++ {
		id := ids[pick(w, i, len(ids))]
		skip := noop(w, i)
		err := s.Update(ctx, id, &c, func(exists bool) error {
			if !exists {
				return ErrNotFound
			}
			if skip {
				return ErrNoChange
			}
			if c.Counts == nil {
				c.Counts = make(map[string]int)
			}
			c.Counts[key]++
			c.Total++
			return nil
		})
		if err != nil {
			fail("update %s: %v", id, err)
		}
		// Readers never see a half-written record.
		var r counterRec
		if err := s.Get(ids[(i+1)%len(ids)], &r); err != nil {
			fail("get: %v", err)
		}
	}
	if err := s.Flush(); err != nil {
		fail("flush: %v", err)
	}
	fmt.Println("ok")
}

type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout bytes.Buffer
	stderr bytes.Buffer
}

// startWorkers starts n workers held at waitForGo; release lets them go.
func startWorkers(t *testing.T, n int, mode string, env func(w int) []string) (ws []*worker, release func()) {
	t.Helper()
	for w := 0; w < n; w++ {
		wk := &worker{cmd: workerCmd(t, mode, env(w)...)}
		wk.cmd.Stdout, wk.cmd.Stderr = &wk.stdout, &wk.stderr
		var err error
		if wk.stdin, err = wk.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := wk.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ws = append(ws, wk)
	}
	t.Cleanup(func() {
		for _, wk := range ws {
			if wk.cmd.ProcessState == nil {
				wk.cmd.Process.Kill()
				wk.cmd.Wait()
			}
		}
	})
	return ws, func() {
		for _, wk := range ws {
			wk.stdin.Close()
		}
	}
}

func waitWorkers(t *testing.T, ws []*worker) {
	t.Helper()
	for w, wk := range ws {
		if err := wk.cmd.Wait(); err != nil {
			t.Errorf("worker %d: %v\n%s", w, err, wk.stderr.Bytes())
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

func runIncrements(t *testing.T, be testBackend, durability string, procs, n, nrec int) {
	dir := t.TempDir()
	ctx := context.Background()
	s := openT(t, dir, be.opts(WithDurability(SyncOnFlush))...)
	var ids []string
	for i := 0; i < nrec; i++ {
		c := newCounter(s)
		if err := s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	ws, release := startWorkers(t, procs, "incr", func(w int) []string {
		return append(be.env(),
			"TB_DIR="+dir, "TB_IDS="+strings.Join(ids, ","), "TB_DURABILITY="+durability,
			"TB_N="+strconv.Itoa(n), "TB_W="+strconv.Itoa(w),
		)
	})
	release()
	waitWorkers(t, ws)

	wantTotal := make([]int, nrec)
	wantCounts := make([]map[string]int, nrec)
	for r := range wantCounts {
		wantCounts[r] = make(map[string]int)
	}
	updates := 0
	for w := 0; w < procs; w++ {
		if got := strings.TrimSpace(ws[w].stdout.String()); got != "ok" {
			t.Fatalf("worker %d said %q", w, got)
		}
		for i := 0; i < n; i++ {
			if noop(w, i) {
				continue
			}
			r := pick(w, i, nrec)
			wantTotal[r]++
			wantCounts[r][fmt.Sprintf("w%02d", w)]++
			updates++
		}
	}
	for r, id := range ids {
		c := getCounter(t, s, id)
		if c.Total != wantTotal[r] {
			t.Errorf("%s: total %d, want %d (lost updates)", id, c.Total, wantTotal[r])
		}
		if c.Rev != int64(1+wantTotal[r]) {
			t.Errorf("%s: rev %d, want %d (1 create + %d updates)", id, c.Rev, 1+wantTotal[r], wantTotal[r])
		}
		if fmt.Sprint(c.Counts) != fmt.Sprint(wantCounts[r]) {
			t.Errorf("%s: counts %v, want %v", id, c.Counts, wantCounts[r])
		}
	}
	assertConsistent(t, s)
	_, stats, err := s.Replay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Entries != nrec+updates || stats.Torn != 0 {
		t.Errorf("journal has %+v, want %d entries and no torn line", stats, nrec+updates)
	}
}

func TestConcurrentIncrementsProcesses(t *testing.T) {
	n := 200
	if raceEnabled || testing.Short() {
		n = 40
	}
	eachBackend(t, func(t *testing.T, be testBackend) { runIncrements(t, be, "flush", 16, n, 4) })
}

func TestConcurrentIncrementsProcessesSyncEachWrite(t *testing.T) {
	n := 25
	if raceEnabled || testing.Short() {
		n = 8
	}
	runIncrements(t, testBackend{name: "dir"}, "each", 16, n, 4)
}

// TestConcurrentIncrementsGoroutines is the same read-modify-write race
// within one process, where it runs under the race detector.
func TestConcurrentIncrementsGoroutines(t *testing.T) {
	eachBackend(t, concurrentIncrementsGoroutines)
}

func concurrentIncrementsGoroutines(t *testing.T, be testBackend) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), be.opts(WithDurability(SyncOnFlush))...)
	c := newCounter(s)
	if err := s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	const workers, n = 8, 50
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			var r counterRec
			for i := 0; i < n; i++ {
				if err := s.Update(ctx, c.ID, &r, func(bool) error { r.Total++; return nil }); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for w := 0; w < workers; w++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	got := getCounter(t, s, c.ID)
	if got.Total != workers*n || got.Rev != workers*n+1 {
		t.Errorf("total %d rev %d, want %d and %d", got.Total, got.Rev, workers*n, workers*n+1)
	}
	assertConsistent(t, s)
}

const claimKey = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func workerClaim() {
	ctx := context.Background()
	s, err := Open(ctx, mustEnv("TB_DIR"), WithDurability(SyncOnFlush), sharedFromEnv())
	if err != nil {
		fail("open: %v", err)
	}
	packMinFromEnv(s)
	waitForGo()
	id, created, err := s.Claim(ctx, "sha256", claimKey, func() (records.Record, error) {
		var g records.Generic
		records.Init(&g, "claimed", s.Now())
		return &g, nil
	})
	if err != nil {
		fail("claim: %v", err)
	}
	fmt.Println(id, created)
}

func TestConcurrentClaimProcesses(t *testing.T) { eachBackend(t, concurrentClaimProcesses) }

func concurrentClaimProcesses(t *testing.T, be testBackend) {
	dir := t.TempDir()
	s := openT(t, dir, be.opts()...)
	ws, release := startWorkers(t, 16, "claim", func(int) []string { return append(be.env(), "TB_DIR="+dir) })
	release()
	waitWorkers(t, ws)
	ids := make(map[string]bool)
	created := 0
	var id string
	for _, wk := range ws {
		f := strings.Fields(wk.stdout.String())
		if len(f) != 2 {
			t.Fatalf("worker said %q", wk.stdout.String())
		}
		id = f[0]
		ids[id] = true
		if f[1] == "true" {
			created++
		}
	}
	if len(ids) != 1 || created != 1 {
		t.Fatalf("claims gave ids %v, %d created; want one id created once", ids, created)
	}
	got, err := s.List("claimed")
	if err != nil || len(got) != 1 || got[0] != id {
		t.Fatalf("claimed records %v (%v), want [%s]", got, err, id)
	}
	if l, err := s.Lookup("sha256", claimKey); err != nil || l != id {
		t.Fatalf("Lookup = %q, %v", l, err)
	}
	assertConsistent(t, s)
}
