package netlab_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/talkbox-sandbox/talkbox/internal/netlab"
	"github.com/talkbox-sandbox/talkbox/internal/netlab/labtest"
)

// dirBytes is what the files directly in dir hold, and the names of
// multilog's rotated files (@….s) among them.
func dirBytes(t *testing.T, dir string) (int64, []string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	var rotated []string
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue // rotated away while listed
		}
		n += fi.Size()
		if strings.HasPrefix(e.Name(), "@") {
			rotated = append(rotated, e.Name())
		}
	}
	return n, rotated
}

// TestSinkholeLogsCapped: a guest flooding the sinkhole's services cannot
// make their logs outgrow their caps. The DNS query log rotates (old files
// are dropped and it goes on logging); INetSim's logs stop at the size of
// their tmpfs and INetSim goes on answering.
func TestSinkholeLogsCapped(t *testing.T) {
	ctx := context.Background()
	l := labtest.New(t)
	cfg := l.Config
	cfg.DNS, cfg.INetSim, cfg.INetSimServices = true, true, []string{"http"}
	t.Cleanup(func() { netlab.Down(ctx, cfg.Dir) })
	if _, err := netlab.Up(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	sinkhole := cfg.Sinkhole()

	t.Run("dns query log rotates within its cap", func(t *testing.T) {
		dir := netlab.LogDir(&cfg, "dns")
		limit := int64(netlab.LogFilesKept+1)*netlab.LogFileSize + 4096 // multilog's lock and state files
		server := net.JoinHostPort(sinkhole.String(), "53")
		var c net.Conn
		labtest.In(t, cfg.HostNS, func() (err error) {
			c, err = net.Dial("udp", server)
			return err
		})
		defer c.Close()
		// Long names, each logged twice (the query, the answer).
		label := strings.Repeat("x", 60)
		seen := map[string]bool{}
		deadline := time.Now().Add(2 * time.Minute)
		for round := 0; ; round++ {
			for i := range 2000 {
				name := fmt.Sprintf("r%d-%d.%s.%s.%s.flood.example.", round, i, label, label, label)
				if _, err := c.Write(dnsQuery(uint16(i), name, dnsmessage.TypeA)); err != nil {
					t.Fatal(err)
				}
			}
			// The sinkhole answers in turn: once this is answered, the
			// round has been handled (logged, or its lines dropped when
			// multilog fell behind).
			if a := lookupA(t, cfg.HostNS, server, "paced.example."); a != sinkhole {
				t.Fatalf("paced.example answered %s", a)
			}
			n, rotated := dirBytes(t, dir)
			if n > limit {
				t.Fatalf("the DNS log holds %d bytes after round %d, over its cap of %d", n, round, limit)
			}
			for _, r := range rotated {
				seen[r] = true
			}
			if len(rotated) > netlab.LogFilesKept {
				t.Fatalf("%d rotated files kept, want at most %d", len(rotated), netlab.LogFilesKept)
			}
			// More files made than kept: the oldest were dropped.
			if len(seen) > netlab.LogFilesKept {
				t.Logf("%d rounds: %d bytes in %s, %d files rotated out", round+1, n, dir, len(seen)-len(rotated))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %d rounds the DNS log has rotated %d times: the flood is not logged", round+1, len(seen))
			}
		}
		// And it still logs: the newest query reaches the current file.
		w := watchDir(t, dir)
		lookupA(t, cfg.HostNS, server, "after-the-flood.example.")
		w.waitFor(t, "current", "after-the-flood.example")
	})

	t.Run("inetsim logs stop at their cap", func(t *testing.T) {
		dir := netlab.LogDir(&cfg, "inetsim")
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		if size := int64(st.Blocks) * st.Bsize; size > netlab.INetSimLogSize {
			t.Fatalf("INetSim's log directory holds up to %d bytes, over its cap of %d", size, netlab.INetSimLogSize)
		}
		// INetSim logs every header line it is sent: twice the cap in
		// long headers.
		pad := strings.Repeat("a", 256<<10)
		for sent := 0; sent < 2*netlab.INetSimLogSize; sent += len(pad) {
			if err := inetsimGet(t, cfg.HostNS, sinkhole, pad); err != nil {
				t.Fatalf("INetSim did not answer the flood's request %d: %v", sent/len(pad), err)
			}
		}
		n, _ := dirBytes(t, dir)
		t.Logf("INetSim's logs: %d bytes", n)
		if n > netlab.INetSimLogSize {
			t.Fatalf("INetSim's logs hold %d bytes, over their cap of %d", n, netlab.INetSimLogSize)
		}
		if n < netlab.INetSimLogSize/2 {
			t.Fatalf("INetSim's logs hold %d bytes after a flood of twice their cap: the flood was not logged", n)
		}
		if err := inetsimGet(t, cfg.HostNS, sinkhole, "after the flood"); err != nil {
			t.Fatalf("INetSim stopped answering once its logs were full: %v", err)
		}
	})

	t.Run("inetsim keeps uploads in its own capped copy", func(t *testing.T) {
		hostPosts, _ := os.ReadDir("/var/lib/inetsim/http/postdata")
		st, err := netlab.Inspect(ctx, cfg.Dir)
		if err != nil {
			t.Fatal(err)
		}
		pid := 0
		for _, s := range st.Services {
			if s.Name == "inetsim" {
				pid = s.PID
			}
		}
		data := filepath.Join("/proc", strconv.Itoa(pid), "root", "var/lib/inetsim")
		body := make([]byte, 1<<20)
		for i := 0; i*len(body) < 2*netlab.INetSimDataSize; i++ {
			body[0] = byte(i) // each a file of its own (INetSim names them by digest)
			if err := inetsimPost(t, cfg.HostNS, sinkhole, body); err != nil {
				t.Fatalf("INetSim did not answer upload %d: %v", i, err)
			}
		}
		var fs unix.Statfs_t
		if err := unix.Statfs(data, &fs); err != nil {
			t.Fatal(err)
		}
		size, used := int64(fs.Blocks)*fs.Bsize, int64(fs.Blocks-fs.Bfree)*fs.Bsize
		t.Logf("INetSim's data: %d of %d bytes used", used, size)
		if size > netlab.INetSimDataSize {
			t.Fatalf("INetSim's data directory holds up to %d bytes, over its cap of %d", size, netlab.INetSimDataSize)
		}
		if used < netlab.INetSimDataSize/2 {
			t.Fatalf("INetSim's data holds %d bytes after uploads of twice its cap: the uploads were not stored", used)
		}
		if after, _ := os.ReadDir("/var/lib/inetsim/http/postdata"); len(after) != len(hostPosts) {
			t.Fatalf("the host's /var/lib/inetsim/http/postdata went from %d to %d files", len(hostPosts), len(after))
		}
		if err := inetsimGet(t, cfg.HostNS, sinkhole, "after the uploads"); err != nil {
			t.Fatalf("INetSim stopped answering once its data was full: %v", err)
		}
	})
}

// inetsimPost uploads body to INetSim's HTTP and reads the answer, which
// comes once it has stored it.
func inetsimPost(t *testing.T, ns string, sinkhole netip.Addr, body []byte) error {
	t.Helper()
	var c net.Conn
	labtest.In(t, ns, func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(sinkhole.String(), "80"), wait)
		return err
	})
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	if _, err := fmt.Fprintf(c, "POST /upload HTTP/1.0\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", len(body)); err != nil {
		return err
	}
	if _, err := c.Write(body); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// inetsimGet asks INetSim's HTTP for a page with a header line of pad and
