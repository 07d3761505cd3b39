package beacon

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/demo/c2"
)

func TestParseRefusesScanTargetsOutsideTheLab(t *testing.T) {
	for _, target := range []string{"8.8.8.8", "10.0.0.1", "10.13.38.2", "127.0.0.1", "192.0.3.1", "198.51.101.1", "203.0.114.9", "169.254.1.1", "::1", "2001:db8::1", "::ffff:8.8.8.8"} {
		_, err := Parse([]string{"-c2", "c2.example", "-scan", "192.0.2.1," + target}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "refusing scan target") {
			t.Errorf("scan target %s: err = %v, want a refusal", target, err)
		}
	}
	c, err := Parse([]string{"-c2", "c2.example", "-scan", "192.0.2.1, 198.51.100.255", "-scan", "203.0.113.7,10.13.37.20"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Scan) != 4 {
		t.Fatalf("scan = %v", c.Scan)
	}
	for _, bad := range [][]string{{}, {"-c2", "8.8.8.8"}, {"-c2", "x", "-c2-addr", "8.8.8.8"}, {"-c2", "x", "-c2-addr", "nonsense"}, {"-c2", "x", "-port", "0"}, {"-c2", "x", "-jitter", "2"}, {"-c2", "x", "-scan", "nonsense"}, {"-c2", "x y"}} {
		if _, err := Parse(bad, io.Discard); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// recorder is the network of a test: it records every dial and lets the
// real dialer through only to loopback.
type recorder struct {
	mu    sync.Mutex
	dials []string
	fail  int // fail this many dials to the C2 port first
}

func (r *recorder) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	r.mu.Lock()
	r.dials = append(r.dials, addr)
	fail := r.fail > 0 && !strings.HasSuffix(addr, ":23")
	if fail {
		r.fail--
	}
	r.mu.Unlock()
	host, _, _ := net.SplitHostPort(addr)
	if fail || host != "127.0.0.1" {
		return nil, errors.New("connection refused (test)")
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func newTest(t *testing.T, cfg *Config, lookup []netip.Addr) (*Beacon, *recorder, *bytes.Buffer) {
	t.Helper()
	rec := &recorder{}
	var log bytes.Buffer
	b := &Beacon{Cfg: cfg, Dial: rec.dial, Log: &log, Rand: rand.New(rand.NewPCG(1, 2)),
		Lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			if host != "c2.example" {
				return nil, errors.New("no such host")
			}
			return lookup, nil
		}}
	return b, rec, &log
}

func c2Server(t *testing.T) (port string, hits func() []c2.Hit) {
	t.Helper()
	var mu sync.Mutex
	var buf bytes.Buffer
	srv := httptest.NewServer(c2.NewHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})))
	t.Cleanup(srv.Close)
	_, port, _ = net.SplitHostPort(srv.Listener.Addr().String())
	return port, func() []c2.Hit {
		mu.Lock()
		defer mu.Unlock()
		h, err := c2.ReadHits(bytes.NewReader(buf.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func config(t *testing.T, port string, extra ...string) *Config {
	t.Helper()
	cfg, err := Parse(append([]string{"-c2", "c2.example", "-port", port, "-interval", "1ms", "-retry", "1ms", "-id", "bot-7"}, extra...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestBeaconsReachTheC2AndScanOnlyItsTargets(t *testing.T) {
	port, hits := c2Server(t)
	b, rec, log := newTest(t, config(t, port, "-count", "3", "-scan", "192.0.2.10,203.0.113.5"), []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	st := b.Run(context.Background())
	if st.Sent != 3 || st.Answered != 3 || st.Scanned != 2 || st.Open != 0 {
		t.Fatalf("stats = %+v\n%s", st, log)
	}
	h := hits()
	if len(h) != 3 {
		t.Fatalf("C2 saw %d beacons, want 3", len(h))
	}
	for i, hit := range h {
		if hit.Bot != "bot-7" || hit.Seq != i+1 || hit.Method != "POST" || hit.Path != "/gate" || hit.Host != "c2.example" {
			t.Errorf("hit %d = %+v", i, hit)
		}
	}
	want := []string{"192.0.2.10:23", "203.0.113.5:23", "127.0.0.1:" + port, "127.0.0.1:" + port, "127.0.0.1:" + port}
	if strings.Join(rec.dials, " ") != strings.Join(want, " ") {
		t.Fatalf("dials = %v, want %v", rec.dials, want)
	}
	if !strings.Contains(log.String(), `server="`+c2.ServerName+`"`) {
		t.Fatalf("log does not show the C2's answer:\n%s", log)
	}
}

func TestHardCodedAddressIsUsedAfterTheLookup(t *testing.T) {
	port, hits := c2Server(t)
	b, rec, log := newTest(t, config(t, port, "-count", "1", "-c2-addr", "127.0.0.1"), []netip.Addr{netip.MustParseAddr("10.13.38.2")})
	looked := false
	lookup := b.Lookup
	b.Lookup = func(ctx context.Context, host string) ([]netip.Addr, error) { looked = true; return lookup(ctx, host) }
	if st := b.Run(context.Background()); st.Answered != 1 || !looked {
		t.Fatalf("stats = %+v, looked up %v\n%s", st, looked, log)
	}
	if h := hits(); len(h) != 1 || h[0].Host != "c2.example" || rec.dials[0] != "127.0.0.1:"+port {
		t.Fatalf("hits = %+v, dials %v", h, rec.dials)
	}
}

func TestBeaconRetriesWhenTheC2DoesNotAnswer(t *testing.T) {
	port, hits := c2Server(t)
	b, rec, log := newTest(t, config(t, port, "-count", "1", "-retries", "3"), []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	rec.fail = 2
	if st := b.Run(context.Background()); st.Answered != 1 {
		t.Fatalf("stats = %+v\n%s", st, log)
	}
	if h := hits(); len(h) != 1 || h[0].Attempt != 3 {
		t.Fatalf("hits = %+v", h)
	}
	rec.fail = 5
	b.Cfg.Retries = 2
	if st := b.Run(context.Background()); st.Failed != 1 || st.Answered != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestBeaconNeverContactsAddressesOutsideTheLab(t *testing.T) {
	// The C2 name resolving outside the allowed networks is not contacted,
	// and a scan target smuggled into a Config built in code is refused.
	cfg := config(t, "80", "-count", "2", "-retries", "2")
	cfg.Scan = []netip.Addr{netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("192.0.2.1")}
	b, rec, log := newTest(t, cfg, []netip.Addr{netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("2606:2800::1")})
	st := b.Run(context.Background())
	if st.Answered != 0 || st.Failed != 2 {
		t.Fatalf("stats = %+v", st)
	}
	if strings.Join(rec.dials, " ") != "192.0.2.1:23" {
		t.Fatalf("dials = %v, want only the allowed scan target", rec.dials)
	}
	if !strings.Contains(log.String(), "scan 8.8.8.8 refused") || !strings.Contains(log.String(), "refusing C2 c2.example") {
		t.Fatalf("log:\n%s", log)
	}
}

func TestBeaconStopsWithItsContext(t *testing.T) {
	port, _ := c2Server(t)
	cfg := config(t, port)
	cfg.Interval = time.Hour
	b, _, _ := newTest(t, cfg, []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Stats)
	go func() { done <- b.Run(ctx) }()
	cancel()
	if st := <-done; st.Sent != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

// TestCrossCompiles builds the sample for every architecture the images
// cover and checks each ELF's machine.
func TestCrossCompiles(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	dir := t.TempDir()
	for _, c := range []struct {
		goarch, goarm string
		machine       elf.Machine
	}{
		{"amd64", "", elf.EM_X86_64}, {"386", "", elf.EM_386}, {"arm64", "", elf.EM_AARCH64},
		{"arm", "7", elf.EM_ARM}, {"mipsle", "", elf.EM_MIPS}, {"mips64le", "", elf.EM_MIPS},
		{"ppc64le", "", elf.EM_PPC64}, {"s390x", "", elf.EM_S390},
	} {
		out := filepath.Join(dir, "beacon-"+c.goarch)
		cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./cmd/beacon")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+c.goarch, "GOARM="+c.goarm, "GOMIPS=softfloat")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", c.goarch, err, b)
		}
		f, err := elf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		if f.Machine != c.machine {
			t.Errorf("%s: machine %v, want %v", c.goarch, f.Machine, c.machine)
		}
		f.Close()
	}
}

func TestParseExpandsScanRangesWithinOneAllowedNetwork(t *testing.T) {
	c, err := Parse([]string{"-c2", "x", "-scan", "198.51.100.1-198.51.100.17,198.51.100.19-198.51.100.254", "-scan", "203.0.113.1-203.0.113.254,192.0.2.7-192.0.2.7",
		"-scan-rounds", "3", "-scan-parallel", "32"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Scan) != 17+236+254+1 || c.ScanRounds != 3 || c.ScanParallel != 32 {
		t.Fatalf("scan %d targets, rounds %d, parallel %d", len(c.Scan), c.ScanRounds, c.ScanParallel)
	}
	seen := map[netip.Addr]bool{}
	for _, a := range c.Scan {
		if seen[a] || !ScanAllowed(a) || a == netip.MustParseAddr("198.51.100.18") {
			t.Fatalf("target %s (seen %v)", a, seen[a])
		}
		seen[a] = true
	}
	if c, err := Parse([]string{"-c2", "x", "-scan", "192.0.2.1"}, io.Discard); err != nil || c.ScanRounds != 1 || c.ScanParallel != 1 {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	for _, r := range []string{"192.0.2.250-198.51.100.3", "8.8.8.0-8.8.8.9", "192.0.2.1-8.8.8.8", "10.13.37.1-10.13.38.1",
		"0.0.0.0-255.255.255.255", "192.0.2.1-203.0.113.255", "203.0.113.9-203.0.113.1", "192.0.2.1-nonsense", "192.0.2.1-", "-192.0.2.1"} {
		if c, err := Parse([]string{"-c2", "x", "-scan", r}, io.Discard); err == nil {
			t.Errorf("range %s accepted: %d targets", r, len(c.Scan))
		}
	}
	for _, bad := range [][]string{{"-scan-rounds", "0"}, {"-scan-parallel", "0"}, {"-scan-parallel", "65"}} {
		if _, err := Parse(append([]string{"-c2", "x"}, bad...), io.Discard); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// gate is the network of a parallel scan: each scan dial waits for the
// test to release it, and fails then.
type gate struct {
	mu       sync.Mutex
	release  chan struct{}
	inFlight int
	dials    map[string]int
}

func (g *gate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	g.mu.Lock()
	g.dials[addr]++
	g.inFlight++
	g.mu.Unlock()
	defer func() { g.mu.Lock(); g.inFlight--; g.mu.Unlock() }()
	select {
	case <-g.release:
		return nil, errors.New("connection refused (test)")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func TestScanRoundsRepeatEveryTargetWithBoundedParallelism(t *testing.T) {
	// In a synctest bubble, Wait returns once every goroutine is blocked:
	// the scanner on its bound, the probes in their dials. So the probes
	// in flight are counted at each step, exactly.
	synctest.Test(t, func(t *testing.T) {
		cfg := config(t, "80", "-scan", "203.0.113.1-203.0.113.40", "-scan-rounds", "3", "-scan-parallel", "8")
		b, _, log := newTest(t, cfg, nil)
		g := &gate{release: make(chan struct{}), dials: map[string]int{}}
		b.Dial = g.dial
		type result struct{ scanned, open int }
		done := make(chan result, 1)
		go func() { n, open := b.scan(context.Background()); done <- result{n, open} }()
		for released := 0; ; released++ {
			synctest.Wait()
			g.mu.Lock()
			inFlight := g.inFlight
			g.mu.Unlock()
			if want := min(8, 120-released); inFlight != want {
				close(g.release) // let the scan end before the bubble does
				<-done
				t.Fatalf("after %d probes, %d in flight, want %d", released, inFlight, want)
			}
			if inFlight == 0 {
				break
			}
			g.release <- struct{}{}
		}
		if r := <-done; r.scanned != 120 || r.open != 0 {
			t.Fatalf("scanned %d, open %d, want 120 and 0\n%s", r.scanned, r.open, log)
		}
		if len(g.dials) != 40 {
			t.Fatalf("%d targets dialled, want 40: %v", len(g.dials), g.dials)
		}
		for addr, n := range g.dials {
			if n != 3 || !strings.HasPrefix(addr, "203.0.113.") || !strings.HasSuffix(addr, ":23") {
				t.Errorf("%s dialled %d times, want 3", addr, n)
			}
		}
	})
}

func TestParallelScanThenBeaconsStayInTheLab(t *testing.T) {
	port, hits := c2Server(t)
	cfg := config(t, port, "-count", "2", "-c2-addr", "127.0.0.1", "-scan", "192.0.2.1-192.0.2.100", "-scan-rounds", "2", "-scan-parallel", "32")
	cfg.Scan = append(cfg.Scan, netip.MustParseAddr("8.8.8.8")) // built in code: refused all the same
	b, rec, log := newTest(t, cfg, []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	st := b.Run(context.Background())
	if st.Scanned != 2*101 || st.Open != 0 || st.Answered != 2 || len(hits()) != 2 {
		t.Fatalf("stats = %+v\n%s", st, log)
	}
	for _, d := range rec.dials {
		if a := netip.MustParseAddrPort(d).Addr(); !ScanAllowed(a) && !a.IsLoopback() {
			t.Fatalf("dialled %s", d)
		}
	}
	if n := len(rec.dials); n != 2*100+2 {
		t.Fatalf("%d dials, want 202", n)
	}
	if n := strings.Count(log.String(), "scan 8.8.8.8 refused"); n != 2 {
		t.Fatalf("the target outside the lab refused %d times, want 2:\n%s", n, log)
	}
}

// TestBehaviourLeavesWhatTheTraceMustSee runs -behave's actions with a
// stand-in for the beacon's binary (a shell script that exits: no sample
// runs on the host) on a locked thread that dies with the test's goroutine,
// so the rename stays with it.
func TestBehaviourLeavesWhatTheTraceMustSee(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(t.TempDir(), "self")
	if err := os.WriteFile(self, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	free, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := free.Addr().(*net.TCPAddr).Port
	free.Close()
	var lines []string
	type result struct {
		ln   net.Listener
		name string
		err  error
	}
	done := make(chan result)
	go func() {
		runtime.LockOSThread() // never unlocked: the renamed thread exits
		b := &Behaviour{Dir: dir, Listen: port, Self: self}
		ln, err := b.Do(context.Background(), func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) })
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/comm", unix.Gettid()))
		done <- result{ln, strings.TrimSpace(string(comm)), err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.ln.Close()
	if r.name != ProcessName[:min(len(ProcessName), 15)] {
		t.Errorf("thread name %q, want %q", r.name, ProcessName)
	}
	if st, err := os.Stat(filepath.Join(dir, Dropped)); err != nil || st.Mode()&0o111 == 0 {
		t.Errorf("dropped file: %v, %v", st, err)
	}
	for _, p := range Persistence {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(self); !os.IsNotExist(err) {
		t.Errorf("own binary not deleted: %v", err)
	}
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("listener: %v", err)
	}
	c.Close()
	if got := strings.Join(lines, "\n"); !strings.Contains(got, "behave child=") || !strings.Contains(got, "behave traced=false") {
		t.Errorf("log:\n%s", got)
	}
}

// The beacon reports the C2's task done on the connection that carried
// it, so that a capture shows the bot answering its C2 (a C2 on probation
// is confirmed on that); an answer without a task (a sinkhole's page) gets
// no report.
func TestBeaconReportsItsTaskOnTheSameConnection(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.Handler
		reports int
	}{
		{"the C2", c2.NewHandler(io.Discard), 2},
		{"a web page", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>sinkhole</html>") }), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			byConn := map[string][]string{}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				mu.Lock()
				byConn[r.RemoteAddr] = append(byConn[r.RemoteAddr], string(body))
				mu.Unlock()
				tc.handler.ServeHTTP(w, r)
			}))
			defer srv.Close()
			_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
			b, _, log := newTest(t, config(t, port, "-count", "2"), []netip.Addr{netip.MustParseAddr("127.0.0.1")})
			if st := b.Run(context.Background()); st.Answered != 2 {
				t.Fatalf("stats = %+v\n%s", st, log)
			}
			mu.Lock()
			defer mu.Unlock()
			reports := 0
			for conn, bodies := range byConn {
				if !strings.Contains(bodies[0], `"done"`) && len(bodies) == 2 && strings.Contains(bodies[1], `"done":"sleep"`) {
					reports++
				} else if len(bodies) != 1 {
					t.Errorf("connection %s carried %q", conn, bodies)
				}
			}
			if len(byConn) != 2 || reports != tc.reports {
				t.Errorf("%d connections, %d with a report, want 2 and %d: %q", len(byConn), reports, tc.reports, byConn)
			}
		})
	}
}
