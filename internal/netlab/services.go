package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/talkbox-sandbox/talkbox/internal/dnsname"
	"github.com/talkbox-sandbox/talkbox/internal/firewall"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

// ServiceStatus is one sinkhole service.
type ServiceStatus struct {
	Name    string `json:"name"`
	PID     int    `json:"pid,omitempty"`
	Running bool   `json:"running"`
}

// DefaultINetSimServices are the fake services started (DNS is dnsmasq's).
var DefaultINetSimServices = []string{"http", "https", "smtp", "smtps", "pop3", "pop3s", "ftp", "ftps",
	"irc", "ntp", "ident", "finger", "syslog", "tftp", "echo_tcp", "echo_udp", "dummy_tcp", "dummy_udp"}

// inetsimListen is where each INetSim service listens: INetSim's own
// defaults (INetSim/Config.pm), which the generated configuration keeps,
// and the one table the lab's firewall reads the sinkhole's served ports
// from. DNS is dnsmasq's, not INetSim's. dummy_tcp and dummy_udp are the
// catch-all, which takes what is sent to every other port
// (Config.catchAll); INetSim binds both to one port.
func inetsimListen() map[string]inetsimPort {
	return map[string]inetsimPort{
		"http": {"tcp", 80}, "https": {"tcp", 443}, "smtp": {"tcp", 25}, "smtps": {"tcp", 465},
		"pop3": {"tcp", 110}, "pop3s": {"tcp", 995}, "ftp": {"tcp", 21}, "ftps": {"tcp", 990},
		"irc": {"tcp", 6667}, "ntp": {"udp", 123}, "ident": {"tcp", 113}, "finger": {"tcp", 79},
		"syslog": {"udp", 514}, "tftp": {"udp", 69},
		"echo_tcp": {"tcp", 7}, "echo_udp": {"udp", 7}, "discard_tcp": {"tcp", 9}, "discard_udp": {"udp", 9},
		"chargen_tcp": {"tcp", 19}, "chargen_udp": {"udp", 19}, "daytime_tcp": {"tcp", 13}, "daytime_udp": {"udp", 13},
		"time_tcp": {"tcp", 37}, "time_udp": {"udp", 37}, "quotd_tcp": {"tcp", 17}, "quotd_udp": {"udp", 17},
		"dummy_tcp": {"tcp", inetsimCatchAllPort}, "dummy_udp": {"udp", inetsimCatchAllPort},
	}
}

// inetsimPort is a service's protocol and port.
type inetsimPort struct {
	proto string
	port  uint16
}

// inetsimCatchAllPort is INetSim's own default for dummy_bind_port.
const inetsimCatchAllPort = 1

// inetsimReady are the sinkhole's addresses of every TCP service INetSim
// starts: INetSim forks a process per service, and neither a guest nor the
// containment check may find one still missing once the lab is up.
func (c *Config) inetsimReady() []string {
	listen := inetsimListen()
	var out []string
	for _, s := range c.inetsimServices() {
		if l, ok := listen[s]; ok && l.proto == "tcp" {
			out = append(out, net.JoinHostPort(c.Sinkhole().String(), strconv.Itoa(int(l.port))))
		}
	}
	return out
}

// inetsimServices are the INetSim services the lab starts.
func (c *Config) inetsimServices() []string {
	if len(c.INetSimServices) > 0 {
		return c.INetSimServices
	}
	return DefaultINetSimServices
}

// catchAll is where the sinkhole takes TCP and UDP to the ports it serves
// nothing on (nil: such a packet keeps its port): INetSim's dummy_tcp and
// dummy_udp, when the lab runs them. The served ports are those of the
// services started and the DNS sinkhole's.
func (c *Config) catchAll() (tcp, udp *firewall.CatchAll) {
	if !c.INetSim {
		return nil, nil
	}
	served := map[string][]uint16{}
	if c.DNS {
		served["tcp"] = append(served["tcp"], 53)
		served["udp"] = append(served["udp"], 53)
	}
	listen := inetsimListen()
	for _, s := range c.inetsimServices() {
		if l, ok := listen[s]; ok {
			served[l.proto] = append(served[l.proto], l.port)
		}
	}
	for proto, ports := range served {
		slices.Sort(ports)
		served[proto] = slices.Compact(ports)
	}
	for _, s := range c.inetsimServices() {
		switch s {
		case "dummy_tcp":
			tcp = &firewall.CatchAll{Port: inetsimCatchAllPort, Served: served["tcp"]}
		case "dummy_udp":
			udp = &firewall.CatchAll{Port: inetsimCatchAllPort, Served: served["udp"]}
		}
	}
	return tcp, udp
}

