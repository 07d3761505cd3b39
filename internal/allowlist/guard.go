package allowlist

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/talkbox-sandbox/talkbox/internal/dnsname"
	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/records"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

// Guard is the built-in never-allow list: destinations no evidence and no
// policy file can allow, because a sample that got them allowed would
// reach the host, the cloud it runs in or the fleet's own services rather
// than the internet. Each says why in its refusal.
type Guard struct {
	prefixes []guarded
	names    []guarded // patterns, as dnsname.Match takes them
}

type guarded struct {
	prefix  netip.Prefix
	pattern string
	why     string
}

// builtinGuard is what every promotion refuses, wherever it runs:
// link-local networks and the cloud host-service and metadata endpoints
// as AWS (instance metadata: 169.254.169.254, fd00:ec2::254), Azure
// (WireServer 168.63.129.16, IMDS 169.254.169.254), Google Cloud
// (metadata.google.internal, 169.254.169.254) and Alibaba Cloud
// (100.100.100.200) document them; and the names of networks that are
// never the internet (.internal, .local, .localhost, .home.arpa).
func builtinGuard() Guard {
	var g Guard
	for _, p := range []struct{ prefix, why string }{
		// The addresses first: a refusal names the first entry that holds.
		{"168.63.129.16/32", "cloud host-service address (Azure WireServer)"},
		{"169.254.169.254/32", "cloud metadata address (AWS, Azure, Google Cloud, OpenStack)"},
		{"100.100.100.200/32", "cloud metadata address (Alibaba Cloud)"},
		{"fd00:ec2::254/128", "cloud metadata address (AWS, IPv6)"},
		{"169.254.0.0/16", "link-local network"},
		{"fe80::/10", "link-local network"},
	} {
		g.addPrefix(netip.MustParsePrefix(p.prefix), p.why)
	}
	for _, n := range []string{"metadata.google.internal", "*.internal", "*.local", "*.localhost", "*.home.arpa"} {
		g.names = append(g.names, guarded{pattern: n, why: "cloud metadata or local name"})
	}
	return g
}

func (g *Guard) addPrefix(p netip.Prefix, why string) {
	g.prefixes = append(g.prefixes, guarded{prefix: p.Masked(), why: why})
}

func (g *Guard) addAddr(a netip.Addr, why string) {
	if a.IsValid() {
		g.addPrefix(netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), why)
	}
}

// refuse is why the guard refuses an address or one of its names ("" when
// it does not).
func (g *Guard) refuse(a netip.Addr, names []string) string {
	if a.IsValid() {
		for _, p := range g.prefixes {
			if p.prefix.Contains(a.Unmap()) {
				return fmt.Sprintf("%s: never_allow: %s %s (built-in)", a, p.why, p.prefix)
			}
		}
	}
	for _, n := range names {
		for _, p := range g.names {
			if dnsname.Match(p.pattern, n) {
				return fmt.Sprintf("%s: never_allow: %s %s (built-in)", n, p.why, p.pattern)
			}
		}
	}
	return ""
}

// LoadGuard is the built-in never-allow list of a promotion on a lab: the
// built-in entries, the networks and gateways of the namespace the lab's
// uplink is in, the lab's upstream resolver, and the fleet's own services
// (the PostgreSQL server of a shared state, the hosts of the workers' blob
// servers). A lab that is not up is taken for one in this namespace
// without an upstream. Anything it cannot read is an error: promoting
// without knowing what to refuse would be promoting blind.
func LoadGuard(ctx context.Context, st *state.Store, lab string) (*Guard, error) {
	l, err := netlab.Expected(st, lab)
	if err != nil {
		return nil, err
	}
	cfg := l.Config
	workers, err := state.Find[records.Worker](st, records.KindWorker, func(w *records.Worker) bool {
		// A worker taken for dead may come back: only one that stopped
		// cleanly serves nothing.
		return w.BlobURL != "" && !w.Stopped
	})
	if err != nil {
		return nil, fmt.Errorf("fleet workers: %w", err)
	}
	var urls []string
	for _, w := range workers {
		urls = append(urls, w.BlobURL)
	}
	return guardFor(ctx, cfg.HostNSPath(), cfg.Upstream, st.Shared(), urls)
}

