package state

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// CheckOptions selects the optional, slower parts of Check.
type CheckOptions struct {
	// Blobs re-hashes every stored blob.
	Blobs bool
	// Repair adds the secondary keys a record lacks (keys.go).
	Repair bool
}

// Problem is one inconsistency Check found.
type Problem struct {
	ID   string `json:"id,omitempty"`
	Path string `json:"path"`
	Err  string `json:"error"`
}

func (p Problem) String() string {
	if p.ID != "" {
		return fmt.Sprintf("%s: %s: %s", p.Path, p.ID, p.Err)
	}
	return fmt.Sprintf("%s: %s", p.Path, p.Err)
}

// CheckReport is the result of Check.
type CheckReport struct {
	Records int          `json:"records"`
	Kinds   int          `json:"kinds"`
	Blobs   int          `json:"blobs,omitempty"`
	Journal JournalStats `json:"journal"`
	// InFlight lists intents whose lock a live writer holds.
	InFlight []string `json:"in_flight,omitempty"`
	// Temp lists files in tmp/: blobs and index keys being written, or
	// left behind by killed processes (harmless, and safe to remove when no
	// tool is running).
	Temp     []string  `json:"temp,omitempty"`
	Problems []Problem `json:"problems,omitempty"`
	// Repaired lists what Repair fixed.
	Repaired []string `json:"repaired,omitempty"`
}

// OK reports whether Check found no problem.
func (r *CheckReport) OK() bool { return len(r.Problems) == 0 }

func (r *CheckReport) problem(id, path, format string, args ...any) {
	r.Problems = append(r.Problems, Problem{ID: id, Path: path, Err: fmt.Sprintf(format, args...)})
}

