// Command capbench measures packet capture side by side: tb-capture's
// pure-Go TPACKET_V3 capture against tcpdump, on the same veth link, with
// the same traffic generated from another network namespace at a fixed
// packet rate. It reports packets sent, captured and dropped, and the CPU
// time each capturer used.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netns"
)

func main() {
	rate := flag.Int("rate", 100000, "packets per second")
	secs := flag.Int("seconds", 5, "seconds of traffic per run")
	tbc := flag.String("tb-capture", "bin/tb-capture", "tb-capture binary")
	flag.Parse()
	if err := run(*rate, *secs, *tbc); err != nil {
		fmt.Fprintln(os.Stderr, "capbench:", err)
		os.Exit(1)
	}
}

// settle is how long each capturer gets after the last packet before it is
// stopped: longer than libpcap's 1 s buffer timeout, so that tcpdump has
// read everything its kernel ring holds (tb-capture drains at stop anyway).
const settle = 2 * time.Second

type result struct {
	name            string
	sent            int
	captured, drops uint64
	cpu             time.Duration
	achieved        float64
}

func run(rate, secs int, tbc string) error {
	id := fmt.Sprintf("tbcb%d", os.Getpid()%100000)
	gen, capns := id+"g", id+"c"
	for _, ns := range []string{gen, capns} {
		if err := netns.Create(ns); err != nil {
			return err
		}
		defer netns.Delete(ns)
	}
	genIf, capIf, err := link(gen, capns, id)
	if err != nil {
		return err
	}
	tbc, err = filepath.Abs(tbc)
	if err != nil {
		return err
	}
	n := rate * secs
	var rows []result

	// tb-capture alone.
	r, err := runTB(tbc, capns, capIf, func() (int, float64, error) { return generate(gen, genIf, capns, capIf, rate, n) })
	if err != nil {
		return err
	}
	rows = append(rows, r)
	// tcpdump alone.
	r, err = runTcpdump(capns, capIf, func() (int, float64, error) { return generate(gen, genIf, capns, capIf, rate, n) })
	if err != nil {
		return err
	}
	rows = append(rows, r)

	fmt.Printf("| capturer | rate asked | rate achieved | sent | captured | dropped | capturer CPU |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Printf("| %s | %d/s | %.0f/s | %d | %d | %d | %.2f s |\n", r.name, rate, r.achieved, r.sent, r.captured, r.drops, r.cpu.Seconds())
	}
	return nil
}

func handle(ns string) (*netlink.Handle, error) {
	h, err := vnetns.GetFromPath(netns.Path(ns))
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return netlink.NewHandleAt(h)
}

// link makes a veth from gen to cap, both up.
func link(gen, capns, id string) (string, string, error) {
	gh, err := handle(gen)
	if err != nil {
		return "", "", err
	}
	defer gh.Close()
	la := netlink.NewLinkAttrs()
	la.Name = id + "g0"
	if err := gh.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: id + "c0"}); err != nil {
		return "", "", err
	}
	peer, err := gh.LinkByName(id + "c0")
	if err != nil {
		return "", "", err
	}
	f, err := os.Open(netns.Path(capns))
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	if err := gh.LinkSetNsFd(peer, int(f.Fd())); err != nil {
		return "", "", err
	}
	g, _ := gh.LinkByName(id + "g0")
	if err := gh.LinkSetUp(g); err != nil {
		return "", "", err
	}
	ch, err := handle(capns)
	if err != nil {
		return "", "", err
	}
	defer ch.Close()
	c, err := ch.LinkByName(id + "c0")
	if err != nil {
		return "", "", err
	}
	// No IPv6 on the captured link: only the generated frames cross it.
	for _, ns := range []string{gen, capns} {
		netns.Do(netns.Path(ns), func() error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/all/disable_ipv6", []byte("1"), 0o644)
		})
	}
	return id + "g0", id + "c0", ch.LinkSetUp(c)
}

