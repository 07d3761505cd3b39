// Command tb-capture owns the lab network, per-lease containment rules and
// packet capture.
package main

import (
	"net/netip"
	"os"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
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
		return cli.Usage(err)
	}
	if cfg.SinkNet, err = netip.ParsePrefix(c.SinkNet); err != nil {
		return cli.Usage(err)
	}
	if c.Upstream != "" {
		if cfg.Upstream, err = netip.ParseAddr(c.Upstream); err != nil {
			return cli.Usage(err)
		}
	}
	return capture.NetUp(env, cfg)
}

type netDownCmd struct{ labFlag }

func (c *netDownCmd) Run(env *cli.Env) error { return capture.NetDown(env, c.Lab) }

type netStatusCmd struct{ labFlag }

func (c *netStatusCmd) Run(env *cli.Env) error { return capture.NetStatus(env, c.Lab) }

type netDNSAllowCmd struct {
	labFlag
	Names []string `arg:"" optional:"" help:"Names (and their subdomains) forwarded to the upstream resolver; none clears the list."`
}

func (c *netDNSAllowCmd) Run(env *cli.Env) error { return capture.NetDNSAllow(env, c.Lab, c.Names) }

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

func (c *startCmd) Run(env *cli.Env) error {
	return capture.StartCmd(env, capture.StartRequest{Lease: c.Lease, Plan: c.Plan, Cycle: c.Cycle, Lab: c.Lab,
		Iface: c.Iface, IP: c.IP, NetNS: c.NetNS, Snaplen: c.Snaplen, Filter: c.Filter, BPF: c.BPF,
		RotateSize: c.RotateSize, RotateEvery: c.RotateEvery, Sensors: c.Sensors, Spool: c.Spool, NoRules: c.NoRules,
		Retention: c.retention(), MinFree: diskspace.Threshold{Bytes: int64(c.MinFree), Percent: c.MinFreePercent}})
}

type pruneCmd struct {
	Lease   string `name:"lease" xor:"which" required:"" help:"Prune the lease's artifacts, of all its captures."`
	Capture string `name:"capture" xor:"which" required:"" help:"Prune a capture's artifacts (a capture without a lease)."`
	retentionFlags
	DryRun bool `name:"dry-run" short:"n" help:"Only print what would be pruned."`
}

func (c *pruneCmd) Run(env *cli.Env) error {
	return capture.PruneCmd(env, c.Capture, c.Lease, c.retention(), c.DryRun)
}

type which struct {
	Lease   string `name:"lease" xor:"which" required:"" help:"The lease's current capture."`
	Capture string `name:"capture" xor:"which" required:"" help:"A capture ID."`
}

type rotateCmd struct {
	which
	Cycle string `name:"cycle" help:"Cycle the closed file belongs to (and later files, until changed)."`
}

func (c *rotateCmd) Run(env *cli.Env) error {
	return capture.RotateCmd(env, c.Capture, c.Lease, c.Cycle)
}

type stopCmd struct{ which }

func (c *stopCmd) Run(env *cli.Env) error { return capture.StopCmd(env, c.Capture, c.Lease) }

type allowCmd struct {
	labFlag
	Lease string   `name:"lease" required:"" help:"Lease whose allow set changes."`
	Add   []string `name:"add" placeholder:"IP:PORT/PROTO[=VERDICT]" help:"Element to add (verdict forward, rate-limit, redirect or drop)."`
	Del   []string `name:"del" placeholder:"IP:PORT/PROTO" help:"Element to delete."`
}

func (c *allowCmd) Run(env *cli.Env) error {
	return capture.AllowCmd(env, c.Lab, c.Lease, c.Add, c.Del)
}

type reconcileCmd struct {
	labFlag
	DryRun bool `name:"dry-run" short:"n" help:"Only report what would be removed."`
}

func (c *reconcileCmd) Run(env *cli.Env) error { return capture.ReconcileCmd(env, c.Lab, c.DryRun) }

type statusCmd struct{ labFlag }

func (c *statusCmd) Run(env *cli.Env) error { return capture.StatusCmd(env, c.Lab) }

