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

	"github.com/talkbox-sandbox/talkbox/internal/cli"
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
}

// Prepared is a file read, digested and triaged, ready to be stored.
type Prepared struct {
	Path    string
	Digests triage.Digests
	Triage  records.Triage
	data    []byte   // the content when it was small enough to keep
	file    *os.File // otherwise the open file, re-read when stored
}

// Close releases what a Prepared holds; Store calls it.
func (p *Prepared) Close() {
	if p.file != nil {
		p.file.Close()
	}
}

func (p *Prepared) content() (io.Reader, error) {
	if p.file == nil {
		return bytes.NewReader(p.data), nil
	}
	_, err := p.file.Seek(0, io.SeekStart)
	return p.file, err
}

// Prepare reads, digests and triages the file at path: the CPU-heavy part of
// ingesting, safe to run on many files at once. buf is reused for the
// content when it fits (nil: allocate).
func Prepare(path string, buf []byte) (*Prepared, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, cli.Failure(fmt.Errorf("%s: %w", path, unwrapPathErr(err)))
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, cli.Failure(fmt.Errorf("%s: %w", path, unwrapPathErr(err)))
	}
	switch {
	case !st.Mode().IsRegular():
		f.Close()
		return nil, cli.Failure(fmt.Errorf("%s: not a regular file", path))
	case st.Size() == 0:
		f.Close()
		return nil, cli.DataErr(fmt.Errorf("%s: empty file", path))
	}
	p := &Prepared{Path: path}
	if st.Size() <= inMemoryLimit {
		data, err := readAll(f, st.Size(), buf)
		f.Close()
		if err != nil {
			return nil, cli.Failure(fmt.Errorf("%s: %w", path, unwrapPathErr(err)))
		}
		p.data = data
		p.Digests = triage.DigestBytes(data)
		p.Triage = triage.Inspect(bytes.NewReader(data), int64(len(data)))
		return p, nil
	}
	if p.Digests, err = triage.Digest(f); err != nil {
		f.Close()
		return nil, cli.Failure(fmt.Errorf("%s: %w", path, unwrapPathErr(err)))
	}
	p.Triage = triage.Inspect(f, st.Size())
	p.file = f
	return p, nil
}

// Save writes a prepared file: blob, sample record, sha256 index.
func (in *Ingester) Save(ctx context.Context, p *Prepared) (*records.Sample, bool, error) {
	defer p.Close()
	return in.store(ctx, p.Path, p.Digests, p.Triage, p.content)
}

func readAll(f *os.File, size int64, buf []byte) ([]byte, error) {
	if int64(cap(buf)) < size+1 {
		buf = make([]byte, size+1)
	}
	buf = buf[:size+1]
	n, err := io.ReadFull(f, buf)
	if err != io.ErrUnexpectedEOF && err != nil {
		return nil, err
	}
	if int64(n) != size {
		return nil, fmt.Errorf("file changed size while being read (%d bytes, expected %d)", n, size)
	}
	return buf[:n], nil
}

// store claims the sha256, creating blob and record for new content, or
// adding the name to the existing record.
func (in *Ingester) store(ctx context.Context, name string, dig triage.Digests, tri records.Triage, content func() (io.Reader, error)) (*records.Sample, bool, error) {
	s := in.Store
	var created *records.Sample
	id, isNew, err := s.Claim(ctx, IndexSHA256, dig.SHA256, func() (string, error) {
		r, err := content()
		if err != nil {
			return "", err
		}
		blob, err := s.PutBlobKnown(ctx, dig.SHA256, r)
		if err != nil {
			return "", err
		}
		now := s.Now()
		smp := &records.Sample{
			SHA256: dig.SHA256, SHA1: dig.SHA1, MD5: dig.MD5, Size: dig.Size, Entropy: dig.Entropy,
			Blob: blob.URI(), Triage: tri, Source: name, Names: []string{baseName(name)},
			Priority: in.Priority, SubmittedAt: now,
		}
		records.Init(smp, records.KindSample, now)
		if err := s.Create(ctx, smp); err != nil {
			return "", err
		}
		created = smp
		return smp.ID, nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("%s: storing sample: %w", name, err)
	}
	if isNew {
		return created, true, nil
	}
	var smp records.Sample
	err = s.Update(ctx, id, &smp, func(exists bool) error {
		if !exists {
			return fmt.Errorf("%s: %w", id, state.ErrNotFound)
		}
		if slices.Contains(smp.Names, baseName(name)) {
			return state.ErrNoChange
		}
		smp.Names = append(smp.Names, baseName(name))
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
// callers may reuse its array once the Prepared is saved.
func (p *Prepared) Data() []byte { return p.data }