type service struct {
	name    string
	ns      string // namespace path
	enabled bool
	// ready are addresses that accept connections once the service is up.
	ready []string
	argv  func(cfg *Config, dir string) ([]string, error)
	// log, when set, is the directory where multilog keeps the service's
	// stderr, capped.
	log string
	// confine is its view of the filesystem (startConfined). Every
	// service writes its pid file (as root, before it drops to its user)
	// into the lab's directory.
	confine confinement
}

func services(cfg *Config) []service {
	sink := netns.Path(cfg.SinkNS)
	return []service{
		// The answerer comes first: the front resolver sends it the
		// subdomains of forwarded names.
		{name: "dns-answer", ns: sink, enabled: cfg.DNS, ready: []string{net.JoinHostPort(dnsAnswerer, "53")}, argv: dnsAnswerArgs,
			confine: confinement{writable: []string{cfg.Dir}}},
		{name: "dns", ns: sink, enabled: cfg.DNS, ready: []string{net.JoinHostPort(cfg.Sinkhole().String(), "53")}, argv: dnsArgs,
			log: LogDir(cfg, "dns"), confine: confinement{writable: []string{cfg.Dir}}},
		// INetSim stores what guests upload (HTTP POST bodies, mail, FTP
		// and TFTP uploads) and its POP3 and FTP sessions in its data
		// directory: each lab's INetSim gets its own capped copy.
		{name: "inetsim", ns: sink, enabled: cfg.INetSim, ready: cfg.inetsimReady(), argv: inetsimArgs,
			confine: confinement{writable: []string{cfg.Dir, LogDir(cfg, "inetsim")},
				private: inetsimData, privateSize: INetSimDataSize}},
		{name: "dhcp", ns: cfg.HostNSPath(), enabled: cfg.DHCP, argv: dhcpArgs,
			log: LogDir(cfg, "dhcp"), confine: confinement{writable: []string{cfg.Dir, dhcpRunDir(cfg)}}},
	}
}

func pidFile(dir, name string) string { return filepath.Join(dir, name+".pid") }

// AllowNamesFile records the names the lab's DNS sinkhole forwards, one
// server=/NAME/UPSTREAM line per name (UPSTREAM empty when the lab has
// none), which allowlist.CurrentNames reads back. dnsmasq itself reads the
// servers-file made from it (dnsServersFile).
func AllowNamesFile(dir string) string { return filepath.Join(dir, "dns-allow.conf") }

// dnsServersFile is the front dnsmasq's servers-file, re-read on SIGHUP
// after it has dropped to its user: in the run directory, which that user
// can reach, unlike the lab's directory.
func dnsServersFile(cfg *Config) string { return filepath.Join(RunDir(cfg), "dns", "servers.conf") }

// writeServersFile sends each name to the upstream and its subdomains to
// the answerer; without an upstream, nothing is forwarded.
func writeServersFile(cfg *Config, names []string) error {
	var b bytes.Buffer
	if cfg.Upstream.IsValid() {
		for _, n := range names {
			fmt.Fprintf(&b, "server=/%s/%s\nserver=/*.%s/%s\n", n, cfg.Upstream, n, dnsAnswerer)
		}
	}
	if err := os.MkdirAll(filepath.Dir(dnsServersFile(cfg)), 0o755); err != nil {
		return err
	}
	return writeAtomic(dnsServersFile(cfg), b.Bytes(), 0o644)
}

// allowedNames reads back the record SetAllowedNames wrote.
func allowedNames(dir string) ([]string, error) {
	b, err := os.ReadFile(AllowNamesFile(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "server=/"); ok {
			if n, _, ok := strings.Cut(rest, "/"); ok {
				names = append(names, n)
			}
		}
	}
	return names, nil
}

// dnsAnswerer is where, inside the sinkhole namespace, the second dnsmasq
// answers every name with the sinkhole address. dnsmasq's server=/NAME/
// forwards NAME and all its subdomains; the servers-file sends the
// subdomains (server=/*.NAME/) here instead, so only NAME itself reaches
// the upstream. The front cannot answer them itself: a domain that has a
// server= line is never answered from --address, and a domain with an empty
// server= line gets NXDOMAIN rather than the sinkhole's address.
const dnsAnswerer = "127.0.0.1"

func dnsAnswerArgs(cfg *Config, dir string) ([]string, error) {
	u, err := dnsmasqUser()
	if err != nil {
		return nil, err
	}
	return []string{"dnsmasq", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--no-poll",
		"--bind-interfaces", "--listen-address=" + dnsAnswerer,
		"--address=/#/" + cfg.Sinkhole().String(),
		// The front logs every query, with where it went.
		"--log-facility=/dev/null",
		"--user=" + u.Username, "--group=" + u.Group, "--pid-file=" + pidFile(dir, "dns-answer")}, nil
}

