// Package beacon is Talkbox's benign test sample: it behaves like a small
// bot (resolves its C2 name, beacons on a period with jitter, retries when
// the C2 does not answer, runs a telnet scan, short or, for a soak,
// repeated over hundreds of addresses) so that the whole loop can be
// exercised. With -c2-proto it speaks one of four bot protocols to its C2
// (botwire): HTTP check-ins (the default), or one long-lived session in
// Mirai's binary protocol, a Gafgyt/Bashlite text channel or IRC, with
// registration and keep-alives; an attack order from the C2 makes it send
// a short, paced UDP flood (attack.go).
//
// It is harmless by construction: it only ever contacts the C2, the scan
// targets and the hostile modes' targets (hostile.go) given as arguments,
// and it refuses any address outside the documentation ranges and the
// lab; an attack goes only to the documentation ranges, at 200 packets a
// second for 5 s at most, 1,000 packets in all. Every byte from the C2 is
// read as hostile: bounded reads, checked lengths, nothing allocated by a
// size it sent.
package beacon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/demo/beacon/botwire"
)

// scanNets are the only networks a scan may touch: the three documentation
// ranges that stand in for the internet and the lab's guest network. The
// list is fixed in the code so that no argument can widen it.
var scanNets = []netip.Prefix{
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("10.13.37.0/24"),
}

// c2Nets are where the C2 name may resolve: the scan networks, the lab's
// sinkhole link (where a sinkholed name points) and loopback (a C2 on the
// same machine, as in the unit tests).
var c2Nets = append(append([]netip.Prefix{}, scanNets...),
	netip.MustParsePrefix("10.13.38.0/24"),
	netip.MustParsePrefix("127.0.0.0/8"),
)

// ScanAllowed reports whether a scan may touch addr.
func ScanAllowed(addr netip.Addr) bool { return inNets(addr, scanNets) }

// C2Allowed reports whether the C2 may be contacted at addr.
func C2Allowed(addr netip.Addr) bool { return inNets(addr, c2Nets) }

func inNets(addr netip.Addr, nets []netip.Prefix) bool {
	addr = addr.Unmap()
	for _, n := range nets {
		if n.Contains(addr) {
			return true
		}
	}
	return false
}

// Config is what the beacon does.
type Config struct {
	// Proto is the bot protocol spoken to the C2 (botwire.Protocols).
	Proto string
	C2    string // host name or address
	// C2Addr is a hard-coded address of the C2, contacted whatever the
	// name resolves to (the name is still resolved, and sent as the HTTP
	// Host), as bots that carry both do.
	C2Addr   netip.Addr
	Port     int
	Path     string
	ID       string
	Interval time.Duration
	Jitter   float64 // fraction of Interval, 0–1
	Count    int     // beacons to send (0: until the context ends)
	Retry    time.Duration
	Retries  int // attempts per beacon
	Timeout  time.Duration
	Scan     []netip.Addr
	ScanPort int
	// ScanRounds is how many times the scan goes over its targets, back to
	// back; ScanParallel how many probes are in flight at once.
	ScanRounds   int
	ScanParallel int
	// Behave is the scratch directory of -behave (Behaviour), "" for none;
	// BehaveListen its listener's port.
	Behave       string
	BehaveListen int
	// Hostile is what -hostile makes the beacon do before it beacons (nil:
	// nothing hostile); with it, -c2 is optional.
	Hostile *Hostile
}

// MaxScanParallel bounds the probes in flight: a scanning bot's pace, not
// a flood of the guest's own socket table.
const MaxScanParallel = 64

