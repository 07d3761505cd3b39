// Command nftbench times applying 10,000 allow-set entries in one batch
// through talkbox's firewall (netlink) against nft -f loading the same
// elements, in a throw-away network namespace.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

func main() {
	n := flag.Int("n", 10000, "elements per batch")
	runs := flag.Int("runs", 7, "repetitions (the median is reported)")
	flag.Parse()
	if err := run(*n, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "nftbench:", err)
		os.Exit(1)
	}
}

func elems(n int) []firewall.Element {
	out := make([]firewall.Element, n)
	for i := range out {
		out[i] = firewall.Element{Dst: netip.AddrFrom4([4]byte{8, byte(i >> 16), byte(i >> 8), byte(i)}), Proto: "tcp", Port: 443, Verdict: firewall.Redirect}
	}
	return out
}

func median(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

func run(n, runs int) error {
	ctx := context.Background()
	ns := fmt.Sprintf("tbbench%d", os.Getpid())
	if err := netns.Create(ns); err != nil {
		return err
	}
	defer netns.Delete(ns)
	f, err := firewall.New(firewall.Config{Table: "talkbox_bench", NetNS: netns.Path(ns), Bridge: "tbb-br",
		LabNet: netip.MustParsePrefix("10.13.37.0/24"), Gateway: netip.MustParseAddr("10.13.37.1"),
		SinkIface: "tbb-sink", SinkNet: netip.MustParsePrefix("10.13.38.0/24"), Sinkhole: netip.MustParseAddr("10.13.38.2")})
	if err != nil {
		return err
	}
	if err := f.Up(ctx); err != nil {
		return err
	}
	defer f.Down(ctx)
	lease := records.NewID("lease", time.Now())
	if err := f.ApplyLease(ctx, firewall.LeaseRules{Lease: lease, IP: netip.MustParseAddr("10.13.37.10")}); err != nil {
		return err
	}
	set := "ardr_" + strings.ToLower(lease[len("lease_"):])
	els := elems(n)

	// The same elements as one nft -f transaction.
	var script bytes.Buffer
	fmt.Fprintf(&script, "add element inet talkbox_bench %s { ", set)
	for i, e := range els {
		if i > 0 {
			script.WriteString(", ")
		}
		fmt.Fprintf(&script, "%s . tcp . %d", e.Dst, e.Port)
	}
	script.WriteString(" }\n")
	file := fmt.Sprintf("/tmp/nftbench-%d.nft", os.Getpid())
	if err := os.WriteFile(file, script.Bytes(), 0o644); err != nil {
		return err
	}
	defer os.Remove(file)

	// The naive form: one rule per entry, as a ruleset without sets does it.
	var rules bytes.Buffer
	rules.WriteString("add chain inet talkbox_bench naive\n")
	for _, e := range els {
		fmt.Fprintf(&rules, "add rule inet talkbox_bench naive ip daddr %s tcp dport %d counter accept\n", e.Dst, e.Port)
	}
	rfile := file + ".rules"
	if err := os.WriteFile(rfile, rules.Bytes(), 0o644); err != nil {
		return err
	}
	defer os.Remove(rfile)

	var tb, nf, nr []time.Duration
	for r := 0; r < runs; r++ {
		start := time.Now()
		if err := f.ApplyAllowSet(ctx, lease, els, nil); err != nil {
			return err
		}
		tb = append(tb, time.Since(start))
		if err := f.ApplyAllowSet(ctx, lease, nil, els); err != nil {
			return err
		}

		start = time.Now()
		out, err := exec.Command("ip", "netns", "exec", ns, "nft", "-f", file).CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft -f: %v: %s", err, out)
		}
		nf = append(nf, time.Since(start))
		got, err := f.AllowSet(ctx, lease)
		if err != nil || len(got) != n {
			return fmt.Errorf("nft -f loaded %d elements: %v", len(got), err)
		}
		if err := f.ApplyAllowSet(ctx, lease, nil, els); err != nil {
			return err
		}

		start = time.Now()
		if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "-f", rfile).CombinedOutput(); err != nil {
			return fmt.Errorf("nft -f rules: %v: %s", err, out)
		}
		nr = append(nr, time.Since(start))
		if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "delete", "chain", "inet", "talkbox_bench", "naive").CombinedOutput(); err != nil {
			return fmt.Errorf("nft delete chain: %v: %s", err, out)
		}
	}
	a, b, c := median(tb), median(nf), median(nr)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }
	fmt.Printf("| apply %d allow entries in one batch (median of %d) | talkbox netlink: %s | nft -f, same set elements: %s (%.1fx) | nft -f, %d rules: %s (%.1fx) |\n",
		n, runs, ms(a), ms(b), float64(b)/float64(a), n, ms(c), float64(c)/float64(a))
	return nil
}
