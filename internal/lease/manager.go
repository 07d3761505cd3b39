package lease

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// State layout under the state directory (besides records and blobs):
//
//	tb-lease/leases/<lease id>/       overlay.qcow2, console.log of a live lease
//	tb-lease/snapshots/<snapshot id>/ memory.save, disk.qcow2
//	virt/accel-<host>.json            the KVM/TCG probe, shared with tb-build
//
// Locks: tb-lease/alloc serialises address allocation, quota checks and
// the choice of an idle lease; tb-lease/acquire/<lease id> is held by the
// process creating a lease, so reap knows a "creating" lease whose lock is
// free was abandoned.
const (
	allocLock = "tb-lease/alloc"
)

func acquireLock(id string) string { return "tb-lease/acquire/" + id }

// CrashEnv names a test hook (crashhook; test builds only):
// TB_LEASE_CRASH_AFTER=start makes acquire kill itself with SIGKILL once the
// domain runs, as kill -9 would.
const CrashEnv = "TB_LEASE_CRASH_AFTER"

// Host is one hypervisor host as the manager uses it: libvirt's (virt.Libvirt)
// in the tools, a fake in the unit tests of the manager's decisions.
type Host interface {
	virt.Hypervisor
	URI() string
	// CreatePaused and RestorePaused start a domain whose guest runs only
	// at Resume: its tap is bound first (Manager.run).
	CreatePaused(ctx context.Context, domXML string) error
	RestorePaused(ctx context.Context, path, domXML string) error
	Resume(ctx context.Context, name string) error
	Domains(ctx context.Context) ([]virt.DomainStatus, error)
	DomainStatusOf(name string) (virt.DomainStatus, bool, error)
	Host(ctx context.Context) (virt.HostStatus, error)
	SaveDomain(ctx context.Context, name, path string) error
	SavedXML(path string) (string, error)
	DumpMemory(ctx context.Context, name, path string) error
	// RearmMIPSTimer re-arms a paused, restored MIPS guest's compare timer
	// (virt.Libvirt.RearmMIPSTimer).
	RearmMIPSTimer(ctx context.Context, name string, regBytes int, order binary.ByteOrder) error
}

var _ Host = (*virt.Libvirt)(nil)

// Manager runs tb-lease's commands against one state directory.
type Manager struct {
	// Out is where per-lease problems (Warnf) and decisions (Log) go.
	Out cmdout.Sink
	St  *state.Store
	Cfg *Config
	// Dial connects to a host by URI (virt.Connect unless a test sets it).
	Dial func(uri string) (Host, error)
	// Labs vouches for the bridge of a host before a guest is started or
	// handed out there; without it no guest is.
	Labs  Labs
	conns map[string]Host
}

// Labs tells whether guests attached to bridge, in network namespace
// hostNS, are contained: the bridge is a Talkbox lab's, on labNet, up and
// passing its containment check (capture.Labs); and binds a guest's tap
// to its MAC and IPv4 at that lab's bridge, or forgets the binding
// (HostLabs).
type Labs interface {
	Contained(ctx context.Context, hostNS, bridge string, labNet netip.Prefix) error
	Attach(ctx context.Context, hostNS, bridge string, labNet netip.Prefix, p netlab.Port) error
	Detach(ctx context.Context, hostNS, bridge, port string) error
}

// leaseContained is contained for the host a lease is on.
func (m *Manager) leaseContained(ctx context.Context, l *records.SandboxLease) error {
	h, ok := m.Cfg.Host(l.Host)
	if !ok {
		return fault.Failure(fmt.Errorf("lease %s is on host %s, which is not configured", l.ID, l.Host))
	}
	return m.contained(ctx, h)
}

// contained is the floor under every guest started or handed out on host.
func (m *Manager) contained(ctx context.Context, host HostConfig) error {
	if host.Remote() {
		return fault.Usage(notContained(host))
	}
	if m.Labs == nil {
		return fault.Failure(errors.New("no lab check configured: tb-lease starts no guest without one"))
	}
	labNet, err := netip.ParsePrefix(m.Cfg.LabNet)
	if err != nil {
		return fault.Usage(fmt.Errorf("lab network: %w", err))
	}
	return m.Labs.Contained(ctx, host.NetNS, m.Cfg.Bridge, labNet)
}

// New is the manager of the leases in st, on the hosts of cfg (over
// libvirt).
func New(st *state.Store, cfg *Config, out cmdout.Sink) *Manager {
	return &Manager{Out: out, St: st, Cfg: cfg, conns: map[string]Host{}, Dial: dialLibvirt}
}

// Close closes the libvirt connections and the state.
func (m *Manager) Close() {
	for _, c := range m.conns {
		c.Close()
	}
	m.St.Close()
}