// Parse reads the command line. Scan targets outside the allowed networks
// are refused here, before anything is sent.
func Parse(args []string, stderr io.Writer) (*Config, error) {
	fs := flag.NewFlagSet("beacon", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &Config{}
	c2addr := fs.String("c2-addr", "", "hard-coded C2 address (documentation ranges and the lab only); the name is still resolved")
	var scan []string
	fs.Func("scan", "scan targets, comma-separated or repeated, each an address or a range FIRST-LAST within one /24 (documentation ranges and 10.13.37.0/24 only)", func(v string) error {
		scan = append(scan, strings.Split(v, ",")...)
		return nil
	})
	fs.StringVar(&c.Proto, "c2-proto", botwire.HTTP, "bot protocol spoken to the C2: http (check-ins), mirai, gafgyt or irc (one long-lived session)")
	fs.StringVar(&c.C2, "c2", "", "C2 host name or address (required unless -hostile is given)")
	fs.IntVar(&c.Port, "port", 80, "C2 port")
	fs.StringVar(&c.Path, "path", "/gate", "C2 HTTP path")
	fs.StringVar(&c.ID, "id", "tb-beacon", "bot identifier sent with each beacon")
	fs.DurationVar(&c.Interval, "interval", 5*time.Second, "beacon period")
	fs.Float64Var(&c.Jitter, "jitter", 0.2, "jitter as a fraction of the period (0-1)")
	fs.IntVar(&c.Count, "count", 0, "beacons to send (0: until killed)")
	fs.DurationVar(&c.Retry, "retry", time.Second, "wait between attempts when the C2 does not answer")
	fs.IntVar(&c.Retries, "retries", 3, "attempts per beacon")
	fs.DurationVar(&c.Timeout, "timeout", 3*time.Second, "timeout of one connection")
	fs.IntVar(&c.ScanPort, "scan-port", 23, "port the scan probes (telnet)")
	fs.IntVar(&c.ScanRounds, "scan-rounds", 1, "times the scan goes over its targets, without pause")
	fs.IntVar(&c.ScanParallel, "scan-parallel", 1, fmt.Sprintf("probes in flight at once (1-%d)", MaxScanParallel))
	fs.StringVar(&c.Behave, "behave", "", "first rename the process, run a child, drop a file, write persistence files, read /proc/self/status and delete its own binary, all within this scratch directory (for the behaviour trace's tests)")
	fs.IntVar(&c.BehaveListen, "behave-listen", 0, "with -behave: also listen on this TCP port (a backdoor, for the tests)")
	hostile := hostileFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var err error
	if c.Hostile, err = hostile(); err != nil {
		return nil, err
	}
	switch {
	case !botwire.Known(c.Proto):
		return nil, fmt.Errorf("-c2-proto %q: want one of %s", c.Proto, strings.Join(botwire.Protocols, ", "))
	case c.Proto != botwire.HTTP && !botwire.ValidID(c.ID):
		return nil, fmt.Errorf("-id %q: the bot protocols announce 1-%d printable bytes without spaces", c.ID, botwire.MaxID)
	case c.C2 == "" && c.Hostile == nil:
		return nil, errors.New("-c2 is required (unless -hostile is given)")
	case c.Port < 1 || c.Port > 65535 || c.ScanPort < 1 || c.ScanPort > 65535:
		return nil, errors.New("ports must be 1-65535")
	case c.Interval <= 0 || c.Jitter < 0 || c.Jitter > 1 || c.Retries < 1 || c.Count < 0:
		return nil, errors.New("-interval must be positive, -jitter within 0-1, -retries at least 1, -count not negative")
	case c.ScanRounds < 1 || c.ScanParallel < 1 || c.ScanParallel > MaxScanParallel:
		return nil, fmt.Errorf("-scan-rounds must be at least 1, -scan-parallel within 1-%d", MaxScanParallel)
	case !strings.HasPrefix(c.Path, "/"):
		return nil, errors.New("-path must start with /")
	case c.BehaveListen < 0 || c.BehaveListen > 65535 || c.BehaveListen != 0 && c.Behave == "":
		return nil, errors.New("-behave-listen needs -behave and a port 1-65535")
	}
	if strings.ContainsAny(c.C2+c.Path+c.ID, " \r\n") {
		return nil, errors.New("-c2, -path and -id must not contain spaces or line breaks")
	}
	if a, err := netip.ParseAddr(c.C2); err == nil && !C2Allowed(a) {
		return nil, fmt.Errorf("refusing C2 %s: outside the documentation ranges and the lab", a)
	}
	if *c2addr != "" {
		a, err := netip.ParseAddr(*c2addr)
		if err != nil {
			return nil, fmt.Errorf("-c2-addr %q is not an IP address", *c2addr)
		}
		if !C2Allowed(a) {
			return nil, fmt.Errorf("refusing C2 %s: outside the documentation ranges and the lab", a)
		}
		c.C2Addr = a
	}
	for _, s := range scan {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		targets, err := scanTargets(s)
		if err != nil {
			return nil, err
		}
		c.Scan = append(c.Scan, targets...)
	}
	return c, nil
}

// scanTargets reads one -scan entry: an address or a range FIRST-LAST.
// Both ends must lie in one allowed network, checked before the range is
// expanded, so that a range can neither leave it nor be large.
func scanTargets(s string) ([]netip.Addr, error) {
	first, last, isRange := strings.Cut(s, "-")
	a, err := netip.ParseAddr(strings.TrimSpace(first))
	if err != nil {
		return nil, fmt.Errorf("scan target %q is not an IP address or a range FIRST-LAST", s)
	}
	if !ScanAllowed(a) {
		return nil, fmt.Errorf("refusing scan target %s: outside 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 and 10.13.37.0/24", a)
	}
	if !isRange {
		return []netip.Addr{a}, nil
	}
	b, err := netip.ParseAddr(strings.TrimSpace(last))
	if err != nil {
		return nil, fmt.Errorf("scan target %q is not an IP address or a range FIRST-LAST", s)
	}
	if !ScanAllowed(b) {
		return nil, fmt.Errorf("refusing scan target %s: outside 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 and 10.13.37.0/24", b)
	}
	if a, b = a.Unmap(), b.Unmap(); !sameNet(a, b) || b.Less(a) {
		return nil, fmt.Errorf("scan range %q must run upwards within one of 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 and 10.13.37.0/24", s)
	}
	var out []netip.Addr
	for x := a; ; x = x.Next() {
		out = append(out, x)
		if x == b {
			return out, nil
		}
	}
}

func sameNet(a, b netip.Addr) bool {
	for _, n := range scanNets {
		if n.Contains(a) {
			return n.Contains(b)
		}
	}
	return false
}

// Beacon runs a Config. Dial and Lookup are the network (net.Dialer and
// net.DefaultResolver unless a test replaces them); Log receives one line per
// action.
type Beacon struct {
	Cfg    *Config
	Dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	Log    io.Writer
	Rand   *rand.Rand
	// PacketConn opens an attack's socket (nil: a UDP socket).
	PacketConn func(ctx context.Context) (net.PacketConn, error)
	logMu      sync.Mutex // parallel probes log
	atkMu      sync.Mutex
	atk        attacks
	atkWG      sync.WaitGroup // the attack running
}

// New returns a Beacon on the real network.
func New(cfg *Config, log io.Writer) *Beacon {
	d := &net.Dialer{Timeout: cfg.Timeout}
	return &Beacon{
		Cfg: cfg, Dial: d.DialContext, Log: log,
		Lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
		},
		Rand: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
}

// Stats is what a run did.
type Stats struct {
	Sent, Answered, Failed, Scanned, Open int
}

// Run scans (ScanRounds times), then beacons until Count beacons were sent
// or ctx ends, and waits for an attack the C2 ordered to end.
func (b *Beacon) Run(ctx context.Context) Stats {
	var st Stats
	b.Logf("start c2=%s port=%d interval=%s jitter=%.2f scan=%d", b.Cfg.C2, b.Cfg.Port, b.Cfg.Interval, b.Cfg.Jitter, len(b.Cfg.Scan))
	st.Scanned, st.Open = b.scan(ctx)
	if b.Cfg.Proto == "" || b.Cfg.Proto == botwire.HTTP {
		b.checkIns(ctx, &st)
	} else {
		b.runChannel(ctx, &st)
	}
	b.atkWG.Wait()
	b.Logf("done sent=%d answered=%d failed=%d scanned=%d open=%d", st.Sent, st.Answered, st.Failed, st.Scanned, st.Open)
	return st
}

// checkIns is Run for HTTP: one check-in a period.
func (b *Beacon) checkIns(ctx context.Context, st *Stats) {
	for seq := 1; b.Cfg.Count == 0 || seq <= b.Cfg.Count; seq++ {
		st.Sent++
		if b.beacon(ctx, seq) {
			st.Answered++
		} else {
			st.Failed++
		}
		if ctx.Err() != nil || (b.Cfg.Count != 0 && seq == b.Cfg.Count) {
			break
		}
		if !sleep(ctx, b.period()) {
			break
		}
	}
}

func (b *Beacon) period() time.Duration {
	j := float64(b.Cfg.Interval) * b.Cfg.Jitter
	return b.Cfg.Interval + time.Duration((b.Rand.Float64()*2-1)*j)
}

// Logf writes one line of what the beacon does, timestamped.
func (b *Beacon) Logf(format string, a ...any) {
	b.logMu.Lock()
	defer b.logMu.Unlock()
	fmt.Fprintf(b.Log, time.Now().UTC().Format(time.RFC3339)+" "+format+"\n", a...)
}

// scan probes every target ScanRounds times, with at most ScanParallel
// probes in flight (one: in order), and stops when ctx ends.
func (b *Beacon) scan(ctx context.Context) (scanned, open int) {
	rounds, par := max(b.Cfg.ScanRounds, 1), min(max(b.Cfg.ScanParallel, 1), MaxScanParallel)
	slots := make(chan struct{}, par)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for r := 0; r < rounds && ctx.Err() == nil; r++ {
		for _, a := range b.Cfg.Scan {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok := b.probe(ctx, a)
				mu.Lock()
				scanned++
				if ok {
					open++
				}
				mu.Unlock()
				<-slots
			}()
		}
	}
	wg.Wait()
	return scanned, open
}

