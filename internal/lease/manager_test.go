package lease

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cmdout"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/guestagent"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
	"github.com/talkbox-sandbox/talkbox/internal/virt"
)

// fakeHost is a hypervisor host for the manager's decisions (placement,
// quota, reap, heal); the real host is libvirt, which the tb-lease scripts
// and leasetest drive for real.
type fakeHost struct {
	mu      sync.Mutex
	uri     string
	status  virt.HostStatus
	domains map[string]virt.DomainStatus
	// answers says whether a domain's agent answers: by name, the number
	// of CreatePaused calls after which it does (0: never).
	answersAfter int
	creates      int
	destroyed    []string
	// saves and restores count SaveDomain and RestorePaused calls, rearms
	// RearmMIPSTimer's (each on a paused domain).
	saves, restores, rearms int
	unsaveable              bool
	// scripts are the shell scripts the guests were given (guest-exec of
	// sh -c); with timersStopped, no guest process ever exits, as in a
	// guest whose timer interrupts stopped.
	scripts       []string
	timersStopped bool
}

func newFakeHost(uri string, memMiB, freeMiB uint64) *fakeHost {
	return &fakeHost{uri: uri, status: virt.HostStatus{URI: uri, MemoryMiB: memMiB, FreeMiB: freeMiB}, domains: map[string]virt.DomainStatus{}}
}

func (h *fakeHost) URI() string { return h.uri }
func (h *fakeHost) Start(context.Context, virt.DomainConfig) error {
	return errors.New("fake host: Start is not used by leases")
}
func (h *fakeHost) EnsureNetwork(context.Context, virt.NetworkConfig) error { return nil }
func (h *fakeHost) Close() error                                            { return nil }

func (h *fakeHost) CreatePaused(ctx context.Context, x string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	name := between(x, "<name>", "</name>")
	desc := between(x, "<description>", "</description>")
	h.creates++
	h.domains[name] = virt.DomainStatus{Name: name, Active: true, State: "paused", Description: desc}
	return nil
}

func (h *fakeHost) Resume(ctx context.Context, name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.domains[name]
	if !ok || d.State != "paused" {
		return fmt.Errorf("fake: %s is not paused", name)
	}
	d.State = "running"
	h.domains[name] = d
	return nil
}

func (h *fakeHost) Destroy(ctx context.Context, name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.domains, name)
	h.destroyed = append(h.destroyed, name)
	return nil
}