func dialLibvirt(uri string) (Host, error) {
	c, err := virt.Connect(uri)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// conn connects to a configured host (once).
func (m *Manager) conn(host string) (Host, error) {
	if c, ok := m.conns[host]; ok {
		return c, nil
	}
	h, ok := m.Cfg.Host(host)
	if !ok {
		return nil, fault.Failure(fmt.Errorf("host %q is not in the configuration", host))
	}
	c, err := m.Dial(h.URI)
	if err != nil {
		return nil, err
	}
	m.conns[host] = c
	return c, nil
}

// connFor connects to a lease's host: by its configured name, else (a
// configuration that no longer names it) by the URI the lease recorded.
func (m *Manager) connFor(l *records.SandboxLease) (Host, error) {
	if _, ok := m.Cfg.Host(l.Host); ok || l.ConnectURI == "" {
		return m.conn(l.Host)
	}
	key := "uri:" + l.ConnectURI
	if c, ok := m.conns[key]; ok {
		return c, nil
	}
	c, err := m.Dial(l.ConnectURI)
	if err != nil {
		return nil, err
	}
	m.conns[key] = c
	return c, nil
}

func (m *Manager) leaseDir(id string) string    { return m.St.Path("tb-lease", "leases", id) }
func (m *Manager) snapshotDir(id string) string { return m.St.Path("tb-lease", "snapshots", id) }

// vmName is the libvirt domain name of a lease.
func vmName(id string) string {
	return "tb-" + strings.ToLower(id[strings.LastIndexByte(id, '_')+1:])
}

// tapName is the lease's tap device: at most 15 characters, from the
// random part of the ID.
func tapName(id string) string {
	s := strings.ToLower(id[strings.LastIndexByte(id, '_')+1:])
	return "tb" + s[len(s)-12:]
}

// macFor is a deterministic, locally administered MAC (QEMU's 52:54:00
// prefix) from the lease ID; try > 0 gives the alternatives used when two
// live leases would collide.
func macFor(id string, try int) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", id, try)))
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", h[0], h[1], h[2])
}

// description marks a domain as a lease of this state directory, so that
// reap never touches other tools' (or other state directories') domains.
func (m *Manager) description(id string) string {
	return "talkbox lease " + id + " state " + m.St.Root()
}

// ownedLease returns the lease ID of a domain this state directory made.
func (m *Manager) ownedLease(desc string) (string, bool) {
	rest, ok := strings.CutPrefix(desc, "talkbox lease ")
	if !ok {
		return "", false
	}
	id, root, ok := strings.Cut(rest, " state ")
	if !ok || root != m.St.Root() || records.CheckID(id) != nil {
		return "", false
	}
	return id, true
}

// Leases lists the lease records, oldest first.
func (m *Manager) Leases() ([]*records.SandboxLease, error) {
	return state.Find[records.SandboxLease](m.St, records.KindLease, nil)
}

// Get reads one lease.
func (m *Manager) Get(id string) (*records.SandboxLease, error) {
	if records.KindOf(id) != records.KindLease || records.CheckID(id) != nil {
		return nil, fault.Usage(fmt.Errorf("%q is not a lease ID", id))
	}
	var l records.SandboxLease
	if err := m.St.Get(id, &l); err != nil {
		if errors.Is(err, state.ErrNotFound) {
			return nil, fault.Failure(fmt.Errorf("lease %s: %w", id, err))
		}
		return nil, err
	}
	return &l, nil
}

// update is a read-modify-write of a lease.
func (m *Manager) update(ctx context.Context, id string, fn func(l *records.SandboxLease) error) (*records.SandboxLease, error) {
	var l records.SandboxLease
	err := m.St.Update(ctx, id, &l, func(exists bool) error {
		if !exists {
			return fmt.Errorf("lease %s: %w", id, state.ErrNotFound)
		}
		return fn(&l)
	})
	if errors.Is(err, state.ErrNoChange) {
		err = nil
	}
	return &l, err
}

// allocation is what a new lease takes from the pool under the alloc lock.
type allocation struct {
	IP, Gateway netip.Addr
	Prefix      int
	MAC, Tap    string
}

