package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/dnsname"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

type labFlag struct {
	Lab string `name:"lab" default:"default" help:"Lab instance name."`
}

type netUpCmd struct {
	labFlag
	HostNS        string   `name:"host-ns" placeholder:"NAME" help:"Network namespace playing the host (default: this one)."`
	Bridge        string   `name:"bridge" default:"tb-lab0" help:"Guest bridge."`
	LabNet        string   `name:"lab-net" default:"10.13.37.0/24" help:"Guest subnet; the gateway is its first address."`
	SinkNS        string   `name:"sink-ns" default:"tb-sink" help:"Sinkhole network namespace."`
	SinkVeth      string   `name:"sink-veth" default:"tb-sink0" help:"Host end of the link to the sinkhole."`
	SinkNet       string   `name:"sink-net" default:"10.13.38.0/24" help:"Sinkhole link subnet (host .1, sinkhole .2)."`
	Table         string   `name:"table" default:"talkbox" help:"Name of talkbox's nftables tables (talkbox*)."`
	Uplink        string   `name:"uplink" help:"Interface forwarded (allow-listed) traffic leaves by."`
	Upstream      string   `name:"upstream" help:"Resolver allow-listed names are forwarded to."`
	Documentation bool     `name:"documentation" help:"Let documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24) stand in for the internet."`
	SMTPPorts     []uint16 `name:"smtp-port" help:"SMTP ports never forwarded unless a plan forces them (default 25, 465, 587, 2525)."`
	NoINetSim     bool     `name:"no-inetsim" help:"Do not run INetSim in the sinkhole."`
	NoDNS         bool     `name:"no-dns" help:"Do not run the DNS sinkhole."`
	DHCP          bool     `name:"dhcp" help:"Serve DHCP to guests (static leases from tb-lease)."`
	INetSimSvc    []string `name:"inetsim-service" help:"INetSim services to start (default: the common ones)."`
}

func (c *netUpCmd) Run(env *cli.Env) error {
	cfg := netlab.Config{Name: c.Lab, HostNS: c.HostNS, Bridge: c.Bridge, SinkNS: c.SinkNS, SinkVeth: c.SinkVeth,
		Table: c.Table, Uplink: c.Uplink, Documentation: c.Documentation, SMTPPorts: c.SMTPPorts,
		INetSim: !c.NoINetSim, DNS: !c.NoDNS, DHCP: c.DHCP, INetSimServices: c.INetSimSvc}
	var err error
	if cfg.LabNet, err = netip.ParsePrefix(c.LabNet); err != nil {
		return fault.Usage(err)
	}
	if cfg.SinkNet, err = netip.ParsePrefix(c.SinkNet); err != nil {
		return fault.Usage(err)
	}
	if c.Upstream != "" {
		if cfg.Upstream, err = netip.ParseAddr(c.Upstream); err != nil {
			return fault.Usage(err)
		}
	}
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	cfg.Dir = netlab.Dir(st, cfg.Name)
	cfg.Defaults()
	if err := cfg.Check(); err != nil {
		return fault.Usage(err)
	}
	rep, err := capture.UpLab(env.Ctx, st, cfg)
	if err != nil {
		return err
	}
	lab, err := netlab.Open(st, cfg.Name)
	if err != nil {
		return err
	}
	s, err := lab.Status(env.Ctx)
	if err != nil {
		return err
	}
	if err := records.PrintLine(env.Stdout, records.LineLabStatus, labStatus{s, rep}); err != nil {
		return err
	}
	// The lab stays up, recorded as failing its check.
	return fault.Failure(rep.Err())
}

// labStatus is the lab-status line: the lab as it is and its last
// containment check.
type labStatus struct {
	*netlab.Status
	Check *netlab.ProbeReport `json:"check,omitempty"`
}

type netCheckCmd struct{ labFlag }

// Run re-runs the containment probes on a lab that is up, records the
// result and prints it; it exits 1 when a probe failed, 69 when the lab is
// not up.
func (c *netCheckCmd) Run(env *cli.Env) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	lab, err := netlab.Open(st, c.Lab)
	if err != nil {
		return err
	}
	rep, err := lab.Check(env.Ctx)
	if err != nil {
		return err
	}
	if err := records.PrintLine(env.Stdout, records.LineLabCheck, rep); err != nil {
		return err
	}
	return fault.Failure(rep.Err())
}

type netDownCmd struct{ labFlag }

func (c *netDownCmd) Run(env *cli.Env) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	return capture.Fault(netlab.Down(env.Ctx, netlab.Dir(st, c.Lab)))
}

