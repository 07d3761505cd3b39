// Command rotation measures what a size rotation of a large pcap costs the
// capture: each tb-capture binary given captures the same paced stream of
// frames, sent with AF_PACKET from one network namespace into a veth whose
// other end it captures, with --rotate-size set so that a rotation falls in
// the middle of the traffic. It reports the rate reached, packets sent and
// captured, the kernel's drops (PACKET_STATISTICS, as the daemon stores them
// on each artifact), and the longest wait for the daemon's packet lock seen
// from outside: a status request, sent every 10 ms, is answered only once
// the lock is free, and in the daemon before issue 27 item 6 the rotation
// held it for the copy into the blob store.
//
// Run it from bench/capture/run.sh, which makes the namespaces and builds
// the binaries.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/talkbox-sandbox/talkbox/internal/capture"
	"github.com/talkbox-sandbox/talkbox/internal/netns"
	"github.com/talkbox-sandbox/talkbox/internal/state"
)

type config struct {
	genNS, genIf, capNS, capIf string
	rate, frame                int
	seconds                    float64
	rotateSize                 int64
	stateDir                   string
}

func main() {
	var c config
	flag.StringVar(&c.genNS, "gen-ns", "", "network namespace the frames are sent from")
	flag.StringVar(&c.genIf, "gen-if", "", "interface in -gen-ns")
	flag.StringVar(&c.capNS, "cap-ns", "", "network namespace of the captured interface")
	flag.StringVar(&c.capIf, "cap-if", "", "captured interface in -cap-ns")
	flag.IntVar(&c.rate, "rate", 100000, "frames per second")
	flag.IntVar(&c.frame, "frame", 1400, "bytes per frame, Ethernet header included")
	flag.Float64Var(&c.seconds, "seconds", 12, "seconds of traffic per capture")
	flag.Int64Var(&c.rotateSize, "rotate-size", 1<<30, "--rotate-size given to tb-capture")
	flag.StringVar(&c.stateDir, "state-parent", "/var/tmp", "where each capture's state directory is made")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: rotation [flags] NAME=TB-CAPTURE-BINARY...")
		os.Exit(2)
	}
	var rows []result
	for _, arg := range flag.Args() {
		name, bin, ok := strings.Cut(arg, "=")
		if !ok {
			fmt.Fprintln(os.Stderr, "rotation: want NAME=BINARY, got", arg)
			os.Exit(2)
		}
		r, err := measure(context.Background(), c, name, bin)
		if err != nil {
			fmt.Fprintf(os.Stderr, "rotation: %s: %v\n", name, err)
			os.Exit(1)
		}
		rows = append(rows, r)
	}
	fmt.Printf("| tb-capture | load before | rate asked | rate reached | sent | captured | dropped (PACKET_STATISTICS) | longest wait for the packet lock | files (reason, size, drops) |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Printf("| %s | %s | %d/s | %.0f/s | %d | %d | %d | %.3f s at %.1f s | %s |\n", r.name, r.load, c.rate, r.reached, r.sent,
			r.captured, r.drops, r.longest.Seconds(), r.longestAt.Seconds(), strings.Join(r.files, ", "))
	}
}

type result struct {
	name, load         string
	sent               int
	reached            float64
	captured, drops    uint64
	longest, longestAt time.Duration
	files              []string
}

