package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/files"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/crashhook"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/version"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// State layout under the state directory (besides records and blobs):
//
//	images/<spec>/<version>/   published image: disk.qcow2, vmlinuz,
//	                           initrd.img, manifest.json, manifest.sig
//	images/.tmp/<spec>.<build> a build in progress (removed when it ends;
//	                           a killed build's is removed by the next
//	                           build of the spec or by gc)
//	cache/apt/<release>-<arch> .deb cache reused by every build
//	keys/tb-build/             ed25519 signing key (created on first use)
//	virt/accel-<host>.json     cached KVM/TCG probe result
func imagesDir(st *state.Store) string { return st.Path("images") }
func tmpDir(st *state.Store) string    { return st.Path("images", ".tmp") }

func specLock(id string) string { return "tb-build/spec/" + id }

// BuildRevision names what a build makes of a spec. It goes up with every
// change to the build that changes the image (what mmdebstrap is asked
// for, the files written, the disk's format), so that a cache of images
// keyed by their spec (leasetest's) builds them again.
const BuildRevision = 2

// BuildRequest is one tb-build build.
type BuildRequest struct {
	Spec     string
	SpecsDir string
	URI      string
	// Accel is auto (probe), kvm or tcg.
	Accel string
	// CacheDir holds the .deb caches (one directory per release and
	// architecture); default <state>/cache/apt.
	CacheDir string
	// Builder defaults to mmdebstrap.
	Builder Builder
}

// CrashEnv names a test hook (crashhook; test builds only): a build whose
// environment has TB_BUILD_CRASH_AFTER=<phase> kills itself with SIGKILL
// when that phase ends, as a power cut or kill -9 would; <phase>:INT sends
// SIGINT instead, as Ctrl-C would. The point "essential" is inside the
// rootfs phase: mmdebstrap starting to install the essential packages in
// its chroot.
const CrashEnv = "TB_BUILD_CRASH_AFTER"

// BuildJob is a build whose spec, tools and hypervisor were checked:
// everything missing is reported before anything long starts, and before
// the state is written.
type BuildJob struct {
	spec     *Spec
	builder  Builder
	hv       virt.Hypervisor
	accel    string
	cacheDir string
}

// PrepareBuild loads the spec and checks what the build needs: the builder,
// the tools and the hypervisor of the smoke test. Close the job when done.
func PrepareBuild(ctx context.Context, req BuildRequest) (*BuildJob, error) {
	specs, err := LoadSpecs(req.SpecsDir)
	if err != nil {
		return nil, err
	}
	spec, err := specs.Get(req.Spec)
	if err != nil {
		return nil, err
	}
	b := req.Builder
	if b == nil {
		b = MMDebstrap{}
	}
	if err := b.Check(ctx, spec); err != nil {
		return nil, err
	}
	for _, t := range [][3]string{{"mkfs.ext4", "e2fsprogs", "makes the root filesystem"}, {"qemu-img", "qemu-utils", "writes the qcow2 disk"},
		{spec.VM.Emulator, emulatorPackage(spec.VM.Emulator), "boots the smoke test"}} {
		if _, err := need(t[0], t[1], t[2]); err != nil {
			return nil, err
		}
	}
	hv, err := virt.Connect(req.URI)
	if err != nil {
		return nil, err
	}
	return &BuildJob{spec: spec, builder: b, hv: hv, accel: req.Accel, cacheDir: req.CacheDir}, nil
}

// Close releases the hypervisor connection.
func (j *BuildJob) Close() error { return j.hv.Close() }

// Run builds, smoke-tests and publishes the image in st, printing the build
// and image records. A failure at any point publishes nothing.
func (j *BuildJob) Run(ctx context.Context, st *state.Store, out cmdout.Sink) error {
	spec := j.spec
	key, err := LoadOrCreateKey(ctx, st.Root(), st.Lock)
	if err != nil {
		return fault.Failure(fmt.Errorf("signing key: %w", err))
	}
	unlock, ok, err := st.TryLock(ctx, specLock(spec.ID))
	if err != nil {
		return err
	}
	if !ok {
		return fault.TempFail(fmt.Errorf("another build of %s is running", spec.ID))
	}
	defer unlock()
	if err := cleanupSpec(ctx, out.Log, st, spec.ID); err != nil {
		return err
	}
	cacheDir := j.cacheDir
	if cacheDir == "" {
		cacheDir = st.Path("cache", "apt")
	}
	bl := &build{out: out, st: st, spec: spec, builder: j.builder, hv: j.hv, key: key, accel: j.accel,
		cache: filepath.Join(cacheDir, spec.OS.Release+"-"+spec.Arch)}
	return bl.run(ctx)
}