type netStatusCmd struct{ labFlag }

// Run exits 69 when the lab is not up, 1 when it is only partly up.
func (c *netStatusCmd) Run(env *cli.Env) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	lab, err := netlab.Open(st, c.Lab)
	if err != nil {
		return err
	}
	s, err := lab.Status(env.Ctx)
	if err != nil {
		return err
	}
	check, err := lab.LastCheck()
	if err != nil {
		return err
	}
	if err := records.PrintLine(env.Stdout, records.LineLabStatus, labStatus{s, check}); err != nil {
		return err
	}
	if !s.Up {
		return fault.Failure(fmt.Errorf("lab %q is only partly up", s.Name))
	}
	return nil
}

type netDNSAllowCmd struct {
	labFlag
	Names []string `arg:"" optional:"" help:"Names forwarded to the upstream resolver, each exactly (its subdomains stay sinkholed); none clears the list."`
}

// Run replaces the names the DNS sinkhole forwards upstream. A name that
// may not be forwarded (not a DNS name, or a public suffix such as "com"
// whose forward would let every name under it through) is refused.
func (c *netDNSAllowCmd) Run(env *cli.Env) error {
	for _, n := range c.Names {
		if _, err := dnsname.Forwardable(n); err != nil {
			return fault.DataErr(fmt.Errorf("invalid name %w", err))
		}
	}
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	lab, err := netlab.Open(st, c.Lab)
	if err != nil {
		return err
	}
	return lab.SetAllowedNames(c.Names)
}

type startCmd struct {
	labFlag
	Lease       string        `name:"lease" help:"Lease ID: its tap, IP and plan are read from the lease record."`
	Iface       string        `name:"iface" help:"Interface to capture (default: the lease's tap)."`
	IP          string        `name:"ip" help:"Guest IP (default: the lease's)."`
	NetNS       string        `name:"netns" help:"Network namespace of the interface (default: the lab's host)."`
	Plan        string        `name:"plan" help:"Plan whose network policy applies (default: the lease's)."`
	Cycle       string        `name:"cycle" help:"Cycle the first file is registered for."`
	Snaplen     int           `name:"snaplen" default:"262144" help:"Bytes kept per packet."`
	Filter      string        `name:"filter" help:"pcap-filter(7) expression (compiled with tcpdump -ddd)."`
	BPF         string        `name:"bpf" help:"Classic BPF program as tcpdump -ddd prints it, or @FILE."`
	RotateSize  int64         `name:"rotate-size" placeholder:"BYTES" help:"Start a new file at this size."`
	RotateEvery time.Duration `name:"rotate-every" help:"Start a new file this often."`
	Sensors     []string      `name:"sensor" help:"External sensor to run beside the capture: tcpdump, dumpcap, or NAME for STATE/tb-capture/sensors/NAME.json."`
	Spool       string        `name:"spool" type:"path" help:"Directory for files being written (default: in the state directory)."`
	NoRules     bool          `name:"no-rules" help:"Capture only; apply no containment rules."`
	retentionFlags
	MinFree        diskspace.Size `name:"min-free" default:"1G" placeholder:"SIZE" help:"Stop the capture (the daemon exits 75) before less than SIZE (default ${default}) is free on the state's or the spool's file system; 0 and --min-free-percent 0: never."`
	MinFreePercent float64        `name:"min-free-percent" default:"2" placeholder:"P" help:"... or less than P percent of it (default ${default}; the larger bound wins)."`
}

type retentionFlags struct {
	KeepDays  float64        `name:"keep-days" placeholder:"N" help:"Prune the lease's pcaps and flow logs older than N days."`
	KeepBytes diskspace.Size `name:"keep-bytes" placeholder:"SIZE" help:"Prune the lease's oldest pcaps and flow logs beyond SIZE (e.g. 20G)."`
}

func (f retentionFlags) retention() capture.Retention {
	return capture.Retention{KeepDays: f.KeepDays, KeepBytes: int64(f.KeepBytes)}
}