// generate writes n minimum-size UDP frames at rate per second from gen.
func generate(gen, genIf, capns, capIf string, rate, n int) (int, float64, error) {
	var dst net.HardwareAddr
	netns.Do(netns.Path(capns), func() error {
		ifc, err := net.InterfaceByName(capIf)
		if err == nil {
			dst = ifc.HardwareAddr
		}
		return err
	})
	var fd int
	var src net.HardwareAddr
	var idx int
	err := netns.Do(netns.Path(gen), func() error {
		ifc, err := net.InterfaceByName(genIf)
		if err != nil {
			return err
		}
		src, idx = ifc.HardwareAddr, ifc.Index
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	frame := udpFrame(src, dst)
	to := &unix.SockaddrLinklayer{Ifindex: idx, Halen: 6}
	copy(to.Addr[:], dst)
	start := time.Now()
	const batch = 64
	for i := 0; i < n; i++ {
		if i%batch == 0 {
			due := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d) // pacing the generator, not synchronisation
			}
		}
		binary.BigEndian.PutUint32(frame[42:], uint32(i))
		if err := unix.Sendto(fd, frame, 0, to); err != nil {
			return i, 0, err
		}
	}
	el := time.Since(start)
	return n, float64(n) / el.Seconds(), nil
}

func udpFrame(src, dst net.HardwareAddr) []byte {
	f := make([]byte, 60)
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], 46)
	copy(ip[12:16], []byte{10, 200, 0, 1})
	copy(ip[16:20], []byte{10, 200, 0, 2})
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:], 4000)
	binary.BigEndian.PutUint16(udp[2:], 9999)
	binary.BigEndian.PutUint16(udp[4:], 26)
	return f
}

func cpuOf(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b)[i+2:])
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return time.Duration(u+s) * 10 * time.Millisecond // USER_HZ = 100
}

func runTB(tbc, capns, capIf string, gen func() (int, float64, error)) (result, error) {
	state, err := os.MkdirTemp("", "capbench-state")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(state)
	out, err := exec.Command(tbc, "--state", state, "start", "--no-rules", "--iface", capIf, "--netns", capns,
		"--filter", "udp dst port 9999").CombinedOutput()
	if err != nil {
		return result{}, fmt.Errorf("tb-capture start: %v: %s", err, out)
	}
	var rec struct {
		ID  string `json:"id"`
		PID int    `json:"pid"`
	}
	if err := json.Unmarshal(out, &rec); err != nil {
		return result{}, fmt.Errorf("tb-capture start: %s", out)
	}
	cpu0 := cpuOf(rec.PID)
	sent, ach, err := gen()
	if err != nil {
		return result{}, err
	}
	time.Sleep(settle)
	cpu := cpuOf(rec.PID) - cpu0
	out, err = exec.Command(tbc, "--state", state, "stop", "--capture", rec.ID).CombinedOutput()
	if err != nil {
		return result{}, fmt.Errorf("tb-capture stop: %v: %s", err, out)
	}
	r := result{name: "tb-capture (Go, TPACKET_V3)", sent: sent, achieved: ach, cpu: cpu}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var a struct {
			Kind    string `json:"kind"`
			Packets uint64 `json:"packets"`
			Drops   uint64 `json:"drops"`
		}
		if json.Unmarshal(sc.Bytes(), &a) == nil && a.Kind == "artifact" {
			r.captured += a.Packets
			r.drops += a.Drops
		}
	}
	return r, nil
}

func runTcpdump(capns, capIf string, gen func() (int, float64, error)) (result, error) {
	dir, err := os.MkdirTemp("", "capbench-tcpdump")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command("tcpdump", "-n", "-i", capIf, "-s", "262144", "-w", filepath.Join(dir, "t.pcap"), "udp dst port 9999")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return result{}, err
	}
	if err := netns.Do(netns.Path(capns), cmd.Start); err != nil {
		return result{}, err
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "listening on") {
			break
		}
	}
	cpu0 := cpuOf(cmd.Process.Pid)
	sent, ach, err := gen()
	if err != nil {
		return result{}, err
	}
	time.Sleep(settle)
	cpu := cpuOf(cmd.Process.Pid) - cpu0
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd.Process.Signal(syscall.SIGINT)
	r := result{name: "tcpdump " + tcpdumpVersion(), sent: sent, achieved: ach, cpu: cpu}
	re := regexp.MustCompile(`^(\d+) packets? (captured|dropped by kernel)`)
	for sc.Scan() && ctx.Err() == nil {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseUint(m[1], 10, 64)
			if m[2] == "captured" {
				r.captured = v
			} else {
				r.drops = v
			}
		}
	}
	cmd.Wait()
	return r, nil
}

func tcpdumpVersion() string {
	out, _ := exec.Command("tcpdump", "--version").CombinedOutput()
	f := strings.Fields(string(out))
	if len(f) >= 3 {
		return f[2]
	}
	return ""
}