func dnsArgs(cfg *Config, dir string) ([]string, error) {
	u, err := dnsmasqUser()
	if err != nil {
		return nil, err
	}
	// The run directory does not outlive a reboot; the record in the
	// lab's directory does.
	names, err := allowedNames(dir)
	if err != nil {
		return nil, err
	}
	if err := writeServersFile(cfg, names); err != nil {
		return nil, err
	}
	return []string{"dnsmasq", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--no-poll",
		"--bind-interfaces", "--listen-address=" + cfg.Sinkhole().String(), "--except-interface=lo",
		// Every name answers with the sinkhole; forwarded names are sent
		// upstream by the more specific server= lines of the servers-file.
		"--address=/#/" + cfg.Sinkhole().String(),
		"--servers-file=" + dnsServersFile(cfg),
		// In the foreground, logging to stderr, which start sends through
		// multilog; queued (and, when multilog falls behind, dropped)
		// rather than waited for, so a flood of queries cannot stall it.
		"--keep-in-foreground", "--log-queries", "--log-facility=-", "--log-async=25",
		"--user=" + u.Username, "--group=" + u.Group, "--pid-file=" + pidFile(dir, "dns")}, nil
}

func inetsimArgs(cfg *Config, dir string) ([]string, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# generated by tb-capture for lab %s\n", cfg.Name)
	for _, s := range cfg.inetsimServices() {
		fmt.Fprintf(&b, "start_service %s\n", s)
	}
	fmt.Fprintf(&b, "service_bind_address %s\n", cfg.Sinkhole())
	fmt.Fprintf(&b, "dns_default_ip %s\n", cfg.Sinkhole())
	// The catch-all never speaks: a bot that waits for its C2 to speak
	// first would otherwise take INetSim's banner ("220 ESMTP FTP +OK
	// POP3 200 OK", sent after 5 silent seconds) for its C2's words.
	fmt.Fprintf(&b, "dummy_bind_port %d\n", inetsimCatchAllPort)
	b.WriteString("dummy_banner_wait 0\n")
	b.WriteString("create_reports no\n")
	conf := filepath.Join(dir, "inetsim.conf")
	if err := writeAtomic(conf, b.Bytes(), 0o644); err != nil {
		return nil, err
	}
	// INetSim's services drop to the inetsim user and reopen the logs, so
	// the logs cannot live in the (private) state directory: they go to a
	// capped tmpfs that only that user (and root) may write.
	inetsimUser, err := user.Lookup("inetsim")
	if err != nil {
		return nil, &MissingError{Program: "inetsim"}
	}
	logs := LogDir(cfg, "inetsim")
	if err := mountCappedLogs(logs, INetSimLogSize, inetsimUser); err != nil {
		return nil, err
	}
	return []string{"inetsim", "--config=" + conf, "--log-dir=" + logs, "--report-dir=" + logs,
		"--data-dir=" + inetsimData, "--pidfile=" + pidFile(dir, "inetsim"), "--session=" + cfg.Name}, nil
}

// RunDir is where a lab keeps files other users must reach.
func RunDir(cfg *Config) string { return filepath.Join("/run/talkbox", cfg.Name) }

// dhcpRunDir holds the DHCP server's leases and its hosts directory, one
// file per lease (MAC,IP), which dnsmasq reads on change, as its user.
func dhcpRunDir(cfg *Config) string { return filepath.Join(RunDir(cfg), "dhcp") }

func dhcpHostsDir(cfg *Config) string { return filepath.Join(dhcpRunDir(cfg), "hosts") }

func dhcpArgs(cfg *Config, dir string) ([]string, error) {
	u, err := dnsmasqUser()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dhcpHostsDir(cfg), 0o755); err != nil {
		return nil, err
	}
	first := cfg.Gateway().Next()
	return []string{"dnsmasq", "--conf-file=/dev/null", "--port=0", "--no-resolv", "--no-hosts",
		"--bind-interfaces", "--interface=" + cfg.Bridge, "--except-interface=lo",
		fmt.Sprintf("--dhcp-range=%s,static,%s", first, net.IP(net.CIDRMask(cfg.LabNet.Bits(), 32)).String()),
		"--dhcp-hostsdir=" + dhcpHostsDir(cfg),
		// Guests resolve through the gateway, whose DNS is DNATed to the sinkhole.
		"--dhcp-option=option:dns-server," + cfg.Gateway().String(),
		"--dhcp-option=option:router," + cfg.Gateway().String(),
		"--dhcp-leasefile=" + filepath.Join(dhcpRunDir(cfg), "dhcp.leases"),
		"--keep-in-foreground", "--log-dhcp", "--log-facility=-", "--log-async=25",
		"--user=" + u.Username, "--group=" + u.Group, "--pid-file=" + pidFile(dir, "dhcp")}, nil
}

