package netlab

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// Probe verdicts. A probe is skipped when the lab runs without the service
// it checks (--no-inetsim, --no-dns); a skip does not fail the check.
const (
	ProbePass = "pass"
	ProbeFail = "fail"
	ProbeSkip = "skip"
)

// ProbeResult is one containment probe.
type ProbeResult struct {
	Name    string `json:"name"`
	Verdict string `json:"verdict"`
	Detail  string `json:"detail"`
}

// ProbeReport is one run of the containment probes on a lab.
type ProbeReport struct {
	Lab    string        `json:"lab"`
	At     time.Time     `json:"at"`
	TookMS int64         `json:"took_ms"`
	Passed bool          `json:"passed"`
	Probes []ProbeResult `json:"probes"`
}

// Failed is the first probe that failed, nil when the check passed.
func (r *ProbeReport) Failed() *ProbeResult {
	for i := range r.Probes {
		if r.Probes[i].Verdict == ProbeFail {
			return &r.Probes[i]
		}
	}
	return nil
}

// Err is nil when every probe passed (or was skipped), else one line
// naming the first probe that failed.
func (r *ProbeReport) Err() error {
	if f := r.Failed(); f != nil {
		return fmt.Errorf("lab %s is not contained: probe %s failed: %s", r.Lab, f.Name, f.Detail)
	}
	return nil
}

// The probes' destinations stand in for the internet. They are
// documentation addresses, so that what a leaking lab lets out goes
// nowhere real.
var (
	probeTCPDst = netip.MustParseAddr("192.0.2.1")
	probeDNSDst = netip.MustParseAddr("192.0.2.53")
	probeV6Dst  = netip.MustParseAddr("2001:db8::1")
	probeV6Src  = netip.MustParsePrefix("2001:db8:7b::2/64")
	probeV6GW   = netip.MustParseAddr("fe80::1")
)

const (
	// dropWindow is how long a probe waits for an answer that must not
	// come. Everything a probe talks to is on this host (bridge, host,
	// sinkhole), so what the lab lets through is answered in far less.
	dropWindow = time.Second
	// answerWait bounds a probe that expects an answer; only a failing
	// probe waits that long.
	answerWait = 5 * time.Second
	// serviceWait bounds INetSim's answer once it accepted the probe's
	// connection (the connection shows the lab sent it to the sinkhole):
	// INetSim forks a Perl process per connection, which took more than
	// answerWait on a test host at a load average of 20.
	serviceWait = 30 * time.Second
)

// checkPath is the lab's last check, kept beside its state so that "down"
// removes it with the lab.
func checkPath(dir string) string { return filepath.Join(dir, "check.json") }

// SaveCheck records a check as the lab's last.
func SaveCheck(dir string, r *ProbeReport) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(checkPath(dir), b, 0o644)
}

