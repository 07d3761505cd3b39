package netlab_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// TestProbe runs the containment probes on a real lab: they pass on the
// lab as built, each one fails when the layer it guards is broken on
// purpose, and no run leaves anything behind.
func TestProbe(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	cfg.DNS, cfg.INetSim = true, true
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// A guest of a lease: the probes must neither disturb it nor change
	// the lab's bookkeeping around it.
	g := l.AddGuest("g1", netip.MustParseAddr("10.13.37.10"))
	if err := netlab.AttachPort(ctx, cfg, g.LabPort()); err != nil {
		t.Fatal(err)
	}
	fw, err := cfg.Firewall()
	if err != nil {
		t.Fatal(err)
	}
	host := l.Handle(cfg.HostNS)
	links := func() []string {
		ls, err := host.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range ls {
			out = append(out, l.Attrs().Name)
		}
		slices.Sort(out)
		return out
	}
	labState, err := os.ReadFile(filepath.Join(cfg.Dir, "lab.json"))
	if err != nil {
		t.Fatal(err)
	}
	linksBefore := links()
	leftNothing := func(t *testing.T) {
		t.Helper()
		if got := links(); !slices.Equal(got, linksBefore) {
			t.Errorf("host links after the probe: %v, before: %v", got, linksBefore)
		}
		if ports, err := fw.Ports(ctx); err != nil || !slices.Equal(ports, []string{g.Port}) {
			t.Errorf("lab ports after the probe: %v %v, want only %s", ports, err, g.Port)
		}
		for _, ns := range netlab.ProbeNames(&cfg) {
			if netns.Exists(ns) {
				t.Errorf("probe namespace %s left", ns)
			}
		}
		if b, _ := os.ReadFile(filepath.Join(cfg.Dir, "lab.json")); string(b) != string(labState) {
			t.Errorf("lab state changed by the probe:\n%s\nwas\n%s", b, labState)
		}
		h := l.Handle(cfg.HostNS)
		br, _ := h.LinkByName(cfg.Bridge)
		neigh, _ := h.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
		for _, n := range neigh {
			// The host's own multicast (IGMP reports) has entries too.
			if !n.IP.Equal(g.IP.AsSlice()) && !n.IP.IsMulticast() {
				t.Errorf("neighbour entry left on the bridge: %s", n.IP)
			}
		}
	}

	// want runs the probes and checks which failed.
	want := func(t *testing.T, failed ...string) {
		t.Helper()
		rep, err := netlab.Probe(ctx, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("probes took %d ms", rep.TookMS)
		var got []string
		for _, p := range rep.Probes {
			t.Logf("%s %s: %s", p.Verdict, p.Name, p.Detail)
			if p.Verdict == netlab.ProbeFail {
				got = append(got, p.Name)
			}
			if p.Verdict == netlab.ProbeSkip {
				t.Errorf("probe %s skipped on a lab with every service", p.Name)
			}
		}
		if !slices.Equal(got, failed) {
			t.Errorf("failed probes %v, want %v", got, failed)
		}
		if rep.Passed != (len(failed) == 0) || (rep.Err() == nil) != rep.Passed {
			t.Errorf("passed %v, err %v", rep.Passed, rep.Err())
		}
		leftNothing(t)
	}
	restore := func(t *testing.T) {
		t.Helper()
		if err := fw.Up(ctx); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("the lab as built", func(t *testing.T) { want(t) })
	t.Run("no drop for guest to host", func(t *testing.T) {
		defer restore(t)
		flushChain(t, l.HostNS(), cfg.Table, "input")
		want(t, "host-dropped")
	})
	t.Run("no dnat to the sinkhole", func(t *testing.T) {
		defer restore(t)
		flushChain(t, l.HostNS(), cfg.Table, "prerouting")
		want(t, "sinkhole-tcp", "sinkhole-http", "sinkhole-dns")
	})
	t.Run("ipv6 on the bridge and no drop for guest to host", func(t *testing.T) {
		defer restore(t)
		v6 := "/proc/sys/net/ipv6/conf/" + cfg.Bridge + "/"
		writeIn(t, l.HostNS(), v6+"accept_dad", "0")
		writeIn(t, l.HostNS(), v6+"disable_ipv6", "0")
		defer writeIn(t, l.HostNS(), v6+"disable_ipv6", "1")
		flushChain(t, l.HostNS(), cfg.Table, "input")
		want(t, "host-dropped", "ipv6-dropped")
	})
	t.Run("no binding at the bridge", func(t *testing.T) {
		defer restore(t)
		flushFamilyChain(t, l.HostNS(), cfg.Table, nftables.TableFamilyBridge, "bind")
		// Nothing is marked as a bound port's either, so the lab forwards
		// nothing of the guests', not even to the sinkhole.
		want(t, "sinkhole-tcp", "sinkhole-http", "sinkhole-dns",
			"spoofed-address-dropped", "spoofed-mac-dropped", "arp-gateway-claim-dropped", "arp-neighbour-claim-dropped")
	})
	t.Run("restored", func(t *testing.T) { want(t) })

	t.Run("a crashed check's guests are removed", func(t *testing.T) {
		for _, ns := range netlab.ProbeNames(&cfg) {
			if err := netns.Create(ns); err != nil {
				t.Fatal(err)
			}
		}
		want(t)
	})
	t.Run("a cancelled check leaves nothing", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := netlab.Probe(cctx, &cfg); err == nil {
			t.Fatal("a cancelled check reported a result")
		}
		leftNothing(t)
	})
}

// flushChain removes every rule of one of the lab's inet chains.
func flushChain(t *testing.T, ns, table, chain string) {
	t.Helper()
	flushFamilyChain(t, ns, table, nftables.TableFamilyINet, chain)
}

// flushFamilyChain removes every rule of one of the lab's chains.
func flushFamilyChain(t *testing.T, ns, table string, family nftables.TableFamily, chain string) {
	t.Helper()
	f, err := os.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	c.FlushChain(&nftables.Chain{Name: chain, Table: &nftables.Table{Name: table, Family: family}})
	if err := c.Flush(); err != nil {
		t.Fatalf("flushing %s %s: %v", table, chain, err)
	}
}

func writeIn(t *testing.T, ns, path, val string) {
	t.Helper()
	labtest.In(t, ns, func() error { return os.WriteFile(path, []byte(val), 0o644) })
}
