package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/lease/leasetest"
	"github.com/talkbox-sandbox/talkbox/internal/records"
)

// hostileLab is what TestHostileGuest runs on: one lab (bridge, sinkhole,
// nftables) with an uplink into an "internet" namespace holding the C2 and
// its resolver (scripts/demo-net.sh: off every network of the host, as the
// allow-list's never-allow list requires, reached through a routing table
// of the lab's own whose default route is the uplink), the tools built by
// the test and the amd64 fixture image in a state of its own. The
// namespace forwards nothing, so whatever else the lab lets through is
// seen on the uplink and dropped there, never sent anywhere else.
type hostileLab struct {
	bin, work, stateDir string
	env                 []string
	lab, bridge, uplink string
	inet                string
	// sinkVeth is the host's end of the sinkhole's link: what the lab
	// sinkholes passes it with its source address.
	sinkVeth string
	// c2 is the C2's address, resolver its resolver's (the lab's
	// upstream); labDir the lab's own directory (its DNS forward list and
	// DNS log).
	c2, resolver, labDir string
	beacon               string
	labNet               string
}

// The hostile guest's targets: documentation addresses off every host
// network (demo-net.sh's internet holds .242 and .243 of the same /28).
// The aim mode's and the names mode's are third parties in the test's
// internet, web servers that answer whatever reaches them (as any web
// server would), so that what stops the aim is the probation's demand for
// a C2's conversation, not silence; nothing listens on the spray's.
const (
	hostileAimAddr   = "198.51.100.247:8443"
	hostileHTTPAddr  = "198.51.100.248:80"
	hostileSprayAddr = "198.51.100.249"
)

