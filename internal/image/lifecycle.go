package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/files"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// The active image of a spec is the one whose record says "active". Every
// status change is one atomic record write; a change that touches two
// records (publish, rollback) first makes the new image active and then
// demotes the old one, so a crash in between leaves two active images, of
// which the newest counts (Active) and gc repairs the other.

// publish moves a smoke-tested build into images/<spec>/<version>/ and
// creates its image record — with the userland ABI a dynamic sample must
// match and the user-mode emulators the guest registers (read from the
// rootfs before the disk phase removed it) — making it active unless the
// active image is pinned. The caller holds the spec's lock.
func publish(ctx context.Context, st *state.Store, spec *Spec, ver Version, b *records.ImageBuildRun, out string,
	m *Manifest, key Key, smoke *records.SmokeResult, emus []string) (*records.SandboxImage, error) {
	final := filepath.Join(imagesDir(st), spec.ID, ver.String())
	if err := mkdirReachable(st, filepath.Dir(final)); err != nil {
		return nil, err
	}
	if _, err := os.Stat(final); err == nil {
		// A leftover of a build killed between rename and record: no
		// record refers to it, so it is garbage.
		if err := removeTree(final); err != nil {
			return nil, err
		}
	}
	if err := os.Rename(out, final); err != nil {
		return nil, fmt.Errorf("publishing: %w", err)
	}
	img := &records.SandboxImage{
		Spec: spec.ID, SpecVersion: spec.Version, Version: ver.String(), BuildNumber: ver.Build,
		Platform: spec.Arch, ABI: ABI(spec.Arch), UserEmulators: emus, OS: spec.OS.Distribution, Release: spec.OS.Release, Status: records.ImageStable,
		Dir: final, Manifest: ManifestFile, KeyID: key.ID(), Boot: m.Boot, Build: b.ID, BootToAgent: smoke.BootToAgent,
	}
	for _, f := range m.Files {
		img.Files = append(img.Files, f)
		img.SizeBytes += f.Size
	}
	for _, n := range [][2]string{{ManifestFile, "manifest"}, {SignatureFile, "signature"}} {
		sum, size, err := files.SHA256(filepath.Join(final, n[0]))
		if err != nil {
			return nil, err
		}
		img.Files = append(img.Files, records.ImageFile{Name: n[0], Role: n[1], SHA256: sum, Size: size})
		img.SizeBytes += size
		if n[0] == ManifestFile {
			img.ManifestSHA256 = sum
		}
	}
	records.Init(img, records.KindImage, st.Now())
	img.PublishedAt = img.CreatedAt
	if err := st.Create(ctx, img); err != nil {
		return nil, err
	}
	cur, err := Active(st, spec.ID)
	if err != nil && !errors.Is(err, state.ErrNotFound) {
		return nil, err
	}
	if cur != nil && cur.Pinned {
		return img, nil
	}
	if err := setStatus(ctx, st, img.ID, records.ImageActive); err != nil {
		return nil, err
	}
	img.Status = records.ImageActive
	if cur != nil {
		if err := setStatus(ctx, st, cur.ID, records.ImageStable); err != nil {
			return nil, err
		}
	}
	return img, nil
}

func setStatus(ctx context.Context, st *state.Store, id, status string) error {
	var img records.SandboxImage
	err := st.Update(ctx, id, &img, func(exists bool) error {
		if !exists {
			return fmt.Errorf("%s: %w", id, state.ErrNotFound)
		}
		if img.Status == status {
			return state.ErrNoChange
		}
		img.Status = status
		return nil
	})
	if errors.Is(err, state.ErrNoChange) {
		return nil
	}
	return err
}

// Images lists the image records, optionally of one spec, oldest version
// first.
func Images(st *state.Store, spec string) ([]*records.SandboxImage, error) {
	out, err := state.Find(st, records.KindImage, func(img *records.SandboxImage) bool { return spec == "" || img.Spec == spec })
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Spec != out[j].Spec {
			return out[i].Spec < out[j].Spec
		}
		a, _ := ParseVersion(out[i].Version)
		b, _ := ParseVersion(out[j].Version)
		return a.Less(b)
	})
	return out, nil
}

