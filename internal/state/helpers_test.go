package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// counterRec is the typed record the tests read and write.
type counterRec struct {
	records.Meta
	Counts map[string]int `json:"counts,omitempty"`
	Total  int            `json:"total"`
	Seq    int            `json:"seq,omitempty"`
	Note   string         `json:"note,omitempty"`
}

const testKind = "counter"

func newCounter(s *Store) *counterRec {
	c := &counterRec{}
	records.Init(c, testKind, s.Now())
	return c
}

func openT(t testing.TB, dir string, opts ...Option) *Store {
	t.Helper()
	s, err := Open(context.Background(), dir, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	packMinFromEnv(s)
	return s
}

// packMinFromEnv sets the fewest records a batch of s packs from
// TB_PACK_MIN, which the tests of every write path set to 1 to run them
// again with every batch packed, a Claim's included (withPacks).
func packMinFromEnv(s *Store) {
	if n, err := strconv.Atoi(os.Getenv("TB_PACK_MIN")); err == nil {
		s.packMin = n
	}
	if n, err := strconv.ParseInt(os.Getenv("TB_PACK_SLACK"), 10, 64); err == nil {
		s.packSlack = n
	}
}

// withPacks runs fn again with every batch packed, in this process and in
// the workers it starts, and no slack for stale copies in packs: a batch's
// new versions of packed records go into its pack or, past the budget, into
// files (budgetUpdates).
func withPacks(t *testing.T, fn func(t *testing.T)) {
	t.Run("packed", func(t *testing.T) {
		t.Setenv("TB_PACK_MIN", "1")
		t.Setenv("TB_PACK_SLACK", "0")
		fn(t)
	})
}

// recordFiles reads every record file, keyed by ID.
func recordFiles(t testing.TB, s *Store) map[string][]byte {
	t.Helper()
	out := make(map[string][]byte)
	kinds, err := s.Kinds()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kinds {
		ids, err := s.List(k)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			b, err := s.ReadRaw(id)
			if err != nil {
				t.Fatalf("ReadRaw %s: %v", id, err)
			}
			out[id] = b
		}
	}
	return out
}

// intents lists the files left in intents/.
func intents(t testing.TB, s *Store) []string {
	t.Helper()
	ents, err := os.ReadDir(s.Path("intents"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// assertConsistent checks the invariants a quiescent store must hold: no
// intents, every record file decodes into its own ID, Replay gives exactly
// the record files, and Check agrees.
func assertConsistent(t testing.TB, s *Store) map[string][]byte {
	t.Helper()
	if in := intents(t, s); len(in) > 0 {
		t.Errorf("intents left: %v", in)
	}
	files := recordFiles(t, s)
	for id, b := range files {
		rec, err := records.Decode(b)
		if err != nil {
			t.Errorf("record %s does not decode: %v\n%s", id, err, b)
			continue
		}
		if rec.Header().ID != id {
			t.Errorf("file of %s holds %s", id, rec.Header().ID)
		}
	}
	replay, _, err := s.Replay(context.Background())
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	diffStates(t, "replay", replay, "files", files)
	rep, err := s.Check(context.Background(), CheckOptions{Blobs: true})
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if !rep.OK() {
		t.Errorf("Check found problems: %v", rep.Problems)
	}
	return files
}

func diffStates(t testing.TB, an string, a map[string][]byte, bn string, b map[string][]byte) {
	t.Helper()
	var ids []string
	for id := range a {
		ids = append(ids, id)
	}
	for id := range b {
		if _, ok := a[id]; !ok {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	bad := 0
	for _, id := range ids {
		x, okx := a[id]
		y, oky := b[id]
		switch {
		case !okx:
			t.Errorf("%s: only in %s", id, bn)
		case !oky:
			t.Errorf("%s: only in %s", id, an)
		case !bytes.Equal(x, y):
			t.Errorf("%s differs:\n%s: %s\n%s: %s", id, an, x, bn, y)
		default:
			continue
		}
		if bad++; bad > 10 {
			t.Fatalf("too many differences")
		}
	}
}

func getCounter(t testing.TB, s *Store, id string) *counterRec {
	t.Helper()
	var c counterRec
	if err := s.Get(id, &c); err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return &c
}

func journalBytes(t testing.TB, s *Store) []byte {
	t.Helper()
	b, err := os.ReadFile(s.journalPath())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return b
}

// workerCmd re-executes the test binary as a worker (see TestMain).
func workerCmd(t testing.TB, mode string, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{workerEnv + "=" + mode}, env...)...)
	// A worker must not outlive a test that failed half way.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// waitSignaled waits for cmd and returns an error unless SIGKILL ended it.
func waitKilled(cmd *exec.Cmd) error {
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return fmt.Errorf("worker was not killed (err %v)", err)
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return fmt.Errorf("worker ended with %v, not SIGKILL", err)
	}
	return nil
}

func mustEnv(name string) string {
	v := os.Getenv(name)
	if v == "" {
		fail("missing %s", name)
	}
	return v
}

// fail ends a worker process.
func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "worker %d: %s\n", os.Getpid(), fmt.Sprintf(format, args...))
	os.Exit(2)
}

func durabilityFromEnv() Durability {
	if strings.EqualFold(os.Getenv("TB_DURABILITY"), "each") {
		return SyncEachWrite
	}
	return SyncOnFlush
}

func mkdirT(t testing.TB, elem ...string) string {
	t.Helper()
	p := filepath.Join(elem...)
	if err := os.MkdirAll(p, 0o750); err != nil {
		t.Fatal(err)
	}
	return p
}

// createPlan stores a runnable plan for platform ("" for any) and returns
// its ID.
func createPlan(t testing.TB, st *Store, platform string) string {
	t.Helper()
	plan := &records.Plan{Runnable: true, Image: records.ImageNeeds{Platform: platform}}
	records.Init(plan, records.KindPlan, st.Now())
	if err := st.Create(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	return plan.ID
}