// upHostileLab builds the beacon and the C2, brings the namespace, the C2
// and the lab up, and registers their teardown.
func upHostileLab(t *testing.T, bin, goBin string) *hostileLab {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	if err := leasetest.Reachable(dir); err != nil {
		t.Fatal(err)
	}
	var tb [3]byte
	rand.Read(tb[:])
	tag := hex.EncodeToString(tb[:])
	l := &hostileLab{bin: bin, work: filepath.Join(dir, "work"), stateDir: filepath.Join(dir, "state"),
		lab: "hos" + tag, bridge: "tbh" + tag, uplink: "tbhu" + tag, inet: "tbhi" + tag, sinkVeth: "tbhk" + tag}
	if err := os.MkdirAll(l.work, 0o755); err != nil {
		t.Fatal(err)
	}
	fx, err := leasetest.Image(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := fx.Install(ctx, l.stateDir); err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: the domains go last, after the
	// leases were released.
	t.Cleanup(func() { leasetest.Cleanup(l.stateDir) })
	l.beacon = filepath.Join(l.work, "beacon")
	for pkg, out := range map[string]string{"./internal/demo/beacon/cmd/beacon": l.beacon, "./internal/demo/c2/cmd/c2server": filepath.Join(l.work, "c2server")} {
		cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, pkg)
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", pkg, err, b)
		}
	}

	// The namespace, its addresses and the lab's routing table:
	// demo-net.sh's free slot and its internet.
	up := exec.Command("bash", "-c", `. scripts/demo-net.sh && demo_net_up "$1" "$2" >&2 && demo_net_internet "$1" "$2" >&2 && echo "$c2 $resolver $labnet $sinknet"`, "demo-net", l.inet, l.uplink)
	up.Dir = "../.."
	out, err := up.Output()
	t.Cleanup(func() {
		down := exec.Command("bash", "-c", `. scripts/demo-net.sh && demo_net_down "$1" "$2"`, "demo-net", l.inet, l.uplink)
		down.Dir = "../.."
		down.Run()
	})
	if err != nil {
		t.Fatalf("demo_net_up: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) != 4 {
		t.Fatalf("demo_net_up said %q", out)
	}
	l.c2, l.resolver, l.labNet = f[0], f[1], f[2]
	sinkNet := f[3]

	// The C2 and its resolver in the namespace.
	server := exec.Command("ip", "netns", "exec", l.inet, filepath.Join(l.work, "c2server"), "-listen", l.c2+":80",
		"-log", filepath.Join(l.work, "c2.log"), "-ready", "/dev/stdout")
	ready, err := server.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Process.Signal(syscall.SIGTERM); server.Wait() })
	if _, err := waitLine(ready, 30*time.Second, func(string) bool { return true }); err != nil {
		t.Fatalf("the C2 server did not start: %v", err)
	}
	// The third parties the hostile guest aims at: web servers (the demo
	// C2's HTTP server, which answers every request with 200), each
	// logging what reaches it.
	for _, web := range []string{hostileAimAddr, hostileHTTPAddr} {
		addr, _, _ := strings.Cut(web, ":")
		run(t, "ip", "-n", l.inet, "addr", "add", addr+"/32", "dev", "up0")
		server := exec.Command("ip", "netns", "exec", l.inet, filepath.Join(l.work, "c2server"), "-listen", web,
			"-log", l.thirdPartyLog(web), "-ready", "/dev/stdout")
		ready, err := server.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := server.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { server.Process.Signal(syscall.SIGTERM); server.Wait() })
		if _, err := waitLine(ready, 30*time.Second, func(string) bool { return true }); err != nil {
			t.Fatalf("the web server on %s did not start: %v", web, err)
		}
	}
	dnsPid := filepath.Join(l.work, "dns.pid")
	run(t, "ip", "netns", "exec", l.inet, "dnsmasq", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--bind-interfaces",
		"--listen-address="+l.resolver, "--address=/c2.example/"+l.c2, "--pid-file="+dnsPid, "--user=root")
	t.Cleanup(func() {
		if b, err := os.ReadFile(dnsPid); err == nil {
			var pid int
			if _, err := fmt.Sscan(string(b), &pid); err == nil && pid > 0 {
				syscall.Kill(pid, syscall.SIGTERM)
			}
		}
	})

	policy := filepath.Join(l.work, "policy.json")
	if err := os.WriteFile(policy, []byte(`{"documentation": true}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l.env = append(os.Environ(), "TB_STATE="+l.stateDir, "PATH="+bin+":"+os.Getenv("PATH"),
		"TB_LEASE_BRIDGE="+l.bridge, "TB_LEASE_LAB_NET="+l.labNet, "TB_ALLOW_POLICY="+policy)
	// Registered first: a lab that fails its containment probes is
	// still half up.
	t.Cleanup(func() { l.run("tb-capture", "net", "down", "--lab", l.lab) })
	l.tool(t, "tb-capture", "net", "up", "--lab", l.lab, "--bridge", l.bridge, "--lab-net", l.labNet, "--sink-ns", "tbhs"+tag,
		"--sink-veth", l.sinkVeth, "--sink-net", sinkNet, "--table", "talkbox"+tag, "--uplink", l.uplink, "--upstream", l.resolver, "--documentation")
	l.labDir = filepath.Join(l.stateDir, "capture", "labs", l.lab)
	return l
}

// thirdPartyLog is where the web server on addr:port logs what reached it.
func (l *hostileLab) thirdPartyLog(web string) string {
	return filepath.Join(l.work, "web-"+strings.ReplaceAll(web, ":", "-")+".log")
}

// run runs a command and fails the test when it fails.
func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if b, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
}

// run runs one of the tools on the lab's state and returns its stdout.
func (l *hostileLab) run(tool string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(l.bin, tool), args...)
	cmd.Env = l.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %v: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func (l *hostileLab) tool(t *testing.T, tool string, args ...string) []byte {
	t.Helper()
	out, err := l.run(tool, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// record decodes the last record of a kind in a tool's output.
func record[T any](t *testing.T, out []byte, kind string, v *T) *T {
	t.Helper()
	found := false
	for _, line := range bytes.Split(out, []byte("\n")) {
		if bytes.Contains(line, []byte(`"kind":"`+kind+`"`)) {
			if err := json.Unmarshal(line, v); err != nil {
				t.Fatal(err)
			}
			found = true
		}
	}
	if !found {
		t.Fatalf("no %s record in %s", kind, out)
	}
	return v
}

// plan plans the beacon with these arguments: allow-list mode, promotion
// on.
func (l *hostileLab) plan(t *testing.T, args ...string) string {
	t.Helper()
	argv := []string{"--network", "allowlist", "--promote", "--timeout", "180s", "--instrumentation", "pcap"}
	for _, a := range args {
		argv = append(argv, "--arg="+a)
	}
	p := record(t, l.tool(t, "tb-plan", append(argv, l.beacon)...), records.KindPlan, &records.Plan{})
	if !p.Runnable {
		t.Fatalf("plan %s is not runnable: %s", p.ID, p.Reason)
	}
	return p.ID
}

// acquire boots a fresh lease for a plan and starts its containment and
// capture; the lease is released at the end of the test.
func (l *hostileLab) acquire(t *testing.T, plan string) (*records.SandboxLease, error) {
	out, err := l.run("tb-lease", "acquire", "--plan", plan, "--fresh")
	m := regexp.MustCompile(`"id":"(lease_[0-9A-Z]+)"`).FindSubmatch(out)
	if m != nil {
		t.Cleanup(func() {
			l.run("tb-capture", "stop", "--lease", string(m[1]))
			l.run("tb-lease", "release", string(m[1]))
		})
	}
	if err != nil {
		return nil, err
	}
	var ls records.SandboxLease
	for _, line := range bytes.Split(out, []byte("\n")) {
		if bytes.Contains(line, []byte(`"kind":"lease"`)) {
			if err := json.Unmarshal(line, &ls); err != nil {
				return nil, err
			}
		}
	}
	if ls.ID == "" || ls.Tap == "" || ls.IP == "" || ls.MAC == "" {
		return nil, fmt.Errorf("tb-lease acquire printed no usable lease: %s", out)
	}
	// The tcpdump sensor beside each capture: its file must keep out the
	// hostile guest's forged frames as the capture's pcaps do
	// (checkSensorKeptOut).
	if _, err := l.run("tb-capture", "start", "--lab", l.lab, "--lease", ls.ID, "--sensor", "tcpdump"); err != nil {
		return nil, err
	}
	return &ls, nil
}

// cycle runs one cycle of a plan on a lease and returns its record.
func (l *hostileLab) cycle(lease, plan string) (*records.Cycle, []byte, error) {
	out, err := l.run("tb-run", "--lab", l.lab, "--lease", lease, "--plan", plan)
	var c records.Cycle
	for _, line := range bytes.Split(out, []byte("\n")) {
		if bytes.Contains(line, []byte(`"kind":"cycle"`)) {
			if jerr := json.Unmarshal(line, &c); jerr != nil {
				return nil, out, jerr
			}
		}
	}
	if c.ID == "" {
		return nil, out, fmt.Errorf("tb-run printed no cycle (%v): %s", err, out)
	}
	return &c, out, nil
}

// sniffer writes one interface's frames in one direction to a pcap file,
// through the AF_PACKET capture tb-capture uses. Not tcpdump: tcpdump,
// stopped by a signal, leaves whatever the kernel had queued and not yet
// handed over unwritten, so the last frames of a cycle (its DNS burst)
// could be missing from the counts checkAttacked makes. stop waits for
// every frame the kernel counted, and a frame the kernel dropped fails the
// test: counts with a gap prove nothing.
type sniffer struct {
	t        *testing.T
	iface    string
	file     string
	src      *capture.AFPacket
	cancel   context.CancelFunc
	done     chan error
	written  atomic.Uint64
	progress chan struct{}
	once     sync.Once
}

// sniffSnaplen is the bytes kept of each frame: headers and the start of a
// payload (an HTTP request line and its Host:).
const sniffSnaplen = 512

// sniff starts capturing on iface (in the host's namespace) the frames of
// one direction, and returns once the socket is bound: "out" is what the
// host sends out of it (what the guest behind a tap, or the namespace
// behind the uplink, receives), "in" what it receives (what the guest
// sent).
func sniff(t *testing.T, dir, iface, direction string) *sniffer {
	t.Helper()
	// ld the packet type (SKF_AD_OFF+SKF_AD_PKTTYPE, -0x1000+4):
	// PACKET_OUTGOING is "out", any other "in".
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0xfffff004},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.PACKET_OUTGOING, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: sniffSnaplen},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	switch direction {
	case "out":
	case "in":
		filter[1].Jt, filter[1].Jf = 1, 0
	default:
		t.Fatalf("sniff: direction %q", direction)
	}
	s := &sniffer{t: t, iface: iface, file: filepath.Join(dir, iface+"-"+direction+".pcap"),
		done: make(chan error, 1), progress: make(chan struct{}, 1)}
	f, err := os.Create(s.file)
	if err != nil {
		t.Fatal(err)
	}
	buf := bufio.NewWriter(f)
	w := pcapgo.NewWriter(buf)
	if err := w.WriteFileHeader(sniffSnaplen, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	// The kernel hands a block over when it is full or its timeout ends,
	// so sparse traffic takes a block a timeout: 16 blocks of 10 ms held
	// 160 ms of it, and a reader kept off the CPU that long on a loaded
	// host lost 12 of 4,220 frames (a fresh-clone make test, 2026-11-30).
	// 256 blocks of 20 ms hold over 5 s; 32 MiB a sniffer.
	s.src, err = capture.OpenAFPacket("", iface, sniffSnaplen, filter,
		capture.RingConfig{BlockSize: 128 << 10, Blocks: 256, Timeout: 20 * time.Millisecond})
	if err != nil {
		f.Close()
		t.Fatalf("capturing on %s: %v", iface, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		err := s.src.Run(ctx, func(ts time.Time, data []byte, origLen int, _ bool) error {
			err := w.WritePacket(gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(data), Length: origLen}, data)
			s.written.Add(1)
			select {
			case s.progress <- struct{}{}:
			default:
			}
			return err
		})
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		s.done <- errors.Join(err, buf.Flush(), f.Close())
	}()
	t.Cleanup(s.stop)
	return s
}

// stop ends the capture once every frame the kernel queued for it is in
// the file.
func (s *sniffer) stop() {
	s.once.Do(func() {
		defer s.src.Close()
		packets, drops, err := s.src.Stats() // the first call: counts since the socket was opened
		if err != nil {
			s.t.Errorf("capture on %s: %v", s.iface, err)
		}
		if drops > 0 {
			s.t.Errorf("capture on %s: the kernel dropped %d of %d frames", s.iface, drops, packets)
		}
		deadline := time.After(30 * time.Second)
	wait:
		for s.written.Load() < packets-drops {
			select {
			case <-s.progress:
			case err := <-s.done:
				s.done <- err
				break wait
			case <-deadline:
				s.t.Errorf("capture on %s: %d of the %d frames the kernel queued were written within 30 s", s.iface, s.written.Load(), packets-drops)
				break wait
			}
		}
		s.cancel()
		if err := <-s.done; err != nil {
			s.t.Errorf("capture on %s: %v", s.iface, err)
		}
	})
}

// waitLine reads lines until one satisfies ok, the reader ends or the
// deadline passes.
func waitLine(r io.Reader, within time.Duration, ok func(string) bool) (string, error) {
	found := make(chan string, 1)
	var once sync.Once
	go func() {
		sc := bufio.NewScanner(r)
		last := ""
		for sc.Scan() {
			last = sc.Text()
			if ok(last) {
				once.Do(func() { found <- last })
				return
			}
		}
		once.Do(func() { found <- "\x00" + last })
	}()
	select {
	case l := <-found:
		if rest, ended := strings.CutPrefix(l, "\x00"); ended {
			return rest, io.ErrUnexpectedEOF
		}
		return l, nil
	case <-time.After(within):
		return "", fmt.Errorf("nothing within %s", within)
	}
}

// bridgeMAC is the lab gateway's MAC: the bridge's.
func (l *hostileLab) bridgeMAC(t *testing.T) string {
	t.Helper()
	ifc, err := net.InterfaceByName(l.bridge)
	if err != nil {
		t.Fatal(err)
	}
	return ifc.HardwareAddr.String()
}

// neighbourWatch is "ip monitor neigh" on the lab's bridge: every change
// of the host's neighbour table there (an ARP claim it believed).
type neighbourWatch struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	done  chan struct{}
	once  sync.Once
}

// watchNeighbours starts the watch and returns once it sees a change the
// test makes itself (an entry for the lab's last address, then removed).
func (l *hostileLab) watchNeighbours(t *testing.T) *neighbourWatch {
	t.Helper()
	w := &neighbourWatch{cmd: exec.Command("ip", "monitor", "neigh", "dev", l.bridge), done: make(chan struct{})}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.stop() })
	marker := strings.TrimSuffix(l.labNet, ".0/24") + ".254"
	r := bufio.NewReader(out)
	go func() {
		defer close(w.done)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				w.mu.Lock()
				w.lines = append(w.lines, strings.TrimSpace(line))
				w.mu.Unlock()
			}
			if err != nil {
				return
			}
		}
	}()
	// Replace until the watch has seen it: the monitor subscribes after
	// it starts, and a change before that is not reported.
	for deadline := time.Now().Add(30 * time.Second); ; {
		run(t, "ip", "neigh", "replace", marker, "lladdr", "02:00:00:00:00:fe", "dev", l.bridge, "nud", "permanent")
		if w.saw(marker) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ip monitor neigh saw nothing")
		}
		run(t, "ip", "neigh", "del", marker, "dev", l.bridge)
	}
	run(t, "ip", "neigh", "del", marker, "dev", l.bridge)
	return w
}

// saw reports whether a line about addr has arrived, waiting a little for
// the monitor to report the change just made.
func (w *neighbourWatch) saw(addr string) bool {
	for range 20 {
		w.mu.Lock()
		found := slices.ContainsFunc(w.lines, func(l string) bool { return strings.HasPrefix(l, addr+" ") })
		w.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-w.done:
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}

// stop ends the watch and returns what it saw.
func (w *neighbourWatch) stop() []string {
	w.once.Do(func() {
		w.cmd.Process.Signal(syscall.SIGTERM)
		<-w.done
		w.cmd.Wait()
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.lines)
}