// ForgetCheck removes the lab's last check: what it checked is gone.
func ForgetCheck(dir string) error {
	if err := os.Remove(checkPath(dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// LoadCheck reads the lab's last check (os.ErrNotExist when none).
func LoadCheck(dir string) (*ProbeReport, error) {
	b, err := os.ReadFile(checkPath(dir))
	if err != nil {
		return nil, err
	}
	var r ProbeReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", checkPath(dir), err)
	}
	return &r, nil
}

// probeGuest is one throw-away guest: a namespace whose eth0 is a veth
// with its other end, Port, on the lab bridge.
type probeGuest struct {
	NS, Port string
	IP       netip.Addr
	MAC      net.HardwareAddr // of eth0, in the guest
	portMAC  net.HardwareAddr // of Port, on the bridge
}

// probePortMAC is the MAC of a probe port. A bridge takes the lowest MAC
// of its ports as its own unless one was set, and guests that learnt the
// old one would lose the gateway; so the probe ports, like libvirt's taps
// (fe:54:...), get MACs above any guest's.
func probePortMAC(last byte) net.HardwareAddr {
	return net.HardwareAddr{0xfe, 0xff, 0xff, 0xff, 0xff, last}
}

func (g *probeGuest) path() string { return netns.Path(g.NS) }

type prober struct {
	cfg  *Config
	a, b probeGuest
}

// Probe checks, with real packets from throw-away guests attached to the
// lab bridge as a lease's guest is, that the lab up in cfg contains: a
// public address lands on the sinkhole, DNS to any resolver is answered by
// the sinkhole, the host, IPv6 and the other guests are out of reach, and
// a guest's frames with the other's address or MAC, or ARP claiming the
// gateway or the other, are dropped at the bridge. The
// guests get the lab's default containment (no lease rules: what a
// sinkhole-mode lease gets) and addresses from the block below the lease
// pool. They are removed afterwards, failed or not, and nothing of them
// stays in the lab's bookkeeping. A probe that fails is in the report; the
// error is for a check that could not be run.
func Probe(ctx context.Context, cfg *Config) (*ProbeReport, error) {
	c := *cfg
	c.Defaults()
	start := time.Now()
	lock, err := os.OpenFile(filepath.Join(c.Dir, "probe.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	// Two checks of one lab would share the probe guests' names and
	// addresses. A check lasts about dropWindow, so waiting is fine.
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	p, err := newProber(&c)
	if err != nil {
		return nil, err
	}
	// A check that crashed left its guests: they go first.
	if err := p.remove(ctx); err != nil {
		return nil, err
	}
	rep, err := p.run(ctx)
	if rerr := p.remove(context.WithoutCancel(ctx)); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return nil, err
	}
	rep.Lab, rep.At = c.Name, start.UTC()
	rep.TookMS = time.Since(start).Milliseconds()
	return rep, nil
}

func newProber(c *Config) (*prober, error) {
	// The names are the lab's own (its directory is unique), so that a
	// check finds what an earlier crashed one of the same lab left.
	h := fnv.New32a()
	h.Write([]byte(c.Dir))
	tag := fmt.Sprintf("tbpr%08x", h.Sum32())
	a, b, err := probeAddrs(c)
	if err != nil {
		return nil, err
	}
	return &prober{cfg: c,
		a: probeGuest{NS: tag + "a", Port: tag + "a", IP: a, portMAC: probePortMAC(0x0a)},
		b: probeGuest{NS: tag + "b", Port: tag + "b", IP: b, portMAC: probePortMAC(0x0b)}}, nil
}

// probeAddrs are two lab addresses no lease gets: tb-lease leaves the
// gateway's next eight addresses (.2 to .9) to the lab and starts its pool
// above them, so the probes take the top two of that block, or of the lab
// net when it is smaller.
func probeAddrs(c *Config) (netip.Addr, netip.Addr, error) {
	pfx := c.LabNet.Masked()
	top := c.Gateway()
	for i := 0; i < 8 && pfx.Contains(top.Next().Next()); i++ {
		top = top.Next() // stops before the broadcast address
	}
	below := top.Prev()
	if below == c.Gateway() || top == c.Gateway() {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("lab net %s has no room for the probe guests", pfx)
	}
	return top, below, nil
}

// remove deletes the probe guests and everything that names them: their
// ports (and with them the bridge's forwarding entries), their entries in
// the lab's port set, the host's neighbour entries for their addresses and
// their namespaces. What is already gone is skipped.
func (p *prober) remove(ctx context.Context) error {
	var errs []error
	h, err := handleAt(p.cfg.HostNSPath())
	if err != nil {
		return err
	}
	defer h.Close()
	ports := []string{p.a.Port, p.b.Port}
	for _, port := range ports {
		if l, err := h.LinkByName(port); err == nil {
			if err := h.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("deleting probe port %s: %w", port, err))
			}
		}
	}
	if fw, err := p.cfg.Firewall(); err == nil {
		for _, port := range ports {
			if _, err := fw.UnbindPort(ctx, port); err != nil {
				errs = append(errs, fmt.Errorf("forgetting probe port %s: %w", port, err))
			}
		}
	}
	if br, err := h.LinkByName(p.cfg.Bridge); err == nil {
		if ns, err := h.NeighList(br.Attrs().Index, netlink.FAMILY_V4); err == nil {
			for _, n := range ns {
				if a, ok := netip.AddrFromSlice(n.IP.To4()); ok && (a == p.a.IP || a == p.b.IP) {
					_ = h.NeighDel(&n) // a stale entry ages out anyway
				}
			}
		}
	}
	for _, ns := range []string{p.a.NS, p.b.NS} {
		if err := netns.Delete(ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// add makes a probe guest and attaches its port as AttachPort attaches a
// lease's tap.
func (p *prober) add(ctx context.Context, h *netlink.Handle, g *probeGuest, ipv6 bool) error {
	if err := p.addGuest(ctx, h, g, ipv6); err != nil {
		return fmt.Errorf("probe guest %s: %w", g.NS, err)
	}
	return nil
}

func (p *prober) addGuest(ctx context.Context, h *netlink.Handle, g *probeGuest, ipv6 bool) error {
	if err := netns.Create(g.NS); err != nil {
		return err
	}
	nsf, err := os.Open(g.path())
	if err != nil {
		return err
	}
	la := netlink.NewLinkAttrs()
	la.Name = g.Port
	la.HardwareAddr = g.portMAC
	err = h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(nsf.Fd()))})
	nsf.Close()
	if err != nil {
		return fmt.Errorf("creating port %s: %w", g.Port, err)
	}
	// The port's own IPv6 (link-local, duplicate address detection,
	// multicast listener reports as it comes up) would reach the guest
	// from outside the lab and be taken for a leak.
	if _, err := sysctl(p.cfg.HostNSPath(), ifSysctl("ipv6", g.Port, "disable_ipv6"), "1"); err != nil {
		return err
	}
	gh, in, err := g.eth0()
	if err != nil {
		return err
	}
	defer gh.Close()
	g.MAC = in.Attrs().HardwareAddr
	// The guest that sends IPv6 must not wait for duplicate address
	// detection; the other sends none, so that nothing of its own is
	// mistaken for a leak.
	sysctls := map[string]string{"net.ipv6.conf.eth0.disable_ipv6": "1"}
	if ipv6 {
		sysctls = map[string]string{"net.ipv6.conf.eth0.disable_ipv6": "0", "net.ipv6.conf.eth0.accept_dad": "0"}
	}
	for k, v := range sysctls {
		if _, err := sysctl(g.path(), k, v); err != nil {
			return err
		}
	}
	if err := addrOn(gh, in, netip.PrefixFrom(g.IP, p.cfg.LabNet.Bits())); err != nil {
		return err
	}
	for _, l := range []string{"lo", "eth0"} {
		if l, err := gh.LinkByName(l); err == nil {
			if err := gh.LinkSetUp(l); err != nil {
				return err
			}
		}
	}
	if err := gh.RouteReplace(&netlink.Route{LinkIndex: in.Attrs().Index, Gw: p.cfg.Gateway().AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return AttachPort(ctx, *p.cfg, Port{Name: g.Port, MAC: g.MAC, IP: g.IP})
}

// eth0 is a netlink handle in the probe guest's namespace and its link.
func (g *probeGuest) eth0() (*netlink.Handle, netlink.Link, error) {
	gh, err := handleAt(g.path())
	if err != nil {
		return nil, nil, err
	}
	in, err := gh.LinkByName("eth0")
	if err != nil {
		gh.Close()
		return nil, nil, err
	}
	return gh, in, nil
}

// neighbour gives guest g a fixed MAC for ip: frames go out even where
// ARP never resolves (to another guest; to the host over IPv6).
func neighbour(g *probeGuest, ip netip.Addr, mac net.HardwareAddr) error {
	gh, in, err := g.eth0()
	if err != nil {
		return err
	}
	defer gh.Close()
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	if err := gh.NeighSet(&netlink.Neigh{LinkIndex: in.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT,
		IP: ip.AsSlice(), HardwareAddr: mac}); err != nil {
		return fmt.Errorf("probe guest %s: neighbour %s: %w", g.NS, ip, err)
	}
	return nil
}

// ipv6Out gives guest a an IPv6 address and a default route through the
// bridge's MAC: its IPv6 reaches the host if the host takes it.
func (p *prober) ipv6Out(brMAC net.HardwareAddr) error {
	if err := neighbour(&p.a, probeV6GW, brMAC); err != nil {
		return err
	}
	gh, in, err := p.a.eth0()
	if err != nil {
		return err
	}
	defer gh.Close()
	a, _ := netlink.ParseAddr(probeV6Src.String())
	a.Flags = unix.IFA_F_NODAD
	if err := gh.AddrReplace(in, a); err != nil {
		return fmt.Errorf("probe guest %s: address %s: %w", p.a.NS, probeV6Src, err)
	}
	if err := gh.RouteReplace(&netlink.Route{LinkIndex: in.Attrs().Index, Gw: probeV6GW.AsSlice(),
		Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}); err != nil {
		return fmt.Errorf("probe guest %s: ipv6 default route: %w", p.a.NS, err)
	}
	return nil
}

func (p *prober) setup(ctx context.Context) error {
	h, err := handleAt(p.cfg.HostNSPath())
	if err != nil {
		return err
	}
	defer h.Close()
	if _, err := h.LinkByName(p.cfg.Bridge); err != nil {
		return fmt.Errorf("bridge %s: %w (tb-capture net up)", p.cfg.Bridge, err)
	}
	if err := p.add(ctx, h, &p.a, true); err != nil {
		return err
	}
	if err := p.add(ctx, h, &p.b, false); err != nil {
		return err
	}
	// Read now: a bridge without other ports has just taken a probe
	// port's MAC.
	br, err := h.LinkByName(p.cfg.Bridge)
	if err != nil {
		return err
	}
	if err := neighbour(&p.a, p.b.IP, p.b.MAC); err != nil {
		return err
	}
	if err := neighbour(&p.b, p.a.IP, p.a.MAC); err != nil {
		return err
	}
	// A link that was just brought up drops what it is given to send
	// until the kernel's link watcher has activated it, up to a second
	// later: a probe sent before would be "dropped" by the lab.
	for ns, links := range map[string][]string{p.cfg.HostNSPath(): {p.a.Port, p.b.Port}, p.a.path(): {"eth0"}, p.b.path(): {"eth0"}} {
		if err := waitCanSend(ctx, ns, links...); err != nil {
			return err
		}
	}
	return p.ipv6Out(br.Attrs().HardwareAddr)
}

// waitCanSend returns once every named link in the namespace at nsPath is
// operationally up with its queueing discipline attached (not the noop
// one an inactive link has), so that it transmits.
func waitCanSend(ctx context.Context, nsPath string, names ...string) error {
	ns := vnetns.None()
	if nsPath != "" {
		var err error
		if ns, err = vnetns.GetFromPath(nsPath); err != nil {
			return fmt.Errorf("network namespace %s: %w", nsPath, err)
		}
		defer ns.Close()
	}
	h, err := handleAt(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	updates := make(chan netlink.LinkUpdate)
	done := make(chan struct{})
	defer func() {
		close(done)
		for range updates { // the subscription closes it once done
		}
	}()
	// The existing links come first, then every change.
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{Namespace: &ns, ListExisting: true}); err != nil {
		return fmt.Errorf("watching links: %w", err)
	}
	pending := map[string]bool{}
	for _, n := range names {
		pending[n] = true
	}
	timeout := time.NewTimer(answerWait)
	defer timeout.Stop()
	for len(pending) > 0 {
		select {
		case u, ok := <-updates:
			if !ok {
				return errors.New("watching links: the subscription ended")
			}
			a := u.Link.Attrs()
			if pending[a.Name] && a.OperState == netlink.OperUp && activated(h, u.Link) {
				delete(pending, a.Name)
			}
		case <-timeout.C:
			var left []string
			for n := range pending {
				left = append(left, n)
			}
			return fmt.Errorf("%s not up within %s", strings.Join(left, ", "), answerWait)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func activated(h *netlink.Handle, l netlink.Link) bool {
	qs, err := h.QdiscList(l)
	if err != nil || len(qs) == 0 {
		return false
	}
	for _, q := range qs {
		if q.Type() == "noop" {
			return false
		}
	}
	return true
}

func (p *prober) run(ctx context.Context) (*ProbeReport, error) {
	if err := p.setup(ctx); err != nil {
		return nil, fmt.Errorf("lab %s: setting up the probe guests: %w", p.cfg.Name, err)
	}
	probes := []func(context.Context) ProbeResult{
		p.sinkholeTCP, p.sinkholeHTTP, p.sinkholeDNS, p.hostDropped, p.ipv6Dropped, p.guestDropped,
	}
	rep := &ProbeReport{Probes: make([]ProbeResult, len(probes))}
	// The probes use different addresses and ports, so they run at once:
	// the check takes about one dropWindow.
	var wg sync.WaitGroup
	for i, fn := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep.Probes[i] = fn(ctx)
		}()
	}
	var hostile []ProbeResult
	wg.Go(func() { hostile = p.hostile(ctx) })
	wg.Wait()
	rep.Probes = append(rep.Probes, hostile...)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rep.Passed = rep.Failed() == nil
	return rep, nil
}

func nonce() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func pass(name, format string, a ...any) ProbeResult {
	return ProbeResult{Name: name, Verdict: ProbePass, Detail: fmt.Sprintf(format, a...)}
}

func fail(name, format string, a ...any) ProbeResult {
	return ProbeResult{Name: name, Verdict: ProbeFail, Detail: fmt.Sprintf(format, a...)}
}

// dialFrom connects from guest g.
func dialFrom(ctx context.Context, g *probeGuest, network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(g.path(), func() (err error) {
		d := net.Dialer{Timeout: timeout}
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// sinkholeTCP: a connection to a public address is answered by a listener
// of the probe's own in the sinkhole namespace, with a nonce nothing
// outside could send; in a lab with a catch-all, the port it asks for is
// one the sinkhole does not serve, so it lands on the catch-all.
func (p *prober) sinkholeTCP(ctx context.Context) ProbeResult {
	const name = "sinkhole-tcp"
	if tcp, _ := p.cfg.catchAll(); tcp != nil {
		return p.sinkholeCatchAll(ctx, name, tcp.Port)
	}
	sink := p.cfg.Sinkhole()
	var ln net.Listener
	if err := netns.Do(netns.Path(p.cfg.SinkNS), func() (err error) {
		ln, err = net.Listen("tcp4", net.JoinHostPort(sink.String(), "0"))
		return err
	}); err != nil {
		return fail(name, "listening in the sinkhole: %v", err)
	}
	defer ln.Close()
	word := nonce()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// The DNAT keeps ports: a guest may land here by chance, and
			// only the probe gets the nonce.
			if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil && ap.Addr().Unmap() == p.a.IP {
				c.SetWriteDeadline(time.Now().Add(answerWait))
				io.WriteString(c, word)
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	dst := netip.AddrPortFrom(probeTCPDst, uint16(port)).String()
	c, err := dialFrom(ctx, &p.a, "tcp4", dst, answerWait)
	if err != nil {
		return fail(name, "connecting to %s: %v", dst, err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(answerWait))
	got := make([]byte, len(word))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != word {
		return fail(name, "%s answered, but not by the sinkhole (%q, %v)", dst, got, err)
	}
	return pass(name, "%s was answered by the sinkhole %s", dst, sink)
}

// probeUnservedPort is a port no sinkhole service listens on.
const probeUnservedPort = 48101

// sinkholeCatchAll: a connection to a public address on a port the sinkhole
// serves nothing on is held by the sinkhole namespace on the catch-all's
// port, with the probe guest's address and port at the other end. The
// catch-all sends nothing, so the sinkhole's socket table is the proof.
func (p *prober) sinkholeCatchAll(ctx context.Context, name string, port uint16) ProbeResult {
	dst := netip.AddrPortFrom(probeTCPDst, probeUnservedPort).String()
	c, err := dialFrom(ctx, &p.a, "tcp4", dst, answerWait)
	if err != nil {
		return fail(name, "connecting to %s: %v", dst, err)
	}
	defer c.Close()
	at := &net.TCPAddr{IP: p.cfg.Sinkhole().AsSlice(), Port: int(port)}
	from := c.LocalAddr().(*net.TCPAddr)
	held := func() (found bool, err error) {
		// The sock_diag socket is opened in the sinkhole's namespace.
		err = netns.Do(netns.Path(p.cfg.SinkNS), func() error {
			// INetSim may listen on an IPv6 socket that takes IPv4 too.
			for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
				socks, err := netlink.SocketDiagTCP(family)
				if err != nil {
					return err
				}
				for _, s := range socks {
					if s.State == unix.BPF_TCP_ESTABLISHED && s.ID.Source.Equal(at.IP) && int(s.ID.SourcePort) == at.Port &&
						s.ID.Destination.Equal(from.IP) && int(s.ID.DestinationPort) == from.Port {
						found = true
						return nil
					}
				}
			}
			return nil
		})
		return found, err
	}
	deadline := time.Now().Add(answerWait)
	for {
		ok, err := held()
		if ok {
			// The same words as the listener's pass: whichever of the
			// sinkhole's listeners took it, the sinkhole answered.
			return pass(name, "%s was answered by the sinkhole %s", dst, p.cfg.Sinkhole())
		}
		if err != nil || time.Now().After(deadline) || ctx.Err() != nil {
			return fail(name, "%s was accepted, but not by the sinkhole's catch-all %s (%v)", dst, at, err)
		}
		time.Sleep(10 * time.Millisecond) // polling the sinkhole's sockets: an accept sends no event
	}
}

// sinkholeHTTP: INetSim answers HTTP for a public address.
func (p *prober) sinkholeHTTP(ctx context.Context) ProbeResult {
	const name = "sinkhole-http"
	if !p.cfg.INetSim {
		return ProbeResult{Name: name, Verdict: ProbeSkip, Detail: "the lab runs no INetSim"}
	}
	dst := netip.AddrPortFrom(probeTCPDst, 80).String()
	c, err := dialFrom(ctx, &p.a, "tcp4", dst, answerWait)
	if err != nil {
		return fail(name, "connecting to %s: %v", dst, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(serviceWait))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\nHost: probe.example\r\n\r\n"); err != nil {
		return fail(name, "%s: %v", dst, err)
	}
	head := make([]byte, 4096)
	n, err := io.ReadFull(c, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return fail(name, "%s: %v", dst, err)
	}
	head = head[:n]
	if !strings.HasPrefix(string(head), "HTTP/") || !strings.Contains(string(head), "INetSim") {
		line, _, _ := strings.Cut(string(head), "\r\n")
		return fail(name, "%s did not answer as INetSim: %q", dst, line)
	}
	return pass(name, "INetSim answered HTTP for %s", dst)
}

// sinkholeDNS: a query for a name nobody has, to an arbitrary resolver, is
// answered with the sinkhole's address.
func (p *prober) sinkholeDNS(ctx context.Context) ProbeResult {
	const name = "sinkhole-dns"
	if !p.cfg.DNS {
		return ProbeResult{Name: name, Verdict: ProbeSkip, Detail: "the lab runs no DNS sinkhole"}
	}
	dst := netip.AddrPortFrom(probeDNSDst, 53).String()
	qname := "tb-probe-" + nonce() + ".example."
	got, err := p.resolve(ctx, dst, qname)
	if err != nil {
		return fail(name, "%s for %s: %v", dst, qname, err)
	}
	if got != p.cfg.Sinkhole() {
		return fail(name, "%s answered %s with %s, not the sinkhole %s", dst, qname, got, p.cfg.Sinkhole())
	}
	return pass(name, "%s answered %s with the sinkhole %s", dst, qname, got)
}

func (p *prober) resolve(ctx context.Context, server, qname string) (netip.Addr, error) {
	c, err := dialFrom(ctx, &p.a, "udp4", server, answerWait)
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	var idb [2]byte
	rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(qname), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, err := b.Finish()
	if err != nil {
		return netip.Addr{}, err
	}
	c.SetDeadline(time.Now().Add(answerWait))
	if _, err := c.Write(q); err != nil {
		return netip.Addr{}, err
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		return netip.Addr{}, err
	}
	var ps dnsmessage.Parser
	h, err := ps.Start(buf[:n])
	if err != nil {
		return netip.Addr{}, err
	}
	if h.ID != id {
		return netip.Addr{}, fmt.Errorf("answer for query %d, not %d", h.ID, id)
	}
	ps.SkipAllQuestions()
	for {
		ah, err := ps.AnswerHeader()
		if err != nil {
			return netip.Addr{}, fmt.Errorf("no A record in the answer (rcode %s)", h.RCode)
		}
		if ah.Type == dnsmessage.TypeA {
			a, err := ps.AResource()
			if err != nil {
				return netip.Addr{}, err
			}
			return netip.AddrFrom4(a.A), nil
		}
		ps.SkipAnswer()
	}
}

// hostDropped: a connection to a port the host listens on, on the
// gateway, gets no answer at all.
func (p *prober) hostDropped(ctx context.Context) ProbeResult {
	const name = "host-dropped"
	gw := p.cfg.Gateway()
	var ln net.Listener
	if err := netns.Do(p.cfg.HostNSPath(), func() (err error) {
		ln, err = net.Listen("tcp4", net.JoinHostPort(gw.String(), "0"))
		return err
	}); err != nil {
		return fail(name, "listening on the host: %v", err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	dst := ln.Addr().String()
	c, err := dialFrom(ctx, &p.a, "tcp4", dst, dropWindow)
	switch {
	case err == nil:
		c.Close()
		return fail(name, "connected to the host at %s", dst)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fail(name, "the host answered at %s (connection refused)", dst)
	case timedOut(err):
		return pass(name, "no answer from the host at %s within %s", dst, dropWindow)
	}
	return fail(name, "connecting to the host at %s: %v", dst, err)
}

// guestDropped: a datagram from one guest to another, sent to its MAC,
// does not arrive.
func (p *prober) guestDropped(ctx context.Context) ProbeResult {
	const name = "guest-to-guest-dropped"
	var pc net.PacketConn
	if err := netns.Do(p.b.path(), func() (err error) {
		pc, err = net.ListenPacket("udp4", net.JoinHostPort(p.b.IP.String(), "0"))
		return err
	}); err != nil {
		return fail(name, "listening in the second guest: %v", err)
	}
	defer pc.Close()
	dst := pc.LocalAddr().String()
	word := nonce()
	c, err := dialFrom(ctx, &p.a, "udp4", dst, answerWait)
	if err != nil {
		return fail(name, "sending to %s: %v", dst, err)
	}
	_, err = io.WriteString(c, word)
	c.Close()
	if err != nil {
		return fail(name, "sending to %s: %v", dst, err)
	}
	pc.SetReadDeadline(time.Now().Add(dropWindow))
	buf := make([]byte, 64)
	for {
		n, from, err := pc.ReadFrom(buf)
		if timedOut(err) {
			return pass(name, "%s got nothing from %s within %s", dst, p.a.IP, dropWindow)
		}
		if err != nil {
			return fail(name, "listening at %s: %v", dst, err)
		}
		if string(buf[:n]) == word {
			return fail(name, "%s received %s's datagram", dst, from)
		}
	}
}

// ipv6Dropped: an echo request to every IPv6 node on the link and a
// datagram routed through the host get nothing back: no IPv6 packet at all
// arrives at the guest.
func (p *prober) ipv6Dropped(ctx context.Context) ProbeResult {
	const name = "ipv6-dropped"
	var res ProbeResult
	err := netns.Do(p.a.path(), func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		// Opened first, so that nothing that comes back is missed.
		sniff, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IPV6)))
		if err != nil {
			return err
		}
		defer unix.Close(sniff)
		if err := unix.Bind(sniff, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: ifc.Index}); err != nil {
			return err
		}
		if err := sendV6(ifc.Index); err != nil {
			return err
		}
		from, ok, err := inboundV6(sniff, time.Now().Add(dropWindow))
		switch {
		case err != nil:
			return err
		case ok:
			res = fail(name, "an IPv6 packet from %s reached the guest", from)
		default:
			res = pass(name, "no IPv6 packet reached the guest within %s", dropWindow)
		}
		return nil
	})
	if err != nil {
		return fail(name, "%v", err)
	}
	return res
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func sendV6(ifindex int) error {
	s, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	// The guest's own copy of its multicast would look like an answer.
	if err := unix.SetsockoptInt(s, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_LOOP, 0); err != nil {
		return err
	}
	// Echo request; the kernel fills in the ICMPv6 checksum.
	echo := append([]byte{128, 0, 0, 0, 0x74, 0x62, 0, 1}, nonce()...)
	allNodes := &unix.SockaddrInet6{Addr: netip.MustParseAddr("ff02::1").As16(), ZoneId: uint32(ifindex)}
	if err := unix.Sendto(s, echo, 0, allNodes); err != nil {
		return fmt.Errorf("ipv6 echo to ff02::1: %w", err)
	}
	if err := unix.Sendto(s, echo, 0, &unix.SockaddrInet6{Addr: probeV6Dst.As16()}); err != nil {
		return fmt.Errorf("ipv6 echo to %s: %w", probeV6Dst, err)
	}
	return nil
}

// inboundV6 waits until deadline for an IPv6 packet that came in on the
// wire (not one the guest sent) and returns its source.
func inboundV6(fd int, deadline time.Time) (netip.Addr, bool, error) {
	buf := make([]byte, 2048)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return netip.Addr{}, false, nil
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return netip.Addr{}, false, err
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return netip.Addr{}, false, err
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && (ll.Pkttype == unix.PACKET_OUTGOING || ll.Pkttype == unix.PACKET_LOOPBACK) {
			continue
		}
		src := netip.IPv6Unspecified()
		if n >= 24 {
			src = netip.AddrFrom16([16]byte(buf[8:24]))
		}
		return src, true, nil
	}
}
