package capture

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Lease is what tb-capture reads from a lease record (written by tb-lease).
type Lease struct {
	records.Meta
	Tap    string `json:"tap"`
	IP     string `json:"ip"`
	MAC    string `json:"mac"`
	VMName string `json:"vm_name"`
	Plan   string `json:"plan"`
	State  string `json:"state"`
}

// Gone reports whether a lease no longer holds its VM.
func (l *Lease) Gone() bool {
	switch l.State {
	case "released", "expired", "failed", "deleted":
		return true
	}
	return false
}

// StartRequest is "tb-capture start".
type StartRequest struct {
	Lease, Plan, Cycle, Lab string
	// Iface, IP, NetNS override (or replace) what the lease record says.
	Iface, IP, NetNS string
	Snaplen          int
	Filter, BPF      string
	RotateSize       int64
	RotateEvery      time.Duration
	Sensors          []string
	Spool            string
	// Retention bounds what the lease keeps of its pcaps and flow logs.
	Retention
	// MinFree is what must stay free on the state's (and the spool's) file
	// system; the zero value never stops the capture.
	MinFree diskspace.Threshold
	// NoRules captures without applying containment rules.
	NoRules bool
	// Daemon is the command line that runs "tb-capture daemon".
	Daemon []string
}

// Start validates everything, applies the lease's rules, and starts the
// capture daemon. Nothing is changed when validation fails; rules applied
// are removed again if the daemon does not come up.
func Start(ctx context.Context, st *state.Store, log *slog.Logger, req StartRequest) (*records.Capture, error) {
	rec := &records.Capture{Lease: req.Lease, Plan: req.Plan, Cycle: req.Cycle, Iface: req.Iface, IP: req.IP,
		NetNS: req.NetNS, Snaplen: req.Snaplen, RotateSize: req.RotateSize, RotateEvery: records.Duration(req.RotateEvery),
		KeepDays: req.KeepDays, KeepBytes: req.KeepBytes, MinFree: req.MinFree.Bytes, MinFreePercent: req.MinFree.Percent}
	if rec.Snaplen <= 0 {
		rec.Snaplen = 262144
	}
	var mac string
	if req.Lease != "" {
		var l Lease
		if err := st.Get(req.Lease, &l); err != nil {
			return nil, &InputError{fmt.Errorf("lease %s: %w", req.Lease, err)}
		}
		if l.Gone() {
			return nil, &InputError{fmt.Errorf("lease %s is %s", req.Lease, l.State)}
		}
		rec.Iface = cmp.Or(req.Iface, l.Tap)
		rec.IP = cmp.Or(req.IP, l.IP)
		rec.Plan = cmp.Or(req.Plan, l.Plan)
		mac = l.MAC
		if rec.Iface == l.Tap && l.MAC != "" && l.IP != "" {
			rec.Bound = &records.PortBound{MAC: l.MAC, IP: l.IP}
		}
	}
	if rec.Iface == "" {
		return nil, &InputError{errors.New("no interface: give --lease (with a tap) or --iface")}
	}
	// The lab, when up, decides the namespace the taps live in.
	lab, labErr := netlab.Open(st, req.Lab)
	if labErr != nil && !errors.Is(labErr, netlab.ErrNotUp) {
		return nil, labErr
	}
	if lab != nil {
		rec.Lab = lab.Config.Name
		if rec.NetNS == "" {
			rec.NetNS = lab.Config.HostNSPath()
		}
	}
	rec.NetNS = netns.Path(rec.NetNS)
	// The lease's tap is bound on the lab's bridge (tb-lease attached it):
	// what the bridge drops of the guest's is kept out of the capture.
	if lab == nil {
		rec.Bound = nil
	}
	if rec.Bound != nil {
		rec.Bound.DHCP = lab.Config.DHCP
		if _, err := portBinding(rec.Bound); err != nil {
			return nil, &InputError{fmt.Errorf("lease %s: %w", req.Lease, err)}
		}
		if rec.Snaplen < minBoundSnaplen {
			return nil, &InputError{fmt.Errorf("--snaplen %d: a capture on a lease's tap keeps at least %d bytes of each frame, to tell the frames the bridge drops", rec.Snaplen, minBoundSnaplen)}
		}
	}

	// Validate before any change.
	var prog []unix.SockFilter
	var err error
	switch {
	case req.BPF != "" && req.Filter != "":
		return nil, &InputError{errors.New("--filter and --bpf are exclusive")}
	case req.BPF != "":
		if prog, err = ParseBPF(req.BPF); err != nil {
			return nil, &InputError{err}
		}
		rec.Filter = "bpf"
	case req.Filter != "":
		if prog, err = CompileFilter(ctx, req.Filter, rec.Snaplen); err != nil {
			return nil, &InputError{err}
		}
		rec.Filter = req.Filter
	}
	for _, name := range req.Sensors {
		if _, err := LoadSensor(SensorsDir(st), name); err != nil {
			return nil, &InputError{err}
		}
	}
	if err := req.Retention.check(); err != nil {
		return nil, err
	}
	if req.MinFree.Bytes < 0 || req.MinFree.Percent < 0 || req.MinFree.Percent >= 100 {
		return nil, &InputError{errors.New("--min-free must be at least 0 and --min-free-percent from 0 to 100")}
	}
	if req.KeepBytes > 0 && req.RotateSize > req.KeepBytes {
		log.Warn("--keep-bytes is below --rotate-size: each full file is pruned as soon as it is registered",
			"keep_bytes", req.KeepBytes, "rotate_size", req.RotateSize)
	}
	// A capture that would stop at once for want of space does not start.
	guards, err := spaceGuards(st, cmp.Or(req.Spool, st.Path("capture", "spool")), req.MinFree)
	if err != nil {
		return nil, err
	}
	for _, g := range guards {
		if _, err := g.Check(0); err != nil {
			return nil, err
		}
	}
	var rules *firewall.LeaseRules
	var fw *firewall.NFT
	if !req.NoRules && req.Lease != "" {
		if lab == nil {
			return nil, fmt.Errorf("no rules can be applied for %s (or --no-rules): %w", req.Lease, labErr)
		}
		if fw, err = lab.LiveFirewall(); err != nil {
			return nil, err
		}
		rules, rec.Rules, err = leaseRules(st, req.Lease, rec, lab)
		if err != nil {
			return nil, err
		}
	}
	// Probe the interface now, so that a typo fails before rules change.
	probe, err := OpenAFPacket(rec.NetNS, rec.Iface, rec.Snaplen, prog, RingConfig{BlockSize: 1 << 12, Blocks: 1, Timeout: time.Second})
	if err != nil {
		return nil, &InputError{err}
	}
	probe.Close()

	unlock, ok, err := st.TryLock(ctx, "capture/lease/"+cmp.Or(req.Lease, rec.Iface))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &BusyError{fmt.Errorf("a capture is starting or stopping for %s", cmp.Or(req.Lease, rec.Iface))}
	}
	defer unlock()
	if id := runningFor(st, req.Lease, rec.Iface); id != "" {
		return nil, &BusyError{fmt.Errorf("capture %s is already running for %s", id, cmp.Or(req.Lease, rec.Iface))}
	}

	records.Init(rec, records.KindCapture, st.Now())
	rec.State = StateStarting
	rec.Clock = ClockNow()
	rec.Spool = cmp.Or(req.Spool, st.Path("capture", "spool"))
	rec.Spool = filepath.Join(rec.Spool, rec.ID)
	if err := os.MkdirAll(rec.Spool, 0o750); err != nil {
		return nil, err
	}
	if len(prog) > 0 {
		if err := writeBPF(filepath.Join(rec.Spool, "filter.bpf"), prog); err != nil {
			return nil, err
		}
	}
	if err := writeSensors(filepath.Join(rec.Spool, "sensors.list"), req.Sensors); err != nil {
		return nil, err
	}
	if err := st.Create(ctx, rec); err != nil {
		return nil, err
	}
	if rules != nil {
		// The tap is bound to the guest's MAC and address before its rules
		// apply: they match only what comes in by it.
		hw, err := net.ParseMAC(mac)
		if err != nil {
			return nil, failStart(ctx, st, rec, &InputError{fmt.Errorf("lease %s: no valid MAC (%q) to bind its tap %s to", req.Lease, mac, rec.Iface)})
		}
		if err := netlab.AttachPort(ctx, lab.Config, netlab.Port{Name: rec.Iface, MAC: hw, IP: rules.IP}); err != nil {
			return nil, failStart(ctx, st, rec, err)
		}
		if err := fw.ApplyLease(ctx, *rules); err != nil {
			return nil, failStart(ctx, st, rec, err)
		}
		if lab.Config.DHCP && mac != "" {
			// The guest's fixed address, served by the lab's DHCP.
			if err := netlab.SetDHCPHost(lab.Dir, req.Lease, mac, rules.IP); err != nil {
				return nil, failStart(ctx, st, rec, err)
			}
		}
	}
	if err := spawn(ctx, st, rec, req.Daemon); err != nil {
		if rules != nil {
			if rerr := fw.RemoveLease(context.WithoutCancel(ctx), rules.Lease); rerr != nil {
				err = errors.Join(err, fmt.Errorf("rolling back rules: %w", rerr))
			}
		}
		return nil, failStart(ctx, st, rec, err)
	}
	if err := st.Get(rec.ID, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

func failStart(ctx context.Context, st *state.Store, rec *records.Capture, err error) error {
	var c records.Capture
	st.Update(context.WithoutCancel(ctx), rec.ID, &c, func(bool) error {
		c.State, c.Error = StateFailed, err.Error()
		if c.Rules != nil {
			c.Rules.Applied = false
		}
		return nil
	})
	return err
}

// InputError is a refused request (bad plan, filter, interface): exit 65.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

// BusyError is a capture already running or being changed: exit 75.
type BusyError struct{ Err error }

func (e *BusyError) Error() string { return e.Err.Error() }
func (e *BusyError) Unwrap() error { return e.Err }

// leaseRules compiles the lease's plan into its rule plan.
func leaseRules(st *state.Store, lease string, rec *records.Capture, lab *netlab.Lab) (*firewall.LeaseRules, *records.RuleSummary, error) {
	ip, err := netip.ParseAddr(rec.IP)
	if err != nil {
		return nil, nil, &InputError{fmt.Errorf("lease %s: no valid IP (%q); give --ip", lease, rec.IP)}
	}
	pol := records.NetPolicy{Mode: "sinkhole"}
	if rec.Plan != "" {
		var p records.Plan
		if err := st.Get(rec.Plan, &p); err != nil {
			return nil, nil, &InputError{fmt.Errorf("plan %s: %w", rec.Plan, err)}
		}
		pol = p.Network
	}
	if pol.Mode != "sinkhole" && pol.Mode != "allowlist" {
		return nil, nil, &InputError{fmt.Errorf("plan %s: network mode %q (sinkhole or allowlist)", rec.Plan, pol.Mode)}
	}
	rate, err := firewall.ParseRate(pol.RateLimit)
	if err != nil {
		return nil, nil, &InputError{fmt.Errorf("plan %s: %w", rec.Plan, err)}
	}
	// A plan without a rate gets the default: a rate-limit verdict is never
	// unlimited.
	if rate.Value == 0 {
		rate = firewall.DefaultRate
	}
	lr := &firewall.LeaseRules{Lease: lease, IP: ip, Port: rec.Iface, Rate: rate, AllowSMTP: pol.AllowSMTP}
	return lr, &records.RuleSummary{Table: lab.Config.Table, Mode: pol.Mode, RateLimit: rate.String(),
		AllowSMTP: pol.AllowSMTP, Applied: true}, nil
}

func writeBPF(path string, prog []unix.SockFilter) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\n", len(prog))
	for _, in := range prog {
		fmt.Fprintf(&b, "%d %d %d %d\n", in.Code, in.Jt, in.Jf, in.K)
	}
	return os.WriteFile(path, []byte(b.String()), 0o640)
}