func measure(ctx context.Context, c config, name, bin string) (result, error) {
	// What the previous run left dirty is written out first, so that
	// each run starts from the same page cache.
	syscall.Sync()
	r := result{name: name, load: loadAvg()}
	dir, err := os.MkdirTemp(c.stateDir, "capbench-rotation-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	out, err := exec.CommandContext(ctx, bin, "--state", dir, "start", "--no-rules", "--iface", c.capIf, "--netns", c.capNS,
		"--filter", "udp dst port 9", "--rotate-size", fmt.Sprint(c.rotateSize)).Output()
	if err != nil {
		return r, fmt.Errorf("tb-capture start: %w", err)
	}
	var rec struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(out, &rec); err != nil || rec.ID == "" {
		return r, fmt.Errorf("tb-capture start printed %q", out)
	}
	st, err := state.Open(ctx, dir)
	if err != nil {
		return r, err
	}

	// The prober: how long a status request waits, every 10 ms.
	start := time.Now()
	probeCtx, stopProbe := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	var probeErr error
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-probeCtx.Done():
				return
			case <-tick.C:
			}
			t0 := time.Now()
			cctx, cancel := context.WithTimeout(probeCtx, time.Minute)
			_, err := capture.Call(cctx, st, rec.ID, "status", "")
			cancel()
			if err != nil && probeCtx.Err() == nil {
				probeErr = err
				return
			}
			if w := time.Since(t0); w > r.longest {
				r.longest, r.longestAt = w, t0.Sub(start)
			}
		}
	}()
	r.sent, r.reached, err = send(c)
	if err != nil {
		stopProbe()
		wg.Wait()
		return r, err
	}
	// Until the daemon has written what the kernel accepted (stop drains
	// the ring too, but a copy still under way would delay it).
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		rep, err := capture.Call(ctx, st, rec.ID, "status", "")
		if err != nil || rep.Packets+rep.Drops >= uint64(r.sent) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling a counter with no event to wait on
	}
	stopProbe()
	wg.Wait()
	if probeErr != nil {
		return r, fmt.Errorf("status: %w", probeErr)
	}
	if out, err := exec.CommandContext(ctx, bin, "--state", dir, "stop", "--capture", rec.ID).CombinedOutput(); err != nil {
		return r, fmt.Errorf("tb-capture stop: %w: %s", err, out)
	}
	out, err = exec.CommandContext(ctx, bin, "--state", dir, "list", "--kind", "artifact").Output()
	if err != nil {
		return r, fmt.Errorf("tb-capture list: %w", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var a struct {
			Packets, Drops uint64
			Size           int64
			Reason         string
		}
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			return r, fmt.Errorf("tb-capture list: %w", err)
		}
		r.captured += a.Packets
		r.drops += a.Drops
		r.files = append(r.files, fmt.Sprintf("%s %.2f GB %d dropped", a.Reason, float64(a.Size)/1e9, a.Drops))
	}
	return r, sc.Err()
}

// send writes the frames from the generator's namespace through a transmit
// ring, paced in batches of 1000 (one send each), and returns how many it
// sent and the rate it reached.
func send(c config) (int, float64, error) {
	frame, err := udpFrame(c.frame)
	if err != nil {
		return 0, 0, err
	}
	const batch = 1000
	frames := make([][]byte, batch)
	for i := range frames {
		frames[i] = frame
	}
	n := int(float64(c.rate) * c.seconds)
	var sent int
	var took time.Duration
	err = netns.Do(netns.Path(c.genNS), func() error {
		ring, err := openTxRing(c.genIf)
		if err != nil {
			return err
		}
		defer ring.Close()
		start := time.Now()
		for sent < n {
			due := start.Add(time.Duration(float64(sent) / float64(c.rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d) // pacing the generator, not synchronisation
			}
			b := frames[:min(batch, n-sent)]
			if err := ring.Send(b); err != nil {
				return err
			}
			sent += len(b)
		}
		took = time.Since(start)
		return nil
	})
	return sent, float64(sent) / took.Seconds(), err
}

// udpFrame is a UDP datagram to port 9 between documentation addresses,
// size bytes long with its Ethernet header.
func udpFrame(size int) ([]byte, error) {
	const headers = 14 + 20 + 8
	if size < 60 || size > 1514 {
		return nil, errors.New("-frame must be from 60 to 1514 bytes")
	}
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
		EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP,
		SrcIP: net.IP{192, 0, 2, 10}, DstIP: net.IP{198, 51, 100, 10}}
	udp := &layers.UDP{SrcPort: 4000, DstPort: 9}
	if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
		return nil, err
	}
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, udp, gopacket.Payload(make([]byte, size-headers)))
	return buf.Bytes(), err
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
