package plan

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/elftest"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/sample"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// runPlan runs tb-plan's planning on inputs and returns stdout, stderr and
// the error.
func runPlan(t *testing.T, stateDir string, jobs int, inputs ...string) ([]byte, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := runRequest(context.Background(), stateDir, Request{Inputs: inputs, Profile: "default", Jobs: jobs}, &stdout, &stderr)
	return stdout.Bytes(), stderr.String(), err
}

// runRequest does what tb-plan does with a request: prepare it, open the
// state and run it, warnings going to stderr as "tb-plan: ...".
func runRequest(ctx context.Context, stateDir string, req Request, stdout, stderr io.Writer) error {
	out := cmdout.New("tb-plan", stdout, stderr, nil)
	job, err := Prepare(req, bytes.NewReader(nil), out)
	if err != nil {
		return err
	}
	st, err := state.Open(ctx, stateDir, state.WithDurability(state.SyncOnFlush))
	if err != nil {
		return err
	}
	return job.Run(ctx, st, out)
}

// corpus writes n files under dir (lexical order = input order): ELF
// binaries of several machines, each unique, except that every 37th file
// repeats an earlier one's content under its own name and every 53rd is
// empty (a bad input). It returns the paths in input order and, for each,
// the path whose content it repeats (itself if new; "" if empty).
func corpus(t *testing.T, dir string, n int) (paths, firstOf []string) {
	t.Helper()
	machines := []struct {
		m    uint16
		bits int
	}{{62, 64}, {3, 32}, {183, 64}, {40, 32}, {8, 32}}
	for i := range n {
		sub := "a"
		if i >= n/2 {
			sub = "b" // a second directory, walked after the first
		}
		path := filepath.Join(dir, sub, fmt.Sprintf("f%04d", i))
		var data []byte
		first := path
		switch {
		case i%53 == 52:
			first = ""
		case i%37 == 36:
			j := i - 30
			for j%53 == 52 || j%37 == 36 {
				j--
			}
			first = firstOf[j]
			data = must(os.ReadFile(first))
		default:
			m := machines[i%len(machines)]
			data = append(elftest.Build(elftest.Spec{Machine: m.m, Bits: m.bits}), fmt.Sprintf("unique %d", i)...)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
		firstOf = append(firstOf, first)
	}
	return paths, firstOf
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestRunOrderAndState plans more files than a batch holds, with repeated
// content and bad inputs among them: records come out in input order, each
// sample followed by its plan; repeated content is one sample with every
// name; every record printed is the one stored; and the state checks clean.
// A second run over the same files (every sample known) gives the same
// samples in the same order.
func TestRunOrderAndState(t *testing.T) {
	for _, jobs := range []int{1, 3} {
		t.Run(fmt.Sprintf("jobs=%d", jobs), func(t *testing.T) {
			dir, stateDir := t.TempDir(), t.TempDir()
			n := 2*batchMax + 45
			paths, firstOf := corpus(t, dir, n)
			var sampleIDs []string
			for run := range 2 {
				out, stderr, err := runPlan(t, stateDir, jobs, dir)
				empties := 0
				for _, f := range firstOf {
					if f == "" {
						empties++
					}
				}
				if err == nil || strings.Count(stderr, ": empty file") != empties {
					t.Fatalf("run %d: err %v, stderr:\n%s", run, err, stderr)
				}
				st, err := state.Open(context.Background(), stateDir)
				if err != nil {
					t.Fatal(err)
				}
				ids := checkOutput(t, st, out, paths, firstOf, run)
				if run == 0 {
					sampleIDs = ids
				} else if !slices.Equal(ids, sampleIDs) {
					t.Fatalf("second run printed other samples")
				}
				rep, err := st.Check(context.Background(), state.CheckOptions{Blobs: true})
				if err != nil || !rep.OK() {
					t.Fatalf("Check = %+v, %v", rep, err)
				}
				unique := 0
				for i, f := range firstOf {
					if f == paths[i] {
						unique++
					}
				}
				for kind, want := range map[string]int{"sample": unique, "plan": (run + 1) * (n - empties)} {
					if ids, err := st.List(kind); err != nil || len(ids) != want {
						t.Fatalf("run %d: %d %s records (%v), want %d", run, len(ids), kind, err, want)
					}
				}
			}
		})
	}
}

// checkOutput checks one run's stdout against the inputs and the state,
// and returns the sample ID printed for each input that is not empty.
func checkOutput(t *testing.T, st *state.Store, out []byte, paths, firstOf []string, run int) []string {
	t.Helper()
	var lines [][]byte
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, slices.Clone(sc.Bytes()))
	}
	last := make(map[string][]byte) // record ID -> last line printed for it
	idOf := make(map[string]string) // first path of a content -> its sample ID
	var ids []string
	k := 0
	for i, path := range paths {
		if firstOf[i] == "" {
			continue
		}
		if k+1 >= len(lines) {
			t.Fatalf("run %d: output ends before %s", run, path)
		}
		var smp records.Sample
		var pl records.Plan
		if err := records.Unmarshal(lines[k], &smp); err != nil || smp.Kind != "sample" {
			t.Fatalf("run %d: line %d for %s is not a sample (%v): %s", run, k, path, err, lines[k])
		}
		if err := records.Unmarshal(lines[k+1], &pl); err != nil || pl.Kind != "plan" || pl.Sample != smp.ID {
			t.Fatalf("run %d: line %d is not the plan of %s (%v): %s", run, k+1, smp.ID, err, lines[k+1])
		}
		// The sample printed for an input is the content's one sample,
		// carrying the input's name.
		if id, ok := idOf[firstOf[i]]; ok && id != smp.ID {
			t.Fatalf("run %d: %s printed as %s, its content is %s", run, path, smp.ID, id)
		}
		idOf[firstOf[i]] = smp.ID
		if smp.Source != firstOf[i] || !slices.Contains(smp.Names, filepath.Base(path)) {
			t.Fatalf("run %d: %s printed as source %s, names %v", run, path, smp.Source, smp.Names)
		}
		if id, err := st.Lookup(sample.IndexSHA256, smp.SHA256); err != nil || id != smp.ID {
			t.Fatalf("run %d: index of %s = %s, %v", run, smp.SHA256, id, err)
		}
		last[smp.ID], last[pl.ID] = lines[k], lines[k+1]
		ids = append(ids, smp.ID)
		k += 2
	}
	if k != len(lines) {
		t.Fatalf("run %d: %d lines printed, %d expected", run, len(lines), k)
	}
	for id, line := range last {
		if raw, err := st.ReadRaw(id); err != nil || !bytes.Equal(raw, line) {
			t.Fatalf("run %d: printed %s\nstored %s (%v)", run, line, raw, err)
		}
	}
	return ids
}