type daemonCmd struct {
	Capture string `arg:"" help:"Capture ID."`
}

func (c *daemonCmd) Run(env *cli.Env) error { return capture.DaemonCmd(env, c.Capture) }

type tbCapture struct {
	cli.Globals
	Net struct {
		Up       netUpCmd       `cmd:"" help:"Bring the lab network up (idempotent)."`
		Down     netDownCmd     `cmd:"" help:"Remove exactly what 'net up' made."`
		Status   netStatusCmd   `cmd:"" help:"Show the lab network, its services and rule counters."`
		DNSAllow netDNSAllowCmd `cmd:"" name:"dns-allow" help:"Set the names the DNS sinkhole forwards upstream."`
	} `cmd:"" help:"The lab network: bridge, sinkhole, nftables."`
	Start     startCmd     `cmd:"" help:"Apply a lease's rules and start capture on its tap."`
	Rotate    rotateCmd    `cmd:"" help:"Close the current capture file and register it as an artifact."`
	Stop      stopCmd      `cmd:"" help:"Stop capture (registering the last file) and remove the lease's rules."`
	Prune     pruneCmd     `cmd:"" help:"Delete a lease's oldest pcaps and flow logs beyond a retention (records stay, marked pruned_at)."`
	Allow     allowCmd     `cmd:"" help:"Add or delete elements of a lease's live allow set, in one batch."`
	Reconcile reconcileCmd `cmd:"" help:"Remove rules, sensors and captures whose lease is gone."`
	Status    statusCmd    `cmd:"" help:"What is applied per lease, with counters."`
	Daemon    daemonCmd    `cmd:"" hidden:"" help:"Run one capture (started by 'start')."`
	List      cli.ListCmd  `cmd:"" help:"List captures and artifacts."`
	Get       cli.GetCmd   `cmd:"" help:"Print stored records by ID."`
}

func main() {
	os.Exit(cli.Run(tool(), &tbCapture{}, os.Args[1:]))
}

// tool is a function, not a variable, so that main_test.go can check the
// examples without package state.
func tool() cli.Tool {
	return cli.Tool{
		Name:        "tb-capture",
		Description: "Lab network, per-lease containment rules in nftables, and packet capture.",
		Kinds:       "capture,artifact",
		Examples: map[string][]string{
			"": {
				"tb-capture net up --uplink eth0 --upstream 9.9.9.9",
				"tb-capture start --lease lease_01JD... --rotate-every 1h",
			},
			"net": {
				"tb-capture net up --uplink eth0 --upstream 9.9.9.9",
				"tb-capture net status",
			},
			"net up": {
				"tb-capture net up --uplink eth0 --upstream 9.9.9.9",
				"tb-capture net up --no-inetsim --dhcp",
			},
			"net down":   {"tb-capture net down"},
			"net status": {"tb-capture net status"},
			"net dns-allow": {
				"tb-capture net dns-allow raw.githubusercontent.com",
				"tb-capture net dns-allow    # none: clears the list",
			},
			"start": {
				"tb-capture start --lease lease_01JD... --rotate-every 1h",
				"tb-capture start --lease lease_01JD... --rotate-every 1h --keep-days 3 --keep-bytes 20G --min-free 5G",
			},
			"prune": {
				"tb-capture prune --lease lease_01JD... --keep-bytes 20G --dry-run",
				"tb-capture prune --lease lease_01JD...    # the capture's own retention",
			},
			"rotate": {"tb-capture rotate --lease lease_01JD... --cycle cycle_01JD..."},
			"stop":   {"tb-capture stop --lease lease_01JD..."},
			"allow": {
				"tb-capture allow --lease lease_01JD... --add 203.0.113.5:443/tcp=rate-limit",
				"tb-capture allow --lease lease_01JD... --del 203.0.113.5:443/tcp",
			},
			"reconcile": {
				"tb-capture reconcile --dry-run",
				"tb-capture reconcile",
			},
			"status": {"tb-capture status"},
			"list":   {"tb-capture list --kind artifact --limit 10"},
			"get":    {"tb-capture get capture_01JD..."},
		},
	}
}
