// Command tb-lease owns long-lived sandbox VMs under libvirt: acquire, renew,
// release, snapshot and restore them, and place them over several hosts.
package main

import (
	"os"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/lease"
)

// common are the flags of every command that touches leases.
type common struct {
	Config string `name:"config" env:"TB_LEASE_CONFIG" type:"path" placeholder:"FILE" help:"Configuration (hosts, placement, pools, bridge); default <state>/tb-lease/config.json if present."`
	Bridge string `name:"bridge" env:"TB_LEASE_BRIDGE" placeholder:"BRIDGE" help:"Lab bridge guests are attached to (default tb-lab0)."`
	LabNet string `name:"lab-net" env:"TB_LEASE_LAB_NET" placeholder:"CIDR" help:"Lab network; its first address is the gateway (default 10.13.37.0/24)."`
}

func (c common) opts() lease.Options {
	return lease.Options{Config: c.Config, Bridge: c.Bridge, LabNet: c.LabNet}
}

type limits struct {
	VCPUs       int           `name:"vcpus" help:"vCPUs (default: the plan's, else the image's)."`
	Memory      int           `name:"memory" placeholder:"MIB" help:"Guest memory in MiB (default: the plan's, else the image's)."`
	Disk        int           `name:"disk" placeholder:"GIB" help:"Disk size in GiB (default: the plan's, else the image's)."`
	CPUQuota    int           `name:"cpu-quota" placeholder:"PCT" help:"Share of one host CPU each vCPU may use, in percent (0: no limit)."`
	TTL         time.Duration `name:"ttl" help:"Time to live (default: the plan's, else 1h)."`
	BootTimeout time.Duration `name:"boot-timeout" help:"Longest wait for the guest agent (default: the plan's, else 3m)."`
	Pool        string        `name:"pool" default:"default" help:"Quota pool."`
	Host        string        `name:"host" help:"Place on this configured host (placement explicit)."`
}

type acquireCmd struct {
	common
	limits
	Plan      string `name:"plan" placeholder:"ID" help:"Stored plan ID (default: the first plan record on stdin)."`
	Image     string `name:"image" placeholder:"REF" help:"Use this image (ID, SPEC or SPEC@VERSION) instead of matching."`
	Placement string `name:"placement" enum:",least-loaded,native-arch-first,explicit" default:"" help:"Placement strategy (default: the configuration's, else least-loaded)."`
	Accel     string `name:"accel" enum:"auto,kvm,tcg" default:"auto" help:"auto: KVM where a cached probe shows it runs guests, TCG otherwise."`
	Fresh     bool   `name:"fresh" help:"Always create a new lease (no reuse of an idle one)."`
	Holder    string `name:"holder" placeholder:"REF" help:"Record what the lease is acquired for (tb-run: the cycle), so that it can be found again if the acquirer dies before recording the lease."`
	DryRun    bool   `name:"dry-run" help:"Print the decision (image, reused lease or host and acceleration) and change nothing."`
}

func (c *acquireCmd) Run(env *cli.Env) error {
	return lease.AcquireCmd(env, c.opts(), c.Plan, lease.Request{
		Image: c.Image, VCPUs: c.VCPUs, MemoryMiB: c.Memory, DiskGiB: c.Disk, CPUQuota: c.CPUQuota, TTL: c.TTL,
		BootTimeout: c.BootTimeout, Pool: c.Pool, Host: c.Host, Placement: c.Placement, Accel: c.Accel, Fresh: c.Fresh, Holder: c.Holder, DryRun: c.DryRun,
	})
}

type listCmd struct {
	common
	State []string `name:"lease-state" help:"Only leases in these states (creating, busy, idle, failed, released, expired)."`
	Live  bool     `name:"live" help:"Only leases that hold a VM."`
	Host  string   `name:"host" help:"Only leases on this configured host."`
}

func (c *listCmd) Run(env *cli.Env) error {
	return lease.ListCmd(env, c.opts(), c.State, c.Live, c.Host)
}

