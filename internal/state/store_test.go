package state

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newClock() *fakeClock {
	return &fakeClock{t: time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)}
}

func TestCreateGetUpdateDeleteList(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	s := openT(t, t.TempDir(), WithClock(clock.now))
	t0 := s.Now()

	a := newCounter(s)
	a.Total = 3
	if err := s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	if a.Rev != 1 || !a.CreatedAt.Equal(t0) || !a.UpdatedAt.Equal(t0) || a.V != records.SchemaVersion {
		t.Fatalf("created header %+v", a.Meta)
	}
	clock.advance(time.Millisecond)
	b := newCounter(s)
	if err := s.Create(ctx, b); err != nil {
		t.Fatal(err)
	}

	got := getCounter(t, s, a.ID)
	if got.Total != 3 || got.Rev != 1 || got.ID != a.ID || got.Kind != testKind {
		t.Fatalf("Get = %+v", got)
	}
	clock.advance(time.Second)
	var u counterRec
	err := s.Update(ctx, a.ID, &u, func(exists bool) error {
		if !exists || u.Total != 3 {
			return fmt.Errorf("update saw exists=%v total=%d", exists, u.Total)
		}
		u.Total++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got = getCounter(t, s, a.ID)
	if got.Total != 4 || got.Rev != 2 || !got.CreatedAt.Equal(t0) || !got.UpdatedAt.Equal(s.Now()) {
		t.Fatalf("after Update: %+v", got)
	}
	if u.Rev != 2 || !u.UpdatedAt.Equal(s.Now()) {
		t.Errorf("Update did not write the stored header back: %+v", u.Meta)
	}

	ids, err := s.List(testKind)
	if err != nil || !slices.Equal(ids, []string{a.ID, b.ID}) {
		t.Fatalf("List = %v, %v; want [%s %s]", ids, err, a.ID, b.ID)
	}
	if kinds, err := s.Kinds(); err != nil || !slices.Equal(kinds, []string{testKind}) {
		t.Fatalf("Kinds = %v, %v", kinds, err)
	}
	if ids, err := s.List("nothing_here"); err != nil || len(ids) != 0 {
		t.Fatalf("List of an absent kind = %v, %v", ids, err)
	}

	if err := s.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if s.Exists(a.ID) {
		t.Fatal("deleted record still exists")
	}
	if err := s.Get(a.ID, &u); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
	if _, err := s.ReadRaw(a.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ReadRaw after Delete: %v", err)
	}
	if err := s.Delete(ctx, a.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Delete: %v", err)
	}
	if ids, _ := s.List(testKind); !slices.Equal(ids, []string{b.ID}) {
		t.Fatalf("List after Delete = %v", ids)
	}
	files := assertConsistent(t, s)
	if len(files) != 1 {
		t.Fatalf("files %v", files)
	}
	_, stats, _ := s.Replay(ctx)
	if stats.Entries != 4 {
		t.Fatalf("journal has %d entries, want 4 (2 creates, update, delete)", stats.Entries)
	}
}

func TestCreateExistsLeavesRecordAlone(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	a := newCounter(s)
	a.Total = 1
	if err := s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	dup := *a
	dup.Total, dup.Rev = 99, 0
	before := journalBytes(t, s)
	if err := s.Create(ctx, &dup); !errors.Is(err, ErrExists) {
		t.Fatalf("Create of a taken ID: %v, want ErrExists", err)
	}
	if dup.Total != 99 || dup.Rev != 0 {
		t.Errorf("failed Create overwrote the caller's record: %+v", dup)
	}
	if got := getCounter(t, s, a.ID); got.Total != 1 || got.Rev != 1 {
		t.Errorf("stored record changed: %+v", got)
	}
	if !bytes.Equal(before, journalBytes(t, s)) {
		t.Error("failed Create wrote the journal")
	}
}

func TestUpdateAbsent(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	id := records.NewID(testKind, s.Now())

	var c counterRec
	err := s.Update(ctx, id, &c, func(exists bool) error {
		if exists {
			t.Error("exists for an absent record")
		}
		return fmt.Errorf("%s: %w", id, ErrNotFound)
	})
	if !errors.Is(err, ErrNotFound) || s.Exists(id) {
		t.Fatalf("Update refusing an absent record: %v, exists %v", err, s.Exists(id))
	}

	// An empty struct gets the kind and ID from the argument; rev starts
	// at 1 whatever the struct carried.
	c = counterRec{}
	c.Rev = 41
	if err := s.Update(ctx, id, &c, func(bool) error { c.Total = 7; return nil }); err != nil {
		t.Fatal(err)
	}
	got := getCounter(t, s, id)
	if got.Kind != testKind || got.ID != id || got.Rev != 1 || got.Total != 7 || got.CreatedAt.IsZero() || got.V != records.SchemaVersion {
		t.Fatalf("record made by Update: %+v", got)
	}

	// A struct naming another record is refused.
	other := newCounter(s)
	id2 := records.NewID(testKind, s.Now())
	if err := s.Update(ctx, id2, other, func(bool) error { return nil }); err == nil || s.Exists(id2) || s.Exists(other.ID) {
		t.Fatalf("Update with a mismatched ID: %v", err)
	}
	// So is a change of ID by fn.
	err = s.Update(ctx, id, &c, func(bool) error { c.ID = other.ID; return nil })
	if err == nil || s.Exists(other.ID) {
		t.Fatalf("Update changing the ID: %v", err)
	}
	assertConsistent(t, s)
}

func TestUpdateNoChange(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	a := newCounter(s)
	if err := s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	file, _ := s.ReadRaw(a.ID)
	journal := journalBytes(t, s)
	var c counterRec
	err := s.Update(ctx, a.ID, &c, func(bool) error {
		c.Total = 1000 // changed, then abandoned
		return fmt.Errorf("nothing to do: %w", ErrNoChange)
	})
	if err != nil {
		t.Fatalf("ErrNoChange: %v", err)
	}
	if now, _ := s.ReadRaw(a.ID); !bytes.Equal(now, file) {
		t.Errorf("record changed:\n%s\n%s", file, now)
	}
	if !bytes.Equal(journal, journalBytes(t, s)) {
		t.Error("journal changed")
	}
	if got := getCounter(t, s, a.ID); got.Rev != 1 {
		t.Errorf("rev %d", got.Rev)
	}
	// Any other error is returned and stores nothing either.
	boom := errors.New("boom")
	if err := s.Update(ctx, a.ID, &c, func(bool) error { c.Total = 5; return boom }); !errors.Is(err, boom) {
		t.Fatalf("error from fn: %v", err)
	}
	if !bytes.Equal(journal, journalBytes(t, s)) {
		t.Error("journal changed")
	}
}

func TestUnknownFieldsSurviveTypedUpdate(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	var g records.Generic
	records.Init(&g, testKind, s.Now())
	g.Extra = map[string]json.RawMessage{
		"total": json.RawMessage("2"),
		// Written by a newer version: nested, indented, with characters
		// encoding/json escapes.
		"future":  json.RawMessage("{\n  \"html\": \"<a href='x'>&</a>\",\n  \"list\": [1, 2,\t3]\n}"),
		"zz_last": json.RawMessage(`"\u2028 ok"`),
	}
	if err := s.Put(ctx, &g); err != nil {
		t.Fatal(err)
	}
	raw, _ := s.ReadRaw(g.ID)
	if bytes.ContainsAny(raw, "\n\t") || !bytes.Contains(raw, []byte(`"html":"<a href='x'>&</a>"`)) {
		t.Errorf("stored record not compact or not verbatim: %s", raw)
	}

	var c counterRec
	if err := s.Update(ctx, g.ID, &c, func(bool) error { c.Total++; return nil }); err != nil {
		t.Fatal(err)
	}
	var back records.Generic
	if err := s.Get(g.ID, &back); err != nil {
		t.Fatal(err)
	}
	if got := string(back.Extra["future"]); got != `{"html":"<a href='x'>&</a>","list":[1,2,3]}` {
		t.Errorf("unknown field after typed Update: %s", got)
	}
	if got := string(back.Extra["zz_last"]); got != `"\u2028 ok"` {
		t.Errorf("zz_last = %s", got)
	}
	if got := string(back.Extra["total"]); got != "3" || back.Rev != 2 {
		t.Errorf("total %s rev %d", got, back.Rev)
	}
	assertConsistent(t, s) // the journal holds the same bytes despite <, >, &
}

func TestUpdateResetsReusedStruct(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	a := newCounter(s)
	a.Counts = map[string]int{"old": 1}
	a.Note = "stale"
	if err := s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	// Another writer replaces the map and clears the note.
	var g records.Generic
	if err := s.Get(a.ID, &g); err != nil {
		t.Fatal(err)
	}
	g.Extra["counts"] = json.RawMessage(`{"new":1}`)
	delete(g.Extra, "note")
	if err := s.Put(ctx, &g); err != nil {
		t.Fatal(err)
	}
	// The caller's struct still holds the first version.
	if err := s.Update(ctx, a.ID, a, func(bool) error { a.Total++; return nil }); err != nil {
		t.Fatal(err)
	}
	got := getCounter(t, s, a.ID)
	if _, stale := got.Counts["old"]; stale || got.Counts["new"] != 1 || got.Note != "" {
		t.Fatalf("stale fields written back: counts %v note %q", got.Counts, got.Note)
	}
	// Get resets as well.
	reused := &counterRec{Note: "x", Counts: map[string]int{"y": 1}}
	if err := s.Get(a.ID, reused); err != nil {
		t.Fatal(err)
	}
	if reused.Note != "" || len(reused.Counts) != 1 {
		t.Fatalf("Get merged into a reused struct: %+v", reused)
	}
}

func TestRevOwnedByStore(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	s := openT(t, t.TempDir(), WithClock(clock.now))
	a := newCounter(s)
	a.Rev = 17
	if err := s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	if a.Rev != 1 {
		t.Fatalf("Create stored rev %d", a.Rev)
	}
	var c counterRec
	if err := s.Update(ctx, a.ID, &c, func(bool) error { c.Rev = 100; c.Total++; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := getCounter(t, s, a.ID); got.Rev != 2 {
		t.Fatalf("rev %d after an Update that set rev 100", got.Rev)
	}
}

func TestPutKeepsCreatedAtAndContinuesRev(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	s := openT(t, t.TempDir(), WithClock(clock.now))
	t0 := s.Now()
	a := newCounter(s)
	if err := s.Put(ctx, a); err != nil {
		t.Fatal(err)
	}
	if a.Rev != 1 || !a.CreatedAt.Equal(t0) {
		t.Fatalf("first Put: %+v", a.Meta)
	}
	clock.advance(time.Hour)
	repl := &counterRec{Total: 9}
	repl.Meta = records.Meta{Kind: testKind, ID: a.ID, Rev: 42, CreatedAt: s.Now().Add(time.Hour)}
	if err := s.Put(ctx, repl); err != nil {
		t.Fatal(err)
	}
	got := getCounter(t, s, a.ID)
	if got.Rev != 2 || !got.CreatedAt.Equal(t0) || !got.UpdatedAt.Equal(s.Now()) || got.Total != 9 {
		t.Fatalf("replacing Put: %+v", got)
	}
	if repl.Rev != 2 || !repl.CreatedAt.Equal(t0) {
		t.Errorf("Put did not write the stored header back: %+v", repl.Meta)
	}
	// After a delete the ID starts over.
	if err := s.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Hour)
	again := &counterRec{}
	again.Meta = records.Meta{Kind: testKind, ID: a.ID, Rev: 5}
	if err := s.Put(ctx, again); err != nil {
		t.Fatal(err)
	}
	if got := getCounter(t, s, a.ID); got.Rev != 1 || !got.CreatedAt.Equal(s.Now()) {
		t.Fatalf("Put after Delete: %+v", got.Meta)
	}
	// Invalid records are refused.
	bad := &counterRec{}
	bad.Meta = records.Meta{Kind: "other", ID: a.ID}
	if err := s.Put(ctx, bad); err == nil {
		t.Fatal("Put of a record whose kind does not match its ID")
	}
	assertConsistent(t, s)
}

func TestFailedWriteRestoresHeader(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	a := newCounter(s)
	if err := s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	// A value that cannot be encoded makes the write fail after the
	// header was stamped.
	var g records.Generic
	if err := s.Get(a.ID, &g); err != nil {
		t.Fatal(err)
	}
	g.Extra["broken"] = json.RawMessage("{not json")
	g.Rev = 0
	if err := s.Put(ctx, &g); err == nil {
		t.Fatal("Put of invalid JSON succeeded")
	}
	if g.Rev != 0 {
		t.Errorf("failed Put left rev %d in the caller's record", g.Rev)
	}
	assertConsistent(t, s)
}

func TestInvalidIDsAndNames(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	root := filepath.Join(parent, "state")
	s := openT(t, root)
	valid := records.NewID(testKind, s.Now())
	suffix := valid[len(testKind):]
	badIDs := []string{
		"", "x", "../x", "..", "/etc/passwd",
		"counter_../../../../../etc/passwd",
		"../" + valid[3:], "counter/.." + suffix, "Counter" + suffix, "count er" + suffix,
		testKind + "_0123456789012345678901234U", // U is not Crockford
		valid + "/", valid + "x", "_" + suffix[1:],
	}
	for _, id := range badIDs {
		if _, err := s.ReadRaw(id); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("ReadRaw(%q) = %v, want a malformed-id error", id, err)
		}
		if s.Exists(id) {
			t.Errorf("Exists(%q)", id)
		}
		var c counterRec
		if err := s.Get(id, &c); err == nil {
			t.Errorf("Get(%q) succeeded", id)
		}
		c.Meta = records.Meta{Kind: testKind, ID: id}
		if err := s.Create(ctx, &c); err == nil {
			t.Errorf("Create(%q) succeeded", id)
		}
		if err := s.Put(ctx, &c); err == nil {
			t.Errorf("Put(%q) succeeded", id)
		}
		if err := s.Update(ctx, id, &c, func(bool) error { return nil }); err == nil {
			t.Errorf("Update(%q) succeeded", id)
		}
		if err := s.Delete(ctx, id); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("Delete(%q) = %v", id, err)
		}
		if err := s.SetIndex("sha256", "key", id); err == nil {
			t.Errorf("SetIndex to %q succeeded", id)
		}
		if _, _, err := s.Claim(ctx, "sha256", "key", func() (records.Record, error) {
			var g records.Generic
			records.Init(&g, "claimed", s.Now())
			g.ID = id
			return &g, nil
		}); err == nil {
			t.Errorf("Claim creating %q succeeded", id)
		}
	}
	for _, kind := range []string{"", "..", "../x", "a/b", "Plan", "_x", "x_", strings.Repeat("k", 33)} {
		if _, err := s.List(kind); err == nil {
			t.Errorf("List(%q) succeeded", kind)
		}
	}
	for _, key := range [][2]string{{"sha256", "../x"}, {"sha256", ".x"}, {"sha256", "a/b"}, {"sha256", ""}, {"../i", "k"}, {"", "k"}} {
		if _, err := s.Lookup(key[0], key[1]); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("Lookup(%q, %q) = %v", key[0], key[1], err)
		}
		if err := s.SetIndex(key[0], key[1], valid); err == nil {
			t.Errorf("SetIndex(%q, %q) succeeded", key[0], key[1])
		}
	}
	for _, sha := range []string{"", "a", "..", "../../../../etc/passwd", strings.Repeat("A", 64), strings.Repeat("g", 64), strings.Repeat("a", 63)} {
		if p := s.BlobPath(sha); !strings.HasPrefix(p, s.Path("blobs", "sha256")+"/") {
			t.Errorf("BlobPath(%q) = %s, outside the blob store", sha, p)
		}
		if s.HasBlob(sha) {
			t.Errorf("HasBlob(%q)", sha)
		}
		if _, err := s.OpenBlob(sha); err == nil {
			t.Errorf("OpenBlob(%q) succeeded", sha)
		}
		if _, err := s.PutBlobKnown(ctx, sha, strings.NewReader("x")); err == nil {
			t.Errorf("PutBlobKnown(%q) succeeded", sha)
		}
	}
	for _, name := range []string{"../../../../escape", "/abs/name", "a/../../b"} {
		unlock, err := s.Lock(ctx, name)
		if err != nil {
			t.Fatalf("Lock(%q): %v", name, err)
		}
		unlock()
	}
	for _, name := range []string{"", "/", "..", "."} {
		if _, err := s.Lock(ctx, name); err == nil {
			t.Errorf("Lock(%q) succeeded", name)
		}
	}
	// Nothing was created outside the state directory.
	ents, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "state" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("files outside the state directory: %v", names)
	}
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(filepath.Base(path), "escape") &&
			!strings.HasPrefix(path, s.Path("locks", "named")+"/") {
			t.Errorf("named lock at %s, outside locks/named", path)
		}
		return nil
	})
}

