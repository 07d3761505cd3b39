package state

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state/pgtest"
)

// ---- random kill points ----

var claimKeys = []string{"k0", "k1", "k2"}

// workerChaos writes, updates, puts and deletes records, stores blobs and
// claims index keys in a loop until it is killed. It prints "begin …" before
// and "done …" after each operation.
func workerChaos() {
	ctx := context.Background()
	s, err := Open(ctx, mustEnv("TB_DIR"), WithDurability(durabilityFromEnv()), journalLimitFromEnv(), sharedFromEnv())
	if err != nil {
		fail("open: %v", err)
	}
	packMinFromEnv(s)
	rng := rand.New(rand.NewSource(int64(envInt("TB_SEED"))))
	seq := envInt("TB_SEQ")
	if pm := envInt("TB_SELFKILL_PERMILLE"); pm > 0 {
		// Also die at a random step of the write protocol.
		hookRng := rand.New(rand.NewSource(rng.Int63()))
		s.crashAt = func(string) {
			if hookRng.Intn(1000) < pm {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
	}
	live, err := s.List(testKind)
	if err != nil {
		fail("list: %v", err)
	}
	say := func(format string, args ...any) {
		if _, err := fmt.Fprintf(os.Stdout, format+"\n", args...); err != nil {
			os.Exit(4)
		}
	}
	note := func() string {
		// Characters json.Marshal would escape, and sizes up to a few KiB.
		return strings.Repeat("<a&b> ", rng.Intn(500))
	}
	for ops := 0; ops < 100000; ops++ {
		seq++
		r := rng.Intn(100)
		switch {
		case len(live) == 0 || r < 25:
			c := newCounter(s)
			c.Seq, c.Note = seq, note()
			say("begin create %s %d", c.ID, seq)
			if err := s.Create(ctx, c); err != nil {
				fail("create: %v", err)
			}
			live = append(live, c.ID)
			say("done create %s %d %d", c.ID, c.Rev, seq)
		case r < 55:
			id := live[rng.Intn(len(live))]
			say("begin update %s %d", id, seq)
			var c counterRec
			err := s.Update(ctx, id, &c, func(exists bool) error {
				if !exists {
					return ErrNotFound
				}
				c.Seq, c.Note = seq, note()
				c.Total++
				return nil
			})
			if err != nil {
				fail("update: %v", err)
			}
			say("done update %s %d %d", id, c.Rev, seq)
		case r < 65:
			id := live[rng.Intn(len(live))]
			say("begin put %s %d", id, seq)
			var g records.Generic
			if err := s.Get(id, &g); err != nil {
				fail("get: %v", err)
			}
			g.Extra["seq"] = json.RawMessage(strconv.Itoa(seq))
			g.Extra["future"] = json.RawMessage(`{ "kept": [1, 2, "<&>"] }`)
			if err := s.Put(ctx, &g); err != nil {
				fail("put: %v", err)
			}
			say("done put %s %d %d", id, g.Rev, seq)
		case r < 75:
			i := rng.Intn(len(live))
			id := live[i]
			say("begin delete %s", id)
			if err := s.Delete(ctx, id); err != nil {
				fail("delete: %v", err)
			}
			live = append(live[:i], live[i+1:]...)
			say("done delete %s", id)
		case r < 85:
			content := make([]byte, rng.Intn(64<<10))
			rng.Read(content)
			sum := sha256.Sum256(content)
			sha := hex.EncodeToString(sum[:])
			say("begin blob %s", sha)
			var err error
			if rng.Intn(2) == 0 {
				_, err = s.PutBlob(ctx, bytes.NewReader(content))
			} else {
				_, err = s.PutBlobKnown(ctx, sha, bytes.NewReader(content))
			}
			if err != nil {
				fail("blob: %v", err)
			}
			say("done blob %s", sha)
		case r < 89 && len(live) > 0:
			// tb-parse --merge's path for observables stored before:
			// new versions of stored records, one batch.
			b := s.NewBatch()
			var queued []string
			for range 1 + rng.Intn(8) {
				id := live[rng.Intn(len(live))]
				var c counterRec
				line, err := b.Update(id, &c, func() error {
					c.Seq, c.Note = seq, note()
					c.Total++
					return nil
				})
				if err != nil {
					fail("batch update: %v", err)
				}
				if line != nil {
					queued = append(queued, id)
				}
			}
			if len(queued) > 0 {
				say("begin batchupdate %d %s", seq, strings.Join(queued, " "))
			}
			if err := b.Commit(); err != nil {
				fail("batch update commit: %v", err)
			}
			if len(queued) > 0 {
				say("done batchupdate %d %s", seq, strings.Join(queued, " "))
			}
		case r < 92:
			// tb-parse's path for new observables: records and the index
			// keys naming them, one batch.
			b := s.NewBatch()
			var queued []string
			for i := range 1 + rng.Intn(8) {
				c := newCounter(s)
				c.Seq, c.Note = seq, note()
				key := fmt.Sprintf("b%d-%d", seq, i)
				if ok, err := b.TryLockIndex("chaosbatch", key); !ok || err != nil {
					fail("batch lock %s: %v, %v", key, ok, err)
				}
				if line, err := b.Create(c); line == nil || err != nil {
					fail("batch create: %s, %v", line, err)
				}
				if err := b.SetIndex("chaosbatch", key, c.ID); err != nil {
					fail("batch key: %v", err)
				}
				queued = append(queued, c.ID+"="+key)
			}
			say("begin batch %d %s", seq, strings.Join(queued, " "))
			if err := b.Commit(); err != nil {
				fail("batch commit: %v", err)
			}
			for _, q := range queued {
				live = append(live, strings.Split(q, "=")[0])
			}
			say("done batch %d %s", seq, strings.Join(queued, " "))
		default:
			key := claimKeys[rng.Intn(len(claimKeys))]
			say("begin claim %s", key)
			id, _, err := s.Claim(ctx, "chaos", key, func() (records.Record, error) {
				// A keyed kind: Check then verifies it is found by its key.
				c := &records.Capture{Lease: "lease-" + key}
				records.Init(c, records.KindCapture, s.Now())
				return c, nil
			})
			if err != nil {
				fail("claim: %v", err)
			}
			say("done claim %s %s", key, id)
		}
	}
	fail("never killed")
}

// journalLimitFromEnv is WithJournalLimit(TB_JOURNAL_LIMIT) when it is set.
func journalLimitFromEnv() Option {
	n, err := strconv.ParseInt(os.Getenv("TB_JOURNAL_LIMIT"), 10, 64)
	if err != nil {
		return func(*Store) {}
	}
	return WithJournalLimit(n)
}

type recState struct {
	rev int64
	seq int
}

// chaosModel is what the worker reported as done.
type chaosModel struct {
	recs   map[string]recState
	blobs  map[string]bool
	claims map[string]string
	// batchKeys are the index keys batches set, to the records they name.
	batchKeys map[string]string
}

// apply replays one "done" line (or a "begin" line, for the operation in
// flight, as if it had completed).
func (m *chaosModel) apply(t *testing.T, f []string) {
	t.Helper()
	atoi := func(s string) int {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("bad line %q", f)
		}
		return n
	}
	begin := f[0] == "begin"
	switch f[1] {
	case "create", "update", "put":
		id := f[2]
		if begin {
			old, ok := m.recs[id]
			if f[1] == "create" {
				old, ok = recState{}, true
			}
			if !ok {
				t.Fatalf("%q of a record the model does not have", f)
			}
			m.recs[id] = recState{old.rev + 1, atoi(f[3])}
		} else {
			m.recs[id] = recState{int64(atoi(f[3])), atoi(f[4])}
		}
	case "delete":
		delete(m.recs, f[2])
	case "blob":
		m.blobs[f[2]] = true
	case "claim":
		if !begin {
			m.claims[f[2]] = f[3]
		}
	case "batch":
		// A batch in flight commits as a whole in practice, but a torn
		// journal append would keep a prefix of it: batchPrefix.
		m.applyBatch(atoi(f[2]), f[3:])
	case "batchupdate":
		if !m.applyBatchUpdate(atoi(f[2]), f[3:]) {
			t.Fatalf("%q of a record the model does not have", f)
		}
	}
}

// applyBatchUpdate adds a new version, with seq, of each of the records
// ids; false if the model has one of them not.
func (m *chaosModel) applyBatchUpdate(seq int, ids []string) bool {
	for _, id := range ids {
		old, ok := m.recs[id]
		if !ok {
			return false
		}
		m.recs[id] = recState{old.rev + 1, seq}
	}
	return true
}

// applyBatch adds the records "ID=KEY" of a batch, created with seq.
func (m *chaosModel) applyBatch(seq int, recs []string) {
	for _, r := range recs {
		id, key, _ := strings.Cut(r, "=")
		m.recs[id] = recState{1, seq}
		m.batchKeys[key] = id
	}
}

func newChaosModel() *chaosModel {
	return &chaosModel{recs: map[string]recState{}, blobs: map[string]bool{}, claims: map[string]string{}, batchKeys: map[string]string{}}
}

func (m *chaosModel) clone() *chaosModel {
	c := newChaosModel()
	maps.Copy(c.batchKeys, m.batchKeys)
	for k, v := range m.recs {
		c.recs[k] = v
	}
	for k, v := range m.blobs {
		c.blobs[k] = v
	}
	for k, v := range m.claims {
		c.claims[k] = v
	}
	return c
}

func observe(t *testing.T, s *Store) map[string]recState {
	t.Helper()
	ids, err := s.List(testKind)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]recState)
	for _, id := range ids {
		c := getCounter(t, s, id)
		var g records.Generic
		if err := s.Get(id, &g); err != nil {
			t.Fatal(err)
		}
		seq := c.Seq
		if raw, ok := g.Extra["seq"]; ok {
			seq, _ = strconv.Atoi(string(raw))
		}
		out[id] = recState{c.Rev, seq}
	}
	return out
}

