package lease

import (
	"cmp"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/crashhook"
	"github.com/talkbox-sandbox/talkbox/internal/image"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// Request is one acquire: a plan and what the flags override.
type Request struct {
	Plan *records.Plan
	// Image forces an image (ID, SPEC or SPEC@VERSION).
	Image       string
	VCPUs       int
	MemoryMiB   int
	DiskGiB     int
	CPUQuota    int
	TTL         time.Duration
	BootTimeout time.Duration
	Pool        string
	Host        string
	Placement   string
	Accel       string // auto, kvm, tcg
	// Fresh skips the reuse of idle leases.
	Fresh bool
	// Holder is recorded on the lease (records.SandboxLease.Holder).
	Holder string
	// DryRun decides (image, reuse, quota, host, accel) and changes nothing.
	DryRun bool
}

// Decision is what an acquire would do, printed by --dry-run.
type Decision struct {
	Plan      string `json:"plan,omitempty"`
	Image     string `json:"image"`
	ImageSpec string `json:"image_spec"`
	Version   string `json:"image_version"`
	Reuse     string `json:"reuse,omitempty"`
	Host      string `json:"host,omitempty"`
	URI       string `json:"connect_uri,omitempty"`
	Accel     string `json:"accel,omitempty"`
	Placement string `json:"placement,omitempty"`
	Pool      string `json:"pool"`
}

// ReadPlan reads the first plan record from r, or the stored plan id.
func ReadPlan(st *state.Store, r io.Reader, id string) (*records.Plan, error) {
	if id != "" {
		var p records.Plan
		if records.KindOf(id) != records.KindPlan {
			return nil, cli.Usage(fmt.Errorf("%q is not a plan ID", id))
		}
		if err := st.Get(id, &p); err != nil {
			return nil, cli.Failure(fmt.Errorf("plan %s: %w", id, err))
		}
		return &p, nil
	}
	rd := records.NewReader(r, "stdin")
	for {
		rec, err := rd.Record()
		if errors.Is(err, io.EOF) {
			return nil, cli.Usage(errors.New("no plan record on stdin (pipe tb-plan's output, or give --plan ID)"))
		}
		if err != nil {
			return nil, cli.DataErr(err)
		}
		if p, ok := rec.(*records.Plan); ok {
			return p, nil
		}
	}
}

func (r *Request) defaults() {
	p := r.Plan
	if r.VCPUs == 0 {
		r.VCPUs = p.Lease.VCPUs
	}
	if r.MemoryMiB == 0 {
		r.MemoryMiB = p.Lease.MemoryMiB
	}
	if r.DiskGiB == 0 {
		r.DiskGiB = p.Lease.DiskGiB
	}
	if r.TTL == 0 {
		r.TTL = p.Lease.TTL.D()
	}
	if r.TTL == 0 {
		r.TTL = time.Hour
	}
	if r.BootTimeout == 0 {
		r.BootTimeout = p.Timeouts.Boot.D()
	}
	if r.BootTimeout == 0 {
		r.BootTimeout = 3 * time.Minute
	}
	if r.Pool == "" {
		r.Pool = "default"
	}
	if r.Accel == "" {
		r.Accel = "auto"
	}
}

// glibcLoaders are the dynamic loaders Debian images of each platform have.
var glibcLoaders = map[string]string{
	"amd64": "/lib64/ld-linux-x86-64.so.2", "i386": "/lib/ld-linux.so.2", "arm64": "/lib/ld-linux-aarch64.so.1",
	"armhf": "/lib/ld-linux-armhf.so.3", "armel": "/lib/ld-linux.so.3", "mipsel": "/lib/ld.so.1", "mips64el": "/lib64/ld.so.1",
	"ppc64el": "/lib64/ld64.so.2", "s390x": "/lib/ld64.so.1",
}

// debianInterpreters are script interpreters every Debian image has.
var debianInterpreters = []string{"/bin/sh", "/bin/bash", "/bin/dash", "/usr/bin/sh", "/usr/bin/bash", "/usr/bin/env", "/usr/bin/perl"}

// missingFeature returns the first plan feature an image lacks.
func missingFeature(img *records.SandboxImage, features []string) string {
	for _, f := range features {
		switch {
		case f == "static":
		case strings.HasPrefix(f, "interpreter:"):
			in := strings.TrimPrefix(f, "interpreter:")
			if in != glibcLoaders[img.Platform] && !slices.Contains(debianInterpreters, in) {
				return f
			}
		case strings.HasPrefix(f, "qemu-user:"):
			// The guest's binfmt_misc hands the sample to this emulator;
			// without it the exec fails with ENOEXEC.
			if !slices.Contains(img.UserEmulators, strings.TrimPrefix(f, "qemu-user:")) {
				return f
			}
		default:
			return f
		}
	}
	return ""
}

// defaultABIs are the userland ABIs of the platforms that have several,
// for image records written before images recorded their ABI.
var defaultABIs = map[string]string{
	"armhf": "eabi5-hf", "armel": "eabi5-sf", "mipsel": "o32", "mips64el": "n64", "ppc64el": "elfv2",
}

// abiMismatch says why an image's userland cannot host the plan's sample,
// or "". Only a dynamic sample run natively links against the image's
// libraries: a static one needs only the platform's kernel (the planner
// already maps static soft-float ARM to armhf for that), and an emulated
// one runs under qemu-user with no guest library at all.
func abiMismatch(img *records.SandboxImage, p *records.Plan) string {
	need, have := p.Image.ABI, img.ABI
	if have == "" {
		have = defaultABIs[img.Platform]
	}
	if need == "" || have == "" || p.Emulation != nil || slices.Contains(p.Image.Features, "static") || abiCompatible(need, have) {
		return ""
	}
	return fmt.Sprintf("%s has abi %s, the plan needs %s", img.ID, have, need)
}

// abiCompatible reports whether a binary of ABI need runs on libraries of
// ABI have. For ARM the float ABI (-hf, -sf) decides which libraries a
// binary links against; a name without one (float unknown) fits either.
func abiCompatible(need, have string) bool {
	if need == have {
		return true
	}
	if strings.HasPrefix(need, "eabi") && strings.HasPrefix(have, "eabi") {
		_, nf, _ := strings.Cut(need, "-")
		_, hf, _ := strings.Cut(have, "-")
		return nf == "" || nf == hf
	}
	return false
}

// imageMismatch says why an image cannot run the plan's sample, or "".
func imageMismatch(img *records.SandboxImage, p *records.Plan) string {
	needs := p.Image
	if needs.Platform != "" && img.Platform != needs.Platform {
		return fmt.Sprintf("%s is %s, the plan needs %s", img.ID, img.Platform, needs.Platform)
	}
	if w := abiMismatch(img, p); w != "" {
		return w
	}
	if f := missingFeature(img, needs.Features); f != "" {
		return fmt.Sprintf("%s lacks %s", img.ID, f)
	}
	return ""
}

// chooseImage finds the best image for a plan: a forced image, then the
// plan's preferred images in order (SPEC@VERSION pins a version), then the
// newest active image of the plan's platform.
func (m *Manager) chooseImage(r *Request) (*records.SandboxImage, error) {
	p := r.Plan
	needs := p.Image
	refs := needs.Preferred
	if r.Image != "" {
		refs = []string{r.Image}
	}
	var why []string
	for _, ref := range refs {
		img, err := image.Resolve(m.St, ref)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: no such image", ref))
			if strings.Contains(ref, "@") || r.Image != "" {
				return nil, m.noImage(p, fmt.Sprintf("pinned image %s is not published", ref))
			}
			continue
		}
		if w := imageMismatch(img, p); w != "" {
			if strings.Contains(ref, "@") || r.Image != "" {
				return nil, m.noImage(p, w)
			}
			why = append(why, w)
			continue
		}
		return img, nil
	}
	imgs, err := image.Images(m.St, "")
	if err != nil {
		return nil, err
	}
	var best *records.SandboxImage
	for _, img := range imgs {
		if img.Status != records.ImageActive {
			continue
		}
		if w := imageMismatch(img, p); w != "" {
			why = append(why, w)
			continue
		}
		if best == nil || img.PublishedAt.After(best.PublishedAt) {
			best = img
		}
	}
	if best == nil {
		return nil, m.noImage(p, strings.Join(why, "; "))
	}
	return best, nil
}

