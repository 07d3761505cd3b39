package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"

	"github.com/talkbox-sandbox/talkbox/internal/decode/pcapgen"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
)

var (
	guestIP = netip.MustParseAddr("10.13.37.2")
	hostIP  = netip.MustParseAddr("10.13.37.1")
)

// TestRealCapture runs the cross-check on a capture tcpdump makes of real
// traffic between two network namespaces: HTTP on a keep-alive
// connection, DNS, a refused and a reset connection, a UDP exchange. tshark
// and tb-parse must agree on everything, direction and conn_state
// included.
func TestRealCapture(t *testing.T) {
	l := labtest.New(t)
	g := l.AddGuest("c", guestIP)
	h := l.Handle(l.Config.HostNS)
	port, err := h.LinkByName(g.Port)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr(hostIP.String() + "/24")
	if err := h.AddrAdd(port, a); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(port); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "tb-parse")
	if out, err := exec.Command("go", "build", "-o", bin, "../../../cmd/tb-parse").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}

	serve(t, l.Config.HostNS)
	file := filepath.Join(dir, "real.pcap")
	stop := tcpdump(t, l.Config.HostNS, g.Port, file)
	traffic(t, g.NS)
	// The marker goes last: once it is in the file, so is the rest.
	marker := []byte("crosscheck: end of traffic")
	labtest.In(t, g.NS, func() error {
		c, err := net.Dial("udp", netip.AddrPortFrom(hostIP, 9).String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(marker)
		return err
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, _ := os.ReadFile(file); bytes.Contains(b, marker) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("tcpdump did not write the traffic")
		}
		time.Sleep(10 * time.Millisecond) // polling the file for a condition
	}
	stop()

	var out bytes.Buffer
	res := crosscheck(&out, bin, file, 20)
	t.Logf("crosscheck:\n%s", out.String())
	for kind, min := range map[string]int{"tcp bytes": 3, "dns queries": 3, "dns answers": 3, "http requests": 3, "direction": 7, "conn_state": 8} {
		if r := res[kind]; r[1] != 0 || r[0] < min {
			t.Errorf("%s: %d checked, %d disagree (want at least %d checked, none disagreeing)", kind, r[0], r[1], min)
		}
	}
}

// serve starts, in the host namespace, an HTTP server on port 80, a DNS
// responder on 53 and a server on 7777 that reads until the client resets.
func serve(t *testing.T, ns string) {
	var web, sink net.Listener
	var dns net.PacketConn
	labtest.In(t, ns, func() error {
		var err error
		if web, err = net.Listen("tcp", netip.AddrPortFrom(hostIP, 80).String()); err != nil {
			return err
		}
		if sink, err = net.Listen("tcp", netip.AddrPortFrom(hostIP, 7777).String()); err != nil {
			return err
		}
		dns, err = net.ListenPacket("udp", netip.AddrPortFrom(hostIP, 53).String())
		return err
	})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", r.Method, strings.Repeat("x", 3000))
	})}
	go srv.Serve(web)
	t.Cleanup(func() { srv.Close() })
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go io.Copy(io.Discard, c)
		}
	}()
	t.Cleanup(func() { sink.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := dns.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:n]
			if n < 17 {
				continue
			}
			// The question as asked, with one A record answering it.
			name := qname(q[12:])
			resp := pcapgen.DNSResponse(uint16(q[0])<<8|uint16(q[1]), name, layers.DNSTypeA, layers.DNSResponseCodeNoErr,
				[]layers.DNSResourceRecord{pcapgen.A(name, netip.MustParseAddr("203.0.113.66"), 60)})
			dns.WriteTo(resp, from)
		}
	}()
	t.Cleanup(func() { dns.Close() })
}

// qname reads an uncompressed name from the start of a question.
func qname(b []byte) string {
	var labels []string
	for len(b) > 0 && b[0] != 0 && int(b[0]) < len(b) {
		labels = append(labels, string(b[1:1+b[0]]))
		b = b[1+b[0]:]
	}
	return strings.Join(labels, ".")
}

// tcpdump captures an interface of a namespace into file; the returned
// function stops it and waits for it to write what it has.
func tcpdump(t *testing.T, ns, iface, file string) func() {
	cmd := exec.Command("ip", "netns", "exec", ns, "tcpdump", "-Z", "root", "-U", "-n", "-i", iface, "-s", "0", "-w", file)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "listening on") {
				listening <- nil
				io.Copy(io.Discard, stderr)
				return
			}
		}
		listening <- fmt.Errorf("tcpdump ended before listening: %v", sc.Err())
	}()
	select {
	case err := <-listening:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("tcpdump is not listening after 30 s")
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
	}
	t.Cleanup(stop)
	return stop
}

// traffic runs the guest's side of the exchanges, each to its end.
func traffic(t *testing.T, ns string) {
	ctx := context.Background()
	labtest.In(t, ns, func() error {
		// Three requests on one keep-alive connection, then a close.
		c, err := net.Dial("tcp", netip.AddrPortFrom(hostIP, 80).String())
		if err != nil {
			return err
		}
		br := bufio.NewReader(c)
		for _, p := range []string{"/a", "/b", "/c"} {
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: c2.example\r\nUser-Agent: crosscheck\r\n\r\n", p)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, br)
		c.Close()

		// DNS lookups, each on its own socket.
		for i := range 4 {
			u, err := net.Dial("udp", netip.AddrPortFrom(hostIP, 53).String())
			if err != nil {
				return err
			}
			u.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := u.Write(pcapgen.DNSQuery(uint16(100+i), fmt.Sprintf("host%d.c2.example", i), layers.DNSTypeA)); err != nil {
				return err
			}
			if _, err := u.Read(make([]byte, 1500)); err != nil {
				return err
			}
			u.Close()
		}

		// A refused connection.
		var d net.Dialer
		if c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(hostIP, 81).String()); err == nil {
			c.Close()
			return fmt.Errorf("port 81 accepted a connection")
		}

		// A connection the client resets after sending.
		c, err = net.Dial("tcp", netip.AddrPortFrom(hostIP, 7777).String())
		if err != nil {
			return err
		}
		c.Write([]byte("some data, then a reset"))
		c.(*net.TCPConn).SetLinger(0)
		return c.Close()
	})
}
