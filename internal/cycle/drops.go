package cycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Bounds of what a cycle copies out of the guest as dropped files.
const (
	maxDroppedFiles = 16
	maxDroppedSize  = 64 << 20
)

// drops copies the files the cycle's behaviour trace says the sample
// dropped (written and left) out of the guest and has them planned as new
// samples whose lineage names the cycle. A file gone from the guest by now
// is skipped; at most maxDroppedFiles, each up to maxDroppedSize (a larger
// one is left, and logged).
func (r *Runner) drops(ctx context.Context, c *records.Cycle) ([]string, error) {
	paths, err := r.droppedPaths(c)
	if err != nil || len(paths) == 0 {
		return nil, err
	}
	g, err := r.connect(ctx, c)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	dir := r.St.Path("tb-run", "drops", c.ID)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var files []DroppedFile
	for i, p := range paths {
		if i == maxDroppedFiles {
			r.Log.Warn("more dropped files than are copied out", "cycle", c.ID, "files", len(paths), "copied", maxDroppedFiles)
			break
		}
		host := filepath.Join(dir, strconv.Itoa(i)+"-"+filepath.Base(p))
		ok, err := copyOut(ctx, g, p, host)
		if err != nil {
			return nil, err
		}
		if !ok {
			r.Log.Info("dropped file not copied out (gone, or larger than the bound)", "cycle", c.ID, "path", p, "max_bytes", maxDroppedSize)
			continue
		}
		files = append(files, DroppedFile{GuestPath: p, HostPath: host})
	}
	if len(files) == 0 {
		return nil, nil
	}
	ids, err := r.Post.PlanDropped(ctx, c.ID, files)
	// Files of the same content are one sample.
	var out []string
	for _, id := range ids {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out, err
}

// droppedPaths are the absolute paths of the files the cycle's traces say
// were dropped.
func (r *Runner) droppedPaths(c *records.Cycle) ([]string, error) {
	traces, err := state.FindBy(r.St, records.KindObservable, records.KeyCycle, c.ID, func(o *records.Observable) bool { return o.Trace != nil })
	if err != nil {
		return nil, err
	}
	var out []string
	for _, o := range traces {
		for _, p := range o.Trace.Dropped {
			if strings.HasPrefix(p, "/") && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// copyOut copies a guest file to host. False: the file is not there, or
// is larger than maxDroppedSize.
func copyOut(ctx context.Context, g Guest, guest, host string) (bool, error) {
	f, err := os.Create(host)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var off int64
	for {
		b, err := g.ReadFileAt(ctx, guest, off, 4<<20)
		if err != nil {
			if off == 0 {
				return false, nil // gone from the guest
			}
			return false, fmt.Errorf("copying %s out of the guest: %w", guest, err)
		}
		if len(b) == 0 {
			return true, f.Close()
		}
		if off += int64(len(b)); off > maxDroppedSize {
			return false, nil
		}
		if _, err := f.Write(b); err != nil {
			return false, err
		}
	}
}