// noImage says what the plan needs, so that the planner can change it or
// an image can be built.
func (m *Manager) noImage(p *records.Plan, why string) error {
	n := p.Image
	need := "platform " + orAny(n.Platform)
	if n.ABI != "" {
		need += ", abi " + n.ABI
	}
	if len(n.Features) > 0 {
		need += ", features " + strings.Join(n.Features, " ")
	}
	hint := "build one with: tb-build build debian-bookworm-" + n.Platform
	if ss, err := image.LoadSpecs(""); err == nil {
		if _, err := ss.Get("debian-bookworm-" + n.Platform); err != nil {
			hint = "no image spec exists for it: re-plan the sample with another --platform, or add a spec"
		}
	}
	if n.Platform == "" {
		hint = "build one with: tb-build build SPEC (see tb-build specs)"
	}
	if e := p.Emulation; e != nil {
		hint = fmt.Sprintf("it runs the %s sample under %s: build an image for %s whose user_emulators include %s (tb-build build debian-bookworm-%s, with qemu-user-static)",
			e.Platform, e.Emulator, n.Platform, e.Target, n.Platform)
	}
	msg := fmt.Sprintf("no image matches plan %s: it needs %s; %s", orAny(p.ID), need, hint)
	if why != "" {
		msg += " (" + why + ")"
	}
	return cli.Failure(errors.New(msg))
}