// allocate picks a free lab address and a MAC no live lease uses. The
// caller holds the alloc lock, and the lease record written before the
// lock is released reserves them.
func (m *Manager) allocate(live []*records.SandboxLease, id string) (allocation, error) {
	pfx := netip.MustParsePrefix(m.Cfg.LabNet).Masked()
	gw := pfx.Addr().Next()
	usedIP, usedMAC := map[string]bool{}, map[string]bool{}
	for _, l := range live {
		if l.Bridge == m.Cfg.Bridge {
			usedIP[l.IP] = true
		}
		usedMAC[l.MAC] = true
	}
	a := allocation{Gateway: gw, Prefix: pfx.Bits(), Tap: tapName(id)}
	for try := 0; ; try++ {
		if a.MAC = macFor(id, try); !usedMAC[a.MAC] {
			break
		}
	}
	// .2 to .9 are left to the lab's own services.
	ip := gw
	for i := 0; i < 9; i++ {
		ip = ip.Next()
	}
	for ; pfx.Contains(ip); ip = ip.Next() {
		if !pfx.Contains(ip.Next()) {
			break // broadcast
		}
		if !usedIP[ip.String()] {
			a.IP = ip
			return a, nil
		}
	}
	return a, fault.TempFail(fmt.Errorf("pool exhausted: no free address left in %s on %s (%d leases live); release or expire leases and retry", pfx, m.Cfg.Bridge, len(usedIP)))
}

func live(ls []*records.SandboxLease) []*records.SandboxLease {
	var out []*records.SandboxLease
	for _, l := range ls {
		if !records.LeaseGone(l.State) {
			out = append(out, l)
		}
	}
	return out
}

// usage is what a lease consumed from its start until now.
func usage(l *records.SandboxLease, now time.Time, cpu time.Duration) *records.Usage {
	if l.StartedAt == nil {
		return &records.Usage{}
	}
	s := now.Sub(*l.StartedAt).Seconds()
	if s < 0 {
		s = 0
	}
	return &records.Usage{Seconds: s, VCPUSeconds: s * float64(l.Limits.VCPUs), MiBSeconds: s * float64(l.Limits.MemoryMiB), CPUSeconds: cpu.Seconds()}
}

// teardown destroys a lease's domain, keeps its console as a blob and
// removes its directory. It is safe to repeat.
func (m *Manager) teardown(ctx context.Context, l *records.SandboxLease) (cpu time.Duration, console string, err error) {
	ctx = context.WithoutCancel(ctx)
	if c, cerr := m.connFor(l); cerr == nil {
		if s, ok, _ := c.DomainStatusOf(l.VMName); ok {
			cpu = s.CPUTime
		}
		if err = c.Destroy(ctx, l.VMName); err != nil {
			return cpu, "", err
		}
	} else {
		return 0, "", cerr
	}
	// The binding of its address goes with the tap, so that a later lease
	// may have the address (tb-capture reconcile forgets one left here).
	if err := m.detach(ctx, l); err != nil {
		m.Out.Log.Warn("forgetting the binding of a gone lease's tap", "lease", l.ID, "tap", l.Tap, "err", err)
	}
	if f, ferr := os.Open(l.ConsoleLog); ferr == nil {
		if b, berr := m.St.PutBlob(ctx, f); berr == nil {
			console = b.URI()
		}
		f.Close()
	}
	if l.Dir != "" && strings.HasPrefix(l.Dir, m.St.Path("tb-lease")) {
		if err := os.RemoveAll(l.Dir); err != nil {
			return cpu, console, err
		}
	}
	return cpu, console, nil
}

// finish moves a lease to a final state after its teardown.
func (m *Manager) finish(ctx context.Context, id, final, why string) (*records.SandboxLease, error) {
	cur, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	cpu, console, terr := m.teardown(ctx, cur)
	if terr != nil {
		return nil, terr
	}
	now := m.St.Now()
	return m.update(context.WithoutCancel(ctx), id, func(l *records.SandboxLease) error {
		if records.LeaseGone(l.State) {
			return state.ErrNoChange
		}
		l.Usage = usage(l, now, cpu)
		l.State, l.Health, l.ReleasedAt = final, records.HealthUnknown, &now
		if console != "" {
			l.Console = console
		}
		if why != "" {
			l.Error = why
		}
		l.PID = 0
		return nil
	})
}

// qemuImg runs qemu-img.
func qemuImg(ctx context.Context, args ...string) error {
	bin, err := exec.LookPath("qemu-img")
	if err != nil {
		return fault.Unavailable(errors.New("qemu-img not found (makes lease overlays): install the Debian package qemu-utils"))
	}
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img %s: %s", args[0], strings.TrimSpace(string(out)))
	}
	return nil
}

// mkdirReachable creates dir searchable by others up to the state root
// (libvirt's QEMU runs as an unprivileged user and opens the overlay and
// the console log by path) and checks the root's own parents.
func (m *Manager) mkdirReachable(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	inside := true
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if !inside {
				return fmt.Errorf("libvirt's QEMU runs as an unprivileged user and cannot reach %s: %s is not searchable by others (chmod o+x %s, or use a state directory elsewhere)", dir, d, d)
			}
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				return err
			}
		}
		if d == m.St.Root() {
			inside = false
		}
	}
	return nil
}