// probe connects to the scan port of a (already checked) target and reads a
// banner line, as a telnet scanner does; it sends nothing.
// bannerWait bounds how long a scan probe waits for a banner once
// connected: a telnet server sends one at once, and the lab's sinkhole
// accepts every port and says nothing (its silent catch-all), where the
// connection's whole timeout per address would stretch a short scan past a
// detached cycle's window.
const bannerWait = 500 * time.Millisecond

func (b *Beacon) probe(ctx context.Context, a netip.Addr) bool {
	if !ScanAllowed(a) { // Parse checked already; a Config built in code is checked too
		b.Logf("scan %s refused", a)
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, b.Cfg.Timeout)
	defer cancel()
	addr := net.JoinHostPort(a.String(), strconv.Itoa(b.Cfg.ScanPort))
	c, err := b.Dial(cctx, "tcp", addr)
	if err != nil {
		b.Logf("scan %s closed: %v", addr, err)
		return false
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(min(b.Cfg.Timeout, bannerWait)))
	line, _ := bufio.NewReader(c).ReadString('\n')
	b.Logf("scan %s open banner=%q", addr, strings.TrimSpace(line))
	return true
}

// beacon resolves the C2 and posts one check-in, retrying.
func (b *Beacon) beacon(ctx context.Context, seq int) bool {
	for attempt := 1; attempt <= b.Cfg.Retries; attempt++ {
		status, server, err := b.checkIn(ctx, seq, attempt)
		if err == nil {
			b.Logf("beacon seq=%d attempt=%d status=%d server=%q", seq, attempt, status, server)
			return true
		}
		b.Logf("beacon seq=%d attempt=%d failed: %v", seq, attempt, err)
		if attempt < b.Cfg.Retries && !sleep(ctx, b.Cfg.Retry) {
			return false
		}
	}
	return false
}

