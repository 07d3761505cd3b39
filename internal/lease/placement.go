package lease

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

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
		return fault.TempFail(fmt.Errorf("pool %s exhausted: %d of %d leases in use; release one and retry", r.Pool, n, q.MaxLeases))
	}
	if q.VMHours > 0 && hours >= q.VMHours {
		return fault.TempFail(fmt.Errorf("pool %s has used its budget: %.2f of %.2f VM-hours", r.Pool, hours, q.VMHours))
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
	remote := 0
	for _, h := range m.Cfg.Hosts {
		if h.Remote() {
			remote++
			continue
		}
		if h.MaxLeases > 0 && count[h.Name] >= h.MaxLeases {
			continue
		}
		cands = append(cands, h)
	}
	switch strategy {
	case Explicit:
		if r.Host == "" {
			return HostConfig{}, fault.Usage(errors.New("placement explicit needs --host NAME"))
		}
		h, ok := m.Cfg.Host(r.Host)
		if !ok {
			return HostConfig{}, fault.Usage(fmt.Errorf("host %q is not in the configuration", r.Host))
		}
		if h.Remote() {
			return HostConfig{}, fault.Usage(notContained(h))
		}
		if h.MaxLeases > 0 && count[h.Name] >= h.MaxLeases {
			return HostConfig{}, fault.TempFail(fmt.Errorf("host %s is full: %d of %d leases", h.Name, count[h.Name], h.MaxLeases))
		}
		return h, nil
	case LeastLoaded, NativeArchFirst:
	default:
		return HostConfig{}, fault.Usage(fmt.Errorf("unknown placement %q (least-loaded, native-arch-first, explicit)", strategy))
	}
	if len(cands) == 0 && remote == len(m.Cfg.Hosts) {
		return HostConfig{}, fault.Usage(notContained(m.Cfg.Hosts[0]))
	}
	if len(cands) == 0 {
		return HostConfig{}, fault.TempFail(errors.New("every host is full; release leases and retry"))
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
			m.Out.Log.Warn("host unreachable; not placing there", "host", h.Name, "err", err)
			continue
		}
		if strategy == NativeArchFirst {
			s.native = m.nativeKVM(ctx, h, img)
		}
		ss = append(ss, s)
	}
	if len(ss) == 0 {
		return HostConfig{}, fault.Unavailable(errors.New("no configured libvirt host is reachable; start libvirtd with: libvirtd -d"))
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
			return "", fault.Usage(fmt.Errorf("--accel kvm: a %s guest cannot run under KVM on host %s", img.Platform, h.Name))
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
		return "", fault.Unavailable(fmt.Errorf("%s not found: install the Debian package qemu-system-x86", img.Boot.Emulator))
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

// notContained says why a remote host gets no lease.
func notContained(h HostConfig) error {
	return fmt.Errorf("host %s (%s) is another machine: a guest is contained only by a lab of the machine it runs on, which tb-lease cannot check there, so it places no lease there; run tb-capture net up and tb-run worker on that host instead (a fleet)", h.Name, h.URI)
}
