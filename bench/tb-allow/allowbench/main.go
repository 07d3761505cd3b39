// Command allowbench measures tb-allow's two ways of pushing revisions to
// a lease's live set, against nft doing the same, side by side in one run,
// in a network namespace it creates and removes: the promote path (the
// change since the last apply, from the new revision's stored delta, sent
// with firewall.ApplyAllowSet in one batch) and apply (the revision's
// active entries diffed against the live set read from the kernel).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/talkbox-sandbox/talkbox/internal/allowlist"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

func main() {
	n := flag.Int("n", 100000, "entries in the big revision")
	runs := flag.Int("runs", 7, "runs of each measurement (the median is reported)")
	prof := flag.String("cpuprofile", "", "write a CPU profile of the tb-allow part to this file")
	flag.Parse()
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			log.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if err := run(*n, *runs); err != nil {
		pprof.StopCPUProfile()
		log.Fatal(err)
	}
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func fmtD(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

// entry is one active endpoint: public-looking addresses that only ever
// exist as set elements in the benchmark's own namespace.
func entry(i int) *records.AllowEntry {
	a := netip.AddrFrom4([4]byte{45, byte(i >> 16), byte(i >> 8), byte(i)})
	exp := time.Now().Add(24 * time.Hour)
	return &records.AllowEntry{Type: records.AllowEndpoint, Value: netip.AddrPortFrom(a, 443).String() + "/tcp",
		Scope: records.ScopeLease, Status: records.StatusActive, Class: "c2", Score: 1, Reason: "bench",
		Verdict: string(firewall.RateLimit), ExpiresAt: &exp}
}

func run(n, runs int) error {
	ctx := context.Background()
	var b [3]byte
	rand.Read(b[:])
	ns := "tbab" + hex.EncodeToString(b[:])
	if err := netns.Create(ns); err != nil {
		return err
	}
	defer netns.Delete(ns)
	h, err := vnetns.GetFromPath(netns.Path(ns))
	if err != nil {
		return err
	}
	nh, err := netlink.NewHandleAt(h)
	h.Close()
	if err != nil {
		return err
	}
	lo, err := nh.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := nh.LinkSetUp(lo); err != nil {
		return err
	}
	nh.Close()
	fw, err := firewall.New(firewall.Config{Table: "talkbox_bench", NetNS: netns.Path(ns), Bridge: "tbb-br",
		LabNet: netip.MustParsePrefix("10.13.37.0/24"), Gateway: netip.MustParseAddr("10.13.37.1"),
		SinkIface: "tbb-sink", SinkNet: netip.MustParsePrefix("10.13.38.0/24"), Sinkhole: netip.MustParseAddr("10.13.38.2"),
		Uplink: "lo", MaxElements: uint32(2*n + 16)})
	if err != nil {
		return err
	}
	if err := fw.Up(ctx); err != nil {
		return err
	}
	lease := records.NewID("lease", time.Now())
	if err := fw.ApplyLease(ctx, firewall.LeaseRules{Lease: lease, IP: netip.MustParseAddr("10.13.37.10")}); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "allowbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	st, err := state.Open(ctx, dir)
	if err != nil {
		return err
	}
	book := &allowlist.Book{St: st}
	chain := allowlist.Chain{Scope: records.ScopeLease, Lease: lease}

	// Three contents: empty, n entries, n+1 entries; each written as a
	// revision (promote's cost, reported apart), then applied in turn.
	big := make([]*records.AllowEntry, n)
	for i := range big {
		big[i] = entry(i)
		big[i].Lease = lease
	}
	plusOne := append(append([]*records.AllowEntry(nil), big...), entry(n))
	plusOne[n].Lease = lease
	write := func(es []*records.AllowEntry) (time.Duration, error) {
		head, cur, err := book.Head(ctx, chain)
		if err != nil {
			return 0, err
		}
		cp := make([]*records.AllowEntry, len(es))
		for i, e := range es {
			c := *e
			cp[i] = &c
		}
		t0 := time.Now()
		_, _, err = book.Write(ctx, allowlist.Commit{Chain: chain, Cause: "bench"}, head, cur, cp)
		return time.Since(t0), err
	}
	timed := func(f func() (allowlist.Applied, error), check func(allowlist.Applied) bool) (time.Duration, error) {
		t0 := time.Now()
		res, err := f()
		d := time.Since(t0)
		if err == nil && !check(res) {
			err = fmt.Errorf("unexpected apply result %+v", res)
		}
		return d, err
	}
	reconcile := func() (allowlist.Applied, error) { return book.Reconcile(ctx, fw, lease) }
	update := func() (allowlist.Applied, error) { return book.Update(ctx, fw, lease) }
	added := func(k int) func(allowlist.Applied) bool {
		return func(r allowlist.Applied) bool { return r.Added == k && r.Deleted == 0 }
	}
	deleted := func(k int) func(allowlist.Applied) bool {
		return func(r allowlist.Applied) bool { return r.Deleted == k && r.Added == 0 }
	}
	m := map[string][]time.Duration{}
	step := func(name string, es []*records.AllowEntry, f func() (allowlist.Applied, error), check func(allowlist.Applied) bool) error {
		if es != nil {
			d, err := write(es)
			if err != nil {
				return err
			}
			m["write "+name] = append(m["write "+name], d)
		}
		d, err := timed(f, check)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		m[name] = append(m[name], d)
		return nil
	}
	empty := []*records.AllowEntry{}
	for r := 0; r < runs; r++ {
		if _, err := write(empty); err != nil {
			return err
		}
		if _, err := reconcile(); err != nil {
			return err
		}
		steps := []struct {
			name  string
			es    []*records.AllowEntry
			f     func() (allowlist.Applied, error)
			check func(allowlist.Applied) bool
		}{
			{"apply-big", big, reconcile, added(n)},
			{"update-add1", plusOne, update, added(1)},
			{"update-del1", big, update, deleted(1)},
			{"apply-add1", plusOne, reconcile, added(1)},
			{"apply-noop", nil, reconcile, func(r allowlist.Applied) bool { return r.Unchanged }},
			{"update-delbig", empty, update, deleted(n + 1)},
			{"update-big", big, update, added(n)},
		}
		for _, s := range steps {
			if err := step(s.name, s.es, s.f, s.check); err != nil {
				return err
			}
		}
		// The parts of a one-entry change through the whole path.
		t0 := time.Now()
		if _, err := book.Desired(ctx, lease, time.Now()); err != nil {
			return err
		}
		m["desired"] = append(m["desired"], time.Since(t0))
		t0 = time.Now()
		if _, err := fw.AllowSet(ctx, lease); err != nil {
			return err
		}
		m["allowset"] = append(m["allowset"], time.Since(t0))
		el := firewall.Element{Dst: netip.AddrFrom4([4]byte{46, 1, 2, 3}), Proto: "tcp", Port: 443, Verdict: firewall.RateLimit}
		t0 = time.Now()
		if err := fw.ApplyAllowSet(ctx, lease, []firewall.Element{el}, nil); err != nil {
			return err
		}
		m["driver-add1"] = append(m["driver-add1"], time.Since(t0))
		if err := fw.ApplyAllowSet(ctx, lease, nil, []firewall.Element{el}); err != nil {
			return err
		}
	}

	// The peer: nft -f loading the same elements into a set of the same
	// type, and nft add element and delete element for one, in the same
	// namespace.
	peer := filepath.Join(dir, "peer.nft")
	var sb strings.Builder
	fmt.Fprintf(&sb, "add table inet talkbox_peer\nadd set inet talkbox_peer s { type ipv4_addr . inet_proto . inet_service; size %d; }\nadd element inet talkbox_peer s { ", 2*n+16)
	for i := 0; i < n; i++ {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "45.%d.%d.%d . tcp . 443", byte(i>>16), byte(i>>8), byte(i))
	}
	sb.WriteString(" }\n")
	if err := os.WriteFile(peer, []byte(sb.String()), 0o644); err != nil {
		return err
	}
	nft := func(args ...string) (time.Duration, error) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...)
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(t0)
		if err != nil {
			return d, fmt.Errorf("nft %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return d, nil
	}
	one := fmt.Sprintf("{ 46.%d.%d.%d . tcp . 443 }", byte(n>>16), byte(n>>8), byte(n))
	var nBig, nOne, nDel []time.Duration
	for r := 0; r < runs; r++ {
		nft("delete", "table", "inet", "talkbox_peer")
		d, err := nft("-f", peer)
		if err != nil {
			return err
		}
		nBig = append(nBig, d)
		d, err = nft("add", "element", "inet", "talkbox_peer", "s", one)
		if err != nil {
			return err
		}
		nOne = append(nOne, d)
		d, err = nft("delete", "element", "inet", "talkbox_peer", "s", one)
		if err != nil {
			return err
		}
		nDel = append(nDel, d)
	}
	nft("delete", "table", "inet", "talkbox_peer")
	fw.Down(ctx)

	for i, w := range m["write update-add1"] {
		m["whole-add1"] = append(m["whole-add1"], w+m["update-add1"][i])
	}
	fmt.Printf("# %d entries, median of %d runs\n", n, runs)
	row := func(label string, ds []time.Duration) { fmt.Printf("%-66s %12s\n", label, fmtD(median(ds))) }
	fmt.Printf("%-66s %12s\n", "measurement", "median")
	row(fmt.Sprintf("tb-allow promote path: %d-entry revision onto an empty set", n), m["update-big"])
	row(fmt.Sprintf("tb-allow apply: %d-entry revision onto an empty set", n), m["apply-big"])
	row(fmt.Sprintf("nft -f: the same %d elements", n), nBig)
	row("tb-allow promote path: one-entry change", m["update-add1"])
	row("tb-allow promote path: one-entry deletion", m["update-del1"])
	row("nft add element: one element", nOne)
	row("nft delete element: one element", nDel)
	row(fmt.Sprintf("tb-allow promote path: deleting all %d entries", n+1), m["update-delbig"])
	row("tb-allow apply: one-entry change (reads the live set)", m["apply-add1"])
	row("tb-allow apply: nothing to change (reads the live set)", m["apply-noop"])
	row("  parts: active entries from the state (Desired)", m["desired"])
	row(fmt.Sprintf("  parts: reading the live set of %d (firewall AllowSet)", n), m["allowset"])
	row("  parts: one element through firewall.ApplyAllowSet alone", m["driver-add1"])
	row(fmt.Sprintf("  promote's write of the %d-entry revision", n), m["write apply-big"])
	row("  promote's write of a one-entry change", m["write update-add1"])
	row("  one-entry change: the write, then the promote path", m["whole-add1"])
	return nil
}