// checkIn posts one check-in and reads the answer; when the answer is a
// task (the C2's, not a sinkhole's page), the beacon reports it done on
// the same connection, as a bot answers its C2: that turn is what
// confirms a C2 on probation (tb-allow(1)), since any server a sample
// aims at answers a request. A task other than "sleep" is an attack
// order (botwire.ParseOrder), carried out beside the check-ins.
func (b *Beacon) checkIn(ctx context.Context, seq, attempt int) (int, string, error) {
	cctx, cancel := context.WithTimeout(ctx, b.Cfg.Timeout)
	defer cancel()
	addr, err := b.resolve(cctx)
	if err != nil {
		return 0, "", err
	}
	c, err := b.Dial(cctx, "tcp", net.JoinHostPort(addr.String(), strconv.Itoa(b.Cfg.Port)))
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	if dl, ok := cctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	body := fmt.Sprintf(`{"id":%q,"seq":%d,"attempt":%d}`, b.Cfg.ID, seq, attempt)
	if _, err := io.WriteString(c, b.post(body, false)); err != nil {
		return 0, "", err
	}
	r := bufio.NewReader(c)
	status, server, length, err := readHead(r)
	if err != nil {
		return 0, "", err
	}
	if task := readTask(r, length); task != "" {
		if task != "sleep" {
			if o, err := botwire.ParseOrder(task); err != nil {
				b.Logf("task ignored: %v", err)
			} else {
				b.order(ctx, o)
			}
		}
		done := fmt.Sprintf(`{"id":%q,"seq":%d,"attempt":%d,"done":%q}`, b.Cfg.ID, seq, attempt, task)
		// The report's own answer does not change the check-in's outcome.
		if _, err := io.WriteString(c, b.post(done, true)); err == nil {
			readHead(r)
		}
	}
	return status, server, nil
}