// Active returns the active image of a spec (the newest, should a crash
// have left two).
func Active(st *state.Store, spec string) (*records.SandboxImage, error) {
	imgs, err := Images(st, spec)
	if err != nil {
		return nil, err
	}
	for i := len(imgs) - 1; i >= 0; i-- {
		if imgs[i].Status == records.ImageActive {
			return imgs[i], nil
		}
	}
	return nil, fmt.Errorf("spec %s has no active image: %w", spec, state.ErrNotFound)
}

// Resolve finds an image by record ID, "SPEC" (its active image) or
// "SPEC@VERSION".
func Resolve(st *state.Store, ref string) (*records.SandboxImage, error) {
	if records.KindOf(ref) == records.KindImage {
		var img records.SandboxImage
		if err := st.Get(ref, &img); err != nil {
			return nil, fault.Usage(fmt.Errorf("image %s: %w", ref, err))
		}
		return &img, nil
	}
	spec, ver, hasVer := strings.Cut(ref, "@")
	if !hasVer {
		img, err := Active(st, spec)
		if err != nil {
			return nil, fault.Usage(fmt.Errorf("%s: not an image ID, and %w", ref, err))
		}
		return img, nil
	}
	imgs, err := Images(st, spec)
	if err != nil {
		return nil, err
	}
	for _, img := range imgs {
		if img.Version == ver {
			return img, nil
		}
	}
	return nil, fault.Usage(fmt.Errorf("no image %s version %s (see tb-build list)", spec, ver))
}

// Lifecycle runs the commands that change published images.
type Lifecycle struct {
	St  *state.Store
	Out cmdout.Sink
}

func (l *Lifecycle) locked(ctx context.Context, spec string, fn func() error) error {
	unlock, err := l.St.Lock(ctx, specLock(spec))
	if err != nil {
		return err
	}
	defer unlock()
	return fn()
}

func (l *Lifecycle) print(ids ...string) error {
	w := records.NewWriter(l.Out.Stdout)
	for _, id := range ids {
		var img records.SandboxImage
		if err := l.St.Get(id, &img); err != nil {
			return err
		}
		if err := w.Write(&img); err != nil {
			return err
		}
	}
	return w.Flush()
}

// Verify checks an image's signature and every file's checksum, naming each
// file that does not match (exit 65).
func (l *Lifecycle) Verify(ref string) error {
	img, err := Resolve(l.St, ref)
	if err != nil {
		return err
	}
	pub, err := LoadPublicKey(l.St.Root())
	if err != nil {
		return fault.Failure(fmt.Errorf("no signing key in this state directory: %w", err))
	}
	m, probs := VerifyDir(img.Dir, pub)
	if m != nil {
		if m.Spec != img.Spec || m.Version != img.Version || m.Build != img.Build {
			probs = append(probs, Problem{ManifestFile, fmt.Sprintf("describes %s %s (build %s), not this image", m.Spec, m.Version, m.Build)})
		}
	}
	for _, f := range img.Files {
		if f.Role == "manifest" {
			if sum, _, err := files.SHA256(filepath.Join(img.Dir, f.Name)); err == nil && sum != img.ManifestSHA256 {
				probs = append(probs, Problem{f.Name, "differs from the manifest recorded when the image was published"})
			}
		}
	}
	if len(probs) > 0 {
		for _, p := range probs {
			l.Out.Warnf("%s: %s", img.ID, p)
		}
		return fault.DataErr(fmt.Errorf("%s (%s %s): %d problem(s); first: %s", img.ID, img.Spec, img.Version, len(probs), probs[0]))
	}
	return records.PrintLine(l.Out.Stdout, records.LineImageVerified, struct {
		ID      string `json:"id"`
		Spec    string `json:"spec"`
		Version string `json:"version"`
		KeyID   string `json:"key_id"`
		Files   int    `json:"files"`
	}{img.ID, img.Spec, img.Version, img.KeyID, len(m.Files) + 2})
}

// Pin protects an image from gc and rm, and an active pinned image from
// being replaced by new builds; unpin undoes it.
func (l *Lifecycle) Pin(ctx context.Context, ref string, pinned bool) error {
	img, err := Resolve(l.St, ref)
	if err != nil {
		return err
	}
	var cur records.SandboxImage
	err = l.St.Update(ctx, img.ID, &cur, func(bool) error {
		if cur.Pinned == pinned {
			return state.ErrNoChange
		}
		cur.Pinned = pinned
		return nil
	})
	if err != nil && !errors.Is(err, state.ErrNoChange) {
		return err
	}
	return l.print(img.ID)
}