type build struct {
	out     cmdout.Sink
	st      *state.Store
	spec    *Spec
	builder Builder
	hv      virt.Hypervisor
	key     Key
	accel   string
	cache   string
	rec     *records.ImageBuildRun
	work    string
	log     *os.File
}

func (bl *build) phase(ctx context.Context, name string, start time.Time) {
	d := time.Since(start).Round(time.Millisecond)
	bl.rec.Phases[name] = records.Duration(d)
	fmt.Fprintf(bl.log, "phase %s: %s\n", name, d)
	bl.out.Log.Info("phase done", "spec", bl.spec.ID, "phase", name, "took", d.String())
	if crashhook.Enabled {
		bl.log.Sync()
		crashhook.At(ctx, CrashEnv, name)
	}
}

func (bl *build) run(ctx context.Context) (err error) {
	st, spec := bl.st, bl.spec
	n, err := nextBuildNumber(st, spec)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	ver := Version{Spec: spec.Version, Build: n}
	cache := bl.cache
	debs, _ := filepath.Glob(filepath.Join(cache, "*.deb"))
	bl.rec = &records.ImageBuildRun{
		Spec: spec.ID, SpecVersion: spec.Version, SpecSHA256: spec.SHA256(), Version: ver.String(), BuildNumber: n,
		Platform: spec.Arch, Status: records.BuildRunning, PID: os.Getpid(), Host: host,
		Inputs: records.BuildInputs{Mirror: spec.OS.Mirror, Suite: spec.OS.Release, Packages: spec.Packages,
			Builder: bl.builder.Name(ctx), Tool: version.String("tb-build"), CachedDebs: len(debs)},
		Phases: map[string]records.Duration{},
	}
	records.Init(bl.rec, records.KindBuild, st.Now())
	bl.rec.StartedAt = bl.rec.CreatedAt
	if err := st.Create(ctx, bl.rec); err != nil {
		return err
	}
	bl.out.Log.Info("build started", "build", bl.rec.ID, "spec", spec.ID, "version", ver.String(), "cached_debs", len(debs))
	bl.work = filepath.Join(tmpDir(st), spec.ID+"."+bl.rec.ID)
	if err := mkdirReachable(st, bl.work); err != nil {
		return err
	}
	bl.log, err = os.Create(filepath.Join(bl.work, "build.log"))
	if err != nil {
		return err
	}
	var img *records.SandboxImage
	defer func() { err = bl.finish(ctx, err, img) }()
	img, err = bl.steps(ctx, ver, cache)
	return err
}

// finish records the outcome, stores the log and removes the work tree.
func (bl *build) finish(ctx context.Context, err error, img *records.SandboxImage) error {
	ctx = context.WithoutCancel(ctx)
	if err != nil {
		fmt.Fprintf(bl.log, "build failed: %v\n", err)
	}
	bl.log.Close()
	now := bl.st.Now()
	bl.rec.FinishedAt = &now
	bl.rec.Duration = records.Duration(now.Sub(bl.rec.StartedAt).Round(time.Millisecond))
	bl.rec.PID = 0
	switch {
	case err == nil:
		bl.rec.Status = records.BuildOK
		bl.rec.Image = img.ID
	case bl.rec.Smoke != nil && !bl.rec.Smoke.Passed:
		bl.rec.Status = records.BuildSmokeFailed
	case errors.Is(err, context.Canceled):
		bl.rec.Status = records.BuildInterrupted
	default:
		bl.rec.Status = records.BuildFailed
	}
	if err != nil {
		bl.rec.Error = err.Error()
	}
	if f, lerr := os.Open(filepath.Join(bl.work, "build.log")); lerr == nil {
		if blob, perr := bl.st.PutBlob(ctx, f); perr == nil {
			bl.rec.Log = blob.URI()
		}
		f.Close()
	}
	if rerr := removeTree(bl.work); rerr != nil {
		bl.out.Warnf("%v", rerr)
	}
	if perr := bl.st.Put(ctx, bl.rec); perr != nil && err == nil {
		err = perr
	}
	w := records.NewWriter(bl.out.Stdout)
	werr := w.Write(bl.rec)
	if img != nil && err == nil && werr == nil {
		werr = w.Write(img)
	}
	if ferr := w.Flush(); werr == nil {
		werr = ferr
	}
	if err == nil {
		err = werr
	}
	if err != nil && fault.Code(err) == fault.ExitFailure {
		err = fmt.Errorf("build %s of %s failed: %w", bl.rec.ID, bl.spec.ID, err)
	}
	return err
}

