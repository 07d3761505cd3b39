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

// The cycle's drop budget: what it copies out of the guest as dropped
// files. The paths come from the trace, which the sample can forge, so the
// budget, not the trace, bounds the work and the bytes.
const (
	maxDroppedFiles = 16        // paths looked at (the first of the trace's)
	maxDroppedSize  = 64 << 20  // bytes of one file
	maxDroppedTotal = 128 << 20 // bytes of all the cycle's files
)

// ArtifactDropsSkipped lists the dropped files a cycle did not copy out
// and why, one per line; its metadata "skipped" holds the same lines for
// the analysis's reasons.
const ArtifactDropsSkipped = "drops-skipped"

// drops copies the files the cycle's behaviour trace says the sample
// dropped (written and left) out of the guest and has them planned as new
// samples whose lineage names the cycle. On the host a file is named by
// its index only, never by its guest name. A file that cannot be copied
// (gone, not a regular file, larger than the budget left) is a warning —
// an artifact the analysis reports — never a failed cycle: a sample must
// not hide its analysis behind a file name.
func (r *Runner) drops(ctx context.Context, c *records.Cycle) (samples []string, skippedArt string, err error) {
	paths, err := r.droppedPaths(c)
	if err != nil || len(paths) == 0 {
		return nil, "", err
	}
	g, err := r.connect(ctx, c)
	if err != nil {
		return nil, "", err
	}
	defer g.Close()
	dir := r.St.Path("tb-run", "drops", c.ID)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(dir)
	var files []DroppedFile
	var skipped []string
	left := int64(maxDroppedTotal)
	for i, p := range paths {
		if i == maxDroppedFiles {
			skipped = append(skipped, fmt.Sprintf("%d more dropped files not looked at: the cycle copies at most %d", len(paths)-i, maxDroppedFiles))
			break
		}
		host := filepath.Join(dir, strconv.Itoa(i))
		n, why, err := copyOut(ctx, g, p, host, min(maxDroppedSize, left))
		if err != nil {
			return nil, "", err
		}
		if why != "" {
			skipped = append(skipped, strconv.Quote(p)+": "+why)
			continue
		}
		left -= n
		files = append(files, DroppedFile{GuestPath: p, HostPath: host})
	}
	if len(skipped) > 0 {
		r.Log.Warn("dropped files not copied out", "cycle", c.ID, "skipped", skipped)
		if skippedArt, err = r.storeSkipped(ctx, c, skipped); err != nil {
			return nil, "", err
		}
	}
	if len(files) == 0 {
		return nil, skippedArt, nil
	}
	ids, err := r.Post.PlanDropped(ctx, c.ID, files)
	// Files of the same content are one sample.
	for _, id := range ids {
		if !slices.Contains(samples, id) {
			samples = append(samples, id)
		}
	}
	return samples, skippedArt, err
}

// storeSkipped stores the list of files not copied out as an artifact of
// the cycle.
func (r *Runner) storeSkipped(ctx context.Context, c *records.Cycle, skipped []string) (string, error) {
	b, err := r.St.PutBlob(ctx, strings.NewReader(strings.Join(skipped, "\n")+"\n"))
	if err != nil {
		return "", err
	}
	a := &records.Artifact{Cycle: c.ID, Lease: c.Lease, Type: ArtifactDropsSkipped, URI: b.URI(), SHA256: b.SHA256, Size: b.Size,
		ContentType: "text/plain", ParserStatus: "none", Metadata: map[string]any{"skipped": skipped}}
	records.Init(a, records.KindArtifact, r.St.Now())
	return a.ID, r.St.Create(ctx, a)
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

// copyOut copies a guest file to host, at most limit bytes. why says why
// it was not (the file is left in the guest); err is the host's own
// failure or the agent's.
func copyOut(ctx context.Context, g Guest, guest, host string, limit int64) (n int64, why string, err error) {
	// Only a regular file: reading a FIFO or a device would stall the
	// agent or never end.
	res, err := g.Run(ctx, "/usr/bin/test", "-f", guest)
	if err != nil {
		return 0, "", fmt.Errorf("looking at dropped file %q: %w", guest, err)
	}
	if res.ExitCode != 0 {
		return 0, "gone, or not a regular file", nil
	}
	f, err := os.Create(host)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	for {
		b, err := g.ReadFileAt(ctx, guest, n, 4<<20)
		if err != nil {
			return 0, "reading it: " + err.Error(), nil
		}
		if len(b) == 0 {
			return n, "", f.Close()
		}
		if n += int64(len(b)); n > limit {
			return 0, fmt.Sprintf("larger than the %d bytes left of the cycle's drop budget", limit), nil
		}
		if _, err := f.Write(b); err != nil {
			return 0, "", err
		}
	}
}