// Supersede retires an image; if it was active, the newest stable image of
// its spec becomes active.
func (l *Lifecycle) Supersede(ctx context.Context, ref string) error {
	img, err := Resolve(l.St, ref)
	if err != nil {
		return err
	}
	var changed []string
	err = l.locked(ctx, img.Spec, func() error {
		if img.Status == records.ImageActive {
			if next := newestStable(l.St, img); next != nil {
				if err := setStatus(ctx, l.St, next.ID, records.ImageActive); err != nil {
					return err
				}
				changed = append(changed, next.ID)
			}
		}
		changed = append(changed, img.ID)
		return setStatus(ctx, l.St, img.ID, records.ImageSuperseded)
	})
	if err != nil {
		return err
	}
	return l.print(changed...)
}

func newestStable(st *state.Store, than *records.SandboxImage) *records.SandboxImage {
	imgs, _ := Images(st, than.Spec)
	for i := len(imgs) - 1; i >= 0; i-- {
		if imgs[i].ID != than.ID && imgs[i].Status == records.ImageStable {
			return imgs[i]
		}
	}
	return nil
}

// Rollback makes the previous stable image of a spec active again and
// supersedes the one that was active.
func (l *Lifecycle) Rollback(ctx context.Context, spec string) error {
	var changed []string
	err := l.locked(ctx, spec, func() error {
		cur, err := Active(l.St, spec)
		if err != nil {
			return fault.Failure(err)
		}
		imgs, err := Images(l.St, spec)
		if err != nil {
			return err
		}
		cv, _ := ParseVersion(cur.Version)
		var prev *records.SandboxImage
		for _, img := range imgs {
			v, _ := ParseVersion(img.Version)
			if img.Status == records.ImageStable && v.Less(cv) {
				prev = img
			}
		}
		if prev == nil {
			return fault.Failure(fmt.Errorf("%s: no stable image older than the active %s to roll back to", spec, cur.Version))
		}
		if err := setStatus(ctx, l.St, prev.ID, records.ImageActive); err != nil {
			return err
		}
		changed = []string{prev.ID, cur.ID}
		return setStatus(ctx, l.St, cur.ID, records.ImageSuperseded)
	})
	if err != nil {
		return err
	}
	return l.print(changed...)
}

// Rm removes an image's files and record. The active image and pinned
// images are refused unless force is set.
func (l *Lifecycle) Rm(ctx context.Context, ref string, force bool) error {
	img, err := Resolve(l.St, ref)
	if err != nil {
		return err
	}
	return l.locked(ctx, img.Spec, func() error {
		var cur records.SandboxImage
		if err := l.St.Get(img.ID, &cur); err != nil {
			return err
		}
		if !force && cur.Pinned {
			return fault.Failure(fmt.Errorf("%s is pinned (unpin it, or use --force)", img.ID))
		}
		if !force && cur.Status == records.ImageActive {
			return fault.Failure(fmt.Errorf("%s is the active image of %s (rollback or supersede it first, or use --force)", img.ID, img.Spec))
		}
		if err := l.remove(ctx, &cur); err != nil {
			return err
		}
		return records.PrintLine(l.Out.Stdout, records.LineImageRemoved, struct {
			ID      string `json:"id"`
			Spec    string `json:"spec"`
			Version string `json:"version"`
		}{cur.ID, cur.Spec, cur.Version})
	})
}

// remove deletes the record first: files without a record are garbage gc
// collects, while a record without files would be a broken image.
func (l *Lifecycle) remove(ctx context.Context, img *records.SandboxImage) error {
	if err := l.St.Delete(ctx, img.ID); err != nil {
		return err
	}
	return removeTree(img.Dir)
}

