package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"github.com/talkbox-sandbox/talkbox/internal/image"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// Release destroys a lease's domain and overlay (keeping the console as a
// blob and the usage in the record). keep instead returns a busy lease to
// the idle pool, running, for the next acquire of a matching plan: as it
// is for the samples its guest has run, reverted for any other.
func (m *Manager) Release(ctx context.Context, id string, keep bool) (*records.SandboxLease, error) {
	l, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	if records.LeaseGone(l.State) {
		return nil, fault.Failure(fmt.Errorf("lease %s is already %s", id, l.State))
	}
	if keep {
		return m.update(ctx, id, func(x *records.SandboxLease) error {
			if x.State != records.LeaseBusy && x.State != records.LeaseIdle {
				return fault.Failure(fmt.Errorf("lease %s is %s; only a busy lease goes back to idle", id, x.State))
			}
			x.State, x.Plan, x.Holder = records.LeaseIdle, "", ""
			return nil
		})
	}
	if l.State == records.LeaseCreating {
		if unlock, ok, _ := m.St.TryLock(ctx, acquireLock(id)); ok {
			unlock()
		} else {
			return nil, fault.TempFail(fmt.Errorf("lease %s is still being created (pid %d); retry when acquire ends", id, l.PID))
		}
	}
	return m.finish(ctx, id, records.LeaseReleased, "")
}

// Renew extends a lease's TTL from now.
func (m *Manager) Renew(ctx context.Context, id string, ttl time.Duration) (*records.SandboxLease, error) {
	if _, err := m.Get(id); err != nil {
		return nil, err
	}
	now := m.St.Now()
	return m.update(ctx, id, func(x *records.SandboxLease) error {
		if records.LeaseGone(x.State) {
			return fault.Failure(fmt.Errorf("lease %s is %s", id, x.State))
		}
		if ttl == 0 {
			ttl = x.TTL.D()
		}
		exp := now.Add(ttl)
		x.ExpiresAt, x.TTL = &exp, records.Duration(ttl)
		return nil
	})
}

// Expire releases (state expired) the live leases past their TTL; without
// apply it only prints them.
func (m *Manager) Expire(ctx context.Context, apply bool) ([]*records.SandboxLease, error) {
	ls, err := m.Leases()
	if err != nil {
		return nil, err
	}
	now := m.St.Now()
	var out []*records.SandboxLease
	for _, l := range live(ls) {
		if l.State == records.LeaseCreating || l.ExpiresAt == nil || l.ExpiresAt.After(now) {
			continue
		}
		if !apply {
			out = append(out, l)
			continue
		}
		x, err := m.finish(ctx, l.ID, records.LeaseExpired, fmt.Sprintf("TTL %s ran out at %s", l.TTL, l.ExpiresAt.Format(time.RFC3339)))
		if err != nil {
			m.Out.Warnf("%s: %v", l.ID, err)
			continue
		}
		out = append(out, x)
	}
	return out, nil
}

// Action is one thing reap or heal did (or would do).
type Action struct {
	Action string `json:"action"`
	Lease  string `json:"lease,omitempty"`
	Host   string `json:"host,omitempty"`
	Domain string `json:"domain,omitempty"`
	Path   string `json:"path,omitempty"`
	Reason string `json:"reason"`
	Error  string `json:"error,omitempty"`
}

