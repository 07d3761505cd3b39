package capture

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/google/gopacket/pcapgo"

	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Action is one thing reconcile did (or, with dry run, would do).
type Action struct {
	Action  string `json:"action"`
	Lease   string `json:"lease,omitempty"`
	Capture string `json:"capture,omitempty"`
	Port    string `json:"port,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Reason  string `json:"reason"`
	Error   string `json:"error,omitempty"`
}

func leaseOfTag(tag string) string { return "lease_" + strings.ToUpper(tag) }

// leaseGone reports whether a lease record is missing or released.
func leaseGone(st *state.Store, id string) (bool, string) {
	var l Lease
	if err := st.Get(id, &l); err != nil {
		if errors.Is(err, state.ErrNotFound) {
			return true, "lease record gone"
		}
		return false, ""
	}
	if l.Gone() {
		return true, "lease " + l.State
	}
	return false, ""
}

// Reconcile finds what a crash left behind, whose lease is gone, and
// removes it: captures whose daemon died, their orphaned sensors, running
// captures of released leases, rules of leases that are gone, bridge
// ports that no longer exist.
func Reconcile(ctx context.Context, st *state.Store, lab string, dryRun bool) ([]Action, error) {
	var acts []Action
	do := func(a Action, fn func() error) {
		if !dryRun && fn != nil {
			if err := fn(); err != nil {
				a.Error = err.Error()
			}
		}
		acts = append(acts, a)
	}
	running, err := state.Find(st, records.KindCapture, isRunning)
	if err != nil {
		return nil, err
	}
	for _, c := range running {
		if !alive(st, c) {
			for _, s := range c.Sensors {
				if s.State == StateRunning && s.PID > 0 && sensorProcess(s.PID, c.Spool) {
					pid := s.PID
					do(Action{Action: "kill-sensor", Capture: c.ID, PID: pid, Reason: "its capture daemon died"},
						func() error { return syscall.Kill(-pid, syscall.SIGTERM) })
				}
			}
			for _, f := range leftovers(c.Spool) {
				f := f
				do(Action{Action: "recover-file", Capture: c.ID, Lease: c.Lease, Reason: "written before the daemon died: " + filepath.Base(f)},
					func() error { return recoverFile(ctx, st, c, f) })
			}
			do(Action{Action: "mark-failed", Capture: c.ID, Lease: c.Lease, Reason: "capture daemon is not running"}, func() error {
				var u records.Capture
				return st.Update(ctx, c.ID, &u, func(bool) error {
					u.State, u.Error = StateFailed, "capture daemon died"
					now := st.Now()
					u.StoppedAt = &now
					for i := range u.Sensors {
						if u.Sensors[i].State == StateRunning {
							u.Sensors[i].State, u.Sensors[i].PID = StateFailed, 0
						}
					}
					return nil
				})
			})
			continue
		}
		if c.Lease != "" {
			if gone, why := leaseGone(st, c.Lease); gone {
				do(Action{Action: "stop-capture", Capture: c.ID, Lease: c.Lease, Reason: why}, func() error {
					_, _, err := Stop(ctx, st, c)
					return err
				})
			}
		}
	}

	m, err := netlab.Open(st, lab)
	if err != nil {
		return acts, nil // no lab: no rules or ports to look at
	}
	fw, err := m.Firewall()
	if err != nil {
		return acts, err
	}
	fst, err := fw.Status(ctx)
	if err != nil {
		return acts, err
	}
	for _, ls := range fst.Leases {
		lease := leaseOfTag(ls.Lease)
		gone, why := leaseGone(st, lease)
		if !gone {
			// A lease that lives keeps its rules (a crashed daemon is
			// restarted by tb-capture start); only gone leases lose them.
			continue
		}
		do(Action{Action: "remove-rules", Lease: lease, Reason: why}, func() error {
			if err := fw.RemoveLease(ctx, lease); err != nil {
				return err
			}
			netlab.SetDHCPHost(m.Dir, lease, "", netip.Addr{})
			return markRulesRemoved(ctx, st, lease)
		})
	}
	ports, err := fw.Ports(ctx)
	if err == nil {
		var gonePorts []string
		_ = netns.Do(m.Config.HostNSPath(), func() error {
			for _, p := range ports {
				if _, err := net.InterfaceByName(p); err != nil {
					gonePorts = append(gonePorts, p)
				}
			}
			return nil
		})
		for _, p := range gonePorts {
			p := p
			do(Action{Action: "forget-port", Port: p, Reason: "interface gone"}, func() error {
				// Its binding and the host's static neighbour entry go too.
				return netlab.DetachPort(ctx, m.Config, p)
			})
		}
	}
	return acts, nil
}

// sensorProcess checks that pid is a sensor of this capture (its working
// directory is under the spool), not a recycled pid.
func sensorProcess(pid int, spool string) bool {
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	return err == nil && spool != "" && strings.HasPrefix(cwd, spool)
}

// LeaseReport is one line of "tb-capture status".
type LeaseReport struct {
	Lease    string                 `json:"lease"`
	IP       string                 `json:"ip,omitempty"`
	Capture  string                 `json:"capture,omitempty"`
	State    string                 `json:"state,omitempty"`
	Iface    string                 `json:"iface,omitempty"`
	Packets  uint64                 `json:"packets"`
	Drops    uint64                 `json:"drops"`
	Files    int                    `json:"files"`
	Sensors  []records.SensorStatus `json:"sensors,omitempty"`
	Elements map[string]int         `json:"elements,omitempty"`
	Rules    []firewall.RuleCounter `json:"rules,omitempty"`
}

// Status reports, per lease with rules or a capture, what is applied and
// its counters.
func Status(ctx context.Context, st *state.Store, lab string) ([]LeaseReport, error) {
	by := map[string]*LeaseReport{}
	var order []string
	get := func(lease string) *LeaseReport {
		if r, ok := by[lease]; ok {
			return r
		}
		r := &LeaseReport{Lease: lease}
		by[lease] = r
		order = append(order, lease)
		return r
	}
	running, err := state.Find(st, records.KindCapture, isRunning)
	if err != nil {
		return nil, err
	}
	for _, c := range running {
		key := cmp.Or(c.Lease, c.Iface)
		r := get(key)
		r.Capture, r.State, r.Iface, r.IP = c.ID, c.State, c.Iface, c.IP
		r.Files, r.Sensors = c.Files, c.Sensors
		if rep, err := Call(ctx, st, c.ID, "status", ""); err == nil {
			r.Packets, r.Drops = rep.Packets, rep.Drops
		} else {
			r.State = "daemon-gone"
		}
	}
	if m, err := netlab.Open(st, lab); err == nil {
		fw, err := m.Firewall()
		if err != nil {
			return nil, err
		}
		fst, err := fw.Status(ctx)
		if err != nil {
			return nil, err
		}
		for _, ls := range fst.Leases {
			r := get(leaseOfTag(ls.Lease))
			if ls.IP.IsValid() {
				r.IP = ls.IP.String()
			}
			r.Elements, r.Rules = ls.Elements, ls.Rules
		}
	}
	out := make([]LeaseReport, 0, len(order))
	for _, k := range order {
		out = append(out, *by[k])
	}
	return out, nil
}

// leftovers are the pcap files a dead daemon left in its spool.
func leftovers(spool string) []string {
	if spool == "" {
		return nil
	}
	files, _ := filepath.Glob(filepath.Join(spool, "capture-*.pcap"))
	return files
}

// recoverFile registers what a dead daemon wrote: the file up to its last
// whole packet, as an artifact with reason "recovered".
func recoverFile(ctx context.Context, st *state.Store, c *records.Capture, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		// Not even a header: nothing to keep.
		return os.Remove(path)
	}
	a := &records.Artifact{Cycle: c.Cycle, Lease: c.Lease, Capture: c.ID, Type: "pcap", Reason: "recovered",
		ContentType: "application/vnd.tcpdump.pcap", ParserStatus: "pending", Iface: c.Iface, Filter: c.Filter, Snaplen: c.Snaplen}
	good := int64(24)
	for {
		_, ci, err := r.ReadPacketData()
		if err != nil {
			break // io.EOF, or a record cut short by the crash
		}
		ts := ci.Timestamp.UTC()
		if a.Packets == 0 {
			a.FirstTS = &ts
		}
		a.LastTS = &ts
		a.Packets++
		good += 16 + int64(ci.CaptureLength)
	}
	if err := os.Truncate(path, good); err != nil {
		return err
	}
	if _, err := f.Seek(0, 0); err != nil {
		return err
	}
	blob, unlock, err := storeBlob(ctx, st, f)
	if err != nil {
		return err
	}
	a.URI, a.SHA256, a.Size = blob.URI(), blob.SHA256, blob.Size
	records.Init(a, records.KindArtifact, st.Now())
	err = st.Create(ctx, a)
	unlock()
	if err != nil {
		return err
	}
	var u records.Capture
	if err := st.Update(ctx, c.ID, &u, func(bool) error {
		u.Artifacts = append(u.Artifacts, a.ID)
		u.Files++
		u.Packets += a.Packets
		return nil
	}); err != nil {
		return err
	}
	return os.Remove(path)
}

// markRulesRemoved records on a lease's captures that its rules are gone.
func markRulesRemoved(ctx context.Context, st *state.Store, lease string) error {
	applied, err := state.FindBy(st, records.KindCapture, records.KeyLease, lease, func(c *records.Capture) bool {
		return c.Rules != nil && c.Rules.Applied
	})
	if err != nil {
		return err
	}
	for _, c := range applied {
		id := c.ID
		var u records.Capture
		if err := st.Update(ctx, id, &u, func(bool) error {
			if u.Rules != nil {
				u.Rules.Applied = false
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

func isRunning(c *records.Capture) bool { return c.State == StateRunning || c.State == StateStarting }