func (h *fakeHost) AgentCommand(ctx context.Context, name, cmd string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.domains[name]; !ok {
		return "", guestagent.ErrGone
	}
	if h.answersAfter == 0 || h.creates < h.answersAfter {
		return "", guestagent.ErrNotReady
	}
	var req struct {
		Execute   string `json:"execute"`
		Arguments struct {
			Arg []string `json:"arg"`
		} `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(cmd), &req); err != nil {
		return "", err
	}
	switch req.Execute {
	case "guest-exec":
		if a := req.Arguments.Arg; len(a) == 3 && a[0] == "sh" && a[1] == "-c" {
			h.scripts = append(h.scripts, a[2])
		}
		return `{"return":{"pid":7}}`, nil
	case "guest-exec-status":
		if h.timersStopped {
			return `{"return":{"exited":false}}`, nil
		}
		return `{"return":{"exited":true,"exitcode":0}}`, nil
	}
	return `{"return":{}}`, nil
}

func (h *fakeHost) Domains(ctx context.Context) ([]virt.DomainStatus, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []virt.DomainStatus
	for _, d := range h.domains {
		out = append(out, d)
	}
	return out, nil
}

func (h *fakeHost) DomainStatusOf(name string) (virt.DomainStatus, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.domains[name]
	return d, ok, nil
}

func (h *fakeHost) Host(ctx context.Context) (virt.HostStatus, error) { return h.status, nil }

// SaveDomain stops the domain and writes its name and description to
// path; unsaveable makes it refuse, as a machine whose devices do not
// migrate.
func (h *fakeHost) SaveDomain(ctx context.Context, name, path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.domains[name]
	if h.unsaveable || !ok {
		return errors.ErrUnsupported
	}
	delete(h.domains, name)
	h.saves++
	return os.WriteFile(path, []byte(name+"\n"+d.Description), 0o600)
}

// RestorePaused starts, paused, the domain a SaveDomain file names.
func (h *fakeHost) RestorePaused(ctx context.Context, path, domXML string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	name, desc, _ := strings.Cut(string(b), "\n")
	h.mu.Lock()
	defer h.mu.Unlock()
	h.restores++
	h.domains[name] = virt.DomainStatus{Name: name, Active: true, State: "paused", Description: desc}
	return nil
}

// RearmMIPSTimer counts the re-arms of a paused domain's timer.
func (h *fakeHost) RearmMIPSTimer(ctx context.Context, name string, regBytes int, order binary.ByteOrder) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if d, ok := h.domains[name]; !ok || d.State != "paused" {
		return fmt.Errorf("fake: %s is not paused", name)
	}
	h.rearms++
	return nil
}

func (h *fakeHost) SavedXML(string) (string, error)                  { return "", errors.ErrUnsupported }
func (h *fakeHost) DumpMemory(context.Context, string, string) error { return errors.ErrUnsupported }

func between(s, a, b string) string {
	_, rest, _ := strings.Cut(s, a)
	v, _, _ := strings.Cut(rest, b)
	return v
}

// fakeURI is a fake host's URI: a libvirtd of this machine, on a socket of
// its own, which is where leases may go.
func fakeURI(name string) string { return "qemu+unix:///system?socket=/run/fake-libvirt/" + name }

// fakeLabs vouches for every bridge, or for none (err); it records what
// it was asked, and the ports it bound. The real one (HostLabs) is tested
// with real labs in the tb-lease scripts and TestRevertRealGuest.
type fakeLabs struct {
	err   error
	asked []string
	// host, when set, is asked whether the port's domain is still paused
	// when it is bound.
	host     *fakeHost
	attached []string
	unbound  []string
}

func (f *fakeLabs) Contained(ctx context.Context, hostNS, bridge string, labNet netip.Prefix) error {
	f.asked = append(f.asked, hostNS+"/"+bridge+"/"+labNet.String())
	return f.err
}

func (f *fakeLabs) Attach(ctx context.Context, hostNS, bridge string, labNet netip.Prefix, p netlab.Port) error {
	if err := f.Contained(ctx, hostNS, bridge, labNet); err != nil {
		return err
	}
	state := ""
	if f.host != nil {
		f.host.mu.Lock()
		defer f.host.mu.Unlock()
		for _, d := range f.host.domains {
			if strings.HasSuffix(d.Name, p.Name[2:]) {
				state = " " + d.State
			}
		}
	}
	f.attached = append(f.attached, p.Name+" "+p.MAC.String()+" "+p.IP.String()+state)
	return nil
}

func (f *fakeLabs) Detach(ctx context.Context, hostNS, bridge, port string) error {
	f.unbound = append(f.unbound, port)
	return nil
}

// fakeManager is a Manager over a fresh state and the fake hosts, by
// configured name (a host missing from hosts is unreachable), whose labs
// all pass.
func fakeManager(t *testing.T, cfg *Config, hosts map[string]*fakeHost) *Manager {
	t.Helper()
	if err := cfg.check("test"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// libvirt's QEMU must reach lease directories: as mkdirReachable asks.
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
	st, err := state.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	byURI := map[string]*fakeHost{}
	for _, h := range cfg.Hosts {
		if fh := hosts[h.Name]; fh != nil {
			byURI[h.URI] = fh
		}
	}
	m := New(st, cfg, cmdout.New("tb-lease", io.Discard, io.Discard, nil))
	m.Labs = &fakeLabs{}
	m.Dial = func(uri string) (Host, error) {
		if h := byURI[uri]; h != nil {
			return h, nil
		}
		return nil, fmt.Errorf("fake: cannot connect to %s", uri)
	}
	return m
}

func TestPlacement(t *testing.T) {
	cfg := func(placement string) *Config {
		return &Config{Placement: placement, Hosts: []HostConfig{
			{Name: "arm", URI: fakeURI("arm"), Arch: "arm64", MaxLeases: 4},
			{Name: "x86", URI: fakeURI("x86"), Arch: debArch(), Accel: "kvm", MaxLeases: 2},
			{Name: "down", URI: fakeURI("down")},
		}}
	}
	hosts := func() map[string]*fakeHost {
		return map[string]*fakeHost{"arm": newFakeHost(fakeURI("arm"), 8192, 6000), "x86": newFakeHost(fakeURI("x86"), 8192, 4000)}
	}
	img := testImage("amd64", "")
	img.Boot.Arch = "x86_64"
	leasesOn := func(host string, n int) []*records.SandboxLease {
		var out []*records.SandboxLease
		for range n {
			out = append(out, &records.SandboxLease{Host: host, State: records.LeaseBusy})
		}
		return out
	}
	place := func(placement string, r Request, lv []*records.SandboxLease) (string, error) {
		m := fakeManager(t, cfg(placement), hosts())
		h, err := m.place(context.Background(), &r, img, lv)
		return h.Name, err
	}
	for _, tc := range []struct {
		name, placement string
		req             Request
		leases          []*records.SandboxLease
		want            string
		code            int
	}{
		// The unreachable host is passed over; fewer leases win, then the
		// share of memory in use.
		{"least-loaded, by memory", LeastLoaded, Request{}, nil, "arm", 0},
		{"least-loaded, by leases", LeastLoaded, Request{}, leasesOn("arm", 1), "x86", 0},
		// Native first: the amd64 guest goes to the KVM host while it has
		// room, even though it is the busier one.
		{"native-arch-first", NativeArchFirst, Request{}, leasesOn("x86", 1), "x86", 0},
		{"native host full", NativeArchFirst, Request{}, leasesOn("x86", 2), "arm", 0},
		{"explicit", Explicit, Request{Host: "arm"}, nil, "arm", 0},
		{"explicit, full", Explicit, Request{Host: "x86"}, leasesOn("x86", 2), "", fault.ExitTempFail},
		{"explicit, unknown", Explicit, Request{Host: "nope"}, nil, "", fault.ExitUsage},
		{"--host makes it explicit", LeastLoaded, Request{Host: "x86"}, nil, "x86", 0},
		// The hosts with room are full; the one without a cap is down.
		{"all full but the one down", LeastLoaded, Request{}, append(leasesOn("arm", 4), leasesOn("x86", 2)...), "", fault.ExitUnavailable},
	} {
		got, err := place(tc.placement, tc.req, tc.leases)
		if got != tc.want || fault.Code(err) != tc.code {
			t.Errorf("%s: placed on %q (%v), want %q (exit %d)", tc.name, got, err, tc.want, tc.code)
		}
	}
	// A host on another machine gets no lease, whatever its configuration
	// says: passed over, refused by name (exit 2), and when it is the only
	// host, said so (exit 2).
	local := &Config{Placement: LeastLoaded, Hosts: []HostConfig{{Name: "local", URI: "qemu:///system"}, {Name: "remote", URI: "qemu+tcp://remote/system"}}}
	both := map[string]*fakeHost{"local": newFakeHost("qemu:///system", 8192, 100), "remote": newFakeHost("qemu+tcp://remote/system", 8192, 8000)}
	m := fakeManager(t, local, both)
	if h, err := m.place(context.Background(), &Request{}, img, nil); err != nil || h.Name != "local" {
		t.Errorf("a local and a remote host: placed on %q, %v", h.Name, err)
	}
	if _, err := m.place(context.Background(), &Request{Host: "remote"}, img, nil); fault.Code(err) != fault.ExitUsage || !strings.Contains(err.Error(), "another machine") {
		t.Errorf("explicit remote host: %v", err)
	}
	m = fakeManager(t, &Config{Placement: LeastLoaded, Hosts: local.Hosts[1:]}, both)
	if _, err := m.place(context.Background(), &Request{}, img, nil); fault.Code(err) != fault.ExitUsage {
		t.Errorf("only a remote host: %v", err)
	}
	// Nothing reachable: exit 69; every host full: exit 75.
	m = fakeManager(t, cfg(LeastLoaded), nil)
	if _, err := m.place(context.Background(), &Request{}, img, nil); fault.Code(err) != fault.ExitUnavailable {
		t.Errorf("no host reachable: %v", err)
	}
	full := cfg(LeastLoaded)
	full.Hosts = full.Hosts[:2]
	m = fakeManager(t, full, hosts())
	if _, err := m.place(context.Background(), &Request{}, img, append(leasesOn("arm", 4), leasesOn("x86", 2)...)); fault.Code(err) != fault.ExitTempFail {
		t.Errorf("every host full: %v", err)
	}
}

func TestQuota(t *testing.T) {
	m := fakeManager(t, &Config{Pools: map[string]PoolConfig{"p": {MaxLeases: 2}}}, nil)
	busy := func(pool string) *records.SandboxLease {
		return &records.SandboxLease{Pool: pool, State: records.LeaseBusy}
	}
	if err := m.checkQuota(&Request{Pool: "p"}, []*records.SandboxLease{busy("p"), busy("q")}); err != nil {
		t.Errorf("one of two: %v", err)
	}
	if err := m.checkQuota(&Request{Pool: "p"}, []*records.SandboxLease{busy("p"), busy("p")}); fault.Code(err) != fault.ExitTempFail {
		t.Errorf("two of two: %v", err)
	}
	if err := m.checkQuota(&Request{Pool: "q"}, []*records.SandboxLease{busy("p"), busy("p")}); err != nil {
		t.Errorf("a pool without quota: %v", err)
	}
}

// storedLease stores a live lease on host, with its domain running there
// unless gone.
func storedLease(t *testing.T, m *Manager, h *fakeHost, host, imageID string, gone bool) *records.SandboxLease {
	t.Helper()
	l := &records.SandboxLease{State: records.LeaseBusy, Health: records.HealthHealthy, Host: host, Image: imageID, Pool: "default",
		Limits: records.Limits{VCPUs: 1, MemoryMiB: 256}, Accel: "tcg", Bridge: "br0", MAC: "52:54:00:00:00:01", IP: "10.13.37.10", Prefix: 24}
	records.Init(l, records.KindLease, m.St.Now())
	l.VMName, l.Dir = vmName(l.ID), m.leaseDir(l.ID)
	l.Overlay, l.ConsoleLog = filepath.Join(l.Dir, "overlay.qcow2"), filepath.Join(l.Dir, "console.log")
	if err := m.St.Create(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	if !gone {
		h.domains[l.VMName] = virt.DomainStatus{Name: l.VMName, Active: true, Description: m.description(l.ID)}
	}
	return l
}

func TestReap(t *testing.T) {
	h := newFakeHost(fakeURI("h"), 4096, 2048)
	m := fakeManager(t, &Config{Hosts: []HostConfig{{Name: "h", URI: fakeURI("h")}}}, map[string]*fakeHost{"h": h})
	live := storedLease(t, m, h, "h", "", false)
	vanished := storedLease(t, m, h, "h", "", true)
	orphan := records.NewID(records.KindLease, m.St.Now())
	h.domains["tb-orphan"] = virt.DomainStatus{Name: "tb-orphan", Description: m.description(orphan)}
	h.domains["someone-else"] = virt.DomainStatus{Name: "someone-else", Description: "not ours"}
	acts, err := m.Reap(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range acts {
		got = append(got, a.Action+" "+a.Lease+" "+a.Domain)
	}
	want := []string{"destroy-domain " + orphan + " tb-orphan", "fail-lease " + vanished.ID + " " + vanished.VMName}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("reap:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, ok := h.domains["someone-else"]; !ok {
		t.Error("reap destroyed a domain that is not this state's")
	}
	var l records.SandboxLease
	if m.St.Get(live.ID, &l); l.State != records.LeaseBusy {
		t.Errorf("the live lease is %s", l.State)
	}
	if m.St.Get(vanished.ID, &l); l.State != records.LeaseFailed {
		t.Errorf("the lease whose domain vanished is %s", l.State)
	}
}

// TestHealRestartsThenReplaces: a lease whose agent is silent is restarted
// on its overlay; when that does not bring the agent back, it is replaced
// by a fresh overlay of its image, keeping its ID, address and MAC.
func TestHealRestartsThenReplaces(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Fatal("qemu-img is needed (scripts/deps.sh installs it)")
	}
	h := newFakeHost(fakeURI("h"), 4096, 2048)
	m := fakeManager(t, &Config{Hosts: []HostConfig{{Name: "h", URI: fakeURI("h")}}}, map[string]*fakeHost{"h": h})
	img := testImage("amd64", "")
	img.Dir = m.St.Path("images", "test")
	img.Boot = records.ImageBoot{Arch: "x86_64", Kernel: "vmlinuz", Initrd: "initrd.img", Disk: "disk.qcow2", Emulator: "qemu-system-x86_64"}
	if err := os.MkdirAll(img.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := qemuImg(context.Background(), "create", "-q", "-f", "qcow2", filepath.Join(img.Dir, "disk.qcow2"), "16M"); err != nil {
		t.Fatal(err)
	}
	if err := m.St.Create(context.Background(), img); err != nil {
		t.Fatal(err)
	}
	l := storedLease(t, m, h, "h", img.ID, false)
	if err := m.mkdirReachable(l.Dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.Overlay, []byte("the old overlay"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.answersAfter = 2 // the restart's boot (create 1) stays silent; the replacement's answers
	acts, err := m.Heal(context.Background(), nil, 600*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range acts {
		got = append(got, a.Action)
	}
	if strings.Join(got, ",") != "restart,replace" || acts[0].Error == "" || acts[1].Error != "" {
		t.Fatalf("heal: %+v", acts)
	}
	var after records.SandboxLease
	if err := m.St.Get(l.ID, &after); err != nil {
		t.Fatal(err)
	}
	if after.State != records.LeaseBusy || after.Health != records.HealthHealthy || after.Restarts != 1 || after.IP != l.IP || after.MAC != l.MAC {
		t.Fatalf("after heal: %+v", after)
	}
	if b, err := os.ReadFile(l.Overlay); err != nil || strings.Contains(string(b), "the old overlay") {
		t.Fatalf("the replacement kept the old overlay (%v)", err)
	}
	// A lease whose agent answers is only marked healthy.
	acts, err = m.Heal(context.Background(), nil, 600*time.Millisecond)
	if err != nil || len(acts) != 1 || acts[0].Action != "healthy" {
		t.Fatalf("second heal: %+v, %v", acts, err)
	}
}

// TestLabFloor: no guest is started, restored, restarted or handed out on
// a host whose lab does not vouch for its bridge; the refusal leaves no
// lease behind, and heal leaves an unhealthy lease as it is.
func TestLabFloor(t *testing.T) {
	h := newFakeHost(fakeURI("h"), 4096, 2048)
	cfg := &Config{Hosts: []HostConfig{{Name: "h", URI: fakeURI("h"), NetNS: "tbns1"}}}
	m := fakeManager(t, cfg, map[string]*fakeHost{"h": h})
	refusal := &fakeLabs{err: fault.Unavailable(errors.New("lab default: containment check failed"))}
	m.Labs = refusal
	img := testImage("amd64", "")
	if err := m.St.Create(context.Background(), img); err != nil {
		t.Fatal(err)
	}
	plan := testPlan("amd64", "")
	ctx := context.Background()
	if _, err := m.Decide(ctx, Request{Plan: plan}); fault.Code(err) != fault.ExitUnavailable {
		t.Errorf("dry run on a failing lab: %v", err)
	}
	if _, err := m.Acquire(ctx, Request{Plan: plan}); fault.Code(err) != fault.ExitUnavailable {
		t.Errorf("acquire on a failing lab: %v", err)
	}
	if ls, err := m.Leases(); err != nil || len(ls) != 0 {
		t.Errorf("a refused acquire left leases: %d (%v)", len(ls), err)
	}
	if want := "tbns1/tb-lab0/10.13.37.0/24"; len(refusal.asked) == 0 || refusal.asked[0] != want {
		t.Errorf("the labs were asked %q, want %q first", refusal.asked, want)
	}
	// An idle lease is not handed out once its lab fails.
	idle := storedLease(t, m, h, "h", img.ID, false)
	m.update(ctx, idle.ID, func(x *records.SandboxLease) error { x.State, x.Platform = records.LeaseIdle, "amd64"; return nil })
	if _, err := m.Acquire(ctx, Request{Plan: plan}); fault.Code(err) != fault.ExitUnavailable {
		t.Errorf("reuse on a failing lab: %v", err)
	}
	// Heal does not restart a silent guest there, nor fail its lease.
	acts, err := m.Heal(ctx, nil, 100*time.Millisecond)
	if err != nil || len(acts) != 1 || acts[0].Action != "restart" || !strings.Contains(acts[0].Error, "containment check failed") {
		t.Fatalf("heal on a failing lab: %+v, %v", acts, err)
	}
	if h.creates != 0 {
		t.Errorf("a guest was started on a failing lab (%d creates)", h.creates)
	}
	var l records.SandboxLease
	if m.St.Get(idle.ID, &l); records.LeaseGone(l.State) || l.Health != records.HealthUnhealthy {
		t.Errorf("after heal on a failing lab the lease is %s, %s", l.State, l.Health)
	}
	// Without a lab check, nothing starts at all.
	m.Labs = nil
	if _, err := m.Decide(ctx, Request{Plan: plan, Fresh: true}); err == nil || !strings.Contains(err.Error(), "no lab check") {
		t.Errorf("no lab check: %v", err)
	}
}
