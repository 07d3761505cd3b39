package state

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
)

// WithMinFree makes every blob write (PutBlob, PutBlobKnown, PutBlobBytes)
// keep min free on the blob directory's file system, the same guard a
// capture keeps: a write that would go below it fails with exit 75 naming
// the blob, before or while it writes, instead of filling the disk that
// the records of the cycle still need. The zero Threshold checks nothing.
func WithMinFree(min diskspace.Threshold) Option { return func(s *Store) { s.minFree = min } }

// blobGuard is the free-space guard of one blob write (nil without one);
// size is the content's length when known ahead (-1 if not), checked
// before anything is written.
func (s *dirStore) blobGuard(name string, size int64) (*spaceGuard, error) {
	if s.minFree.Zero() {
		return nil, nil
	}
	g := &spaceGuard{g: diskspace.Guard{Path: s.blobRoot, Min: s.minFree}, name: name}
	if _, err := g.g.Check(max(size, 0)); errors.Is(err, diskspace.ErrLow) {
		return nil, g.fail(err)
	}
	return g, nil
}

// spaceGuard counts what a blob write has written.
type spaceGuard struct {
	g    diskspace.Guard
	name string
	n    int64
}

func (g *spaceGuard) fail(err error) error {
	if g.n > 0 {
		return fault.TempFail(fmt.Errorf("blob %s, after %d bytes: %w", g.name, g.n, err))
	}
	return fault.TempFail(fmt.Errorf("blob %s: %w", g.name, err))
}

// wrote accounts n bytes written; its error ends the write. A file system
// that cannot be read (statfs failing) does not stop it: the write would.
func (g *spaceGuard) wrote(n int) error {
	if g == nil {
		return nil
	}
	g.n += int64(n)
	if err := g.g.Wrote(int64(n), 0); errors.Is(err, diskspace.ErrLow) {
		return g.fail(err)
	}
	return nil
}

// guardedWriter checks the guard after each write to w.
type guardedWriter struct {
	w io.Writer
	g *spaceGuard
}

func (gw guardedWriter) Write(p []byte) (int, error) {
	n, err := gw.w.Write(p)
	if err != nil {
		return n, err
	}
	return n, gw.g.wrote(n)
}

// knownSize is r's length when r says it (a file, an in-memory reader),
// else -1.
func knownSize(r io.Reader) int64 {
	switch r := r.(type) {
	case interface{ Len() int }:
		return int64(r.Len())
	case *os.File:
		fi, err := r.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			return -1
		}
		if off, err := r.Seek(0, io.SeekCurrent); err == nil {
			return fi.Size() - off
		}
	}
	return -1
}
