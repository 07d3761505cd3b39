package parsejob

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/observe"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// workerEnv, when set, makes the test binary run tb-parse as a process the
// test kills (TestKilledParseKeepsWhatItPrinted) instead of running tests.
const workerEnv = "TB_PARSE_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		parseWorker()
	}
	os.Exit(m.Run())
}

const storeLease = "lease_01JD0000000000000000000STO"

// parseWorker parses TB_INPUT into the state TB_DIR (in the database
// TB_SHARED when set) with --merge when TB_MERGE is set, printing to stdout
// as tb-parse does.
func parseWorker() {
	ctx := context.Background()
	opts := []state.Option{state.WithDurability(state.SyncOnFlush)}
	if u := os.Getenv("TB_SHARED"); u != "" {
		opts = append(opts, state.WithShared(u))
	}
	st, err := state.Open(ctx, os.Getenv("TB_DIR"), opts...)
	if err == nil {
		err = runStored(ctx, st, os.Getenv("TB_INPUT"), os.Getenv("TB_MERGE") != "", os.Stdout, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runStored is tb-parse --lease storeLease [--merge] INPUT on st. A small
// --max-held makes the observables go out, and their batches commit, while
// the capture is read, not only at its end.
func runStored(ctx context.Context, st *state.Store, input string, merge bool, out, errb io.Writer) error {
	sink := cmdout.New("tb-parse", out, errb, nil)
	job, err := Prepare(Request{Inputs: []string{input}, Lease: storeLease, Merge: merge, MaxHeld: 97}, nil, sink.Warnf)
	if err != nil {
		return err
	}
	return job.Run(ctx, st, sink)
}

// conversations writes a capture of n answered connections from the guest,
// each to its own address and port (no port is scanned): one endpoint
// observable each, and more for the addresses. Each is repeated 150
// connections later: with a --max-held below that, a run emits it twice,
// most often into one batch.
func conversations(t *testing.T, path string, n int) {
	t.Helper()
	err := pcapgen.WriteFile(path, pcapgen.Options{}, func(g *pcapgen.Gen) {
		g.Step = time.Millisecond
		guest := netip.MustParseAddr("10.13.37.5")
		conv := func(i int) {
			// Addresses only ever in this file, never on a wire.
			dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(20 + i/60000), byte(i / 250 % 240), byte(i % 250), 7}), uint16(1024+i%60000))
			c := g.Dial(netip.AddrPortFrom(guest, uint16(20000+i%40000)), dst, uint32(i), 9)
			c.Send([]byte("GET / HTTP/1.0\r\n\r\n"))
			c.Reply([]byte("HTTP/1.0 200 OK\r\n\r\n"))
			c.Close()
		}
		const lag = 150
		for i := range n + lag {
			if i < n {
				conv(i)
			}
			if i >= lag {
				conv(i - lag)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

type storeBackend struct {
	name string
	// newURL gives each state its own database; nil: the directory.
	newURL func(t testing.TB) string
}

func (be storeBackend) open(t *testing.T, dir, url string) *state.Store {
	t.Helper()
	opts := []state.Option{state.WithDurability(state.SyncOnFlush)}
	if url != "" {
		opts = append(opts, state.WithShared(url))
	}
	st, err := state.Open(context.Background(), dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func eachStoreBackend(t *testing.T, f func(t *testing.T, be storeBackend)) {
	t.Run("dir", func(t *testing.T) { f(t, storeBackend{name: "dir"}) })
	t.Run("postgres", func(t *testing.T) {
		c := pgtest.Start(t, pgtest.WithoutFsync())
		f(t, storeBackend{name: "postgres", newURL: c.NewDatabase})
	})
}

// storedObservables reads the lease's observables from st, by their index
// key, which must name one of them. With merged, a key has one record;
// without, a run stores an observable it emits twice twice, and the key
// names the last.
func storedObservables(t *testing.T, st *state.Store, merged bool) map[string][]*records.Observable {
	t.Helper()
	all, err := state.FindBy[records.Observable](st, records.KindObservable, records.KeyLease, storeLease, nil)
	if err != nil {
		t.Fatal(err)
	}
	byKey := make(map[string][]*records.Observable, len(all))
	for _, o := range all {
		key := IndexKey(o.Lease, o.Type, observe.Key(o))
		if prev := byKey[key]; merged && prev != nil {
			t.Fatalf("two observables for %s %s: %s and %s", o.Type, observe.Key(o), prev[0].ID, o.ID)
		}
		byKey[key] = append(byKey[key], o)
	}
	for key, os := range byKey {
		id, err := st.Lookup(IndexName, key)
		if err != nil || !slices.ContainsFunc(os, func(o *records.Observable) bool { return o.ID == id }) {
			t.Fatalf("index key of %s %s = %q, %v; want one of its %d records", os[0].Type, observe.Key(os[0]), id, err, len(os))
		}
	}
	return byKey
}

// A tb-parse killed with SIGKILL at any point of its run has stored every
// observable it printed, each with its index key, and each observable is
// stored with its key or not at all: the batches commit before their
// records are printed, and a batch cut short by the kill is recovered or
// discarded whole when the state is next opened.
func TestKilledParseKeepsWhatItPrinted(t *testing.T) { killedParse(t, false) }

// TestKilledMergeKeepsWhatItPrinted is TestKilledParseKeepsWhatItPrinted
// for a --merge run into a state that holds the capture's observables
// already (from a --merge run of it), whose batches fill at once: what it
// printed of each observable is stored (or a later version of it, merged
// and committed before the kill), and each key names one observable.
func TestKilledMergeKeepsWhatItPrinted(t *testing.T) { killedParse(t, true) }

func killedParse(t *testing.T, merge bool) {
	input := filepath.Join(t.TempDir(), "conv.pcap")
	conversations(t, input, 200)
	eachStoreBackend(t, func(t *testing.T, be storeBackend) {
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		rng := rand.New(rand.NewPCG(seed, 1))
		rounds := 4
		tally := map[string]int{}
		for round := range rounds {
			dir, url := t.TempDir(), ""
			if be.newURL != nil {
				url = be.newURL(t)
			}
			env := append(os.Environ(), workerEnv+"=1", "TB_DIR="+dir, "TB_INPUT="+input, "TB_SHARED="+url)
			if merge {
				env = append(env, "TB_MERGE=1")
				first := exec.Command(os.Args[0], "-test.run=^$")
				first.Env = env
				if out, err := first.CombinedOutput(); err != nil {
					t.Fatalf("round %d: the first --merge run: %v\n%.2000s", round, err, out)
				}
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = env
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(out)
			var printed [][]byte
			want := rng.IntN(900)
			for len(printed) < want {
				line, err := br.ReadBytes('\n')
				if err != nil {
					break
				}
				printed = append(printed, line)
			}
			// Off the line boundaries by up to a few batches' time.
			spin := time.Duration(rng.IntN(20000)) * time.Microsecond
			for t0 := time.Now(); time.Since(t0) < spin; {
			}
			cmd.Process.Signal(syscall.SIGKILL)
			for {
				line, err := br.ReadBytes('\n')
				if err != nil {
					break // a line cut short was not printed
				}
				printed = append(printed, line)
			}
			err = cmd.Wait()
			var exit *exec.ExitError
			switch {
			case err == nil:
				tally["finished"]++
			case errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL:
				tally["killed"]++
			default:
				t.Fatalf("round %d: %v\n%s", round, err, stderr.Bytes())
			}

			st := be.open(t, dir, url) // recovers what the kill left
			stored := 0
			for _, os := range storedObservables(t, st, merge) {
				stored += len(os)
			}
			// With --merge an observable emitted twice is printed
			// twice, the second time merged again: its last line is
			// checked.
			last := map[string][]byte{}
			var order []string
			for _, line := range printed {
				var g records.Generic
				if err := records.Unmarshal(bytes.TrimSuffix(line, []byte("\n")), &g); err != nil {
					t.Fatalf("round %d: printed %q: %v", round, line, err)
				}
				if g.Kind != records.KindObservable {
					continue
				}
				if _, ok := last[g.ID]; !ok || !merge {
					order = append(order, g.ID)
				}
				last[g.ID] = bytes.TrimSuffix(line, []byte("\n"))
			}
			n := len(order)
			for _, id := range order {
				line := last[id]
				raw, err := st.ReadRaw(id)
				if err == nil && merge && !bytes.Equal(raw, line) {
					// Merged and committed again after this line,
					// before the kill: a later revision.
					var was, is records.Generic
					if records.Unmarshal(line, &was) == nil && records.Unmarshal(raw, &is) == nil && is.Rev > was.Rev {
						continue
					}
				}
				if err != nil || !bytes.Equal(raw, line) {
					t.Fatalf("round %d: printed %s but stored %s, %v", round, line, raw, err)
				}
			}
			if n > stored {
				t.Fatalf("round %d: %d observables printed, %d stored", round, n, stored)
			}
			rep, err := st.Check(context.Background(), state.CheckOptions{})
			if err != nil || !rep.OK() {
				t.Fatalf("round %d: check: %v %v", round, err, rep)
			}
			t.Logf("round %d: %d observables printed, %d stored", round, n, stored)
		}
		t.Logf("%v", tally)
	})
}

// Two tb-parse --merge runs on one lease at once store one observable per
// index key, into which both runs' sightings are merged: a run queues a new
// observable in its batch only under the key's lock (TryLockIndex) and
// after finding the key unset, and merges into the record of a key another
// run holds or has set once that run's batch is committed.
func TestConcurrentMergeRunsAgree(t *testing.T) {
	input := filepath.Join(t.TempDir(), "conv.pcap")
	conversations(t, input, 200)
	var once bytes.Buffer
	if err := tbParse(t.TempDir(), nil, Request{Inputs: []string{input}, Lease: storeLease, NoStore: true, MaxHeld: 97}, &once, io.Discard); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(once.String()), "\n") {
		var o records.Observable
		if err := records.Unmarshal([]byte(line), &o); err != nil {
			t.Fatal(err)
		}
		if o.Kind == records.KindObservable {
			counts[IndexKey(storeLease, o.Type, observe.Key(&o))] += o.Count
		}
	}
	eachStoreBackend(t, func(t *testing.T, be storeBackend) {
		dir, url := t.TempDir(), ""
		if be.newURL != nil {
			url = be.newURL(t)
		}
		const runs = 3
		var wg sync.WaitGroup
		errs := make([]error, runs)
		for r := range runs {
			// Each run its own store, as a process of its own would
			// have: its own lock descriptors and connections.
			st := be.open(t, dir, url)
			wg.Add(1)
			go func() {
				defer wg.Done()
				var errb bytes.Buffer
				if err := runStored(context.Background(), st, input, true, io.Discard, &errb); err != nil {
					errs[r] = fmt.Errorf("run %d: %v: %s", r, err, errb.String())
				}
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		stored := storedObservables(t, be.open(t, dir, url), true)
		if len(stored) != len(counts) {
			t.Errorf("%d observables stored, want %d", len(stored), len(counts))
		}
		for key, want := range counts {
			if stored[key] == nil {
				t.Fatalf("key %s not stored", key)
			}
			o := stored[key][0]
			if o.Count != runs*want {
				t.Errorf("%s %s: count %d, want %d (%d runs of %d)", o.Type, o.Value, o.Count, runs*want, runs, want)
			}
		}
	})
}

// A --merge run that meets a stored observable that does not decode fails
// naming it, having stored and printed every observable before it, those
// queued in the same batch included, and nothing after it.
func TestMergeIntoARecordThatDoesNotDecode(t *testing.T) {
	input := filepath.Join(t.TempDir(), "conv.pcap")
	conversations(t, input, 200)
	dir := t.TempDir()
	// Every observable held to the end of the run: each is printed once,
	// in one order (observe.Set.Flush sorts them).
	run := func(out io.Writer) error {
		st := storeBackend{name: "dir"}.open(t, dir, "")
		sink := cmdout.New("tb-parse", out, io.Discard, nil)
		job, err := Prepare(Request{Inputs: []string{input}, Lease: storeLease, Merge: true}, nil, sink.Warnf)
		if err != nil {
			return err
		}
		return job.Run(context.Background(), st, sink)
	}
	printed := func(out *bytes.Buffer) []*records.Observable {
		var obs []*records.Observable
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var o records.Observable
			if err := records.Unmarshal([]byte(line), &o); err != nil {
				t.Fatal(err)
			}
			if o.Kind == records.KindObservable {
				obs = append(obs, &o)
			}
		}
		return obs
	}
	var first bytes.Buffer
	if err := run(&first); err != nil {
		t.Fatal(err)
	}
	order := printed(&first)
	// Not the first of its batch: the observables before it are queued
	// with it when it fails.
	bad := order[10]
	// Its own file, which comes before its pack's copy.
	kindDir := filepath.Join(dir, "records", records.KindObservable)
	if err := os.MkdirAll(kindDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(kindDir, bad.ID+".json"), []byte(`{"kind":"observable","id":`), 0o640); err != nil {
		t.Fatal(err)
	}
	var second bytes.Buffer
	err := run(&second)
	if err == nil || !strings.Contains(err.Error(), bad.ID) || !strings.Contains(err.Error(), "does not decode") {
		t.Fatalf("run over a record that does not decode: %v", err)
	}
	var got, want []string
	for _, o := range printed(&second) {
		got = append(got, o.ID)
	}
	for _, o := range order[:10] {
		want = append(want, o.ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("printed %v\nwant the 10 before the bad one: %v", got, want)
	}
	st := storeBackend{name: "dir"}.open(t, dir, "")
	for i, o := range order {
		if i == 10 {
			continue
		}
		wantCount := o.Count
		if i < 10 {
			wantCount *= 2
		}
		var cur records.Observable
		if err := st.Get(o.ID, &cur); err != nil || cur.Count != wantCount {
			t.Fatalf("observable %d: count %d, %v; want %d", i, cur.Count, err, wantCount)
		}
	}
}

// TestMergeOverADeletedObservable: a --merge run meets an index key whose
// observable was deleted (the batch's Lookup reads the key alone, and the
// record's absence comes out at its Update): the observable is stored
// anew, the key names the new record, and the others are merged as ever.
func TestMergeOverADeletedObservable(t *testing.T) { eachStoreBackend(t, mergeOverADeletedObservable) }

func mergeOverADeletedObservable(t *testing.T, be storeBackend) {
	ctx := context.Background()
	input := filepath.Join(t.TempDir(), "conv.pcap")
	conversations(t, input, 200)
	url := ""
	if be.newURL != nil {
		url = be.newURL(t)
	}
	st := be.open(t, t.TempDir(), url)
	// Every observable held to the end of the run (no --max-held): each
	// is printed once.
	run := func() map[string]*records.Observable {
		var out bytes.Buffer
		sink := cmdout.New("tb-parse", &out, io.Discard, nil)
		job, err := Prepare(Request{Inputs: []string{input}, Lease: storeLease, Merge: true}, nil, sink.Warnf)
		if err != nil {
			t.Fatal(err)
		}
		if err := job.Run(ctx, st, sink); err != nil {
			t.Fatal(err)
		}
		byKey := map[string]*records.Observable{}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var o records.Observable
			if err := records.Unmarshal([]byte(line), &o); err != nil {
				t.Fatal(err)
			}
			if o.Kind == records.KindObservable {
				byKey[IndexKey(o.Lease, o.Type, observe.Key(&o))] = &o
			}
		}
		return byKey
	}
	first := run()
	var gone *records.Observable
	var goneKey string
	for key, o := range first {
		if o.Type == "endpoint" {
			gone, goneKey = o, key
			break
		}
	}
	if gone == nil {
		t.Fatal("no endpoint observable in the first run")
	}
	if err := st.Delete(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	second := run()
	if len(second) != len(first) {
		t.Fatalf("second run printed %d observables, the first %d", len(second), len(first))
	}
	anew := second[goneKey]
	if anew == nil || anew.ID == gone.ID || anew.Count != gone.Count || anew.Rev != 1 {
		t.Fatalf("the deleted observable %s (count %d) came back as %+v; want a new record with its count", gone.ID, gone.Count, anew)
	}
	for key, o := range first {
		if key == goneKey {
			continue
		}
		if got := second[key]; got == nil || got.ID != o.ID || got.Count != 2*o.Count {
			t.Fatalf("%s %s after a second merge: %+v; want %s with count %d", o.Type, o.Value, got, o.ID, 2*o.Count)
		}
	}
	stored := storedObservables(t, st, true)
	if got := stored[goneKey]; len(got) != 1 || got[0].ID != anew.ID {
		t.Fatalf("stored under the deleted one's key: %+v; want %s", got, anew.ID)
	}
}

// TestIndexKeyIsTheDigestOfLeaseTypeAndValue: stored keys are the hex
// sha256 of lease, type and value joined by NULs, whatever the length.
func TestIndexKeyIsTheDigestOfLeaseTypeAndValue(t *testing.T) {
	for _, value := range []string{"", "c2.example", strings.Repeat("a", 300)} {
		sum := sha256.Sum256([]byte("lease_01JD0000000000000000000RUN\x00domain\x00" + value))
		if got, want := IndexKey("lease_01JD0000000000000000000RUN", "domain", value), hex.EncodeToString(sum[:]); got != want {
			t.Errorf("IndexKey of a %d-byte value = %s, want %s", len(value), got, want)
		}
	}
}

// A commit that fails in the background (its batch filled and committed
// while the next one is gathered) ends the run with its error: its
// observables are not printed, nothing is stored after it, and what was
// printed is what the state holds, every line of it. The state is broken
// (its intents/ swapped for a file, in one rename) when the first lines
// reach stdout, which tb-parse writes only on joining a committed batch;
// the batch committing then may have appended to the journal already, and
// so stored its observables without printing them, as a single write
// that fails late does: at most one batch more is stored than printed.
func TestFailedBackgroundCommit(t *testing.T) {
	input := filepath.Join(t.TempDir(), "conv.pcap")
	conversations(t, input, 1500)
	dir := t.TempDir()
	open := func() *state.Store {
		st, err := state.Open(context.Background(), dir, state.WithDurability(state.SyncOnFlush))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := open()
	intents, file := filepath.Join(dir, "intents"), filepath.Join(dir, "intents.file")
	if err := os.WriteFile(file, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	swap := func() error {
		return unix.Renameat2(unix.AT_FDCWD, file, unix.AT_FDCWD, intents, unix.RENAME_EXCHANGE)
	}
	var out bytes.Buffer
	w := &onFirstWrite{w: &out, f: func() {
		if err := swap(); err != nil {
			t.Error(err)
		}
	}}
	var errb bytes.Buffer
	// Without --max-held, every observable goes out at the end of the
	// capture, once each: the batches are whole but for the last.
	sink := cmdout.New("tb-parse", w, &errb, nil)
	job, err := Prepare(Request{Inputs: []string{input}, Lease: storeLease}, nil, sink.Warnf)
	if err != nil {
		t.Fatal(err)
	}
	err = job.Run(context.Background(), st, sink)
	if err == nil || !strings.Contains(err.Error(), "storing 256 observables") || !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("the run after its state broke: %v", err)
	}
	if !w.called {
		t.Fatal("nothing was printed before the end of the run")
	}
	st.Close()
	if err := swap(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	st = open() // settles the batch that failed
	defer st.Close()
	stored := 0
	for _, os := range storedObservables(t, st, false) {
		stored += len(os)
	}
	lines := bytes.Split(bytes.TrimSuffix(out.Bytes(), []byte("\n")), []byte("\n"))
	printed := 0
	for _, line := range lines {
		var g records.Generic
		if err := records.Unmarshal(line, &g); err != nil {
			t.Fatalf("printed %q: %v", line, err)
		}
		if g.Kind != records.KindObservable {
			continue
		}
		printed++
		if raw, err := st.ReadRaw(g.ID); err != nil || !bytes.Equal(raw, line) {
			t.Fatalf("printed %s but stored %s, %v", line, raw, err)
		}
	}
	if printed%batchMax != 0 || stored != printed && stored != printed+batchMax {
		t.Fatalf("%d observables printed, %d stored; want whole batches of %d, and as many stored or one batch more", printed, stored, batchMax)
	}
	// Nothing half-done is left: the state checks clean, and a later run
	// stores what this one did not.
	rep, err := st.Check(context.Background(), state.CheckOptions{})
	if err != nil || !rep.OK() {
		t.Fatalf("check: %v %v", err, rep)
	}
	var again bytes.Buffer
	if err := runStored(context.Background(), st, input, true, &again, io.Discard); err != nil {
		t.Fatalf("a --merge run after it: %v", err)
	}
	t.Logf("%d observables printed and %d stored before the failure; %d lines from the run after", printed, stored, bytes.Count(again.Bytes(), []byte("\n")))
}

// onFirstWrite writes to w, and calls f once, before the first write.
type onFirstWrite struct {
	w      io.Writer
	f      func()
	called bool
}

func (o *onFirstWrite) Write(p []byte) (int, error) {
	if !o.called {
		o.called = true
		o.f()
	}
	return o.w.Write(p)
}

// TestMergeMeetsARecordAnotherWriterHolds: a --merge run whose batch finds
// one stored observable's record locked by another writer (TryLockRecords
// stops there) stores the observables before it in the batch, waits for
// the record on its own (storeAlone), and merges every observable once:
// none lost, none stored twice. The test lets the record go once the run
// waits for it: on the directory store as /proc/locks shows, on
// PostgreSQL as pg_locks does.
func TestMergeMeetsARecordAnotherWriterHolds(t *testing.T) {
	eachStoreBackend(t, func(t *testing.T, be storeBackend) {
		ctx := context.Background()
		input := filepath.Join(t.TempDir(), "conv.pcap")
		conversations(t, input, 200)
		dir, url := t.TempDir(), ""
		waits := func() bool { return waitsForLock(t, filepath.Join(dir, "locks", "records")) }
		if be.newURL != nil {
			url = be.newURL(t)
			waits = func() bool { return waitsForAdvisoryLock(t, url) }
		}
		st := be.open(t, dir, url)
		var errb bytes.Buffer
		if err := runStored(ctx, st, input, true, io.Discard, &errb); err != nil {
			t.Fatal(err, errb.String())
		}
		first := storedObservables(t, st, true)
		// The record held: one in the middle of the run's first batch.
		keys := slices.Sorted(maps.Keys(first))
		heldKey := keys[len(keys)/2]
		held := first[heldKey][0]
		holder := be.open(t, dir, url).NewBatch()
		if n, err := holder.TryLockRecords([]string{held.ID}); n != 1 || err != nil {
			t.Fatalf("the other writer's TryLockRecords = %d, %v", n, err)
		}
		done := make(chan error, 1)
		var out bytes.Buffer
		go func() { done <- runStored(ctx, st, input, true, &out, io.Discard) }()
		for !waits() {
			select {
			case err := <-done:
				holder.Discard()
				t.Fatalf("the run ended (%v) without waiting for the held record %s", err, held.ID)
			default:
			}
		}
		holder.Discard()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		second := storedObservables(t, st, true)
		if len(second) != len(first) {
			t.Errorf("%d observables after the second run, %d after the first", len(second), len(first))
		}
		for key, os := range first {
			o := os[0]
			if got := second[key]; len(got) != 1 || got[0].ID != o.ID || got[0].Count != 2*o.Count {
				t.Errorf("%s %s (held: %v): %+v; want %s with count %d", o.Type, o.Value, key == heldKey, got, o.ID, 2*o.Count)
			}
		}
		// Printed once or more (--max-held emits early and merges again).
		if !strings.Contains(out.String(), `"id":"`+held.ID+`"`) {
			t.Errorf("the held record %s was not printed", held.ID)
		}
	})
}

// waitsForAdvisoryLock reports whether a session of the database at url
// waits for an advisory lock (PostgreSQL's record and key locks).
func waitsForAdvisoryLock(t *testing.T, url string) bool {
	t.Helper()
	ctx := context.Background()
	conn := pgtest.Connect(t, url)
	defer conn.Close(ctx) // called again and again: one connection at a time
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
		WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// waitsForLock reports whether /proc/locks shows a request waiting for a
// lock on a file in dir.
func waitsForLock(t *testing.T, dir string) bool {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, e := range ents {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, e.Name()), &st); err == nil {
			inodes[fmt.Sprintf(":%d", st.Ino)] = true
		}
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		// "N: -> OFDLCK ADVISORY WRITE -1 MAJ:MIN:INODE START END"
		if len(f) >= 7 && f[1] == "->" {
			if i := strings.LastIndexByte(f[6], ':'); i >= 0 && inodes[f[6][i:]] {
				return true
			}
		}
	}
	return false
}