func (bl *build) steps(ctx context.Context, ver Version, cache string) (*records.SandboxImage, error) {
	st, spec := bl.st, bl.spec
	root := filepath.Join(bl.work, "rootfs")
	out := filepath.Join(bl.work, "out")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	t := time.Now()
	if err := bl.builder.Rootfs(ctx, spec, root, cache, bl.log); err != nil {
		return nil, err
	}
	bl.phase(ctx, "rootfs", t)

	t = time.Now()
	if err := customize(root, spec); err != nil {
		return nil, fmt.Errorf("customizing the root filesystem: %w", err)
	}
	pkgs, err := installedPackages(root)
	if err != nil {
		return nil, fmt.Errorf("reading the package list: %w", err)
	}
	emus, err := userEmulators(root)
	if err != nil {
		return nil, fmt.Errorf("listing the user-mode emulators: %w", err)
	}
	kpath, krel, err := findKernel(root)
	if err != nil {
		return nil, err
	}
	if err := files.Copy(kpath, filepath.Join(out, KernelFile)); err != nil {
		return nil, err
	}
	if err := writeInitramfs(filepath.Join(out, InitrdFile), root, krel, spec.Kernel.Modules); err != nil {
		return nil, err
	}
	bl.phase(ctx, "customize", t)

	t = time.Now()
	if err := makeDisk(ctx, root, filepath.Join(out, DiskFile), spec.Disk.SizeMiB, bl.log); err != nil {
		return nil, err
	}
	if err := removeTree(root); err != nil {
		return nil, err
	}
	bl.phase(ctx, "disk", t)

	boot := bootFor(spec)
	var produced []records.ImageFile
	for _, f := range [][2]string{{DiskFile, "disk"}, {KernelFile, "kernel"}, {InitrdFile, "initrd"}} {
		sum, size, err := files.SHA256(filepath.Join(out, f[0]))
		if err != nil {
			return nil, err
		}
		produced = append(produced, records.ImageFile{Name: f[0], Role: f[1], SHA256: sum, Size: size})
	}
	m := &Manifest{
		Spec: spec.ID, SpecVersion: spec.Version, SpecSHA256: bl.rec.SpecSHA256, Version: ver.String(), BuildNumber: ver.Build,
		Platform: spec.Arch, OS: spec.OS.Distribution, Release: spec.OS.Release, Build: bl.rec.ID,
		Builder: bl.rec.Inputs.Builder, Tool: bl.rec.Inputs.Tool, Host: bl.rec.Host,
		StartedAt: bl.rec.StartedAt, FinishedAt: st.Now(), Boot: boot, Packages: pkgs, Files: produced,
	}
	if err := WriteSigned(out, m, bl.key); err != nil {
		return nil, fmt.Errorf("signing the manifest: %w", err)
	}
	bl.rec.Files = produced

	t = time.Now()
	accel, err := bl.chooseAccel(ctx, filepath.Join(out, KernelFile), bl.log)
	if err != nil {
		return nil, err
	}
	smokeDir := filepath.Join(bl.work, "smoke")
	if err := os.MkdirAll(smokeDir, 0o755); err != nil {
		return nil, err
	}
	sm := &Smoke{H: bl.hv, Accel: accel, Spec: spec, Dir: out, Work: smokeDir,
		Name: "tb-smoke-" + strings.ToLower(bl.rec.ID[len(bl.rec.ID)-12:]), Boot: boot, Log: bl.log}
	res, err := sm.Run(ctx)
	bl.rec.Smoke = res
	bl.phase(ctx, "smoke", t)
	if err != nil {
		return nil, fmt.Errorf("smoke test: %w", err)
	}

	t = time.Now()
	img, err := publish(ctx, st, spec, ver, bl.rec, out, m, bl.key, res, emus)
	if err != nil {
		return nil, err
	}
	bl.phase(ctx, "publish", t)
	return img, nil
}