// Check verifies the store: it first settles writes that dead processes
// left in flight (as Open does), then checks that every record file decodes
// and sits where its ID says, and that replaying the journal gives exactly
// the record files. Records that differ while other processes write are
// checked again under their lock, so Check may run on a live store. The
// error is for failures to read the store; what is wrong with it is in the
// report.
func (s *dirStore) Check(ctx context.Context, opts CheckOptions) (*CheckReport, error) {
	rep := &CheckReport{}
	if err := s.recoverIntents(ctx); err != nil {
		return nil, err
	}
	want, stats, err := s.Replay(ctx)
	if err != nil {
		return nil, err
	}
	rep.Journal = stats
	seen := make(map[string]bool)
	keys := &keyChecker{s: s}
	recDir := filepath.Join(s.root, "records")
	kinds, err := os.ReadDir(recDir)
	if err != nil {
		return nil, err
	}
	for _, k := range kinds {
		kpath := filepath.Join(recDir, k.Name())
		if !k.IsDir() || !records.ValidKind(k.Name()) {
			rep.problem("", kpath, "unexpected entry in records/")
			continue
		}
		rep.Kinds++
		ents, err := os.ReadDir(kpath)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			path := filepath.Join(kpath, e.Name())
			id, ok := strings.CutSuffix(e.Name(), ".json")
			if !ok || records.CheckID(id) != nil || records.KindOf(id) != k.Name() || !e.Type().IsRegular() {
				rep.problem("", path, "unexpected file in records/%s/", k.Name())
				continue
			}
			seen[id] = true
			rep.Records++
			data, err := os.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				// Deleted since the listing: compared below, under the lock.
				if _, ok := want[id]; !ok {
					continue
				}
			} else if err != nil {
				return nil, err
			} else {
				rec, err := records.Decode(data)
				if err != nil {
					rep.problem(id, path, "does not decode: %v", err)
				} else if rec.Header().ID != id {
					rep.problem(id, path, "holds record %q", rec.Header().ID)
				} else if err := keys.checkKeys(rep, rec, path, opts.Repair); err != nil {
					return nil, err
				}
				if j, ok := want[id]; ok && bytes.Equal(j, data) {
					continue
				}
			}
			if err := s.checkAgainstJournal(ctx, rep, k.Name(), id); err != nil {
				return nil, err
			}
		}
	}
	if err := s.checkPacked(ctx, rep, keys, want, seen, opts.Repair); err != nil {
		return nil, err
	}
	missing := make([]string, 0)
	for id := range want {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	sort.Strings(missing)
	for _, id := range missing {
		kind, err := checkRef(id)
		if err != nil {
			rep.problem(id, s.journalPath(), "journal holds a malformed id")
			continue
		}
		if err := s.checkAgainstJournal(ctx, rep, kind, id); err != nil {
			return nil, err
		}
	}
	if err := s.checkIntents(ctx, rep); err != nil {
		return nil, err
	}
	if ents, err := os.ReadDir(filepath.Join(s.root, "tmp")); err == nil {
		for _, e := range ents {
			rep.Temp = append(rep.Temp, e.Name())
		}
	}
	if opts.Blobs {
		if err := s.checkBlobs(ctx, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// checkPacked checks the packed records that have no file of their own, as
// Check does those that have: each decodes and holds its own ID, has its
// keys, and is the journal's last version of it.
func (s *dirStore) checkPacked(ctx context.Context, rep *CheckReport, keys *keyChecker, want map[string][]byte, seen map[string]bool, repair bool) error {
	ents, err := os.ReadDir(filepath.Join(s.root, "packs"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, k := range ents {
		if !k.IsDir() {
			continue
		}
		kind := k.Name()
		if !records.ValidKind(kind) {
			rep.problem("", filepath.Join(s.root, "packs", kind), "unexpected entry in packs/")
			continue
		}
		if _, err := os.Stat(filepath.Join(s.root, "records", kind)); err != nil {
			rep.Kinds++ // not counted with the record files
		}
		packed, err := s.packedIDs(kind)
		if err != nil {
			return err
		}
		for id, loc := range packed {
			if err := ctx.Err(); err != nil {
				return err
			}
			if seen[id] {
				continue // its file comes first, checked above
			}
			seen[id] = true
			rep.Records++
			path := s.packPath(loc.batch)
			data, err := s.readPacked(loc)
			if err != nil {
				rep.problem(id, path, "pack copy unreadable: %v", err)
				continue
			}
			rec, err := records.Decode(data)
			if err != nil {
				rep.problem(id, path, "does not decode: %v", err)
			} else if rec.Header().ID != id {
				rep.problem(id, path, "holds record %q", rec.Header().ID)
			} else if err := keys.checkKeys(rep, rec, path, repair); err != nil {
				return err
			}
			if j, ok := want[id]; ok && bytes.Equal(j, data) {
				continue
			}
			if err := s.checkAgainstJournal(ctx, rep, kind, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkAgainstJournal compares one record file with its last journal entry
// under the record's lock, where neither can change.
func (s *dirStore) checkAgainstJournal(ctx context.Context, rep *CheckReport, kind, id string) error {
	unlock, err := s.lockRecord(ctx, kind, id)
	if err != nil {
		return err
	}
	defer unlock()
	path := s.recordPath(kind, id)
	data, err := s.readRecord(kind, id)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	last, err := s.lastJournalEntry(id)
	if err != nil {
		return err
	}
	journaled := last != nil && last.Op == opPut
	switch {
	case exists && !journaled && last == nil:
		rep.problem(id, path, "record is not in the journal")
	case exists && !journaled:
		rep.problem(id, path, "record was deleted in the journal but its file remains")
	case !exists && journaled:
		rep.problem(id, path, "record file is missing (journal has rev %d)", last.Rev)
	case exists && journaled && !bytes.Equal(data, last.Record):
		rep.problem(id, path, "record file differs from the journal (file rev %d, journal rev %d)", s.prevHeader(id, data).Rev, last.Rev)
	}
	return nil
}

// checkIntents reports intents that are still there: held by a live writer
// (in flight) or, if a writer died after recovery ran, a problem.
func (s *dirStore) checkIntents(ctx context.Context, rep *CheckReport) error {
	dir := filepath.Join(s.root, "intents")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		if name, ok := batchIntentName(e.Name()); ok {
			unlock, locked, err := lockFile(ctx, s.batchLockPath(), lockOffset(name), false)
			if err != nil {
				return err
			}
			if !locked {
				rep.InFlight = append(rep.InFlight, e.Name())
				continue
			}
			if _, err := os.Lstat(path); err == nil {
				rep.problem(name, path, "batch left in flight by a dead process")
			}
			unlock()
			continue
		}
		kind, id, ok := parseIntentName(e.Name())
		if !ok {
			rep.problem("", path, "unexpected file in intents/")
			continue
		}
		unlock, locked, err := lockFile(ctx, s.recordLockPath(kind, id), lockOffset(id), false)
		if err != nil {
			return err
		}
		if !locked {
			rep.InFlight = append(rep.InFlight, e.Name())
			continue
		}
		if _, err := os.Lstat(path); err == nil {
			rep.problem(id, path, "write left in flight by a dead process")
		}
		unlock()
	}
	return nil
}

// checkBlobs re-hashes every blob.
func (s *dirStore) checkBlobs(ctx context.Context, rep *CheckReport) error {
	dir := filepath.Join(s.blobRoot, "blobs", "sha256")
	subs, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, sub := range subs {
		spath := filepath.Join(dir, sub.Name())
		if !sub.IsDir() || len(sub.Name()) != 2 {
			rep.problem("", spath, "unexpected entry in blobs/sha256/")
			continue
		}
		ents, err := os.ReadDir(spath)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := ctx.Err(); err != nil {
				return err
			}
			path := filepath.Join(spath, e.Name())
			if !validSHA256(e.Name()) || e.Name()[:2] != sub.Name() || !e.Type().IsRegular() {
				rep.problem("", path, "unexpected file in blobs/sha256/%s/", sub.Name())
				continue
			}
			rep.Blobs++
			sum, err := hashFile(path)
			if err != nil {
				rep.problem("", path, "unreadable: %v", err)
			} else if sum != e.Name() {
				rep.problem("", path, "content has sha256 %s", sum)
			}
		}
	}
	return nil
}

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
