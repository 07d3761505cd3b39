// Package sample ingests files as samples: one read to digest and triage
// them, one copy in the blob store per content, one sample record per sha256.
package sample

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/triage"
)

// IndexSHA256 is the state index from a sample's sha256 to its record ID.
const IndexSHA256 = "sample_sha256"

// inMemoryLimit is the largest file read whole into memory; bigger ones are
// streamed twice (digest, then copy) so memory stays bounded.
const inMemoryLimit = 16 << 20

// Ingester stores samples in a state directory. Not safe for concurrent use.
type Ingester struct {
	Store    *state.Store
	Priority int
	// DroppedBy, if set, is added to every sample's lineage.
	DroppedBy *records.Drop
}

// Prepared is a file read, digested and triaged, ready to be stored.
type Prepared struct {
	Path    string
	Digests triage.Digests
	Triage  records.Triage
	data    []byte   // the content when it was small enough to keep
	file    *os.File // otherwise the open file, re-read when stored
	blob    string   // the blob's URI once StoreBlob has copied the content
}

// Close releases what a Prepared holds; Save and StoreBlob call it.
func (p *Prepared) Close() {
	if p.file != nil {
		p.file.Close()
		p.file = nil
	}
}

// Prepare reads, digests and triages the file at path: the CPU-heavy part of
// ingesting, safe to run on many files at once. buf is reused for the
// content when it fits (nil: allocate).
func Prepare(path string, buf []byte) (*Prepared, error) {
	// Raw system calls: os.Open would spend five more per file trying to
	// register it with the network poller, more than reading a small
	// sample takes.
	fd, err := openRead(path)
	if err != nil {
		return nil, fault.Failure(fmt.Errorf("%s: %w", path, err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fault.Failure(fmt.Errorf("%s: %w", path, err))
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		unix.Close(fd)
		return nil, fault.Failure(fmt.Errorf("%s: not a regular file", path))
	case st.Size == 0:
		unix.Close(fd)
		return nil, fault.DataErr(fmt.Errorf("%s: empty file", path))
	}
	p := &Prepared{Path: path}
	if st.Size <= inMemoryLimit {
		data, err := readAll(fd, st.Size, buf)
		unix.Close(fd)
		if err != nil {
			return nil, fault.Failure(fmt.Errorf("%s: %w", path, err))
		}
		p.data = data
		p.Digests = triage.DigestBytes(data)
		p.Triage = triage.Inspect(bytes.NewReader(data), int64(len(data)))
		return p, nil
	}
	f := os.NewFile(uintptr(fd), path)
	if p.Digests, err = triage.Digest(f); err != nil {
		f.Close()
		return nil, fault.Failure(fmt.Errorf("%s: %w", path, unwrapPathErr(err)))
	}
	p.Triage = triage.Inspect(f, st.Size)
	p.file = f
	return p, nil
}

func openRead(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// StoreBlob copies the content into the store's blobs (nothing is written
// when that content is there already) and lets go of it (a large file is
// closed; Data is nil afterwards). Blobs are content-addressed, so workers
// may store them in any order, before the sample is claimed: the worst a
// crash leaves is a blob no sample names.
func (p *Prepared) StoreBlob(ctx context.Context, st *state.Store) error {
	defer p.Close()
	var (
		blob state.Blob
		err  error
	)
	if p.file == nil {
		blob, err = st.PutBlobBytes(ctx, p.Digests.SHA256, p.data)
		p.data = nil
	} else if _, err = p.file.Seek(0, io.SeekStart); err != nil {
		return fault.Failure(fmt.Errorf("%s: %w", p.Path, unwrapPathErr(err)))
	} else {
		blob, err = st.PutBlobKnown(ctx, p.Digests.SHA256, p.file)
	}
	if err != nil {
		return fmt.Errorf("%s: storing blob: %w", p.Path, err)
	}
	p.blob = blob.URI()
	return nil
}

// Save writes a prepared file: blob (unless StoreBlob did), sample record,
// sha256 index.
func (in *Ingester) Save(ctx context.Context, p *Prepared) (*records.Sample, bool, error) {
	defer p.Close()
	return in.store(ctx, p)
}

// Queue adds the sample record of p, new content whose blob is stored
// (StoreBlob), to a batch, with its sha256 index key, and returns it and
// its JSON as it will be stored. Nil, and no error: the content is known
// already, is in the batch already, or another writer is claiming it;
// commit the batch (which may hold the key's lock) and Save p instead.
func (in *Ingester) Queue(b *state.Batch, p *Prepared) (*records.Sample, []byte, error) {
	if p.blob == "" {
		return nil, nil, nil
	}
	sha := p.Digests.SHA256
	ok, err := b.TryLockIndex(IndexSHA256, sha)
	if err != nil || !ok {
		return nil, nil, wrapStoring(p.Path, err)
	}
	if _, err := in.Store.Lookup(IndexSHA256, sha); !errors.Is(err, state.ErrNotFound) {
		return nil, nil, wrapStoring(p.Path, err)
	}
	smp := in.newSample(p)
	line, err := b.Create(smp)
	if err != nil || line == nil {
		return nil, nil, wrapStoring(p.Path, err)
	}
	if err := b.SetIndex(IndexSHA256, sha, smp.ID); err != nil {
		return nil, nil, wrapStoring(p.Path, err)
	}
	return smp, line, nil
}

func wrapStoring(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: storing sample: %w", name, err)
}

func (in *Ingester) newSample(p *Prepared) *records.Sample {
	now := in.Store.Now()
	dig := p.Digests
	smp := &records.Sample{
		SHA256: dig.SHA256, SHA1: dig.SHA1, MD5: dig.MD5, Size: dig.Size, Entropy: dig.Entropy,
		Blob: p.blob, Triage: p.Triage, Source: p.Path, Names: []string{baseName(p.Path)},
		Priority: in.Priority, SubmittedAt: now,
	}
	if in.DroppedBy != nil {
		smp.DroppedBy = []records.Drop{*in.DroppedBy}
	}
	records.Init(smp, records.KindSample, now)
	return smp
}

// readAll reads a file of the given size whole into buf (grown if need be),
// and fails if it turns out to have another size.
func readAll(fd int, size int64, buf []byte) ([]byte, error) {
	if int64(cap(buf)) < size+1 {
		buf = make([]byte, size+1)
	}
	buf = buf[:size+1]
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		n += m
		if m == 0 || int64(n) == size {
			// A read of a regular file on a local filesystem that stops
			// short of what was asked has reached the end: no second call
			// to be told so.
			break
		}
	}
	if int64(n) != size {
		return nil, fmt.Errorf("file changed size while being read (%d bytes, expected %d)", n, size)
	}
	return buf[:n], nil
}

// store claims the sha256, creating blob and record for new content, or
// adding the name to the existing record.
func (in *Ingester) store(ctx context.Context, p *Prepared) (*records.Sample, bool, error) {
	s := in.Store
	name := p.Path
	var created *records.Sample
	id, isNew, err := s.Claim(ctx, IndexSHA256, p.Digests.SHA256, func() (records.Record, error) {
		if p.blob == "" {
			if err := p.StoreBlob(ctx, s); err != nil {
				return nil, err
			}
		}
		created = in.newSample(p)
		return created, nil
	})
	if err != nil {
		return nil, false, wrapStoring(name, err)
	}
	if isNew {
		return created, true, nil
	}
	var smp records.Sample
	err = s.Update(ctx, id, &smp, func(exists bool) error {
		if !exists {
			return fmt.Errorf("%s: %w", id, state.ErrNotFound)
		}
		newName := !slices.Contains(smp.Names, baseName(name))
		newDrop := in.DroppedBy != nil && !slices.Contains(smp.DroppedBy, *in.DroppedBy)
		if !newName && !newDrop {
			return state.ErrNoChange
		}
		if newName {
			smp.Names = append(smp.Names, baseName(name))
		}
		if newDrop {
			smp.DroppedBy = append(smp.DroppedBy, *in.DroppedBy)
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("%s: updating sample %s: %w", name, id, err)
	}
	if smp.ID == "" {
		return nil, false, fmt.Errorf("%s: sample %s vanished", name, id)
	}
	return &smp, false, nil
}

// BySHA256 returns the stored sample with that digest.
func (in *Ingester) BySHA256(sha string) (*records.Sample, error) {
	id, err := in.Store.Lookup(IndexSHA256, sha)
	if err != nil {
		return nil, err
	}
	var smp records.Sample
	if err := in.Store.Get(id, &smp); err != nil {
		return nil, err
	}
	return &smp, nil
}

func baseName(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}

// unwrapPathErr drops the *PathError wrapper: callers already name the path.
func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Data is the content kept in memory (nil for a large file read from disk);
// callers may reuse its array once the Prepared is saved or its blob stored.
func (p *Prepared) Data() []byte { return p.data }