func (bl *build) chooseAccel(ctx context.Context, kernel string, log io.Writer) (virt.Accel, error) {
	switch bl.accel {
	case "kvm":
		return virt.KVM, nil
	case "tcg":
		return virt.TCG, nil
	}
	if !virt.GuestCanUseKVM(bl.spec.VM.QEMUArch) {
		return virt.TCG, nil
	}
	r, err := virt.ProbeAccel(ctx, virt.ProbeConfig{Emulator: bl.spec.VM.Emulator, Machine: bl.spec.VM.Machine, Kernel: kernel, CacheDir: bl.st.Path("virt")})
	if err != nil {
		return "", err
	}
	fmt.Fprintf(log, "acceleration: %s (%s)\n", r.Accel, r.Detail)
	bl.out.Log.Info("acceleration", "accel", string(r.Accel), "detail", r.Detail)
	return r.Accel, nil
}

// bootFor is how a spec's image boots.
func bootFor(s *Spec) records.ImageBoot {
	cmd := []string{"root=/dev/vda", "rw", "console=" + s.Boot.Console, "panic=-1"}
	if s.Boot.Mode == "systemd" {
		cmd = append(cmd, "talkbox.init=/sbin/init")
	}
	cmd = append(cmd, strings.Fields(s.Boot.Cmdline)...)
	return records.ImageBoot{
		Kernel: KernelFile, Initrd: InitrdFile, Disk: DiskFile, Cmdline: strings.Join(cmd, " "), Mode: s.Boot.Mode,
		Emulator: s.VM.Emulator, Arch: s.VM.QEMUArch, Machine: s.VM.Machine, CPU: s.VM.CPU, Console: s.Boot.Console,
		DiskBus: s.VM.DiskBus, MemoryMiB: s.VM.MemoryMiB, VCPUs: s.VM.VCPUs, NetModel: s.VM.NetModel,
		Interface: s.Network.Interface, NetworkSet: s.Network.Mode,
	}
}

// mkdirReachable creates dir and makes it and its parents up to the state
// root searchable, so that libvirt's unprivileged QEMU can open image
// files (checkReachable checks the rest of the path before a guest starts).
func mkdirReachable(st *state.Store, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				return err
			}
		}
		if d == st.Root() || d == "/" {
			return nil
		}
	}
}

// nextBuildNumber is one more than the highest build of this spec version.
func nextBuildNumber(st *state.Store, s *Spec) (int, error) {
	builds, err := listBuilds(st)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, b := range builds {
		if b.Spec == s.ID && b.SpecVersion == s.Version && b.BuildNumber > n {
			n = b.BuildNumber
		}
	}
	return n + 1, nil
}

func listBuilds(st *state.Store) ([]*records.ImageBuildRun, error) {
	return state.Find[records.ImageBuildRun](st, records.KindBuild, nil)
}

// cleanupSpec removes what killed builds of a spec left behind: work trees
// and "running" build records. The caller holds the spec's lock, so no
// live build of it exists.
func cleanupSpec(ctx context.Context, log *slog.Logger, st *state.Store, spec string) error {
	dirs, _ := filepath.Glob(filepath.Join(tmpDir(st), spec+".build_*"))
	for _, d := range dirs {
		log.Info("removing the leftovers of an interrupted build", "dir", d)
		if err := removeTree(d); err != nil {
			return err
		}
	}
	builds, err := listBuilds(st)
	if err != nil {
		return err
	}
	for _, b := range builds {
		if b.Spec != spec || b.Status != records.BuildRunning {
			continue
		}
		var cur records.ImageBuildRun
		err := st.Update(ctx, b.ID, &cur, func(exists bool) error {
			if !exists || cur.Status != records.BuildRunning {
				return state.ErrNoChange
			}
			cur.Status = records.BuildInterrupted
			cur.Error = "the build process died before it finished"
			cur.PID = 0
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