// post is a request to the C2 carrying body.
func (b *Beacon) post(body string, last bool) string {
	conn := "keep-alive"
	if last {
		conn = "close"
	}
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: tb-beacon/1\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: %s\r\n\r\n%s",
		b.Cfg.Path, b.Cfg.C2, len(body), conn, body)
}

// maxTask bounds the answer body the beacon reads for its task.
const maxTask = 4096

// readHead reads an HTTP response's status line and headers: the status,
// the Server header and the Content-Length (-1 when there is none).
func readHead(r *bufio.Reader) (status int, server string, length int, err error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, "", -1, fmt.Errorf("no answer: %w", err)
	}
	f := strings.Fields(line)
	if len(f) < 2 || !strings.HasPrefix(f[0], "HTTP/") {
		return 0, "", -1, fmt.Errorf("not HTTP: %q", strings.TrimSpace(line))
	}
	if status, err = strconv.Atoi(f[1]); err != nil {
		return 0, "", -1, fmt.Errorf("not HTTP: %q", strings.TrimSpace(line))
	}
	length = -1
	for {
		h, err := r.ReadString('\n')
		if err != nil || strings.TrimSpace(h) == "" {
			break
		}
		k, v, ok := strings.Cut(h, ":")
		switch {
		case !ok:
		case strings.EqualFold(k, "Server"):
			server = strings.TrimSpace(v)
		case strings.EqualFold(k, "Content-Length"):
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
				length = n
			}
		}
	}
	return status, server, length, nil
}

// readTask reads an answer's body of length bytes and returns the task it
// carries ({"task":"..."}), or "" when it carries none.
func readTask(r *bufio.Reader, length int) string {
	if length <= 0 || length > maxTask {
		return ""
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(r, body); err != nil {
		return ""
	}
	var answer struct {
		Task string `json:"task"`
	}
	if json.Unmarshal(body, &answer) != nil {
		return ""
	}
	return answer.Task
}

func (b *Beacon) resolve(ctx context.Context) (netip.Addr, error) {
	if a, err := netip.ParseAddr(b.Cfg.C2); err == nil {
		if !C2Allowed(a) {
			return netip.Addr{}, fmt.Errorf("refusing C2 %s", a)
		}
		return a, nil
	}
	addrs, err := b.Lookup(ctx, b.Cfg.C2)
	if b.Cfg.C2Addr.IsValid() {
		if !C2Allowed(b.Cfg.C2Addr) {
			return netip.Addr{}, fmt.Errorf("refusing C2 %s", b.Cfg.C2Addr)
		}
		b.Logf("resolved %s to %v (%v); using %s", b.Cfg.C2, addrs, err, b.Cfg.C2Addr)
		return b.Cfg.C2Addr, nil
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("resolving %s: %w", b.Cfg.C2, err)
	}
	for _, a := range addrs {
		if C2Allowed(a) {
			b.Logf("resolved %s to %s", b.Cfg.C2, a)
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("refusing C2 %s: resolves to %v, outside the documentation ranges and the lab", b.Cfg.C2, addrs)
}

// sleep waits d or until ctx ends; false means ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