type releaseCmd struct {
	common
	IDs  []string `arg:"" name:"lease" help:"Lease IDs."`
	Keep bool     `name:"keep" help:"Keep the VM running as an idle lease that the next matching acquire reuses."`
}

func (c *releaseCmd) Run(env *cli.Env) error { return lease.ReleaseCmd(env, c.opts(), c.IDs, c.Keep) }

type renewCmd struct {
	common
	ID  string        `arg:"" name:"lease" help:"Lease ID."`
	TTL time.Duration `name:"ttl" help:"New time to live from now (default: the lease's TTL)."`
}

func (c *renewCmd) Run(env *cli.Env) error { return lease.RenewCmd(env, c.opts(), c.ID, c.TTL) }

type expireCmd struct {
	common
	Apply bool `name:"apply" help:"Release the expired leases (default: only print them)."`
}

func (c *expireCmd) Run(env *cli.Env) error { return lease.ExpireCmd(env, c.opts(), c.Apply) }

type reapCmd struct {
	common
	DryRun bool `name:"dry-run" help:"Print what would be done."`
}

func (c *reapCmd) Run(env *cli.Env) error { return lease.ReapCmd(env, c.opts(), c.DryRun) }

type healCmd struct {
	common
	IDs         []string      `arg:"" optional:"" name:"lease" help:"Leases to check (default: every live lease)."`
	BootTimeout time.Duration `name:"boot-timeout" default:"3m" help:"Longest wait for a restarted guest's agent."`
}

func (c *healCmd) Run(env *cli.Env) error { return lease.HealCmd(env, c.opts(), c.IDs, c.BootTimeout) }

type inspectHostCmd struct {
	common
	Name string `arg:"" optional:"" name:"host" help:"Configured host name (default: every host)."`
}

func (c *inspectHostCmd) Run(env *cli.Env) error { return lease.InspectHostCmd(env, c.opts(), c.Name) }

type snapshotCmd struct {
	common
	ID string `arg:"" name:"lease" help:"Lease ID."`
}

func (c *snapshotCmd) Run(env *cli.Env) error { return lease.SnapshotCmd(env, c.opts(), c.ID) }

type dumpCmd struct {
	common
	ID    string `arg:"" name:"lease" help:"Lease ID."`
	Cycle string `name:"cycle" placeholder:"ID" help:"Record the dump as an artifact of this cycle."`
}

func (c *dumpCmd) Run(env *cli.Env) error { return lease.DumpCmd(env, c.opts(), c.ID, c.Cycle) }

type snapshotsCmd struct {
	common
	Verify bool `name:"verify" help:"Check every file against its recorded checksum (exit 65 on a mismatch)."`
}

func (c *snapshotsCmd) Run(env *cli.Env) error { return lease.SnapshotsCmd(env, c.opts(), c.Verify) }

type snapshotRmCmd struct {
	common
	IDs []string `arg:"" name:"snapshot" help:"Snapshot IDs."`
}

func (c *snapshotRmCmd) Run(env *cli.Env) error { return lease.DeleteSnapshotCmd(env, c.opts(), c.IDs) }

type restoreCmd struct {
	common
	ID          string        `arg:"" name:"snapshot" help:"Snapshot ID."`
	TTL         time.Duration `name:"ttl" default:"1h" help:"Time to live of the new lease."`
	Pool        string        `name:"pool" default:"default" help:"Quota pool."`
	BootTimeout time.Duration `name:"boot-timeout" default:"1m" help:"Longest wait for the restored guest's agent."`
}

func (c *restoreCmd) Run(env *cli.Env) error {
	return lease.RestoreCmd(env, c.opts(), c.ID, lease.Request{TTL: c.TTL, Pool: c.Pool, BootTimeout: c.BootTimeout})
}

