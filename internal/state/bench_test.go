package state

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func benchCreate(b *testing.B, d Durability) {
	ctx := context.Background()
	s := openT(b, b.TempDir(), WithDurability(d))
	b.ReportAllocs()
	for b.Loop() {
		c := newCounter(s)
		c.Note = "benchmark record"
		if err := s.Create(ctx, c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCreate(b *testing.B) {
	b.Run("SyncOnFlush", func(b *testing.B) { benchCreate(b, SyncOnFlush) })
	b.Run("SyncEachWrite", func(b *testing.B) { benchCreate(b, SyncEachWrite) })
}

// eachDurability runs fn as a sub-benchmark per durability.
func eachDurability(b *testing.B, fn func(b *testing.B, s *Store)) {
	for _, d := range []struct {
		name string
		d    Durability
	}{{"SyncOnFlush", SyncOnFlush}, {"SyncEachWrite", SyncEachWrite}} {
		b.Run(d.name, func(b *testing.B) { fn(b, openT(b, b.TempDir(), WithDurability(d.d))) })
	}
}

// BenchmarkCreateKeyed is BenchmarkCreate for a record found by two keys
// (an observable: its lease and its cycle), which the store writes first.
func BenchmarkCreateKeyed(b *testing.B) {
	eachDurability(b, func(b *testing.B, s *Store) {
		b.ReportAllocs()
		for b.Loop() {
			o := &records.Observable{Type: records.ObsDomain, Value: "c2.example", Lease: "lease_x", Cycle: "cycle_x"}
			records.Init(o, records.KindObservable, s.Now())
			if err := s.Create(context.Background(), o); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkUpdate(b *testing.B) {
	eachDurability(b, func(b *testing.B, s *Store) {
		ctx := context.Background()
		c := newCounter(s)
		if err := s.Create(ctx, c); err != nil {
			b.Fatal(err)
		}
		var r counterRec
		b.ReportAllocs()
		for b.Loop() {
			if err := s.Update(ctx, c.ID, &r, func(bool) error { r.Total++; return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkPutBlob64KiB(b *testing.B) {
	eachDurability(b, func(b *testing.B, s *Store) {
		buf := make([]byte, 64<<10)
		rng := rand.New(rand.NewSource(1))
		b.SetBytes(int64(len(buf)))
		b.ReportAllocs()
		for b.Loop() {
			rng.Read(buf[:16]) // new content each time
			if _, err := s.PutBlob(context.Background(), bytes.NewReader(buf)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// fillJournal appends puts of nrec records, round robin, each about 800
// bytes, and now and then a delete, through the journal's own append, until
// the journal reaches size bytes. (Writing them through Update would take
// minutes for 64 MiB; the lines are the same.)
func fillJournal(b *testing.B, s *Store, nrec int, size int64) {
	ids := make([]string, nrec)
	for i := range ids {
		ids[i] = records.NewID(testKind, s.Now())
	}
	rev := make([]int64, nrec)
	for i := 0; ; i++ {
		r := i % nrec
		rev[r]++
		e := &entry{At: s.Now(), Op: opPut, Kind: testKind, ID: ids[r], Rev: rev[r]}
		if i%97 == 96 {
			e.Op = opDelete
		} else {
			c := &counterRec{Total: i, Note: strings.Repeat("observed ", 70)}
			records.Init(c, testKind, s.Now())
			c.ID, c.Rev = ids[r], rev[r]
			raw, err := records.Marshal(c)
			if err != nil {
				b.Fatal(err)
			}
			e.Record = raw
		}
		if err := s.appendJournal(e); err != nil {
			b.Fatal(err)
		}
		if i%1000 == 0 {
			if st, err := os.Stat(s.journalPath()); err != nil || st.Size() >= size {
				if err != nil {
					b.Fatal(err)
				}
				return
			}
		}
	}
}

func copyFile(b *testing.B, from, to string) {
	data, err := os.ReadFile(from)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o640); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkCompact times Compact of a journal of 16 and 64 MiB holding
// many versions of a thousand records, and of one of 16 MiB where no record
// has a second version (the worst case: everything is kept), and, side by
// side on the same file, cp(1) alone and cp(1) then sync(1) of the copy: the
// floor for rewriting it, which a compaction, fsyncing what it wrote, also
// pays.
func BenchmarkCompact(b *testing.B) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		nrec int
		mib  int64
	}{{"16MiB", 1000, 16}, {"64MiB", 1000, 64}, {"16MiB-all-kept", 1 << 30, 16}} {
		b.Run(tc.name, func(b *testing.B) {
			dir := b.TempDir()
			s := openT(b, dir, WithDurability(SyncOnFlush), WithJournalLimit(0))
			fillJournal(b, s, min(tc.nrec, int(tc.mib<<20)/800), tc.mib<<20)
			orig := filepath.Join(dir, "journal.orig")
			copyFile(b, s.journalPath(), orig)
			st, err := os.Stat(orig)
			if err != nil {
				b.Fatal(err)
			}
			b.Run("compact", func(b *testing.B) {
				b.SetBytes(st.Size())
				var after int64
				for b.Loop() {
					b.StopTimer()
					copyFile(b, orig, s.Path("tmp", "journal.bench"))
					if err := os.Rename(s.Path("tmp", "journal.bench"), s.journalPath()); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					cs, err := s.Compact(ctx)
					if err != nil {
						b.Fatal(err)
					}
					after = cs.After
				}
				b.ReportMetric(float64(after)/float64(st.Size()), "after/before")
			})
			for _, tool := range []struct{ name, script string }{
				{"cp", `cp "$0" "$1"`},
				{"cp+sync", `cp "$0" "$1" && sync "$1"`},
			} {
				b.Run(tool.name, func(b *testing.B) {
					b.SetBytes(st.Size())
					dst := filepath.Join(dir, "journal.copy")
					for b.Loop() {
						b.StopTimer()
						os.Remove(dst)
						b.StartTimer()
						if out, err := exec.Command("sh", "-c", tool.script, orig, dst).CombinedOutput(); err != nil {
							b.Fatalf("%s: %v %s", tool.script, err, out)
						}
					}
				})
			}
		})
	}
}

// BenchmarkJournalWeek simulates a week of one lease through the store: a
// cycle every ten minutes (1008), each with six state transitions of its
// cycle record, six events, an analysis, and a merge into each of the
// lease's 100 observables. It reports the journal's size per live record
// without compaction, with the default limit and with an 8 MiB one. Run it
// once (-benchtime=1x): it is a simulation, not a loop.
func BenchmarkJournalWeek(b *testing.B) {
	const cycles, observables = 1008, 100
	for _, tc := range []struct {
		name  string
		limit int64
	}{{"none", 0}, {"default", DefaultJournalLimit}, {"8MiB", 8 << 20}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				simulateWeek(b, tc.limit, cycles, observables)
			}
		})
	}
}

func simulateWeek(b *testing.B, limit int64, cycles, observables int) {
	ctx := context.Background()
	s := openT(b, b.TempDir(), WithDurability(SyncOnFlush), WithJournalLimit(limit))
	generic := func(kind string, fields map[string]any) *records.Generic {
		g := &records.Generic{}
		records.Init(g, kind, s.Now())
		g.Extra = map[string]json.RawMessage{}
		for k, v := range fields {
			raw, err := json.Marshal(v)
			if err != nil {
				b.Fatal(err)
			}
			g.Extra[k] = raw
		}
		return g
	}
	obs := make([]string, observables)
	var recent []string // the cycles an observable remembers (bounded)
	for c := 0; c < cycles; c++ {
		cy := generic("cycle", map[string]any{"sample": "sample_01JD0000000000000000000000", "lease": "lease_01JD0000000000000000000000",
			"plan": "plan_01JD0000000000000000000000", "state": "pending", "seq": 0})
		if err := s.Create(ctx, cy); err != nil {
			b.Fatal(err)
		}
		recent = append(recent, cy.ID)
		if len(recent) > 16 {
			recent = recent[1:]
		}
		for i, to := range []string{"leasing", "preparing", "executing", "post_processing", "completed", "completed"} {
			var g records.Generic
			err := s.Update(ctx, cy.ID, &g, func(bool) error {
				g.Extra["state"], _ = json.Marshal(to)
				g.Extra["seq"], _ = json.Marshal(i + 1)
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			ev := generic("event", map[string]any{"type": "cycle.state", "subject": cy.ID, "cycle": cy.ID, "seq": i + 1, "to": to})
			if err := s.Create(ctx, ev); err != nil {
				b.Fatal(err)
			}
		}
		for o := range obs {
			fields := map[string]any{"type": "domain", "value": fmt.Sprintf("c2-%03d.example.com", o),
				"lease": "lease_01JD0000000000000000000000", "cycle": cy.ID, "cycles": recent,
				"first_seen": time.Unix(0, 0).UTC(), "last_seen": s.Now(), "count": c + 1, "sources": []string{"pcap", "zeek"}}
			if c == 0 {
				g := generic("observable", fields)
				if err := s.Create(ctx, g); err != nil {
					b.Fatal(err)
				}
				obs[o] = g.ID
				continue
			}
			var g records.Generic
			err := s.Update(ctx, obs[o], &g, func(bool) error {
				for k, v := range fields {
					g.Extra[k], _ = json.Marshal(v)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		an := generic("analysis", map[string]any{"cycle": cy.ID, "observables": map[string]int{"domain": observables},
			"classification": []string{"beaconing"}, "recommendation": "continue", "reasons": []string{"the C2 answered"}})
		if err := s.Create(ctx, an); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	files := recordFiles(b, s)
	var live int64
	for _, data := range files {
		live += int64(len(data))
	}
	st, err := os.Stat(s.journalPath())
	if err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(s.journalPath())
	if err != nil {
		b.Fatal(err)
	}
	gen, _, err := readHeader(f)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(st.Size()), "journal-bytes")
	b.ReportMetric(float64(st.Size())/float64(len(files)), "journal-B/record")
	b.ReportMetric(float64(live)/float64(len(files)), "record-B/record")
	b.ReportMetric(float64(gen), "compactions")
	b.StartTimer()
}