// reads the answer, which comes once the request (and its log lines) are
// done.
func inetsimGet(t *testing.T, ns string, sinkhole netip.Addr, pad string) error {
	t.Helper()
	var c net.Conn
	labtest.In(t, ns, func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(sinkhole.String(), "80"), wait)
		return err
	})
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	if _, err := fmt.Fprintf(c, "GET /flood HTTP/1.0\r\nX-Pad: %s\r\n\r\n", pad); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// dirWatch is an inotify watch on a directory: a test waits on it for a
// file to be written rather than polling on a timer.
type dirWatch struct {
	fd  int
	dir string
}

func watchDir(t *testing.T, dir string) *dirWatch {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MODIFY|unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE); err != nil {
		t.Fatal(err)
	}
	return &dirWatch{fd: fd, dir: dir}
}

// waitFor waits until file holds text, failing the test after wait.
func (w *dirWatch) waitFor(t *testing.T, file, text string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	buf := make([]byte, 4096)
	for {
		b, err := os.ReadFile(filepath.Join(w.dir, file))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if strings.Contains(string(b), text) {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("%s: no %q within %s", filepath.Join(w.dir, file), text, wait)
		}
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(left.Milliseconds())+1); err != nil && err != unix.EINTR {
			t.Fatal(err)
		}
		for {
			if _, err := unix.Read(w.fd, buf); err != nil {
				break // drained
			}
		}
	}
}