func orAny(s string) string {
	if s == "" {
		return "any"
	}
	return s
}

// Decide is an acquire's choices without their effects.
func (m *Manager) Decide(ctx context.Context, r Request) (*Decision, error) {
	r.defaults()
	img, err := m.chooseImage(&r)
	if err != nil {
		return nil, err
	}
	d := &Decision{Plan: r.Plan.ID, Image: img.ID, ImageSpec: img.Spec, Version: img.Version, Pool: r.Pool}
	all, err := m.Leases()
	if err != nil {
		return nil, err
	}
	lv := live(all)
	if !r.Fresh {
		for _, l := range lv {
			if l.State == records.LeaseIdle && l.Pool == r.Pool && l.Image == img.ID && l.Limits.VCPUs >= r.VCPUs &&
				l.Limits.MemoryMiB >= r.MemoryMiB && l.Limits.DiskGiB >= r.DiskGiB && (r.Host == "" || l.Host == r.Host) {
				d.Reuse, d.Host, d.URI, d.Accel = l.ID, l.Host, l.ConnectURI, l.Accel
				return d, nil
			}
		}
	}
	if err := m.checkQuota(&r, all); err != nil {
		return nil, err
	}
	host, err := m.place(ctx, &r, img, lv)
	if err != nil {
		return nil, err
	}
	a, err := m.accel(ctx, host, r.Accel, img)
	if err != nil {
		return nil, err
	}
	d.Host, d.URI, d.Accel, d.Placement = host.Name, host.URI, string(a), cmp.Or(r.Placement, m.Cfg.Placement)
	if r.Host != "" {
		d.Placement = Explicit
	}
	return d, nil
}

