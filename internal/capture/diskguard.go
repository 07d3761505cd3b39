package capture

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"golang.org/x/sys/unix"
)

func (d *Daemon) threshold() diskspace.Threshold {
	return diskspace.Threshold{Bytes: d.rec.MinFree, Percent: d.rec.MinFreePercent}
}

// checkSpace reads the file systems now and returns a *LowError when one
// is low; d.mu is held (or the capture is not running yet). The state's
// must keep room for the open file's copy into the blob store.
func (d *Daemon) checkSpace() error {
	for i, g := range d.guards {
		if _, err := g.Check(d.reserve(i)); d.lowSpace(err) {
			return err
		}
	}
	return nil
}

// wroteLocked accounts n bytes written to the open file.
func (d *Daemon) wroteLocked(n int64) error {
	for i, g := range d.guards {
		if err := g.Wrote(n, d.reserve(i)); d.lowSpace(err) {
			return err
		}
	}
	return nil
}

// lowSpace reports whether err is low space; a file system that cannot be
// read (statfs failing) does not stop the capture, the writes would tell.
func (d *Daemon) lowSpace(err error) bool {
	if err != nil && !errors.Is(err, diskspace.ErrLow) {
		d.Log.Warn("capture: reading free space", "capture", d.ID, "err", err)
	}
	return errors.Is(err, diskspace.ErrLow)
}

// reserve is what guard i must keep room for besides its threshold: the
// buffer, which is not on disk yet, and, on the state's file system (guard
// 0), the copies into the blob store of the open file and of the closed
// files still waiting for registration. From a spool on another file system
// (guard 1 is then the spool's) those copies all land on the state's; from
// a spool on the state's, files are copied one at a time and each removed
// after its copy, so the largest is what the copies take at once.
func (d *Daemon) reserve(i int) int64 {
	if d.w == nil {
		return 0
	}
	if i > 0 {
		return d.w.Buffered()
	}
	copies := d.w.Size()
	if len(d.guards) > 1 {
		copies += d.queuedBytes
	} else {
		for _, cf := range d.queue {
			copies = max(copies, cf.file.Size)
		}
	}
	return copies + d.w.Buffered()
}

// spaceGuards returns the free-space guards of a capture: the state's file
// system first, then the spool's if it is another.
func spaceGuards(st *state.Store, spool string, min diskspace.Threshold) ([]*diskspace.Guard, error) {
	if min.Zero() {
		return nil, nil
	}
	gs := []*diskspace.Guard{{Path: st.Root(), Min: min}}
	sp := existingDir(spool)
	var a, b unix.Stat_t
	if err := unix.Stat(st.Root(), &a); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", st.Root(), err)
	}
	if err := unix.Stat(sp, &b); err != nil {
		return nil, fmt.Errorf("spool %s: %w", sp, err)
	}
	if a.Dev != b.Dev {
		gs = append(gs, &diskspace.Guard{Path: sp, Min: min})
	}
	return gs, nil
}

// existingDir is dir or its nearest existing parent.
func existingDir(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil || dir == filepath.Dir(dir) {
			return dir
		}
		dir = filepath.Dir(dir)
	}
}

// roomFor checks that the state's file system takes a copy of file p.
func (d *Daemon) roomFor(p string) error {
	if len(d.guards) == 0 {
		return nil
	}
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err = d.guards[0].Check(fi.Size()); d.lowSpace(err) {
		return err
	}
	return nil
}