func startServices(ctx context.Context, cfg *Config) error {
	if cfg.DNS && cfg.Upstream.IsValid() {
		if err := limitUpstream(cfg); err != nil {
			return err
		}
	}
	for _, s := range services(cfg) {
		if !s.enabled {
			continue
		}
		if pid := runningPID(cfg.Dir, s.name); pid > 0 {
			continue
		}
		argv, err := s.argv(cfg, cfg.Dir)
		if err != nil {
			return err
		}
		if _, err := exec.LookPath(argv[0]); err != nil {
			return &MissingError{Program: argv[0]}
		}
		if err := start(ctx, s, argv, cfg.Dir); err != nil {
			return err
		}
	}
	return nil
}

// MissingError is a service whose program is not installed.
type MissingError struct{ Program string }

func (e *MissingError) Error() string {
	return fmt.Sprintf("%s is not installed (scripts/deps.sh installs it)", e.Program)
}

func start(ctx context.Context, s service, argv []string, dir string) error {
	logf, err := os.OpenFile(filepath.Join(dir, s.name+".out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	var logw *os.File
	var logged <-chan struct{}
	if s.log != "" {
		// Only dnsmasq logs through multilog: as dnsmasq's user.
		u, err := dnsmasqUser()
		if err != nil {
			return err
		}
		if logw, logged, err = cappedLog(s.log, logf, u); err != nil {
			return err
		}
		cmd.Stderr = logw
	}
	cmd.Dir = dir
	// INetSim shares state through SysV shared memory under a fixed key:
	// each service gets its own IPC namespace, so labs never collide.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWIPC}
	os.Remove(pidFile(dir, s.name))
	err = startConfined(cmd, s.ns, s.confine)
	if logw != nil {
		// The service holds its own end now: multilog ends when it does.
		logw.Close()
	}
	if err != nil {
		return fmt.Errorf("starting %s: %w", s.name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Whatever fails from here on, the process group started is ended, so
	// that a failed start leaves nothing running.
	ok := false
	defer func() {
		if !ok {
			if pid := filePID(pidFile(dir, s.name)); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	// Each address is dialled until it first accepts, and not again: a
	// connection to an INetSim service holds one of its few processes.
	pending := s.ready
	for {
		// dnsmasq daemonizes unless kept in the foreground: its first
		// process exits once the daemon is up.
		select {
		case err := <-exited:
			if argv[0] == "dnsmasq" && err == nil {
				exited = nil
				continue
			}
			return fmt.Errorf("%s exited at start (%v): %s", s.name, err, startOutput(s, dir, logged))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if pid := filePID(pidFile(dir, s.name)); pid > 0 {
			st, alive := ProcStart(pid)
			if alive {
				pending = dialIn(s.ns, pending)
			}
			if alive && len(pending) == 0 {
				ok = true
				return writeAtomic(pidFile(dir, s.name)+".start", []byte(st), 0o644)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not come up within 30s: %s", s.name, startOutput(s, dir, nil))
		}
	}
}

// startOutput is the last line a service wrote, for the error of a failed
// start. A service that logs through multilog (logged) has exited: its
// last line is in the log once multilog has ended, which it does at once.
func startOutput(s service, dir string, logged <-chan struct{}) string {
	if s.log == "" {
		out, _ := os.ReadFile(filepath.Join(dir, s.name+".out"))
		return lastLine(out)
	}
	if logged != nil {
		select {
		case <-logged:
		case <-time.After(time.Second):
		}
	}
	out, _ := os.ReadFile(filepath.Join(s.log, "current"))
	line := lastLine(out)
	// multilog's TAI64N stamp says nothing the error needs.
	if stamp, rest, ok := strings.Cut(line, " "); ok && strings.HasPrefix(stamp, "@") {
		line = rest
	}
	return line
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// dialIn connects to each address in turn and returns those from the first
// that did not accept on.
func dialIn(ns string, addrs []string) []string {
	_ = netns.Do(ns, func() error {
		// dnsmasq answers DNS over TCP too, so every service is probed by TCP.
		for len(addrs) > 0 {
			c, err := net.DialTimeout("tcp", addrs[0], 200*time.Millisecond)
			if err != nil {
				return nil
			}
			c.Close()
			addrs = addrs[1:]
		}
		return nil
	})
	return addrs
}

// runningPID is the service's pid when its pid file names a live process
// that is the one this lab started (same start time), not a reused pid.
func runningPID(dir, name string) int {
	pid := filePID(pidFile(dir, name))
	if pid == 0 {
		return 0
	}
	want, err := os.ReadFile(pidFile(dir, name) + ".start")
	if err != nil {
		return 0
	}
	if st, ok := ProcStart(pid); !ok || st != strings.TrimSpace(string(want)) {
		return 0
	}
	return pid
}

func filePID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// ProcStart is a live, non-zombie process's start time (clock ticks since
// boot), which with the pid identifies it.
func ProcStart(pid int) (string, bool) {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", false
	}
	i := bytes.LastIndexByte(st, ')')
	if i < 0 {
		return "", false
	}
	f := strings.Fields(string(st[i+1:]))
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return "", false
	}
	return f[19], true
}

func stopServices(cfg *Config) {
	for _, s := range services(cfg) {
		pid := runningPID(cfg.Dir, s.name)
		if pid == 0 {
			continue
		}
		// Each service leads its own process group (setsid): INetSim's
		// per-service children go with it.
		_ = syscall.Kill(pid, syscall.SIGTERM)
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		deadline := time.Now().Add(10 * time.Second)
		for runningPID(cfg.Dir, s.name) > 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // no pidfd for a process we did not fork
		}
		if runningPID(cfg.Dir, s.name) > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		os.Remove(pidFile(cfg.Dir, s.name))
		os.Remove(pidFile(cfg.Dir, s.name) + ".start")
	}
	unmountCappedLogs(LogDir(cfg, "inetsim"))
}

func serviceStatus(cfg *Config) []ServiceStatus {
	var out []ServiceStatus
	for _, s := range services(cfg) {
		if !s.enabled {
			continue
		}
		pid := runningPID(cfg.Dir, s.name)
		out = append(out, ServiceStatus{Name: s.name, PID: pid, Running: pid > 0})
	}
	return out
}

// SetAllowedNames makes the DNS sinkhole forward exactly these names to
// the upstream resolver, without restarting it: a subdomain of a forwarded
// name is answered by the sinkhole unless it is in the list itself, so a
// sample cannot tunnel through, or flood other people's name servers with,
// made-up subdomains. A lab without an upstream resolver records the list
// and forwards nothing. It never fails on a name: one that is not a valid
// DNS name is skipped and logged (callers validate; one bad entry must not
// stop the others).
func SetAllowedNames(dir string, names []string) error {
	m, err := Load(dir)
	if err != nil {
		return err
	}
	return setAllowedNames(&m.Config, names)
}

func setAllowedNames(cfg *Config, names []string) error {
	up := cfg.Upstream
	valid := make([]string, 0, len(names))
	for _, n := range names {
		c, err := dnsname.Forwardable(n)
		if err != nil {
			// The signature is the allow-list's and carries no logger.
			slog.Warn("not forwarding a name", "lab", cfg.Name, "err", err)
			continue
		}
		valid = append(valid, c)
	}
	sort.Strings(valid)
	valid = slices.Compact(valid)
	var record bytes.Buffer
	for _, n := range valid {
		if up.IsValid() {
			fmt.Fprintf(&record, "server=/%s/%s\n", n, up)
		} else {
			fmt.Fprintf(&record, "server=/%s/\n", n)
		}
	}
	if err := writeServersFile(cfg, valid); err != nil {
		return err
	}
	if err := writeAtomic(AllowNamesFile(cfg.Dir), record.Bytes(), 0o644); err != nil {
		return err
	}
	if pid := runningPID(cfg.Dir, "dns"); pid > 0 {
		return syscall.Kill(pid, syscall.SIGHUP)
	}
	return nil
}

// SetDHCPHost gives a guest MAC a fixed address (a file in the hosts dir,
// read by dnsmasq on change); ip invalid removes it, which for a lab that
// is not up is done already.
func SetDHCPHost(dir, lease, mac string, ip netip.Addr) error {
	m, err := Load(dir)
	if errors.Is(err, os.ErrNotExist) && !ip.IsValid() {
		return nil
	}
	if err != nil {
		return err
	}
	p := filepath.Join(dhcpHostsDir(&m.Config), lease)
	if !ip.IsValid() {
		err := os.Remove(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return writeAtomic(p, []byte(fmt.Sprintf("%s,%s\n", mac, ip)), 0o644)
}