// Acquire returns a lease for the plan: an idle healthy match, or a new
// VM booted until its guest agent answers.
func (m *Manager) Acquire(ctx context.Context, r Request) (*records.SandboxLease, error) {
	r.defaults()
	img, err := m.chooseImage(&r)
	if err != nil {
		return nil, err
	}
	if r.VCPUs == 0 {
		r.VCPUs = img.Boot.VCPUs
	}
	if r.MemoryMiB == 0 {
		r.MemoryMiB = img.Boot.MemoryMiB
	}
	unlock, err := m.St.Lock(ctx, allocLock)
	if err != nil {
		return nil, err
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	all, err := m.Leases()
	if err != nil {
		return nil, err
	}
	lv := live(all)
	if !r.Fresh {
		if l, err := m.reuse(ctx, &r, img, lv); l != nil || err != nil {
			return l, err
		}
	}
	if err := m.checkQuota(&r, all); err != nil {
		return nil, err
	}
	host, err := m.place(ctx, &r, img, lv)
	if err != nil {
		return nil, err
	}
	accel, err := m.accel(ctx, host, r.Accel, img)
	if err != nil {
		return nil, err
	}
	l := &records.SandboxLease{State: records.LeaseCreating, Health: records.HealthUnknown, Plan: r.Plan.ID, Holder: r.Holder, Pool: r.Pool,
		Host: host.Name, ConnectURI: host.URI, Image: img.ID, ImageSpec: img.Spec, ImageVersion: img.Version,
		Platform: img.Platform, Features: r.Plan.Image.Features, Accel: string(accel), Bridge: m.Cfg.Bridge,
		Limits: records.Limits{VCPUs: r.VCPUs, MemoryMiB: r.MemoryMiB, DiskGiB: r.DiskGiB, CPUQuota: r.CPUQuota},
		TTL:    records.Duration(r.TTL), PID: os.Getpid()}
	records.Init(l, records.KindLease, m.St.Now())
	a, err := m.allocate(lv, l.ID)
	if err != nil {
		return nil, err
	}
	l.VMName, l.Tap, l.MAC, l.IP, l.Prefix, l.Gateway = vmName(l.ID), a.Tap, a.MAC, a.IP.String(), a.Prefix, a.Gateway.String()
	l.Dir = m.leaseDir(l.ID)
	l.Overlay, l.ConsoleLog = filepath.Join(l.Dir, "overlay.qcow2"), filepath.Join(l.Dir, "console.log")
	// The acquire lock is taken before the record exists: a record in
	// "creating" whose lock is free belongs to a dead process.
	unlockAcq, ok, err := m.St.TryLock(ctx, acquireLock(l.ID))
	if err != nil || !ok {
		return nil, fmt.Errorf("acquire lock of %s: %v", l.ID, err)
	}
	defer unlockAcq()
	if err := m.St.Create(ctx, l); err != nil {
		return nil, err
	}
	unlock()
	locked = false
	return m.boot(ctx, l, img, r.BootTimeout, false)
}

// reuse takes an idle lease that matches the request, after checking that
// its agent answers. The caller holds the alloc lock.
func (m *Manager) reuse(ctx context.Context, r *Request, img *records.SandboxImage, lv []*records.SandboxLease) (*records.SandboxLease, error) {
	now := m.St.Now()
	for _, l := range lv {
		if l.State != records.LeaseIdle || l.Pool != r.Pool || l.Platform != img.Platform || l.Image != img.ID ||
			l.Limits.VCPUs < r.VCPUs || l.Limits.MemoryMiB < r.MemoryMiB || l.Limits.DiskGiB < r.DiskGiB ||
			(r.Host != "" && l.Host != r.Host) || (r.Accel != "auto" && l.Accel != r.Accel) ||
			(l.ExpiresAt != nil && !l.ExpiresAt.After(now)) {
			continue
		}
		c, err := m.connFor(l)
		if err != nil {
			continue
		}
		g := &virt.Guest{H: c, Name: l.VMName, ConsoleLog: l.ConsoleLog}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = g.Ping(pctx)
		cancel()
		if err != nil {
			m.Env.Log.Warn("idle lease does not answer; not reused (tb-lease heal restarts it)", "lease", l.ID, "err", err)
			m.update(ctx, l.ID, func(x *records.SandboxLease) error { x.Health = records.HealthUnhealthy; return nil })
			continue
		}
		exp := now.Add(r.TTL)
		return m.update(ctx, l.ID, func(x *records.SandboxLease) error {
			if x.State != records.LeaseIdle {
				return fmt.Errorf("lease %s changed state to %s", x.ID, x.State)
			}
			x.State, x.Health, x.Plan, x.Holder = records.LeaseBusy, records.HealthHealthy, r.Plan.ID, r.Holder
			x.AcquiredAt, x.ExpiresAt, x.TTL = &now, &exp, records.Duration(r.TTL)
			x.Acquisitions++
			return nil
		})
	}
	return nil, nil
}

// checkQuota enforces the pool's concurrent leases and VM-hours.
func (m *Manager) checkQuota(r *Request, all []*records.SandboxLease) error {
	q, ok := m.Cfg.Pools[r.Pool]
	if !ok {
		return nil
	}
	now := m.St.Now()
	n, hours := 0, 0.0
	for _, l := range all {
		if l.Pool != r.Pool {
			continue
		}
		if !records.LeaseGone(l.State) {
			n++
			hours += usage(l, now, 0).Seconds / 3600
		} else if l.Usage != nil {
			hours += l.Usage.Seconds / 3600
		}
	}
	if q.MaxLeases > 0 && n >= q.MaxLeases {
		return cli.TempFail(fmt.Errorf("pool %s exhausted: %d of %d leases in use; release one and retry", r.Pool, n, q.MaxLeases))
	}
	if q.VMHours > 0 && hours >= q.VMHours {
		return cli.TempFail(fmt.Errorf("pool %s has used its budget: %.2f of %.2f VM-hours", r.Pool, hours, q.VMHours))
	}
	return nil
}

// debArch is this machine's Debian architecture.
func debArch() string {
	switch runtime.GOARCH {
	case "386":
		return "i386"
	case "arm":
		return "armhf"
	}
	return runtime.GOARCH
}

// nativeKVM reports whether a host runs the image's platform under KVM.
func (m *Manager) nativeKVM(ctx context.Context, h HostConfig, img *records.SandboxImage) bool {
	a, err := m.accel(ctx, h, "auto", img)
	return err == nil && a == virt.KVM
}

// place chooses the host for a new lease.
func (m *Manager) place(ctx context.Context, r *Request, img *records.SandboxImage, lv []*records.SandboxLease) (HostConfig, error) {
	strategy := r.Placement
	if strategy == "" {
		strategy = m.Cfg.Placement
	}
	if r.Host != "" {
		strategy = Explicit
	}
	count := map[string]int{}
	for _, l := range lv {
		count[l.Host]++
	}
	var cands []HostConfig
	for _, h := range m.Cfg.Hosts {
		if h.MaxLeases > 0 && count[h.Name] >= h.MaxLeases {
			continue
		}
		cands = append(cands, h)
	}
	switch strategy {
	case Explicit:
		if r.Host == "" {
			return HostConfig{}, cli.Usage(errors.New("placement explicit needs --host NAME"))
		}
		h, ok := m.Cfg.Host(r.Host)
		if !ok {
			return HostConfig{}, cli.Usage(fmt.Errorf("host %q is not in the configuration", r.Host))
		}
		if h.MaxLeases > 0 && count[h.Name] >= h.MaxLeases {
			return HostConfig{}, cli.TempFail(fmt.Errorf("host %s is full: %d of %d leases", h.Name, count[h.Name], h.MaxLeases))
		}
		return h, nil
	case LeastLoaded, NativeArchFirst:
	default:
		return HostConfig{}, cli.Usage(fmt.Errorf("unknown placement %q (least-loaded, native-arch-first, explicit)", strategy))
	}
	if len(cands) == 0 {
		return HostConfig{}, cli.TempFail(errors.New("every host is full; release leases and retry"))
	}
	type scored struct {
		h      HostConfig
		native bool
		load   float64
	}
	var ss []scored
	for _, h := range cands {
		s := scored{h: h, load: float64(count[h.Name])}
		if c, err := m.conn(h.Name); err == nil {
			if hs, err := c.Host(ctx); err == nil && hs.MemoryMiB > 0 {
				// Leases first, then the share of memory in use.
				s.load += 1 - float64(hs.FreeMiB)/float64(hs.MemoryMiB)
			}
		} else {
			m.Env.Log.Warn("host unreachable; not placing there", "host", h.Name, "err", err)
			continue
		}
		if strategy == NativeArchFirst {
			s.native = m.nativeKVM(ctx, h, img)
		}
		ss = append(ss, s)
	}
	if len(ss) == 0 {
		return HostConfig{}, cli.Unavailable(errors.New("no configured libvirt host is reachable; start libvirtd with: libvirtd -d"))
	}
	slices.SortStableFunc(ss, func(a, b scored) int {
		if a.native != b.native {
			if a.native {
				return -1
			}
			return 1
		}
		switch {
		case a.load < b.load:
			return -1
		case a.load > b.load:
			return 1
		}
		return 0
	})
	return ss[0].h, nil
}

// accel decides KVM or TCG for an image on a host: forced, configured for
// the host, or the cached probe of this machine.
func (m *Manager) accel(ctx context.Context, h HostConfig, want string, img *records.SandboxImage) (virt.Accel, error) {
	native := (h.Arch == "" || h.Arch == debArch()) && virt.GuestCanUseKVM(img.Boot.Arch)
	switch want {
	case "kvm":
		if !native {
			return "", cli.Usage(fmt.Errorf("--accel kvm: a %s guest cannot run under KVM on host %s", img.Platform, h.Name))
		}
		return virt.KVM, nil
	case "tcg":
		return virt.TCG, nil
	}
	if !native {
		return virt.TCG, nil
	}
	switch h.Accel {
	case "kvm":
		return virt.KVM, nil
	case "tcg":
		return virt.TCG, nil
	}
	if !isLocal(h.URI) {
		return virt.TCG, nil
	}
	emu, err := exec.LookPath(img.Boot.Emulator)
	if err != nil {
		return "", cli.Unavailable(fmt.Errorf("%s not found: install the Debian package qemu-system-x86", img.Boot.Emulator))
	}
	res, err := virt.ProbeAccel(ctx, virt.ProbeConfig{Emulator: emu, Kernel: filepath.Join(img.Dir, img.Boot.Kernel), CacheDir: m.St.Path("virt")})
	if err != nil {
		return "", err
	}
	return res.Accel, nil
}

func isLocal(uri string) bool {
	return uri == "" || strings.HasPrefix(uri, "qemu:///") || strings.HasPrefix(uri, "qemu+unix:///")
}

// domainXML renders the lease's domain: the image's direct kernel boot
// with the lease's address on the kernel command line, its disk overlay,
// tap, MAC, console log and limits.
func (m *Manager) domainXML(l *records.SandboxLease, img *records.SandboxImage) (string, error) {
	b := img.Boot
	emu := b.Emulator
	if p, err := exec.LookPath(emu); err == nil {
		emu = p
	} else if !filepath.IsAbs(emu) {
		emu = "/usr/bin/" + emu
	}
	// The lease's parameters go first: QEMU's Malta board hands the kernel
	// at most 255 bytes of command line and drops the rest.
	cmdline := image.LeaseCmdline(cmp.Or(b.Interface, "eth0"), l.IP, l.Prefix, l.Gateway) + " " + b.Cmdline
	x, err := virt.DomainXML(virt.DomainConfig{
		Name: l.VMName, Accel: virt.Accel(l.Accel), Emulator: emu, Arch: b.Arch, Machine: b.Machine, CPU: b.CPU,
		MemoryMiB: l.Limits.MemoryMiB, VCPUs: l.Limits.VCPUs,
		Kernel: filepath.Join(img.Dir, b.Kernel), Initrd: filepath.Join(img.Dir, b.Initrd), Cmdline: cmdline,
		Disks:      []virt.Disk{{Path: l.Overlay, Format: "qcow2", Bus: b.DiskBus}},
		ConsoleLog: l.ConsoleLog,
		NICs:       []virt.NIC{{Bridge: l.Bridge, MAC: l.MAC, Model: b.NetModel}},
	})
	if err != nil {
		return "", err
	}
	var desc strings.Builder
	xml.EscapeText(&desc, []byte(m.description(l.ID)))
	extra := "<description>" + desc.String() + "</description>"
	if q := l.Limits.CPUQuota; q > 0 {
		extra += "<cputune><period>100000</period><quota>" + strconv.Itoa(q*1000) + "</quota></cputune>"
	}
	nameTag := "<name>" + l.VMName + "</name>"
	if !strings.Contains(x, nameTag) || !strings.Contains(x, `<interface type="bridge">`) {
		return "", fmt.Errorf("unexpected domain XML from virt.DomainXML")
	}
	x = strings.Replace(x, nameTag, nameTag+extra, 1)
	x = strings.Replace(x, `<interface type="bridge">`, `<interface type="bridge"><target dev="`+l.Tap+`"></target>`, 1)
	return x, nil
}

// boot makes the overlay, starts the domain and waits for the guest agent.
// On failure the domain and overlay are removed and the lease is failed
// with the console's tail. restart reuses an existing overlay.
func (m *Manager) boot(ctx context.Context, l *records.SandboxLease, img *records.SandboxImage, timeout time.Duration, restart bool) (*records.SandboxLease, error) {
	fail := func(err error) (*records.SandboxLease, error) {
		tail := ""
		var be *virt.BootError
		if errors.As(err, &be) {
			tail = be.Console
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (interrupted)", err)
		}
		if fl, ferr := m.finish(ctx, l.ID, records.LeaseFailed, err.Error()); ferr == nil && tail != "" {
			m.update(context.WithoutCancel(ctx), fl.ID, func(x *records.SandboxLease) error { x.ConsoleTail = tail; return nil })
		}
		return nil, cli.Failure(fmt.Errorf("lease %s failed: %w", l.ID, err))
	}
	c, err := m.connFor(l)
	if err != nil {
		return fail(err)
	}
	if err := m.mkdirReachable(l.Dir); err != nil {
		return fail(err)
	}
	if _, err := os.Stat(l.Overlay); !restart || err != nil {
		args := []string{"create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", filepath.Join(img.Dir, img.Boot.Disk), l.Overlay}
		if l.Limits.DiskGiB > 0 {
			args = append(args, strconv.Itoa(l.Limits.DiskGiB)+"G")
		}
		os.Remove(l.Overlay)
		if err := qemuImg(ctx, args...); err != nil {
			return fail(err)
		}
	}
	os.Remove(l.ConsoleLog)
	x, err := m.domainXML(l, img)
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	if err := c.CreateXML(ctx, x); err != nil {
		return fail(err)
	}
	now := m.St.Now()
	if _, err := m.update(ctx, l.ID, func(x *records.SandboxLease) error { x.StartedAt = &now; return nil }); err != nil {
		return fail(err)
	}
	crashhook.At(ctx, CrashEnv, "start")
	g := &virt.Guest{H: c, Name: l.VMName, ConsoleLog: l.ConsoleLog}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	err = g.WaitAgent(wctx)
	cancel()
	if err != nil {
		return fail(err)
	}
	took := time.Since(start).Round(time.Millisecond)
	if err := checkAddress(ctx, g, l.IP); err != nil {
		return fail(err)
	}
	return m.ready(ctx, l.ID, took, restart)
}

// checkAddress confirms the guest has its lease address.
func checkAddress(ctx context.Context, g *virt.Guest, ip string) error {
	ifs, err := g.Interfaces(ctx)
	if err != nil {
		return err
	}
	var seen []string
	for _, i := range ifs {
		for _, a := range i.Addresses {
			if strings.HasPrefix(a, ip+"/") {
				return nil
			}
			seen = append(seen, i.Name+"="+a)
		}
	}
	return fmt.Errorf("guest does not have its lease address %s (agent reports %s)", ip, strings.Join(seen, " "))
}

// ready marks a started lease busy and healthy, with its TTL running.
func (m *Manager) ready(ctx context.Context, id string, took time.Duration, restart bool) (*records.SandboxLease, error) {
	now := m.St.Now()
	return m.update(ctx, id, func(x *records.SandboxLease) error {
		if !restart {
			exp := now.Add(x.TTL.D())
			x.State, x.AcquiredAt, x.ExpiresAt = records.LeaseBusy, &now, &exp
			x.Acquisitions++
		}
		x.Health, x.BootToAgent, x.PID, x.Error = records.HealthHealthy, records.Duration(took), 0, ""
		return nil
	})
}