// Reap reconciles libvirt with the state: leases left "creating" by a dead
// acquire, this state directory's domains without a live lease, live
// leases whose domain is gone, and lease directories without a live lease.
func (m *Manager) Reap(ctx context.Context, dryRun bool) ([]Action, error) {
	var acts []Action
	do := func(a Action, fn func() error) {
		if !dryRun {
			if err := fn(); err != nil {
				a.Error = err.Error()
			}
		}
		acts = append(acts, a)
	}
	ls, err := m.Leases()
	if err != nil {
		return nil, err
	}
	byID := map[string]*records.SandboxLease{}
	for _, l := range ls {
		byID[l.ID] = l
	}
	domains := map[string]map[string]bool{} // host -> domain names present
	for _, h := range m.Cfg.Hosts {
		c, err := m.conn(h.Name)
		if err != nil {
			if len(m.Cfg.Hosts) == 1 {
				return nil, err
			}
			m.Out.Warnf("host %s: %v", h.Name, err)
			continue
		}
		doms, err := c.Domains(ctx)
		if err != nil {
			return nil, err
		}
		domains[h.Name] = map[string]bool{}
		for _, d := range doms {
			domains[h.Name][d.Name] = d.Active
			id, ours := m.ownedLease(d.Description)
			if !ours {
				continue
			}
			l := byID[id]
			if l != nil && !records.LeaseGone(l.State) {
				continue
			}
			why := "no lease record"
			if l != nil {
				why = "lease " + l.State
			}
			host, name := h.Name, d.Name
			do(Action{Action: "destroy-domain", Lease: id, Host: host, Domain: name, Reason: why}, func() error {
				return c.Destroy(ctx, name)
			})
		}
	}
	for _, l := range ls {
		if l.State == records.LeaseCreating {
			unlock, ok, err := m.St.TryLock(ctx, acquireLock(l.ID))
			if err != nil {
				return nil, err
			}
			if !ok {
				continue // its acquire is running
			}
			id := l.ID
			do(Action{Action: "fail-lease", Lease: id, Host: l.Host, Domain: l.VMName, Reason: fmt.Sprintf("acquire (pid %d) died while creating it", l.PID)}, func() error {
				_, err := m.finish(ctx, id, records.LeaseFailed, "acquire interrupted: tb-lease died while creating the lease; cleaned up by reap")
				return err
			})
			unlock()
			continue
		}
		if records.LeaseGone(l.State) {
			continue
		}
		present, known := domains[l.Host]
		if !known {
			continue // host unreachable: nothing can be said
		}
		if _, ok := present[l.VMName]; !ok {
			id := l.ID
			do(Action{Action: "fail-lease", Lease: id, Host: l.Host, Domain: l.VMName, Reason: "its domain is gone"}, func() error {
				_, err := m.finish(ctx, id, records.LeaseFailed, "domain vanished (found by reap)")
				return err
			})
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(m.St.Path("tb-lease", "leases"), "*"))
	for _, d := range dirs {
		id := filepath.Base(d)
		l := byID[id]
		if l != nil && !records.LeaseGone(l.State) {
			continue
		}
		if l != nil && l.State == records.LeaseCreating {
			continue
		}
		why := "no lease record"
		if l != nil {
			why = "lease " + l.State
		}
		dir := d
		do(Action{Action: "remove-overlay", Lease: id, Path: dir, Reason: why}, func() error { return os.RemoveAll(dir) })
	}
	return acts, nil
}

// Heal checks every live lease's agent; an unhealthy one is restarted on
// its overlay, and replaced by a fresh overlay of its image if that fails.
// A lease neither brings back is failed.
func (m *Manager) Heal(ctx context.Context, ids []string, timeout time.Duration) ([]Action, error) {
	ls, err := m.Leases()
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var acts []Action
	for _, l := range live(ls) {
		if (len(ids) > 0 && !want[l.ID]) || l.State == records.LeaseCreating {
			continue
		}
		c, err := m.connFor(l)
		if err != nil {
			m.Out.Warnf("%s: %v", l.ID, err)
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		perr := virt.NewGuest(c, l.VMName, l.ConsoleLog).WaitAgent(pctx)
		cancel()
		if perr == nil {
			if l.Health != records.HealthHealthy {
				m.update(ctx, l.ID, func(x *records.SandboxLease) error { x.Health = records.HealthHealthy; return nil })
			}
			acts = append(acts, Action{Action: "healthy", Lease: l.ID, Host: l.Host, Domain: l.VMName, Reason: "guest agent answers"})
			continue
		}
		m.update(ctx, l.ID, func(x *records.SandboxLease) error { x.Health = records.HealthUnhealthy; return nil })
		img, err := image.Resolve(m.St, l.Image)
		if err != nil {
			acts = append(acts, Action{Action: "fail-lease", Lease: l.ID, Reason: "image gone", Error: err.Error()})
			m.finish(ctx, l.ID, records.LeaseFailed, "unhealthy and its image is gone")
			continue
		}
		a := Action{Action: "restart", Lease: l.ID, Host: l.Host, Domain: l.VMName, Reason: firstLine(perr.Error())}
		if err := m.leaseContained(ctx, l); err != nil {
			// Left unhealthy, not failed: it is restarted once its lab
			// passes its check again.
			a.Error = err.Error()
			acts = append(acts, a)
			continue
		}
		if err := m.restart(ctx, l, img, timeout, false); err != nil {
			a.Error = err.Error()
			acts = append(acts, a)
			a = Action{Action: "replace", Lease: l.ID, Host: l.Host, Domain: l.VMName, Reason: "restart failed: a fresh overlay of " + img.ID}
			if err := m.restart(ctx, l, img, timeout, true); err != nil {
				a.Error = err.Error()
				acts = append(acts, a)
				m.finish(ctx, l.ID, records.LeaseFailed, "unhealthy; restart and replacement failed: "+firstLine(err.Error()))
				acts = append(acts, Action{Action: "fail-lease", Lease: l.ID, Reason: "neither restart nor replacement brought it back"})
				continue
			}
		}
		acts = append(acts, a)
	}
	return acts, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "; console ends")
	return s
}

// restart destroys a lease's domain and boots it again, on its own
// overlay or (fresh) on a new one; the lease keeps its ID, address and MAC.
func (m *Manager) restart(ctx context.Context, l *records.SandboxLease, img *records.SandboxImage, timeout time.Duration, fresh bool) error {
	took, err := m.reboot(ctx, l, img, timeout, fresh)
	if err != nil {
		return err
	}
	_, err = m.update(ctx, l.ID, func(x *records.SandboxLease) error {
		x.Health, x.BootToAgent = records.HealthHealthy, records.Duration(took)
		x.Restarts++
		return nil
	})
	return err
}

// reboot destroys a lease's domain and boots it again until its agent
// answers, on its own overlay or (fresh) on a new one of its image.
func (m *Manager) reboot(ctx context.Context, l *records.SandboxLease, img *records.SandboxImage, timeout time.Duration, fresh bool) (time.Duration, error) {
	c, err := m.connFor(l)
	if err != nil {
		return 0, err
	}
	if err := c.Destroy(ctx, l.VMName); err != nil {
		return 0, err
	}
	if fresh {
		os.Remove(l.Overlay)
	}
	x, err := m.domainXML(l, img)
	if err != nil {
		return 0, err
	}
	if _, err := os.Stat(l.Overlay); err != nil {
		args := []string{"create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", filepath.Join(img.Dir, img.Boot.Disk), l.Overlay}
		if l.Limits.DiskGiB > 0 {
			args = append(args, fmt.Sprintf("%dG", l.Limits.DiskGiB))
		}
		if err := m.mkdirReachable(l.Dir); err != nil {
			return 0, err
		}
		if err := qemuImg(ctx, args...); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	if err := m.run(ctx, c, l, func() error { return c.CreatePaused(ctx, x) }); err != nil {
		return 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	err = virt.NewGuest(c, l.VMName, l.ConsoleLog).WaitAgent(wctx)
	cancel()
	took := time.Since(start).Round(time.Millisecond)
	if err == nil {
		err = agentAnswered(ctx, c, l, img)
	}
	if err != nil {
		c.Destroy(context.WithoutCancel(ctx), l.VMName)
		return 0, err
	}
	return took, nil
}

// HostReport is one line of "inspect host".
type HostReport struct {
	Name string `json:"name"`
	virt.HostStatus
	Accel       string   `json:"accel"`
	AccelDetail string   `json:"accel_detail,omitempty"`
	StateDir    string   `json:"state_dir"`
	FreeDiskMiB uint64   `json:"free_disk_mib"`
	Leases      int      `json:"leases"`
	LeaseIDs    []string `json:"lease_ids,omitempty"`
	// Platforms are those of the active images whose files are on this
	// machine (what an acquire may boot there); Native those of them the
	// host runs under KVM.
	Platforms []string `json:"platforms,omitempty"`
	Native    []string `json:"native,omitempty"`
	Error     string   `json:"error,omitempty"`
}

// InspectHosts reports each configured host.
func (m *Manager) InspectHosts(ctx context.Context, only string) ([]HostReport, error) {
	ls, err := m.Leases()
	if err != nil {
		return nil, err
	}
	imgs, err := image.Images(m.St, "")
	if err != nil {
		return nil, err
	}
	var out []HostReport
	for _, h := range m.Cfg.Hosts {
		if only != "" && h.Name != only {
			continue
		}
		r := HostReport{Name: h.Name, StateDir: m.St.Root(), Accel: h.Accel}
		r.URI = h.URI
		var sfs unix.Statfs_t
		if unix.Statfs(m.St.Root(), &sfs) == nil {
			r.FreeDiskMiB = sfs.Bavail * uint64(sfs.Bsize) >> 20
		}
		for _, l := range live(ls) {
			if l.Host == h.Name {
				r.Leases++
				r.LeaseIDs = append(r.LeaseIDs, l.ID)
			}
		}
		c, err := m.conn(h.Name)
		if err != nil {
			if len(m.Cfg.Hosts) == 1 || only != "" {
				return nil, err
			}
			r.Error = err.Error()
			out = append(out, r)
			continue
		}
		if r.HostStatus, err = c.Host(ctx); err != nil {
			r.Error = err.Error()
		}
		if r.Accel == "" || r.Accel == "auto" {
			r.Accel, r.AccelDetail = m.cachedAccel(h)
		}
		r.Platforms, r.Native = bootable(h, r.Accel, imgs)
		out = append(out, r)
	}
	if only != "" && len(out) == 0 {
		return nil, fault.Usage(fmt.Errorf("host %q is not in the configuration", only))
	}
	return out, nil
}

// bootable are the platforms of the active images whose files are here,
// and those of them whose guests host h, running its own architecture's
// guests with accel, runs under KVM (as accel decides for an acquire).
func bootable(h HostConfig, accel string, imgs []*records.SandboxImage) (platforms, native []string) {
	for _, img := range imgs {
		if img.Status != records.ImageActive || slices.Contains(platforms, img.Platform) || notHere(img) != "" {
			continue
		}
		platforms = append(platforms, img.Platform)
		if accel == string(virt.KVM) && (h.Arch == "" || h.Arch == debArch()) && virt.GuestCanUseKVM(img.Boot.Arch) {
			native = append(native, img.Platform)
		}
	}
	slices.Sort(platforms)
	slices.Sort(native)
	return platforms, native
}

// cachedAccel reads the probe result cached for this machine (written by
// the first acquire or tb-build build); remote hosts without a configured
// accel run TCG.
func (m *Manager) cachedAccel(h HostConfig) (string, string) {
	if !isLocal(h.URI) {
		return string(virt.TCG), "remote host without a configured accel"
	}
	host, _ := os.Hostname()
	b, err := os.ReadFile(m.St.Path("virt", "accel-"+host+".json"))
	if err != nil {
		return "unprobed", "no cached probe yet (the first acquire with --accel auto probes)"
	}
	var r virt.ProbeResult
	if json.Unmarshal(b, &r) != nil {
		return "unprobed", "unreadable probe cache"
	}
	return string(r.Accel), r.Detail
}

// Exec runs a program in a lease's guest through the agent.
func (m *Manager) Exec(ctx context.Context, id string, argv []string) (*guestagent.Result, error) {
	l, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	if records.LeaseGone(l.State) {
		return nil, fault.Failure(fmt.Errorf("lease %s is %s", id, l.State))
	}
	c, err := m.connFor(l)
	if err != nil {
		return nil, err
	}
	r, err := guestagent.New(c, l.VMName).Run(ctx, argv...)
	if errors.Is(err, guestagent.ErrGone) {
		return nil, fault.Failure(fmt.Errorf("lease %s: %w (tb-lease heal restarts it)", id, err))
	}
	return r, err
}