func (c *startCmd) Run(env *cli.Env) (err error) {
	req := capture.StartRequest{Lease: c.Lease, Plan: c.Plan, Cycle: c.Cycle, Lab: c.Lab,
		Iface: c.Iface, IP: c.IP, NetNS: c.NetNS, Snaplen: c.Snaplen, Filter: c.Filter, BPF: c.BPF,
		RotateSize: c.RotateSize, RotateEvery: c.RotateEvery, Sensors: c.Sensors, Spool: c.Spool, NoRules: c.NoRules,
		Retention: c.retention(), MinFree: diskspace.Threshold{Bytes: int64(c.MinFree), Percent: c.MinFreePercent}}
	if req.Lease == "" && req.Iface == "" && env.StdinPiped() {
		// A pipeline's "tb-lease acquire | tb-capture start": the lease
		// is the first lease record (or a capture's), other records are
		// passed over and counted in the log.
		if req.Lease, err = leaseFromStdin(env.Stdin, env.Log); err != nil {
			return err
		}
	}
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	if strings.HasPrefix(req.BPF, "@") {
		b, err := os.ReadFile(req.BPF[1:])
		if err != nil {
			return fault.Usage(err)
		}
		req.BPF = string(b)
	}
	if req.Daemon, err = daemonArgv(); err != nil {
		return err
	}
	rec, err := capture.Start(env.Ctx, st, env.Log, req)
	if err != nil {
		return capture.Fault(err)
	}
	w := records.NewWriter(env.Stdout)
	defer w.Finish(&err)
	return w.Write(rec)
}

// leaseFromStdin is the lease of the first lease or capture record on in,
// which it reads to the end (so that the tool before it never sees a closed
// pipe); the records it does not use it counts, by kind, in log.
func leaseFromStdin(in io.Reader, log *slog.Logger) (string, error) {
	rd := records.NewReader(in, "stdin")
	lease := ""
	passed := records.PassedOver{}
	for {
		rec, err := rd.Record()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", err
		}
		h := rec.Header()
		switch {
		case lease != "":
			passed.Add(h.Kind)
		case h.Kind == records.KindLease:
			lease = h.ID
		case h.Kind == records.KindCapture && rec.(*records.Capture).Lease != "":
			lease = rec.(*records.Capture).Lease
		default:
			passed.Add(h.Kind)
		}
	}
	passed.Log(log)
	if lease == "" {
		return "", fault.DataErr(errors.New("stdin: no lease or capture record (give --lease or --iface)"))
	}
	return lease, nil
}

// daemonArgv is how "start" runs the daemon: this same program.
func daemonArgv() ([]string, error) {
	exe := os.Args[0]
	if !strings.Contains(exe, "/") {
		p, err := exec.LookPath(exe)
		if err != nil {
			if p, err = os.Executable(); err != nil {
				return nil, err
			}
		}
		exe = p
	}
	abs, err := filepath.Abs(exe)
	if err != nil {
		return nil, err
	}
	return []string{abs}, nil
}

type pruneCmd struct {
	Lease   string `name:"lease" xor:"which" required:"" help:"Prune the lease's artifacts, of all its captures."`
	Capture string `name:"capture" xor:"which" required:"" help:"Prune a capture's artifacts (a capture without a lease)."`
	retentionFlags
	DryRun bool `name:"dry-run" short:"n" help:"Only print what would be pruned."`
}

// Run prints the artifacts it pruned (or would prune), oldest first.
// Without --keep-days or --keep-bytes it applies the retention of the
// lease's (or the capture's) newest capture.
func (c *pruneCmd) Run(env *cli.Env) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	ret, err := capture.RetentionFor(st, c.Capture, c.Lease, c.retention())
	if err != nil {
		return err
	}
	res, err := capture.Prune(env.Ctx, st, env.Log, capture.PruneRequest{Lease: c.Lease, Capture: c.Capture, Retention: ret, DryRun: c.DryRun})
	w := records.NewWriter(env.Stdout)
	if res != nil {
		for i := range res.Pruned {
			if werr := w.Write(&res.Pruned[i]); werr != nil {
				return werr
			}
		}
	}
	// What was pruned is printed even when a later deletion failed.
	if werr := w.Flush(); werr != nil {
		return werr
	}
	return capture.Fault(err)
}

type which struct {
	Lease   string `name:"lease" xor:"which" required:"" help:"The lease's current capture."`
	Capture string `name:"capture" xor:"which" required:"" help:"A capture ID."`
}

type rotateCmd struct {
	which
	Cycle string `name:"cycle" help:"Cycle the closed file belongs to (and later files, until changed)."`
}

func (c *rotateCmd) Run(env *cli.Env) (err error) {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	cp, err := capture.Find(st, c.Capture, c.Lease)
	if err != nil {
		return capture.Fault(err)
	}
	arts, err := capture.Rotate(env.Ctx, st, cp, c.Cycle)
	if err != nil {
		return capture.Fault(err)
	}
	w := records.NewWriter(env.Stdout)
	defer w.Finish(&err)
	for i := range arts {
		if err := w.Write(&arts[i]); err != nil {
			return err
		}
	}
	return nil
}