// TestDroppedByIsLineage: files planned with --dropped-by carry the cycle
// (with its lease and sample) as lineage; the same content dropped again,
// by another cycle, gains a second entry, and by the same one none.
func TestDroppedByIsLineage(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := state.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	var cycles []string
	for i := range 2 {
		c := &records.Cycle{State: records.CycleCompleted, Plan: "plan_01JD0000000000000000000000", Lease: "lease_01JD0000000000000000000000", Sample: fmt.Sprintf("%064d", i)}
		records.Init(c, records.KindCycle, st.Now())
		if err := st.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		cycles = append(cycles, c.ID)
	}
	file := filepath.Join(t.TempDir(), ".tbdrop")
	if err := os.WriteFile(file, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	drop := func(cycle string) *records.Sample {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if err := runRequest(ctx, dir, Request{Inputs: []string{file}, Profile: "default", DroppedBy: &records.Drop{Cycle: cycle, Path: "/var/tmp/x/.tbdrop"}}, &stdout, &stderr); err != nil {
			t.Fatalf("%v: %s", err, stderr.String())
		}
		var smp records.Sample
		line, _, _ := strings.Cut(stdout.String(), "\n")
		if err := json.Unmarshal([]byte(line), &smp); err != nil || smp.Kind != records.KindSample {
			t.Fatalf("%v: %s", err, line)
		}
		return &smp
	}
	first := drop(cycles[0])
	want := records.Drop{Cycle: cycles[0], Lease: "lease_01JD0000000000000000000000", Path: "/var/tmp/x/.tbdrop", Sample: fmt.Sprintf("%064d", 0)}
	if len(first.DroppedBy) != 1 || first.DroppedBy[0] != want {
		t.Fatalf("lineage %+v, want %+v", first.DroppedBy, want)
	}
	if again := drop(cycles[0]); len(again.DroppedBy) != 1 {
		t.Fatalf("the same drop twice: %+v", again.DroppedBy)
	}
	if other := drop(cycles[1]); len(other.DroppedBy) != 2 || other.DroppedBy[1].Cycle != cycles[1] {
		t.Fatalf("dropped by a second cycle: %+v", other.DroppedBy)
	}
	err = runRequest(ctx, dir, Request{Inputs: []string{file}, Profile: "default", DroppedBy: &records.Drop{Cycle: "cycle_01JD0000000000000000000000"}}, io.Discard, io.Discard)
	if fault.Code(err) != fault.ExitUsage {
		t.Fatalf("an unknown cycle: %v", err)
	}
}