func writeSensors(path string, names []string) error {
	return os.WriteFile(path, []byte(strings.Join(names, "\n")), 0o640)
}

// spawn starts the daemon detached and waits until it answers.
func spawn(ctx context.Context, st *state.Store, rec *records.Capture, argv []string) error {
	logf, err := os.OpenFile(filepath.Join(rec.Spool, "daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], append(append(argv[1:], st.Flags()...), "daemon", rec.ID)...)
	// A fleet's database URL goes in the environment: a command line is
	// readable by every user of the host.
	cmd.Env = append(os.Environ(), st.Environ()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the capture daemon: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := Call(cctx, st, rec.ID, "status", "")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(filepath.Join(rec.Spool, "daemon.log"))
			return fmt.Errorf("capture daemon exited (%v): %s", err, strings.TrimSpace(lastLines(string(b), 3)))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond): // the socket appears without an event to wait on
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			return errors.New("capture daemon did not answer within 15s")
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// RunDaemon is "tb-capture daemon ID": it opens the capture and serves it.
func RunDaemon(ctx context.Context, st *state.Store, log *slog.Logger, id string) error {
	var rec records.Capture
	if err := st.Get(id, &rec); err != nil {
		return err
	}
	var prog []unix.SockFilter
	if b, err := os.ReadFile(filepath.Join(rec.Spool, "filter.bpf")); err == nil {
		if prog, err = ParseBPF(string(b)); err != nil {
			return err
		}
	}
	d := &Daemon{St: st, ID: id, Log: log}
	if b, err := os.ReadFile(filepath.Join(rec.Spool, "sensors.list")); err == nil {
		for _, name := range strings.Fields(string(b)) {
			s, err := LoadSensor(SensorsDir(st), name)
			if err != nil {
				return err
			}
			d.Sensors = append(d.Sensors, s)
		}
	}
	src, err := OpenAFPacket(rec.NetNS, rec.Iface, rec.Snaplen, prog, DefaultRing)
	if err != nil {
		return d.fail(ctx, err)
	}
	d.Source = src
	defer src.Close()
	return d.Serve(ctx)
}

// minBoundSnaplen is the frame's bytes PortBinding.Passes reads at most: an
// Ethernet header, an IPv4 header with options and a UDP header's ports.
const minBoundSnaplen = 14 + 60 + 4

// portBinding is the binding b records.
func portBinding(b *records.PortBound) (*firewall.PortBinding, error) {
	mac, err := net.ParseMAC(b.MAC)
	if err != nil || len(mac) != 6 {
		return nil, fmt.Errorf("port binding: MAC %q is not an Ethernet address", b.MAC)
	}
	ip, err := netip.ParseAddr(b.IP)
	if err != nil || !ip.Is4() {
		return nil, fmt.Errorf("port binding: %q is not an IPv4 address", b.IP)
	}
	return &firewall.PortBinding{MAC: mac, IP: ip}, nil
}

// runningFor finds a running capture of a lease (or, without lease, of an
// interface) whose daemon is alive.
func runningFor(st *state.Store, lease, iface string) string {
	mine := func(c *records.Capture) bool {
		return (c.State == StateRunning || c.State == StateStarting) && (lease != "" || c.Lease == "" && c.Iface == iface)
	}
	var found []*records.Capture
	if lease != "" {
		found, _ = state.FindBy(st, records.KindCapture, records.KeyLease, lease, mine)
	} else {
		found, _ = state.Find(st, records.KindCapture, mine)
	}
	for _, c := range found {
		if alive(st, c) {
			return c.ID
		}
	}
	return ""
}

func alive(st *state.Store, c *records.Capture) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := Call(ctx, st, c.ID, "status", "")
	return err == nil
}

// Find resolves --capture or --lease to the capture to act on: the given
// capture, or the lease's newest capture.
func Find(st *state.Store, captureID, lease string) (*records.Capture, error) {
	var c records.Capture
	if captureID != "" {
		if err := st.Get(captureID, &c); err != nil {
			return nil, err
		}
		return &c, nil
	}
	if lease == "" {
		return nil, &InputError{errors.New("give --lease or --capture")}
	}
	latest, err := state.LatestBy[records.Capture](st, records.KindCapture, records.KeyLease, lease, nil)
	if errors.Is(err, state.ErrNotFound) {
		return nil, fmt.Errorf("no capture for lease %s: %w", lease, state.ErrNotFound)
	}
	return latest, err
}

// Rotate closes the current file of a running capture and returns the
// artifacts registered.
func Rotate(ctx context.Context, st *state.Store, c *records.Capture, cycle string) ([]records.Artifact, error) {
	rep, err := Call(ctx, st, c.ID, "rotate", cycle)
	if err != nil {
		return nil, err
	}
	return artifacts(st, rep.Artifacts)
}

func artifacts(st *state.Store, ids []string) ([]records.Artifact, error) {
	var out []records.Artifact
	for _, id := range ids {
		var a records.Artifact
		if err := st.Get(id, &a); err != nil {
			return out, err
		}
		out = append(out, a)
	}
	return out, nil
}

// Stop stops a capture (flushing and registering its last file), then
// removes the lease's rules. A capture whose daemon is gone is marked
// stopped and its rules are removed all the same.
func Stop(ctx context.Context, st *state.Store, c *records.Capture) (*records.Capture, []records.Artifact, error) {
	var arts []records.Artifact
	var errs []error
	if rep, err := Call(ctx, st, c.ID, "stop", ""); err == nil {
		arts, err = artifacts(st, rep.Artifacts)
		errs = append(errs, err)
	} else if !errors.Is(err, errNotRunning) {
		errs = append(errs, err)
	}
	if err := removeRules(ctx, st, c); err != nil {
		errs = append(errs, err)
	}
	var out records.Capture
	err := st.Update(ctx, c.ID, &out, func(bool) error {
		if out.State == StateRunning || out.State == StateStarting {
			out.State = StateStopped
			if out.Error == "" {
				out.Error = "daemon was not running at stop"
			}
			now := st.Now()
			out.StoppedAt = &now
		}
		if out.Rules != nil {
			out.Rules.Applied = false
		}
		return nil
	})
	errs = append(errs, err)
	return &out, arts, errors.Join(errs...)
}

func removeRules(ctx context.Context, st *state.Store, c *records.Capture) error {
	if c.Rules == nil || !c.Rules.Applied || c.Lease == "" {
		return nil
	}
	lab, err := netlab.Open(st, c.Lab)
	if err != nil {
		return nil // the lab is down: its tables, and the rules, are gone
	}
	fw, err := lab.Firewall()
	if err != nil {
		return err
	}
	if err := netlab.SetDHCPHost(lab.Dir, c.Lease, "", netip.Addr{}); err != nil {
		return err
	}
	return fw.RemoveLease(ctx, c.Lease)
}
