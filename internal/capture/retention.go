package capture

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Retention is how much of a lease's pcaps and flow logs is kept: a bot
// observed for a week must not fill the disk.
type Retention struct {
	// KeepDays prunes what is older than this many days (0: no bound).
	KeepDays float64
	// KeepBytes prunes the oldest until the rest fits (0: no bound).
	KeepBytes int64
}

// Zero reports whether the retention keeps everything.
func (r Retention) Zero() bool { return r.KeepDays <= 0 && r.KeepBytes <= 0 }

func (r Retention) check() error {
	if r.KeepDays < 0 || r.KeepBytes < 0 {
		return &InputError{errors.New("--keep-days and --keep-bytes cannot be negative")}
	}
	return nil
}

// Artifact types that retention prunes.
const (
	TypePcap    = "pcap"
	TypeFlowLog = "flow-log"
)

// PruneRequest is "tb-capture prune": the artifacts of a lease (or, for a
// capture without one, of a capture) beyond the retention.
type PruneRequest struct {
	Lease   string
	Capture string
	Retention
	DryRun bool
}

// PruneResult is what a prune did (or, dry, would do).
type PruneResult struct {
	// Pruned are the artifacts pruned by this run, as stored after it
	// (unchanged when dry), oldest first.
	Pruned []records.Artifact
	// Deleted counts the blobs (and spool files) deleted, Freed their bytes;
	// they include deletions an earlier run was cut short before.
	Deleted int
	Freed   int64
	// Kept counts the artifacts left, KeptBytes their distinct content.
	Kept      int
	KeptBytes int64
}

// Prune applies a retention to one lease's pcaps and flow logs. Each
// artifact is dated by its last packet (a flow log without one by its
// capture's); the oldest go first, and an artifact goes when it is older
// than KeepDays or when it and everything newer no longer fit KeepBytes
// (content shared by several artifacts counts once).
//
// A pruned artifact keeps its record, with pruned_at set, and loses its
// content: the record is updated first and the blob deleted after, and
// only once no artifact that is not pruned refers to it, so a crash in
// between leaves a pruned record and a blob that the next run deletes,
// never a record that points at nothing without saying so.
func Prune(ctx context.Context, st *state.Store, log *slog.Logger, req PruneRequest) (*PruneResult, error) {
	scope := cmp.Or(req.Lease, req.Capture)
	if scope == "" {
		return nil, &InputError{errors.New("give --lease or --capture")}
	}
	if err := req.Retention.check(); err != nil {
		return nil, err
	}
	if req.Retention.Zero() {
		return nil, &InputError{errors.New("no retention: give --keep-days or --keep-bytes")}
	}
	unlock, err := st.Lock(ctx, "capture/prune/"+scope)
	if err != nil {
		return nil, err
	}
	defer unlock()
	inScope := func(a *records.Artifact) bool {
		if req.Lease != "" {
			return a.Lease == req.Lease
		}
		return a.Capture == req.Capture
	}

	p := &pruner{st: st, log: log, seen: map[string]bool{}, refs: map[string]map[string]bool{}}
	ids, err := st.List(records.KindArtifact)
	if err != nil {
		return nil, err
	}
	dated := map[string]time.Time{} // every artifact's last packet, for flow logs' sources
	var mine []*records.Artifact
	for _, id := range ids {
		a, ok := p.load(id)
		if !ok {
			continue
		}
		if a.LastTS != nil {
			dated[id] = *a.LastTS
		}
		if inScope(a) && (a.Type == TypePcap || a.Type == TypeFlowLog) {
			mine = append(mine, a)
		}
	}
	when := func(a *records.Artifact) time.Time {
		switch {
		case a.LastTS != nil:
			return *a.LastTS
		case a.FirstTS != nil:
			return *a.FirstTS
		}
		if t, ok := dated[a.Source]; ok {
			return t
		}
		return a.CreatedAt
	}
	// A flow log dated by its capture sorts after it, so that a pcap goes
	// before the flow log made from it.
	rank := func(a *records.Artifact) int {
		if a.Type == TypeFlowLog {
			return 1
		}
		return 0
	}
	slices.SortFunc(mine, func(a, b *records.Artifact) int {
		return cmp.Or(when(a).Compare(when(b)), rank(a)-rank(b), strings.Compare(a.ID, b.ID))
	})

	// Newest first: keep while the bounds hold, then prune the rest.
	now := st.Now()
	cutoff := now.Add(-time.Duration(req.KeepDays * float64(24*time.Hour)))
	res := &PruneResult{}
	var prune []*records.Artifact
	counted := map[string]bool{}
	full := false
	for i := len(mine) - 1; i >= 0; i-- {
		a := mine[i]
		if a.PrunedAt != nil {
			continue
		}
		size := a.Size
		if counted[a.URI] {
			size = 0
		}
		old := req.KeepDays > 0 && when(a).Before(cutoff)
		if !old && !full && req.KeepBytes > 0 && res.KeptBytes+size > req.KeepBytes {
			full = true
		}
		if old || full {
			prune = append(prune, a)
			continue
		}
		counted[a.URI] = true
		res.Kept++
		res.KeptBytes += size
	}
	slices.Reverse(prune)

	if req.DryRun {
		for _, a := range prune {
			res.Pruned = append(res.Pruned, *a)
		}
		return res, nil
	}
	// Deletions an earlier run did not finish, then this run's.
	for _, a := range mine {
		if a.PrunedAt != nil {
			if err := p.release(ctx, a, res); err != nil {
				return res, err
			}
		}
	}
	for _, a := range prune {
		var u records.Artifact
		err := st.Update(ctx, a.ID, &u, func(bool) error {
			if u.PrunedAt != nil {
				return state.ErrNoChange
			}
			u.PrunedAt = &now
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("pruning %s: %w", a.ID, err)
		}
		if sha, ok := state.BlobOf(u.URI); ok {
			delete(p.refs[sha], u.ID)
		}
		res.Pruned = append(res.Pruned, u)
		if err := p.release(ctx, &u, res); err != nil {
			return res, err
		}
	}
	if len(res.Pruned) > 0 || res.Deleted > 0 {
		log.Info("capture retention", "scope", scope, "pruned", len(res.Pruned), "deleted", res.Deleted,
			"freed_bytes", res.Freed, "kept", res.Kept, "kept_bytes", res.KeptBytes)
	}
	return res, nil
}

// pruner knows which artifacts that are not pruned refer to each blob.
type pruner struct {
	st   *state.Store
	log  *slog.Logger
	seen map[string]bool
	refs map[string]map[string]bool // sha256 -> IDs of unpruned artifacts
}

func (p *pruner) load(id string) (*records.Artifact, bool) {
	p.seen[id] = true
	var a records.Artifact
	if err := p.st.Get(id, &a); err != nil {
		p.log.Warn("capture retention: skipping an unreadable artifact", "artifact", id, "err", err)
		return nil, false
	}
	if sha, ok := state.BlobOf(a.URI); ok && a.PrunedAt == nil {
		if p.refs[sha] == nil {
			p.refs[sha] = map[string]bool{}
		}
		p.refs[sha][id] = true
	}
	return &a, true
}

// release deletes the content of a pruned artifact unless another artifact
// still needs it. Under the blob's lock, artifacts created since the
// listing are read too: a writer registering the same content holds that
// lock from storing the blob to creating its record.
func (p *pruner) release(ctx context.Context, a *records.Artifact, res *PruneResult) error {
	sha, ok := state.BlobOf(a.URI)
	if !ok {
		return p.removeSpoolFile(a, res)
	}
	if !p.st.HasBlob(sha) {
		return nil
	}
	unlock, err := p.st.LockBlob(ctx, sha)
	if err != nil {
		return err
	}
	defer unlock()
	ids, err := p.st.List(records.KindArtifact)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if !p.seen[id] {
			p.load(id)
		}
	}
	if len(p.refs[sha]) > 0 {
		return nil
	}
	fi, err := os.Stat(p.st.BlobPath(sha))
	if err != nil {
		return nil // deleted meanwhile by another prune
	}
	if err := p.st.DeleteBlob(sha); err != nil {
		return err
	}
	res.Deleted++
	res.Freed += fi.Size()
	return nil
}