type execCmd struct {
	common
	ID   string   `arg:"" name:"lease" help:"Lease ID."`
	Argv []string `arg:"" name:"command" passthrough:"" help:"Program (absolute path in the guest) and arguments."`
}

func (c *execCmd) Run(env *cli.Env) error { return lease.ExecCmd(env, c.opts(), c.ID, c.Argv) }

type tbLease struct {
	cli.Globals
	Acquire acquireCmd `cmd:"" help:"Acquire a lease for a plan (reuses an idle matching lease)."`
	List    listCmd    `cmd:"" help:"List leases."`
	Get     cli.GetCmd `cmd:"" help:"Print stored records by ID."`
	Renew   renewCmd   `cmd:"" aliases:"extend-ttl" help:"Extend a lease's TTL."`
	Release releaseCmd `cmd:"" help:"Destroy a lease's domain and overlay (or --keep it idle for reuse)."`
	Expire  expireCmd  `cmd:"" help:"Release leases past their TTL (dry run unless --apply)."`
	Reap    reapCmd    `cmd:"" help:"Reconcile libvirt with the state."`
	Heal    healCmd    `cmd:"" help:"Restart or replace unhealthy leases."`
	Exec    execCmd    `cmd:"" help:"Run a program in a lease's guest through its agent."`
	Inspect struct {
		Host inspectHostCmd `cmd:"" help:"Acceleration, capacity and running leases of a host."`
	} `cmd:"" help:"Inspect hosts."`
	Snapshot   snapshotCmd   `cmd:"" help:"Save a lease's disk and memory."`
	Snapshots  snapshotsCmd  `cmd:"" help:"List snapshots with size and checksum."`
	Dump       dumpCmd       `cmd:"" help:"Write a lease's guest memory to the blob store as an artifact (ELF core, zstd)."`
	SnapshotRm snapshotRmCmd `cmd:"" name:"snapshot-rm" help:"Delete snapshots."`
	Restore    restoreCmd    `cmd:"" help:"Start a new lease from a snapshot, without a boot."`
}

func main() {
	os.Exit(cli.Run(tool(), &tbLease{}, os.Args[1:]))
}

// tool is a function, not a variable, so that main_test.go can check the
// examples without package state.
func tool() cli.Tool {
	return cli.Tool{
		Name:        "tb-lease",
		Description: "Long-lived libvirt sandbox leases: acquire, health, TTL, snapshots, placement.",
		Kinds:       "lease",
		Examples: map[string][]string{
			"": {
				"tb-lease acquire --plan PLAN --ttl 6h",
				"tb-lease list --live",
			},
			"acquire": {
				"tb-lease acquire --plan PLAN --ttl 6h",
				"tb-lease acquire --plan PLAN --dry-run",
			},
			"list": {
				"tb-lease list --live",
				"tb-lease list --lease-state idle --lease-state busy",
			},
			"get":   {"tb-lease get LEASE"},
			"renew": {"tb-lease renew LEASE --ttl 2h"},
			"release": {
				"tb-lease release --keep LEASE    # back to the idle pool",
				"tb-lease release LEASE",
			},
			"expire": {
				"tb-lease expire",
				"tb-lease expire --apply && tb-lease reap",
			},
			"reap": {
				"tb-lease reap --dry-run",
				"tb-lease reap",
			},
			"heal": {
				"tb-lease heal",
				"tb-lease heal LEASE",
			},
			"exec":         {"tb-lease exec LEASE /bin/busybox uname -a"},
			"inspect":      {"tb-lease inspect host"},
			"inspect host": {"tb-lease inspect host"},
			"snapshot":     {"tb-lease snapshot LEASE && tb-lease restore SNAPSHOT"},
			"dump":         {"tb-lease dump LEASE --cycle CYCLE"},
			"snapshots":    {"tb-lease snapshots --verify"},
			"snapshot-rm":  {"tb-lease snapshot-rm SNAPSHOT"},
			"restore":      {"tb-lease restore SNAPSHOT --ttl 2h"},
		},
	}
}
