package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
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
	// Revert: the reused lease's guest has run another sample, and is
	// reverted to a clean one first.
	Revert    bool   `json:"revert,omitempty"`
	Host      string `json:"host,omitempty"`
	URI       string `json:"connect_uri,omitempty"`
	Accel     string `json:"accel,omitempty"`
	Placement string `json:"placement,omitempty"`
	Pool      string `json:"pool"`
}

// ReadPlan is the stored plan id or, without one, the first plan record
// on r, which it reads to the end (so that the tool before it never sees
// a closed pipe): the records it does not use, a second plan among them,
// are passed over and counted in log, so that pipes compose. A line that
// is not a record is bad data (exit 65), named by its line number.
func ReadPlan(st *state.Store, r io.Reader, id string, log *slog.Logger) (*records.Plan, error) {
	if id != "" {
		var p records.Plan
		if records.KindOf(id) != records.KindPlan {
			return nil, fault.Usage(fmt.Errorf("%q is not a plan ID", id))
		}
		if err := st.Get(id, &p); err != nil {
			return nil, fault.Failure(fmt.Errorf("plan %s: %w", id, err))
		}
		return &p, nil
	}
	rd := records.NewReader(r, "stdin")
	var plan *records.Plan
	passed := records.PassedOver{}
	for {
		rec, err := rd.Record()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fault.DataErr(err)
		}
		if p, ok := rec.(*records.Plan); ok && plan == nil {
			plan = p
			continue
		}
		passed.Add(rec.Header().Kind)
	}
	passed.Log(log)
	if plan == nil {
		return nil, fault.Usage(errors.New("no plan record on stdin (pipe tb-plan's output, or give --plan ID)"))
	}
	return plan, nil
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
				if err := m.leaseContained(ctx, l); err != nil {
					return nil, err
				}
				serves, err := m.serves(l, r.Plan)
				if err != nil {
					return nil, err
				}
				d.Reuse, d.Revert, d.Host, d.URI, d.Accel = l.ID, !serves, l.Host, l.ConnectURI, l.Accel
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
	if err := m.contained(ctx, host); err != nil {
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
		l, claimed, err := m.reuse(ctx, &r, img, lv)
		if err != nil || (l != nil && claimed == nil) {
			return l, err
		}
		if l != nil {
			// Claimed "creating" under its acquire lock: the revert boots
			// without holding up other acquires.
			defer claimed()
			unlock()
			locked = false
			return m.revert(ctx, l, &r)
		}
	}
	if err := m.checkQuota(&r, all); err != nil {
		return nil, err
	}
	host, err := m.place(ctx, &r, img, lv)
	if err != nil {
		return nil, err
	}
	if err := m.contained(ctx, host); err != nil {
		return nil, err
	}
	accel, err := m.accel(ctx, host, r.Accel, img)
	if err != nil {
		return nil, err
	}
	l := &records.SandboxLease{State: records.LeaseCreating, Health: records.HealthUnknown, Plan: r.Plan.ID, Samples: sampleList(r.Plan), Holder: r.Holder, Pool: r.Pool,
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

// reuse takes an idle lease that matches the request: first one whose
// guest serves the plan's sample, after checking that its agent answers;
// else any, claimed for a revert (dirty, with the function that releases
// its acquire lock) that the caller runs once it has released the alloc
// lock, which it holds here.
func (m *Manager) reuse(ctx context.Context, r *Request, img *records.SandboxImage, lv []*records.SandboxLease) (*records.SandboxLease, func(), error) {
	now := m.St.Now()
	var candidates []*records.SandboxLease
	for _, l := range lv {
		if l.State != records.LeaseIdle || l.Pool != r.Pool || l.Platform != img.Platform || l.Image != img.ID ||
			l.Limits.VCPUs < r.VCPUs || l.Limits.MemoryMiB < r.MemoryMiB || l.Limits.DiskGiB < r.DiskGiB ||
			(r.Host != "" && l.Host != r.Host) || (r.Accel != "auto" && l.Accel != r.Accel) ||
			(l.ExpiresAt != nil && !l.ExpiresAt.After(now)) {
			continue
		}
		// A lab that failed its check since hands out no guest on it.
		if err := m.leaseContained(ctx, l); err != nil {
			m.Out.Log.Warn("idle lease not reused: its lab does not vouch for it", "lease", l.ID, "err", err)
			continue
		}
		candidates = append(candidates, l)
	}
	for _, l := range candidates {
		ok, err := m.serves(l, r.Plan)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			continue
		}
		c, err := m.connFor(l)
		if err != nil {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = guestagent.New(c, l.VMName).Ping(pctx)
		cancel()
		if err != nil {
			m.Out.Log.Warn("idle lease does not answer; not reused (tb-lease heal restarts it)", "lease", l.ID, "err", err)
			m.update(ctx, l.ID, func(x *records.SandboxLease) error { x.Health = records.HealthUnhealthy; return nil })
			continue
		}
		exp := now.Add(r.TTL)
		x, err := m.update(ctx, l.ID, func(x *records.SandboxLease) error {
			if x.State != records.LeaseIdle {
				return fmt.Errorf("lease %s changed state to %s", x.ID, x.State)
			}
			x.State, x.Health, x.Plan, x.Holder = records.LeaseBusy, records.HealthHealthy, r.Plan.ID, r.Holder
			if s := planSample(r.Plan); !slices.Contains(x.Samples, s) {
				x.Samples = append(x.Samples, s) // a dropped descendant
			}
			x.AcquiredAt, x.ExpiresAt, x.TTL = &now, &exp, records.Duration(r.TTL)
			x.Acquisitions++
			return nil
		})
		return x, nil, err
	}
	for _, l := range candidates {
		// The guest is rebooted clean whether or not it answers now.
		x, unlock, err := m.claimForRevert(ctx, l, r)
		if err != nil {
			m.Out.Log.Warn("idle lease not claimed for a revert", "lease", l.ID, "err", err)
			continue
		}
		return x, unlock, nil
	}
	return nil, nil, nil
}