// removeSpoolFile deletes a pcap that could not be stored as a blob (the
// state's disk was full) and stayed in the capture's spool.
func (p *pruner) removeSpoolFile(a *records.Artifact, res *PruneResult) error {
	path, ok := strings.CutPrefix(a.URI, "file://")
	if !ok || a.Type != TypePcap || !strings.HasPrefix(filepath.Base(path), "capture-") || filepath.Ext(path) != ".pcap" {
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("pruning %s: %w", a.ID, err)
	}
	res.Deleted++
	res.Freed += fi.Size()
	return nil
}

// startRetention starts the goroutine that prunes the lease's pcaps and
// flow logs after each rotation (and once now, which also finishes what a
// crash interrupted), off the packet path.
func (d *Daemon) startRetention(ctx context.Context) {
	ret := Retention{KeepDays: d.rec.KeepDays, KeepBytes: d.rec.KeepBytes}
	if ret.Zero() {
		return
	}
	req := PruneRequest{Lease: d.rec.Lease, Retention: ret}
	if req.Lease == "" {
		req.Capture = d.ID
	}
	d.prune = make(chan struct{}, 1)
	d.prune <- struct{}{}
	d.pruneWG.Add(1)
	go func() {
		defer d.pruneWG.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-d.prune:
			}
			if _, err := Prune(ctx, d.St, d.Log, req); err != nil && ctx.Err() == nil {
				d.Log.Error("capture retention", "capture", d.ID, "err", err)
			}
		}
	}()
}

// kickPrune asks for a retention pass without waiting for it.
func (d *Daemon) kickPrune() {
	if d.prune == nil {
		return
	}
	select {
	case d.prune <- struct{}{}:
	default: // one is already pending
	}
}