func TestBlobs(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	content := []byte("malware sample bytes\x00\x01")
	sum := sha256.Sum256(content)
	sha := hex.EncodeToString(sum[:])

	b1, err := s.PutBlob(ctx, bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	if b1.SHA256 != sha || b1.Size != int64(len(content)) || b1.URI() != "blob:sha256:"+sha {
		t.Fatalf("PutBlob = %+v", b1)
	}
	st1, err := os.Stat(s.BlobPath(sha))
	if err != nil {
		t.Fatal(err)
	}
	if st1.Mode().Perm() != 0o444 {
		t.Errorf("blob mode %v, want read-only", st1.Mode())
	}
	b2, err := s.PutBlob(ctx, bytes.NewReader(content))
	if err != nil || b2 != b1 {
		t.Fatalf("second PutBlob = %+v, %v", b2, err)
	}
	st2, _ := os.Stat(s.BlobPath(sha))
	if !os.SameFile(st1, st2) {
		t.Error("identical content was stored again")
	}
	// Known digest of a stored blob: the reader is not touched.
	b3, err := s.PutBlobKnown(ctx, sha, iotest{t})
	if err != nil || b3 != b1 {
		t.Fatalf("PutBlobKnown of a stored blob = %+v, %v", b3, err)
	}
	// Wrong digest: refused, nothing stored under either name.
	other := []byte("other content")
	osum := sha256.Sum256(other)
	wrong := strings.Repeat("ab", 32)
	if _, err := s.PutBlobKnown(ctx, wrong, bytes.NewReader(other)); err == nil {
		t.Fatal("PutBlobKnown with a wrong digest succeeded")
	}
	if s.HasBlob(wrong) || s.HasBlob(hex.EncodeToString(osum[:])) {
		t.Fatal("a blob with a wrong digest was stored")
	}
	// Right digest for new content.
	if b, err := s.PutBlobKnown(ctx, hex.EncodeToString(osum[:]), bytes.NewReader(other)); err != nil || b.Size != int64(len(other)) {
		t.Fatalf("PutBlobKnown = %+v, %v", b, err)
	}
	f, err := s.OpenBlob(sha)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if !bytes.Equal(got, content) {
		t.Fatal("OpenBlob content differs")
	}
	if _, err := s.OpenBlob(strings.Repeat("0", 64)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("OpenBlob of an absent blob: %v", err)
	}
	if ents, _ := os.ReadDir(s.Path("tmp")); len(ents) != 0 {
		t.Errorf("tmp/ not cleaned: %v", ents)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Check(ctx, CheckOptions{Blobs: true})
	if err != nil || !rep.OK() || rep.Blobs != 2 {
		t.Fatalf("Check = %+v, %v", rep, err)
	}
}

// iotest is a reader that must not be read.
type iotest struct{ t *testing.T }

func (r iotest) Read([]byte) (int, error) {
	r.t.Error("reader was read")
	return 0, io.ErrUnexpectedEOF
}

func TestBlobCutShortIsReplaced(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	content := bytes.Repeat([]byte("0123456789"), 1000)
	sum := sha256.Sum256(content)
	sha := hex.EncodeToString(sum[:])
	// What a power cut before Flush can leave: the name, not the data.
	mkdirT(t, filepath.Dir(s.BlobPath(sha)))
	if err := os.WriteFile(s.BlobPath(sha), content[:100], 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBlob(ctx, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(s.BlobPath(sha))
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("short blob not replaced (%d bytes, %v)", len(got), err)
	}
}

func TestClaimAndIndex(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	calls := 0
	create := func() (records.Record, error) {
		calls++
		return newCounter(s), nil
	}
	id1, created, err := s.Claim(ctx, "sha256", "abc", create)
	if err != nil || !created {
		t.Fatalf("first Claim = %s, %v, %v", id1, created, err)
	}
	for i := 0; i < 3; i++ {
		id, created, err := s.Claim(ctx, "sha256", "abc", create)
		if err != nil || created || id != id1 {
			t.Fatalf("Claim again = %s, %v, %v; want %s", id, created, err, id1)
		}
	}
	if calls != 1 {
		t.Fatalf("create called %d times", calls)
	}
	if id, err := s.Lookup("sha256", "abc"); err != nil || id != id1 {
		t.Fatalf("Lookup = %s, %v", id, err)
	}
	if _, err := s.Lookup("sha256", "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Lookup of a missing key: %v", err)
	}
	// create's error is returned and nothing indexed.
	boom := errors.New("boom")
	if _, _, err := s.Claim(ctx, "sha256", "def", func() (records.Record, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("Claim with failing create: %v", err)
	}
	if _, err := s.Lookup("sha256", "def"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("key indexed after a failed create: %v", err)
	}
	// A key whose record has gone counts as absent, and is claimed anew.
	if err := s.Delete(ctx, id1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup("sha256", "abc"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Lookup of a key whose record is gone: %v", err)
	}
	id2, created, err := s.Claim(ctx, "sha256", "abc", create)
	if err != nil || !created || id2 == id1 {
		t.Fatalf("Claim after delete = %s, %v, %v", id2, created, err)
	}
	other := newCounter(s)
	if err := s.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := s.SetIndex("sha256", "abc", other.ID); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.Lookup("sha256", "abc"); id != other.ID {
		t.Fatalf("Lookup after SetIndex = %s", id)
	}
}

func TestLocks(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	unlock, err := s.Lock(ctx, "build/spec-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.TryLock(ctx, "build/spec-1"); ok || err != nil {
		t.Fatalf("TryLock of a held lock = %v, %v", ok, err)
	}
	// A wait for a held lock ends when its context does.
	cctx, cancel := context.WithCancel(ctx)
	waiting := make(chan struct{})
	lockWaitHook = func(string) { close(waiting) }
	// The abandoned wait may yet get the lock, for a moment, once it is
	// free: the TryLock below asks after that moment.
	abandoned := make(chan struct{})
	lockAbandonedHook = func(string) { close(abandoned) }
	defer func() { lockWaitHook, lockAbandonedHook = nil, nil }()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Lock(cctx, "build/spec-1")
		errc <- err
	}()
	<-waiting
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Lock with a cancelled context: %v", err)
		}
	case <-time.After(30 * time.Second): // a deadline, not a synchronisation
		t.Fatal("Lock kept waiting after its context was cancelled")
	}
	lockWaitHook = nil
	unlock()
	unlock2, err := s.Lock(ctx, "build/spec-1") // not kept by the abandoned wait
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
	<-abandoned
	u3, ok, err := s.TryLock(ctx, "build/spec-1")
	if !ok || err != nil {
		t.Fatalf("TryLock of a free lock = %v, %v", ok, err)
	}
	u3()
	// Record locks, index locks and named locks do not share files.
	c := newCounter(s)
	if err := s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	held, err := s.Lock(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer held()
	if err := s.Update(ctx, c.ID, &counterRec{}, func(bool) error { return nil }); err != nil {
		t.Fatalf("Update while a named lock of the same name is held: %v", err)
	}
}

func TestJournalTornLastLine(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	a := newCounter(s)
	if err := s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	// A writer killed half way through its entry.
	full := journalBytes(t, s)
	f, err := os.OpenFile(s.journalPath(), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	torn := bytes.TrimSuffix(full, []byte("\n"))
	torn = torn[:len(torn)/2]
	f.Write(torn)
	f.Close()
	if _, stats, err := s.Replay(ctx); err != nil || stats.Entries != 1 || stats.Torn != 1 {
		t.Fatalf("Replay with a torn tail = %+v, %v", stats, err)
	}
	// Recovery (reading the journal backwards) is not fooled by it.
	if e, err := s.lastJournalEntry(a.ID); err != nil || e == nil || e.Rev != 1 {
		t.Fatalf("lastJournalEntry = %+v, %v", e, err)
	}
	var c counterRec
	if err := s.Update(ctx, a.ID, &c, func(bool) error { c.Total++; return nil }); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(journalBytes(t, s)), "\n")
	if len(lines) != 4 || lines[3] != "" || lines[1] != string(torn) {
		t.Fatalf("journal lines after the torn one: %q", lines)
	}
	var e entry
	if err := json.Unmarshal([]byte(lines[2]), &e); err != nil || e.Rev != 2 || e.Op != opPut {
		t.Fatalf("new entry %q does not stand on its own line: %v", lines[2], err)
	}
	if _, stats, _ := s.Replay(ctx); stats.Entries != 2 || stats.Torn != 1 {
		t.Fatalf("Replay = %+v", stats)
	}
	assertConsistent(t, s)
}

// TestLastJournalEntryChunks compares the backwards scan with a forward one
// when lines cross chunk boundaries: tiny chunks over a small journal, and
// real ones over lines longer than a chunk.
func TestLastJournalEntryChunks(t *testing.T) {
	t.Run("small", func(t *testing.T) {
		checkBackwardsScan(t, 30, []int{0, 1, 10, 50, 200, 1000}, []int64{1, 2, 7, 64, 333, 4096})
	})
	t.Run("large", func(t *testing.T) {
		checkBackwardsScan(t, 14, []int{0, 10, 300 << 10, 1<<20 + 17, 1536 << 10, 700 << 10},
			[]int64{64 << 10, 1<<20 - 1, 1 << 20})
	})
}

func checkBackwardsScan(t *testing.T, ops int, sizes []int, chunks []int64) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), WithDurability(SyncOnFlush))
	rng := rand.New(rand.NewSource(1))
	var ids []string
	for i := 0; i < 6; i++ {
		c := newCounter(s)
		ids = append(ids, c.ID)
	}
	for i := 0; i < ops; i++ {
		id := ids[rng.Intn(len(ids))]
		n := sizes[rng.Intn(len(sizes))]
		if rng.Intn(8) == 0 && s.Exists(id) {
			if err := s.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var c counterRec
		err := s.Update(ctx, id, &c, func(bool) error {
			c.Note = strings.Repeat("x", n)
			c.Total = i
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// An ID that is only mentioned inside other records' content.
	ghost := records.NewID(testKind, s.Now())
	var c counterRec
	if err := s.Update(ctx, ids[0], &c, func(bool) error { c.Note = `"id":"` + ghost + `"`; return nil }); err != nil {
		t.Fatal(err)
	}
	forward := make(map[string]entry)
	if _, err := s.scanJournal(ctx, func(e *entry) { forward[e.ID] = *e }); err != nil {
		t.Fatal(err)
	}
	journal := journalBytes(t, s)
	size := int64(len(journal))
	longest := 0
	for _, l := range bytes.Split(journal, []byte("\n")) {
		longest = max(longest, len(l))
	}
	if int64(longest) <= chunks[len(chunks)-2] {
		t.Fatalf("longest journal line is %d bytes: lines do not span chunks of %d", longest, chunks[len(chunks)-2])
	}
	for _, chunk := range append(chunks, size-1, size, size+1) {
		func() {
			defer func(old int64) { journalChunk = old }(journalChunk)
			journalChunk = chunk
			for _, id := range append(ids, ghost) {
				e, err := s.lastJournalEntry(id)
				if err != nil {
					t.Fatal(err)
				}
				want, ok := forward[id]
				if !ok {
					if e != nil {
						t.Errorf("chunk %d: %s: found %s rev %d, want none", chunk, id, e.Op, e.Rev)
					}
					continue
				}
				if e == nil || e.Op != want.Op || e.Rev != want.Rev || !bytes.Equal(e.Record, want.Record) {
					t.Errorf("chunk %d: %s: got %v, want %s rev %d", chunk, id, e != nil, want.Op, want.Rev)
				}
			}
		}()
	}
	assertConsistent(t, s)
}

// TestRecoveryLeavesLiveIntentsAlone: an intent whose record lock is held
// belongs to a live writer.
func TestRecoveryLeavesLiveIntentsAlone(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openT(t, dir)
	a := newCounter(s)
	if err := s.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	unlock, err := s.lockRecord(ctx, testKind, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	intent := s.intentPath(testKind, a.ID)
	if err := os.WriteFile(intent, []byte(`{"in":"flight"}`), 0o640); err != nil {
		t.Fatal(err)
	}
	openT(t, dir)
	if _, err := os.Stat(intent); err != nil {
		t.Fatal("Open removed the intent of a live writer")
	}
	rep, err := s.Check(ctx, CheckOptions{})
	if err != nil || len(rep.InFlight) != 1 {
		t.Fatalf("Check in flight = %+v, %v", rep, err)
	}
	unlock()
	s = openT(t, dir)
	if _, err := os.Stat(intent); err == nil {
		t.Fatal("Open kept the intent of a dead writer")
	}
	if got := getCounter(t, s, a.ID); got.Rev != 1 {
		t.Fatalf("uncommitted intent was applied: %+v", got)
	}
	assertConsistent(t, s)
}

func TestCheckFindsProblems(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir())
	var ids []string
	for i := 0; i < 4; i++ {
		c := newCounter(s)
		if err := s.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	blob, err := s.PutBlob(ctx, strings.NewReader("blob"))
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := s.Check(ctx, CheckOptions{Blobs: true}); err != nil || !rep.OK() || rep.Records != 4 {
		t.Fatalf("Check of a good store = %+v, %v", rep, err)
	}
	path := func(id string) string { return s.recordPath(testKind, id) }
	os.WriteFile(path(ids[0]), []byte("{garbage"), 0o640)                                              // does not decode
	os.Remove(path(ids[1]))                                                                            // missing
	raw, _ := os.ReadFile(path(ids[2]))                                                                //
	os.WriteFile(path(ids[2]), bytes.Replace(raw, []byte(`"total":0`), []byte(`"total":1`), 1), 0o640) // differs
	stray := newCounter(s)                                                                             //
	b, _ := records.Marshal(stray)                                                                     //
	os.WriteFile(path(stray.ID), b, 0o640)                                                             // not journaled
	os.WriteFile(filepath.Join(filepath.Dir(path(ids[3])), "junk.txt"), nil, 0o640)                    // stray file
	os.Chmod(s.BlobPath(blob.SHA256), 0o644)
	os.WriteFile(s.BlobPath(blob.SHA256), []byte("bolb"), 0o444) // corrupt blob
	rep, err := s.Check(ctx, CheckOptions{Blobs: true})
	if err != nil {
		t.Fatal(err)
	}
	found := strings.Builder{}
	for _, p := range rep.Problems {
		found.WriteString(p.String() + "\n")
	}
	for _, want := range []string{
		ids[0] + ": does not decode",
		ids[0] + ": record file differs",
		ids[1] + ": record file is missing",
		ids[2] + ": record file differs",
		stray.ID + ": record is not in the journal",
		"junk.txt: unexpected file",
		blob.SHA256 + ": content has sha256",
	} {
		if !strings.Contains(found.String(), want) {
			t.Errorf("Check did not report %q; it reported:\n%s", want, found.String())
		}
	}
	if len(rep.Problems) != 7 {
		t.Errorf("%d problems, want 7:\n%s", len(rep.Problems), found.String())
	}
}