// guardFor builds the guard from its parts: hostNS the path of the
// namespace whose networks are the host's ("" this one), upstream the
// lab's resolver (may be invalid), shared the state's database URL ("" for
// a directory) and blobURLs the workers' blob servers.
func guardFor(ctx context.Context, hostNS string, upstream netip.Addr, shared string, blobURLs []string) (*Guard, error) {
	g := builtinGuard()
	if err := g.hostNetworks(hostNS); err != nil {
		return nil, fmt.Errorf("the host's networks: %w", err)
	}
	g.addAddr(upstream, "the lab's upstream resolver")
	if shared != "" {
		hosts, err := databaseHosts(shared)
		if err != nil {
			return nil, err
		}
		for _, h := range hosts {
			if err := g.fleetHost(ctx, h, "the fleet's database server"); err != nil {
				return nil, err
			}
		}
	}
	for _, s := range blobURLs {
		u, err := url.Parse(s)
		if err != nil || u.Hostname() == "" {
			return nil, fmt.Errorf("a worker's blob URL %s does not parse", dnsname.Display(s))
		}
		if err := g.fleetHost(ctx, u.Hostname(), "a fleet worker's blob server"); err != nil {
			return nil, err
		}
	}
	return &g, nil
}

// minRouteBits are the prefix lengths from which a route's destination is
// taken for one of the host's networks: a VPN's "redirect-gateway def1"
// routes 0.0.0.0/1 and 128.0.0.0/1, which are the internet.
func minRouteBits(a netip.Addr) int {
	if a.Is4() {
		return 8
	}
	return 16
}

// hostNetworks adds the networks of the namespace's addresses, the
// destinations of its routes and their gateways.
func (g *Guard) hostNetworks(path string) error {
	return netns.Do(path, func() error {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if p, ok := prefixOf(a.IPNet); ok {
				g.addPrefix(p, "a network of the host")
			}
		}
		routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if p, ok := prefixOf(r.Dst); ok && p.Bits() >= minRouteBits(p.Addr()) {
				g.addPrefix(p, "a network the host routes to")
			}
			if gw, ok := netip.AddrFromSlice(r.Gw); ok {
				g.addAddr(gw, "the host's gateway")
			}
			for _, nh := range r.MultiPath {
				if gw, ok := netip.AddrFromSlice(nh.Gw); ok {
					g.addAddr(gw, "the host's gateway")
				}
			}
		}
		return nil
	})
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	bits, _ := n.Mask.Size()
	a = a.Unmap()
	if a.Is4() && bits > 32 {
		bits -= 96
	}
	return netip.PrefixFrom(a, bits), true
}

// databaseHosts are the hosts of a PostgreSQL URL: its host, or those of
// its host parameter (libpq's comma-separated list); a socket directory
// is no network address.
func databaseHosts(shared string) ([]string, error) {
	u, err := url.Parse(shared)
	if err != nil {
		return nil, errors.New("the state's database URL does not parse")
	}
	var out []string
	for _, h := range append(strings.Split(u.Host, ","), strings.Split(u.Query().Get("host"), ",")...) {
		if h == "" || strings.HasPrefix(h, "/") {
			continue
		}
		if host, _, err := net.SplitHostPort(h); err == nil {
			h = host
		}
		out = append(out, strings.Trim(h, "[]"))
	}
	return out, nil
}

// fleetHost refuses a fleet service's host: its address, or the addresses
// its name resolves to and the name itself.
func (g *Guard) fleetHost(ctx context.Context, host, why string) error {
	if a, err := netip.ParseAddr(host); err == nil {
		g.addAddr(a, why)
		return nil
	}
	g.names = append(g.names, guarded{pattern: strings.ToLower(host), why: why})
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("%s %s: %w", why, dnsname.Display(host), err)
	}
	for _, a := range addrs {
		g.addAddr(a, why)
	}
	return nil
}