type stopCmd struct{ which }

// Run prints the last artifacts, then the capture.
func (c *stopCmd) Run(env *cli.Env) (err error) {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	cp, err := capture.Find(st, c.Capture, c.Lease)
	if err != nil {
		return capture.Fault(err)
	}
	out, arts, stopErr := capture.Stop(env.Ctx, st, cp)
	w := records.NewWriter(env.Stdout)
	defer w.Finish(&err)
	for i := range arts {
		if err := w.Write(&arts[i]); err != nil {
			return errors.Join(capture.Fault(stopErr), err)
		}
	}
	if out != nil && out.ID != "" {
		if err := w.Write(out); err != nil {
			return errors.Join(capture.Fault(stopErr), err)
		}
	}
	return capture.Fault(stopErr)
}

type allowCmd struct {
	labFlag
	Lease string   `name:"lease" required:"" help:"Lease whose allow set changes."`
	Add   []string `name:"add" placeholder:"IP:PORT/PROTO[=VERDICT]" help:"Element to add (verdict forward, rate-limit, redirect or drop)."`
	Del   []string `name:"del" placeholder:"IP:PORT/PROTO" help:"Element to delete."`
}

// Run changes the lease's live allow set in one batch, then prints the set.
func (c *allowCmd) Run(env *cli.Env) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	lab, err := netlab.Open(st, c.Lab)
	if err != nil {
		return err
	}
	fw, err := lab.LiveFirewall()
	if err != nil {
		return err
	}
	parse := func(in []string) ([]firewall.Element, error) {
		var out []firewall.Element
		for _, s := range in {
			e, err := firewall.ParseElement(s)
			if err != nil {
				return nil, fault.Usage(err)
			}
			out = append(out, e)
		}
		return out, nil
	}
	a, err := parse(c.Add)
	if err != nil {
		return err
	}
	d, err := parse(c.Del)
	if err != nil {
		return err
	}
	if len(a)+len(d) > 0 {
		if err := fw.ApplyAllowSet(env.Ctx, c.Lease, a, d); err != nil {
			if errors.Is(err, firewall.ErrNoLease) {
				return fault.Failure(err)
			}
			return capture.Fault(err)
		}
	}
	els, err := fw.AllowSet(env.Ctx, c.Lease)
	if err != nil {
		return fault.Failure(err)
	}
	w := records.NewWriter(env.Stdout)
	for _, e := range els {
		if err := w.Line(records.LineAllowElement, e); err != nil {
			return err
		}
	}
	return w.Flush()
}

type reconcileCmd struct {
	labFlag
	DryRun bool `name:"dry-run" short:"n" help:"Only report what would be removed."`
}

func (c *reconcileCmd) Run(env *cli.Env) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	acts, err := capture.Reconcile(env.Ctx, st, c.Lab, c.DryRun)
	w := records.NewWriter(env.Stdout)
	for _, a := range acts {
		if werr := w.Line(records.LineReconcileAction, a); werr != nil {
			return werr
		}
	}
	// The actions taken are printed even when a later one failed.
	if werr := w.Flush(); werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	for _, a := range acts {
		if a.Error != "" {
			return fault.Failure(fmt.Errorf("%s %s%s: %s", a.Action, a.Lease, a.Capture, a.Error))
		}
	}
	return nil
}

type statusCmd struct{ labFlag }

func (c *statusCmd) Run(env *cli.Env) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	reps, err := capture.Status(env.Ctx, st, c.Lab)
	if err != nil {
		return err
	}
	w := records.NewWriter(env.Stdout)
	for _, r := range reps {
		if err := w.Line(records.LineCaptureStatus, r); err != nil {
			return err
		}
	}
	return w.Flush()
}

type daemonCmd struct {
	Capture string `arg:"" help:"Capture ID."`
}

// Run serves one capture; it exits 75 when it stopped for want of disk
// space.
func (c *daemonCmd) Run(env *cli.Env) error {
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	// The blobs the daemon stores (its pcaps, its sensors' files) keep
	// the capture's own free-space threshold, which it watches, rather
	// than the tools' default.
	var rec records.Capture
	if err := st.Get(c.Capture, &rec); err != nil {
		return capture.Fault(err)
	}
	st.Close()
	min := diskspace.Threshold{Bytes: rec.MinFree, Percent: rec.MinFreePercent}
	if st, err = env.OpenState(state.WithMinFree(min)); err != nil {
		return err
	}
	return capture.Fault(capture.RunDaemon(env.Ctx, st, env.Log, c.Capture))
}
