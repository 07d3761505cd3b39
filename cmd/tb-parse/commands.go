package main

import (
	"fmt"
	"net/netip"
	"os"
	"runtime/debug"
	"slices"

	"github.com/talkbox-sandbox/talkbox/internal/cli"
	"github.com/talkbox-sandbox/talkbox/internal/diskspace"
	"github.com/talkbox-sandbox/talkbox/internal/fault"
	"github.com/talkbox-sandbox/talkbox/internal/flowlog"
	"github.com/talkbox-sandbox/talkbox/internal/heap"
	"github.com/talkbox-sandbox/talkbox/internal/parsejob"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

type parseCmd struct {
	Inputs         []string       `arg:"" optional:"" name:"file" help:"Captures (pcap, pcapng, gzip) or logs (Zeek TSV/JSON, Suricata EVE). '-' or none: read artifact records or paths from stdin, one per line."`
	Lease          string         `name:"lease" help:"Lease the file inputs belong to (artifact records carry their own)."`
	Cycle          string         `name:"cycle" help:"Cycle the file inputs belong to (artifact records carry their own)."`
	Merge          bool           `name:"merge" help:"Fold observables into those the state already holds for the lease (count, first/last seen, sets)."`
	NoStore        bool           `name:"no-store" help:"Only print the observables; do not write them to the state."`
	MaxFlows       int            `name:"max-flows" default:"131072" help:"Connections tracked at once (about 530 bytes each: a flow's 512 and its table entry); beyond it the least recently active one is ended early."`
	MaxHeld        int            `name:"max-held" default:"16384" help:"Distinct observables held for deduplication; beyond it the least recently updated half is written out early."`
	MinFree        diskspace.Size `name:"min-free" default:"1G" placeholder:"SIZE" help:"Stop (exit 75) before less than SIZE (default ${default}) is free on the state's file system; 0 and --min-free-percent 0: never."`
	MinFreePercent float64        `name:"min-free-percent" default:"2" placeholder:"P" help:"... or less than P percent of it (default ${default}; the larger bound wins)."`
}

func (c *parseCmd) Run(env *cli.Env) error {
	tuneGC()
	meter := env.Progress()
	defer meter.Wait()
	job, err := parsejob.Prepare(parsejob.Request{
		Inputs:    c.Inputs,
		FromStdin: slices.Contains(c.Inputs, "-") || len(c.Inputs) == 0 && env.StdinPiped(),
		Lease:     c.Lease, Cycle: c.Cycle,
		Merge: c.Merge, NoStore: c.NoStore, MaxFlows: c.MaxFlows, MaxHeld: c.MaxHeld,
		MinFree:  diskspace.Threshold{Bytes: int64(c.MinFree), Percent: c.MinFreePercent},
		Progress: meter,
	}, env.Stdin, env.Warnf)
	if err != nil {
		return err
	}
	var st *state.Store
	if job.NeedsState() {
		if st, err = env.OpenState(state.WithDurability(state.SyncOnFlush)); err != nil {
			return err
		}
	}
	primeHeap(job.InputBytes(st))
	return job.Run(env.Ctx, st, env.Sink())
}

// primeHeap readies the heap for inputs of n bytes: parsing allocates
// with the size of a capture and more with its conversations (the bulk
// capture 1.1 MB a MB with the state, the denser mixed one about 3) before
// the collector runs, so the heap is primed with 3 times n, up to 3/4 of the
// soft limit, and never more than 3/4 of tb-parse's own, whatever GOMEMLIMIT
// says (beyond, the collector frees pages that are then reused).
// Unused primed memory costs less than the page faults of memory that was
// not primed: on this host 1 ms a MB against 4 to 5. Inputs under 256 KiB
// take too few faults to matter.
func primeHeap(n int64) {
	heap.Prime(int(primeSize(n, debug.SetMemoryLimit(-1))))
}

// primeSize is what primeHeap primes for inputs of n bytes under the soft
// limit limit (0: nothing).
func primeSize(n, limit int64) int64 {
	if n < 256<<10 {
		return 0
	}
	return min(n*3, limit/4*3, memoryLimit/4*3)
}

// memoryLimit is the soft heap limit tb-parse runs under (see tb-parse(1)).
const memoryLimit = 128 << 20

// tuneGC collects only as the heap nears the soft limit: parsing allocates
// mostly short-lived observables over a live heap the flow table and the
// observable set bound, so a capture whose allocations fit under the limit
// is parsed without a collection, and a larger one collects no more often
// than the limit makes it. Under a GOMEMLIMIT of the user's, which may be
// far larger, it collects at 5× the live heap instead. GOGC still wins.
func tuneGC() {
	limit := os.Getenv("GOMEMLIMIT") == ""
	if limit {
		debug.SetMemoryLimit(memoryLimit)
	}
	if os.Getenv("GOGC") == "" {
		if limit {
			debug.SetGCPercent(-1)
		} else {
			debug.SetGCPercent(400)
		}
	}
}

type flowsCmd struct {
	Lease     string   `name:"lease" help:"Only the flow logs of this lease."`
	Cycle     string   `name:"cycle" help:"Only the flow logs of this cycle."`
	Artifacts []string `name:"artifact" sep:"none" help:"Only these flow logs, or those parsed from these capture artifacts (repeatable)."`
	Addrs     []string `name:"addr" sep:"none" help:"Only connections with this address on either side (repeatable)."`
	Ports     []uint16 `name:"port" sep:"none" help:"Only connections with this port on either side (repeatable)."`
	UIDs      []string `name:"uid" sep:"none" help:"Only the connection with this uid, as an observable's provenance names it (repeatable)."`
	ZeekTSV   string   `name:"zeek" placeholder:"FILE" help:"Write Zeek's TSV conn.log to FILE instead of records on stdout."`
}

func (c *flowsCmd) Run(env *cli.Env) error {
	q := flowlog.Query{Lease: c.Lease, Cycle: c.Cycle, Artifacts: c.Artifacts, Ports: c.Ports, UIDs: c.UIDs}
	for _, u := range c.UIDs {
		if !flowlog.ValidUID(u) {
			return fault.Usage(fmt.Errorf("--uid %q: not a connection uid (letters, digits, - and _, at most %d)", u, flowlog.MaxUID))
		}
	}
	for _, s := range c.Addrs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fault.Usage(fmt.Errorf("--addr %q: not an IP address", s))
		}
		q.Addrs = append(q.Addrs, a.Unmap())
	}
	st, err := env.OpenState()
	if err != nil {
		return err
	}
	return parsejob.Flows(env.Ctx, st, parsejob.FlowsRequest{Query: q, ZeekTSV: c.ZeekTSV}, env.Sink())
}