func sameRecs(a, b map[string]recState) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestCrashRandomKill(t *testing.T) {
	eachBackend(t, crashRandomKill)
	withPacks(t, func(t *testing.T) { crashRandomKill(t, testBackend{name: "dir"}) })
}

func crashRandomKill(t *testing.T, be testBackend) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("TB_STATE_TEST_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	t.Logf("seed %d (set TB_STATE_TEST_SEED to repeat)", seed)
	rng := rand.New(rand.NewSource(seed))
	rounds, budget := 25, 20*time.Second
	if raceEnabled || testing.Short() {
		rounds, budget = 8, 15*time.Second
	}
	dir := t.TempDir()
	model := newChaosModel()
	start := time.Now()
	var done, inFlight int
	tally := make(map[string]int)
	for round := 0; round < rounds; round++ {
		if round >= 5 && time.Since(start) > budget {
			t.Logf("stopping after %d rounds: %v spent", round, time.Since(start))
			break
		}
		durability := "flush"
		if round%2 == 1 {
			durability = "each"
		}
		// Every third round the worker also kills itself at random steps
		// of the write protocol, which the parent's kill rarely hits.
		selfKill := 0
		if round%3 == 2 {
			selfKill = 15
		}
		// A small journal limit, so that writes compact the journal often
		// and kills land in compactions too.
		cmd := workerCmd(t, "chaos", append(be.env(), "TB_DIR="+dir, "TB_DURABILITY="+durability, "TB_JOURNAL_LIMIT=16384",
			"TB_SEED="+strconv.FormatInt(rng.Int63(), 10), "TB_SEQ="+strconv.Itoa(round*1000000),
			"TB_SELFKILL_PERMILLE="+strconv.Itoa(selfKill))...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		var lines [][]string
		want := rng.Intn(60)
		for n := 0; n < want && sc.Scan(); {
			f := strings.Fields(sc.Text())
			lines = append(lines, f)
			if f[0] == "done" {
				n++
			}
		}
		// Move the kill point off line boundaries by up to about one
		// operation's time of busy waiting.
		spin := time.Duration(rng.Intn(3000)) * time.Microsecond
		for t0 := time.Now(); time.Since(t0) < spin; {
		}
		cmd.Process.Signal(syscall.SIGKILL) // if it already died, waitKilled says why
		for sc.Scan() {                     // what it printed before it died
			lines = append(lines, strings.Fields(sc.Text()))
		}
		if os.Getenv("TB_DEBUG") != "" {
			t.Logf("round %d: want %d, %d lines, last %v", round, want, len(lines), lines[max(0, len(lines)-3):])
		}
		if err := waitKilled(cmd); err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, stderr.Bytes())
		}

		// Everything done must be there; the operation in flight may or
		// may not be.
		var pending []string
		for _, f := range lines {
			if f[0] == "begin" {
				pending = f
			} else {
				model.apply(t, f)
				pending = nil
			}
		}
		if be.url != "" {
			killedWriterSettled(t, be.url)
		}
		s := openT(t, dir, be.opts()...) // recovers
		assertConsistent(t, s)
		obs := observe(t, s)
		// What the store may hold: the model, or with the operation in
		// flight (a batch: any prefix of its records).
		alts := []*chaosModel{model}
		if pending != nil && (pending[1] == "batch" || pending[1] == "batchupdate") {
			for n := 1; n <= len(pending)-3; n++ {
				alt := model.clone()
				seq, err := strconv.Atoi(pending[2])
				if err != nil {
					t.Fatalf("bad line %q", pending)
				}
				if pending[1] == "batch" {
					alt.applyBatch(seq, pending[3:3+n])
				} else if !alt.applyBatchUpdate(seq, pending[3:3+n]) {
					t.Fatalf("%q of a record the model does not have", pending)
				}
				alts = append(alts, alt)
			}
		} else if pending != nil {
			alt := model.clone()
			alt.apply(t, pending)
			alts = append(alts, alt)
		}
		alt := alts[len(alts)-1]
		switch {
		case pending == nil:
			tally["between operations"]++
		case pending[1] == "blob" || pending[1] == "claim":
			tally[pending[1]+" in flight"]++
		}
		kept := -1
		for i, a := range alts {
			if sameRecs(obs, a.recs) {
				kept = i
				break
			}
		}
		switch {
		case kept == 0:
			if pending != nil && pending[1] != "blob" && pending[1] != "claim" {
				tally[pending[1]+" in flight, not committed"]++
			}
		case kept > 0:
			inFlight++
			tally[pending[1]+" in flight, committed"]++
			if kept < len(alts)-1 {
				tally[pending[1]+" in flight, partly committed"]++
			}
		default:
			t.Fatalf("round %d: store %v\nwant %v\nor (with %v) %v", round, obs, model.recs, pending, alt.recs)
		}
		// A batch's key is set if and only if its record is there.
		keys := alts[max(kept, 0)].batchKeys
		if pending != nil && pending[1] == "batch" {
			for _, r := range pending[3:] {
				id, key, _ := strings.Cut(r, "=")
				if _, ok := keys[key]; !ok {
					if got, err := s.Lookup("chaosbatch", key); !errors.Is(err, ErrNotFound) {
						t.Fatalf("round %d: key %s of the uncommitted %s = %q, %v", round, key, id, got, err)
					}
				}
			}
		}
		for key, id := range keys {
			if !s.Exists(id) {
				continue // deleted since; a key naming nothing counts as absent
			}
			if got, err := s.Lookup("chaosbatch", key); err != nil || got != id {
				t.Fatalf("round %d: batch key %s = %q, %v; want %s", round, key, got, err, id)
			}
		}
		for sha := range model.blobs {
			if !s.HasBlob(sha) {
				t.Fatalf("round %d: blob %s reported stored is missing", round, sha)
			}
		}
		for key, id := range model.claims {
			if got, err := s.Lookup("chaos", key); err != nil || got != id {
				t.Fatalf("round %d: claim %s = %q, %v; want %s", round, key, got, err, id)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		model.recs = obs
		model.batchKeys = keys
		done += len(lines)
	}
	var gen int64
	if f, err := os.Open(openT(t, dir).journalPath()); err == nil && be.url == "" {
		gen, _, _ = readHeader(f)
		f.Close()
	}
	t.Logf("%d lines of operations, %d committed in-flight operations, %d journal compactions, in %v; kill points: %v", done, inFlight, gen, time.Since(start), tally)
}

// ---- deterministic kill points ----

const crashBlob = "content of the crash test blob"

func workerCrashAt() {
	ctx := context.Background()
	s, err := Open(ctx, mustEnv("TB_DIR"), WithDurability(SyncEachWrite), journalLimitFromEnv())
	if err != nil {
		fail("open: %v", err)
	}
	packMinFromEnv(s)
	point, id := mustEnv("TB_POINT"), mustEnv("TB_ID")
	s.crashAt = func(p string) {
		if p == point {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	switch op := mustEnv("TB_OP"); op {
	case "update":
		var c counterRec
		err = s.Update(ctx, id, &c, func(bool) error { c.Total++; return nil })
	case "put":
		var g records.Generic
		if err = s.Get(id, &g); err == nil {
			g.Extra["total"] = json.RawMessage("5")
			err = s.Put(ctx, &g)
		}
	case "create":
		c := newCounter(s)
		c.ID = id
		err = s.Create(ctx, c)
	case "delete":
		err = s.Delete(ctx, id)
	case "compact":
		_, err = s.Compact(ctx)
	case "blob":
		_, err = s.PutBlob(ctx, strings.NewReader(crashBlob))
	case "claim":
		_, _, err = s.Claim(ctx, "crash", "key", func() (records.Record, error) {
			var g records.Generic
			records.Init(&g, "claimed", s.Now())
			g.ID = id
			return &g, nil
		})
	default:
		fail("unknown op %q", op)
	}
	if err != nil {
		fail("%v", err)
	}
	fmt.Fprintln(os.Stderr, "crash point never reached")
	os.Exit(3)
}

func TestCrashPoints(t *testing.T) {
	testCrashPoints(t)
	// A claim's batch packed: its crash windows are a large batch's.
	withPacks(t, testCrashPoints)
}

func testCrashPoints(t *testing.T) {
	type want struct {
		rev   int64 // of the target record after recovery; 0: absent
		total int
	}
	// The base record is at rev 2 with total 0 (created, then Put with an
	// unknown field).
	cases := []struct {
		op, point string
		want      want
		// open: what must be on disk before recovery for the window to
		// be the one named.
		intent, marker, torn bool
		// limit is the worker's journal limit (0: the default): 1 makes
		// its write compact the journal. compacted: the journal in place
		// is the compaction's.
		limit     int64
		compacted bool
	}{
		{"update", crashPutIntent, want{2, 0}, true, false, false, 0, false},
		{"update", crashJournalTorn, want{2, 0}, true, false, true, 0, false},
		{"update", crashPutJournaled, want{3, 1}, true, false, false, 0, false},
		{"update", crashPutRenamed, want{3, 1}, false, false, false, 0, false},
		{"put", crashPutIntent, want{2, 0}, true, false, false, 0, false},
		{"put", crashPutJournaled, want{3, 5}, true, false, false, 0, false},
		{"create", crashPutIntent, want{0, 0}, true, false, false, 0, false},
		{"create", crashJournalTorn, want{0, 0}, true, false, true, 0, false},
		{"create", crashPutJournaled, want{1, 0}, true, false, false, 0, false},
		{"delete", crashDeleteIntent, want{2, 0}, false, true, false, 0, false},
		{"delete", crashJournalTorn, want{2, 0}, false, true, true, 0, false},
		{"delete", crashDeleteJournaled, want{0, 0}, false, true, false, 0, false},
		{"delete", crashDeleteRemoved, want{0, 0}, false, true, false, 0, false},
		{"blob", crashBlobTemp, want{}, false, false, false, 0, false},
		{"blob", crashBlobLinked, want{}, false, false, false, 0, false},
		// A claim is a batch of one: its intent is the batch's (checked
		// below), and recovery keeps the record and its key together.
		{"claim", crashPutIntent, want{}, false, false, false, 0, false},
		{"claim", crashPutJournaled, want{}, false, false, false, 0, false},
		{"claim", crashClaimCreated, want{}, false, false, false, 0, false},
		{"claim", crashPartitionTorn, want{}, false, false, false, 0, false},
		// Compactions: explicit, and started by a write that just committed
		// (its intent is still there).
		{"compact", crashCompactWritten, want{2, 0}, false, false, false, 0, false},
		{"claim", crashPackLinked, want{}, false, false, false, 0, false},
		{"compact", crashCompactRenamed, want{2, 0}, false, false, false, 0, true},
		{"update", crashCompactWritten, want{3, 1}, true, false, false, 1, false},
		{"update", crashCompactRenamed, want{3, 1}, true, false, false, 1, true},
		{"create", crashCompactRenamed, want{1, 0}, true, false, false, 1, true},
		{"delete", crashCompactWritten, want{0, 0}, false, true, false, 1, false},
		{"delete", crashCompactRenamed, want{0, 0}, false, true, false, 1, true},
	}
	for _, tc := range cases {
		if tc.point == crashPackLinked && !packsBatchOf(1) {
			continue // a claim packs nothing
		}
		for _, via := range []string{"open", "writer"} {
			if via == "writer" && (tc.op == "blob" || tc.op == "claim") {
				continue
			}
			t.Run(tc.op+"/"+tc.point+"/"+via, func(t *testing.T) {
				ctx := context.Background()
				dir := t.TempDir()
				s0 := openT(t, dir)
				base := newCounter(s0)
				base.Note = "<a&b>\u2028"
				if err := createBase(s0, base); err != nil {
					t.Fatal(err)
				}
				var g records.Generic
				if err := s0.Get(base.ID, &g); err != nil {
					t.Fatal(err)
				}
				g.Extra["future"] = json.RawMessage("{ \"kept\":\n [1, 2] }")
				if err := s0.Put(ctx, &g); err != nil {
					t.Fatal(err)
				}
				target := base.ID
				if tc.op == "create" || tc.op == "claim" {
					kind := testKind
					if tc.op == "claim" {
						kind = "claimed"
					}
					target = records.NewID(kind, s0.Now())
				}
				cmd := workerCmd(t, "crashat", "TB_DIR="+dir, "TB_POINT="+tc.point, "TB_OP="+tc.op, "TB_ID="+target)
				if tc.limit != 0 {
					cmd.Env = append(cmd.Env, "TB_JOURNAL_LIMIT="+strconv.FormatInt(tc.limit, 10))
				}
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				if err := waitKilled(cmd); err != nil {
					t.Fatalf("%v\n%s", err, stderr.Bytes())
				}

				// The window is the one named.
				kind := records.KindOf(target)
				if _, err := os.Stat(s0.intentPath(kind, target)); (err == nil) != tc.intent {
					t.Errorf("write intent present = %v, want %v", err == nil, tc.intent)
				}
				if _, err := os.Stat(s0.deleteIntentPath(kind, target)); (err == nil) != tc.marker {
					t.Errorf("delete intent present = %v, want %v", err == nil, tc.marker)
				}
				if batches, _ := filepath.Glob(filepath.Join(dir, "intents", "*"+batchIntentSuffix)); (len(batches) == 1) != (tc.op == "claim") {
					t.Errorf("batch intents %v after a crash at %s", batches, tc.point)
				}
				j := journalBytes(t, s0)
				if torn := len(j) > 0 && j[len(j)-1] != '\n'; torn != tc.torn {
					t.Errorf("journal torn = %v, want %v", torn, tc.torn)
				}
				first, _, _ := bytes.Cut(j, []byte("\n"))
				if compacted := bytes.Contains(first, []byte(`"op":"compact"`)); compacted != tc.compacted {
					t.Errorf("journal compacted = %v, want %v", compacted, tc.compacted)
				}

				s := s0
				w := tc.want
				if via == "open" {
					s = openT(t, dir)
					if in := intents(t, s); len(in) > 0 {
						t.Fatalf("Open left intents %v", in)
					}
					if tc.op != "blob" && tc.op != "claim" {
						checkTarget(t, s, target, w.rev, w.total)
					}
				}
				switch tc.op {
				case "blob":
					sum := sha256.Sum256([]byte(crashBlob))
					sha := hex.EncodeToString(sum[:])
					if s.HasBlob(sha) != (tc.point == crashBlobLinked) {
						t.Errorf("HasBlob = %v after a crash at %s", s.HasBlob(sha), tc.point)
					}
					if _, err := s.PutBlob(ctx, strings.NewReader(crashBlob)); err != nil || !s.HasBlob(sha) {
						t.Errorf("PutBlob after crash: %v", err)
					}
				case "claim":
					// Committed (journaled): the record and its key; not
					// committed: neither, and the key is claimed anew.
					committed := tc.point != crashPutIntent
					if s.Exists(target) != committed {
						t.Errorf("claimed record %s present = %v after a crash at %s", target, s.Exists(target), tc.point)
					}
					id, err := s.Lookup("crash", "key")
					if committed && (err != nil || id != target) || !committed && !errors.Is(err, ErrNotFound) {
						t.Errorf("Lookup after a crash at %s = %s, %v", tc.point, id, err)
					}
					id, created, err := s.Claim(ctx, "crash", "key", func() (records.Record, error) {
						var g records.Generic
						records.Init(&g, "claimed", s.Now())
						return &g, nil
					})
					if err != nil || created == committed || committed && id != target {
						t.Errorf("Claim after crash = %s, %v, %v", id, created, err)
					}
				default:
					// A later write of the record (which, in the writer
					// variant, is what settles the crashed one).
					var c counterRec
					err := s.Update(ctx, target, &c, func(exists bool) error {
						if !exists {
							return ErrNotFound
						}
						c.Total += 100
						return nil
					})
					if w.rev == 0 {
						if !errors.Is(err, ErrNotFound) {
							t.Fatalf("Update of a record that should be absent: %v", err)
						}
					} else {
						if err != nil {
							t.Fatal(err)
						}
						w.rev, w.total = w.rev+1, w.total+100
					}
					checkTarget(t, s, target, w.rev, w.total)
					if target == base.ID && w.rev != 0 {
						var g records.Generic
						if err := s.Get(target, &g); err != nil {
							t.Fatal(err)
						}
						if string(g.Extra["future"]) != `{"kept":[1,2]}` {
							t.Errorf("unknown field lost or changed: %s", g.Extra["future"])
						}
					}
				}
				assertConsistent(t, s)
				_, stats, err := s.Replay(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if want := map[bool]int{true: 1, false: 0}[tc.torn]; stats.Torn != want {
					t.Errorf("journal has %d torn lines, want %d", stats.Torn, want)
				}
				if tc.op == "compact" || tc.limit != 0 {
					// The next compaction replaces what the killed one left in tmp/.
					before := recordFiles(t, s)
					if _, err := s.Compact(ctx); err != nil {
						t.Fatal(err)
					}
					if _, err := os.Stat(s.compactTempPath()); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("%s left after a compaction: %v", s.compactTempPath(), err)
					}
					diffStates(t, "before compacting", before, "after", assertConsistent(t, s))
				}
				if t.Failed() {
					t.Logf("journal:\n%s", journalBytes(t, s))
				}
			})
		}
	}
}

// createBase stores the crash tests' base record: in a pack when batches
// of one are packed (withPacks), so that its later versions shadow the
// pack's copy and its delete marks that copy deleted.
func createBase(s *Store, base *counterRec) error {
	if !packsBatchOf(1) {
		return s.Create(context.Background(), base)
	}
	b := s.NewBatch()
	if line, err := b.Create(base); err != nil || line == nil {
		return fmt.Errorf("batch create: %s, %v", line, err)
	}
	return b.Commit()
}

func checkTarget(t *testing.T, s *Store, id string, rev int64, total int) {
	t.Helper()
	if records.KindOf(id) != testKind {
		return
	}
	if rev == 0 {
		if s.Exists(id) {
			t.Fatalf("%s exists, want it absent", id)
		}
		return
	}
	c := getCounter(t, s, id)
	if c.Rev != rev || c.Total != total {
		t.Fatalf("%s at rev %d total %d, want rev %d total %d", id, c.Rev, c.Total, rev, total)
	}
}

// killedWriterSettled waits (up to a minute) until no client backend of
// url's database but this one is in a statement: a worker killed as it
// sent COMMIT leaves its server backend committing for a moment after the
// kill, and assertConsistent reads the records and then the journal in
// two statements, which such a commit landing between them would set
// apart ("only in replay", seen once under make test's load).
func killedWriterSettled(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	conn := pgtest.Connect(t, url)
	defer conn.Close(ctx) // called again and again: one connection at a time
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		var busy int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			AND backend_type = 'client backend' AND state IS DISTINCT FROM 'idle'`).Scan(&busy); err != nil {
			t.Fatal(err)
		}
		if busy == 0 {
			return
		}
	}
	t.Log("a killed worker's backend was still busy after a minute")
}