// GC removes build leftovers of specs no build is running for, marks dead
// builds interrupted, deletes superseded unpinned images, removes image
// directories no record refers to, and repairs a spec left with two
// active images.
func (l *Lifecycle) GC(ctx context.Context) error {
	st := l.St
	specs := map[string]bool{}
	dirs, _ := filepath.Glob(filepath.Join(tmpDir(st), "*.build_*"))
	for _, d := range dirs {
		specs[strings.SplitN(filepath.Base(d), ".build_", 2)[0]] = true
	}
	builds, err := listBuilds(st)
	if err != nil {
		return err
	}
	for _, b := range builds {
		if b.Status == records.BuildRunning {
			specs[b.Spec] = true
		}
	}
	imgs, err := Images(st, "")
	if err != nil {
		return err
	}
	for _, img := range imgs {
		specs[img.Spec] = true
	}
	entries, _ := os.ReadDir(imagesDir(st))
	for _, e := range entries {
		if e.IsDir() && e.Name() != ".tmp" {
			specs[e.Name()] = true
		}
	}
	var names []string
	for s := range specs {
		names = append(names, s)
	}
	sort.Strings(names)
	removed := 0
	for _, spec := range names {
		unlock, ok, err := st.TryLock(ctx, specLock(spec))
		if err != nil {
			return err
		}
		if !ok {
			l.Out.Log.Info("skipping a spec whose build is running", "spec", spec)
			continue
		}
		n, err := l.gcSpec(ctx, spec)
		unlock()
		if err != nil {
			return err
		}
		removed += n
	}
	return records.PrintLine(l.Out.Stdout, records.LineGCSummary, struct {
		Removed int `json:"removed"`
	}{removed})
}

func (l *Lifecycle) gcSpec(ctx context.Context, spec string) (int, error) {
	st := l.St
	n := 0
	before, _ := filepath.Glob(filepath.Join(tmpDir(st), spec+".build_*"))
	if err := cleanupSpec(ctx, l.Out.Log, st, spec); err != nil {
		return n, err
	}
	n += len(before)
	imgs, err := Images(st, spec)
	if err != nil {
		return n, err
	}
	known := map[string]bool{}
	var active []*records.SandboxImage
	for _, img := range imgs {
		if img.Status == records.ImageSuperseded && !img.Pinned {
			l.Out.Log.Info("removing superseded image", "image", img.ID, "version", img.Version)
			if err := l.remove(ctx, img); err != nil {
				return n, err
			}
			n++
			continue
		}
		known[img.Dir] = true
		if img.Status == records.ImageActive {
			active = append(active, img)
		}
	}
	for i := 0; i+1 < len(active); i++ {
		if err := setStatus(ctx, st, active[i].ID, records.ImageStable); err != nil {
			return n, err
		}
		n++
	}
	vdirs, _ := filepath.Glob(filepath.Join(imagesDir(st), spec, "*"))
	for _, d := range vdirs {
		if !known[d] {
			l.Out.Log.Info("removing an image directory no record refers to", "dir", d)
			if err := removeTree(d); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// SmokeAgain boots a published image on a throw-away overlay and runs its
// spec's smoke test again, printing the result as one JSON line. It
// changes no record; it is how boot times are measured.
func (l *Lifecycle) SmokeAgain(ctx context.Context, ref, uri, accel, specsDir string) error {
	img, err := Resolve(l.St, ref)
	if err != nil {
		return err
	}
	ss, err := LoadSpecs(specsDir)
	if err != nil {
		return err
	}
	spec, err := ss.Get(img.Spec)
	if err != nil {
		return err
	}
	hv, err := virt.Connect(uri)
	if err != nil {
		return err
	}
	defer hv.Close()
	work, err := os.MkdirTemp(tmpDir(l.St), "smoke.")
	if err != nil {
		return err
	}
	defer removeTree(work)
	if err := mkdirReachable(l.St, work); err != nil {
		return err
	}
	b := &build{out: l.Out, st: l.St, spec: spec, accel: accel}
	a, err := b.chooseAccel(ctx, filepath.Join(img.Dir, KernelFile), io.Discard)
	if err != nil {
		return err
	}
	sm := &Smoke{H: hv, Accel: a, Spec: spec, Dir: img.Dir, Work: work, Boot: img.Boot, Log: io.Discard,
		Name: "tb-smoke-" + strings.ToLower(filepath.Base(work))}
	res, err := sm.Run(ctx)
	if res != nil {
		if perr := records.PrintLine(l.Out.Stdout, records.LineImageSmoke, struct {
			ID string `json:"id"`
			*records.SmokeResult
		}{img.ID, res}); err == nil {
			err = perr
		}
	}
	return err
}
